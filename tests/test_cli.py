"""The `pgt` command as users run it: real subprocesses, exit codes, one-line errors (the refusals of a file or
folder in this process, tests/in_process.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_process import pgt_here

PGT = [sys.executable, "-m", "pgt.cli"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PGT, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})


def imported_modules(*python_args) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python -X importtime ARGS`: its outcome, and every module it imported."""
    out = subprocess.run([sys.executable, "-X", "importtime", *map(str, python_args)], capture_output=True, text=True)
    return out, {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}


def imported_packages(*args) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`pgt ARGS` under -X importtime: its outcome, and the top-level packages it imported."""
    out, modules = imported_modules("-m", "pgt.cli", *args)
    return out, {module.split(".")[0] for module in modules}


def test_help_is_fast_and_imports_no_torch():
    out, imported = imported_packages("--help")
    assert out.returncode == 0 and "preprocess" in out.stdout and "synth" in out.stdout
    assert not imported & {"torch", "ray", "mlflow", "prefect", "polars", "sklearn"}


def test_training_and_scoring_import_no_scikit_learn(tmp_path):
    """Every `pgt` command that trains or scores, every Ray Train worker and every Tune trial imports the scoring; it
    leaves scikit-learn (2 s an import on 2 busy cores) to the preprocessing that clusters places."""
    out, imported = imported_packages("train", "--data", tmp_path, "--out", tmp_path / "run")
    assert out.returncode == 2 and "no manifest.json" in out.stderr  # the command ran as far as its first check
    assert {"torch", "pgt"} <= imported and "sklearn" not in imported
    # a tracked run logs its model through the served model's module: raw GPS's place search stays unimported
    logged, modules = imported_modules("-c", "import pgt.serving.mlflow_model")
    assert logged.returncode == 0 and "pgt.serving.mlflow_model" in modules
    assert not {"sklearn", "preprocessing.fitted"} & modules


def test_synth_then_preprocess_then_reuse(tmp_path):
    fixes = tmp_path / "synth.parquet"
    r = run("synth", "--users", 4, "--days", 70, "--seed", 5, "--out", fixes)
    assert r.returncode == 0 and fixes.is_file() and "GPS points of 4 users over 70 days" in r.stdout
    config = tmp_path / "c.yaml"
    config.write_text("timezone: Asia/Shanghai\n")
    out = tmp_path / "seq"
    r = run("preprocess", "--input", fixes, "--format", "positionfixes", "--out", out, "--config", config)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out}") and "preprocess" in r.stderr  # the progress bar
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["timezone"] == "Asia/Shanghai" and min(manifest["counts"]["samples"].values()) > 0
    assert set(manifest["counts"]) == {"positionfixes_read", "positionfixes_quarantined", "staypoints",
                                       "activity_staypoints", "users_kept", "locations", "staypoints_merged", "samples"}
    assert set(manifest["vocab"]) == {"locations", "users", "time_slots", "weekdays", "recency", "durations", "max_history"}
    assert (manifest["vocab"]["time_slots"], manifest["vocab"]["recency"], manifest["vocab"]["durations"]) == (96, 8, 96)
    assert {"config", "input_sha256", "version"} <= set(manifest) and manifest["producer"] == "pgt preprocess"
    r = run("preprocess", "--input", fixes, "--format", "positionfixes", "--out", out, "--config", config, "--no-progress")
    assert r.returncode == 0 and r.stdout.startswith(f"reused {out}") and r.stderr == ""
    r = run("manifest", out)  # the counts and vocabulary sizes, as the manifest holds them
    assert r.returncode == 0 and json.loads(r.stdout) == {"counts": manifest["counts"], "vocab": manifest["vocab"]}


def test_manifest_of_a_folder_that_is_not_a_preprocess_output(tmp_path):
    _single_error_line(pgt_here("manifest", tmp_path), f"{tmp_path}: no manifest.json; expected a `pgt preprocess` output folder")
    (tmp_path / "manifest.json").write_text("{not json")
    _single_error_line(pgt_here("manifest", tmp_path), f"{tmp_path / 'manifest.json'}: corrupt manifest, not JSON")
    (tmp_path / "manifest.json").write_text('{"name": "someone else\'s"}')
    _single_error_line(pgt_here("manifest", tmp_path), "not the manifest of a `pgt preprocess` output")


def _single_error_line(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


@pytest.mark.parametrize("fmt,make,needle", [
    ("positionfixes", None, "no such file"),
    ("positionfixes", "user_id,when,latitude,longitude\n1,2008-10-23 02:53:04,1,1\n", "missing column tracked_at"),
    ("positionfixes", "user_id,tracked_at,latitude,longitude\n", "header only"),
    ("positionfixes", b"\x00\xff\x13garbage\x00" * 30, "binary content"),
    ("staypoints", "user_id,started_at,finished_at\n1,2008-10-23 02:53:04,2008-10-23 03:53:04\n", "missing column geom"),
])
def test_whole_file_problems(tmp_path, fmt, make, needle):
    path = tmp_path / "input.csv"
    if isinstance(make, bytes):
        path.write_bytes(make)
    elif make is not None:
        path.write_text(make)
    r = pgt_here("preprocess", "--input", path, "--format", fmt, "--out", tmp_path / "out")
    _single_error_line(r, str(path), needle)
    assert not (tmp_path / "out").exists()


def test_not_parquet_and_not_geolife(tmp_path):
    fake = tmp_path / "points.parquet"
    fake.write_text("user_id,tracked_at\n")
    _single_error_line(pgt_here("preprocess", "--input", fake, "--format", "positionfixes", "--out", tmp_path / "o"),
                       str(fake), "not a Parquet file")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "readme.txt").write_text("hello")
    _single_error_line(pgt_here("preprocess", "--input", folder, "--format", "geolife-plt", "--out", tmp_path / "o"),
                       str(folder), "not the GeoLife layout")
    bad_config = tmp_path / "c.yaml"
    bad_config.write_text("dist_threshold: 100\n")
    _single_error_line(pgt_here("preprocess", "--input", fake, "--format", "positionfixes", "--out", tmp_path / "o",
                           "--config", bad_config), str(bad_config), "unknown setting")


def test_serve_on_a_port_in_use_fails_at_once_in_one_line(tmp_path):
    import socket
    import time

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        start = time.monotonic()
        r = run("serve", "--model", "models:/none@champion", "--port", port, "--tracking-uri",
                f"sqlite:///{tmp_path / 'mlflow.db'}")
        _single_error_line(r, f"cannot listen on 127.0.0.1:{port}: in use")
        assert time.monotonic() - start < 60  # before any model or tracking store is touched
        assert not (tmp_path / "mlflow.db").exists()


def test_bad_format_choice_is_a_usage_error(tmp_path):
    r = run("preprocess", "--input", tmp_path, "--format", "gpx", "--out", tmp_path / "o")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "gpx" in r.stderr


def test_force_refuses_an_out_holding_the_users_files(tmp_path):
    """exit 2 in one line naming the folder and the files; nothing in it changes, --force included."""
    fixes = tmp_path / "synth.parquet"
    assert run("synth", "--users", 3, "--days", 60, "--out", fixes).returncode == 0
    out = tmp_path / "seq"
    assert run("preprocess", "--input", fixes, "--format", "positionfixes", "--out", out, "--no-progress").returncode == 0
    (out / "notes.md").write_text("my notes")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    r = run("preprocess", "--input", fixes, "--format", "positionfixes", "--out", out, "--force", "--no-progress")
    _single_error_line(r, str(out), "notes.md", "did not write")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("chapter 1")
    r = run("preprocess", "--input", fixes, "--format", "positionfixes", "--out", home, "--force", "--no-progress")
    _single_error_line(r, str(home), "thesis.tex")
    assert [p.name for p in home.iterdir()] == ["thesis.tex"]

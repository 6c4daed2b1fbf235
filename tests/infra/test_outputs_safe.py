"""Every command that writes leaves its inputs and other people's files alone, and fails in seconds on a service
that does not answer: exit 2, one line naming the path or address, nothing created or changed. The refusals run
in this process (tests/in_process.py); the data is made, and a PATH without a compiler tried, by subprocesses."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.in_process import pgt_here

PGT = [sys.executable, "-m", "pgt.cli"]


def pgt(*args, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PGT, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def refused(r: subprocess.CompletedProcess, *words: str) -> bool:
    """Exit 2 with one line on stderr holding every word, and no traceback."""
    lines = r.stderr.strip().splitlines()
    return r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words) and "Traceback" not in r.stderr


def digest(path: Path) -> str:
    """A folder's or a file's content, names and bytes, as one hash."""
    h = hashlib.sha256()
    for p in sorted([path] if path.is_file() else path.rglob("*")):
        h.update(str(p.relative_to(path.parent)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three synthetic people (points.parquet, written by `pgt synth`) and their `pgt preprocess` folder."""
    root = tmp_path_factory.mktemp("safe")
    assert pgt("synth", "--out", root / "points.parquet", "--users", 3, "--days", 60, "--no-progress").returncode == 0
    r = pgt("preprocess", "--input", root / "points.parquet", "--format", "positionfixes", "--out", root / "seq",
            "--no-progress")
    assert r.returncode == 0, r.stderr
    return root


def test_synth_replaces_its_own_file_and_nothing_else(tmp_path):
    out = tmp_path / "points.parquet"
    assert pgt_here("synth", "--out", out, "--users", 1, "--days", 2, "--no-progress").returncode == 0
    first = out.read_bytes()
    assert pgt_here("synth", "--out", out, "--users", 1, "--days", 2, "--no-progress").returncode == 0  # its own: rewritten
    assert out.read_bytes() == first  # the same config writes the same bytes
    foreign = tmp_path / "mine.parquet"
    foreign.write_bytes(b"PAR1 a file of someone else's")
    assert refused(pgt_here("synth", "--out", foreign, "--no-progress"), str(foreign), "not written by `pgt synth`")
    assert foreign.read_bytes() == b"PAR1 a file of someone else's"
    assert refused(pgt_here("synth", "--out", tmp_path / "points.csv"), "must end in .parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.parquet", "points.parquet"]


def test_preprocess_never_writes_over_or_into_its_inputs(data, tmp_path):
    before = {name: digest(data / name) for name in ("points.parquet", "seq")}
    cases = {
        "--out is --input": (["--input", data / "points.parquet", "--format", "positionfixes", "--out",
                              data / "points.parquet"], "is --input itself"),
        "--out holds --input": (["--input", data / "points.parquet", "--format", "positionfixes", "--out", data],
                                "holds --input"),
        "--out is --fitted": (["--input", data / "points.parquet", "--format", "positionfixes", "--fitted", data / "seq",
                               "--out", data / "seq"], "is --fitted itself"),
        "--out inside --fitted": (["--input", data / "points.parquet", "--format", "positionfixes", "--fitted",
                                   data / "seq", "--out", data / "seq" / "applied"], "lies inside --fitted"),
        "--fitted is a file": (["--input", data / "points.parquet", "--format", "positionfixes", "--fitted",
                                data / "points.parquet", "--out", tmp_path / "applied"], "is a file"),
        "--work-dir is a file": (["--input", data / "points.parquet", "--format", "positionfixes", "--out",
                                  tmp_path / "o", "--work-dir", data / "points.parquet"], "--work-dir is a file"),
    }
    for name, (args, words) in cases.items():
        assert refused(pgt_here("preprocess", *args, "--no-progress"), words), name
    assert {name: digest(data / name) for name in before} == before
    assert list(tmp_path.iterdir()) == []


def test_train_tune_and_explain_refuse_folders_of_other_files(data, tmp_path):
    theirs = tmp_path / "theirs"
    (theirs / "checkpoints").mkdir(parents=True)  # a folder `pgt train` would otherwise clear
    (theirs / "notes.txt").write_text("mine")
    before = digest(theirs)
    assert refused(pgt_here("train", "--data", data / "seq", "--out", theirs, "--epochs", 1), "notes.txt", "did not write")
    assert refused(pgt_here("train", "--data", data / "seq", "--out", data / "seq", "--epochs", 1), "is --data itself")
    assert refused(pgt_here("tune", "--data", data / "seq", "--out", theirs, "--trials", 1), "notes.txt", "`pgt tune`")
    assert refused(pgt_here("explain", "--checkpoint", data / "points.parquet", "--data", data / "seq", "--out", theirs),
                   "notes.txt", "`pgt explain`")
    assert digest(theirs) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs"]  # no MLflow run, no --out, nothing


def test_predict_refuses_an_output_it_did_not_write_before_loading_the_model(data, tmp_path):
    foreign = tmp_path / "pred.parquet"
    foreign.write_bytes(b"someone's")
    common = ["--model", "models:/none@champion", "--input", data / "points.parquet", "--format", "positionfixes",
              "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]
    assert refused(pgt_here("predict", *common, "--out", foreign), "not written by `pgt predict`")
    assert refused(pgt_here("predict", *common, "--out", tmp_path), "is a folder")
    assert refused(pgt_here("predict", *common, "--out", tmp_path / "pred.txt"), "must end in .parquet or .csv")
    assert refused(pgt_here("predict", *common, "--out", data / "points.parquet"), "not written by `pgt predict`")
    assert foreign.read_bytes() == b"someone's" and not (tmp_path / "none.db").exists()


def test_a_file_tracking_store_is_refused_in_one_line_before_any_work(data, tmp_path, monkeypatch):
    """MLflow 3 refuses its file store deep inside a run (a traceback); a path or file: URI is refused at the door,
    with what to use instead, for train and tune alike."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for args in (["train", "--data", data / "seq", "--out", tmp_path / "run", "--tracking-uri", tmp_path / "mlruns"],
                 ["tune", "--data", data / "seq", "--out", tmp_path / "sweep", "--tracking-uri",
                  (tmp_path / "mlruns").as_uri()]):
        r = pgt_here(*args)
        assert refused(r, (tmp_path / "mlruns").as_uri(), "a file store", "sqlite:///"), r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # nothing made before the check


def test_compile_model_without_a_c_compiler_is_refused_before_any_work(data, tmp_path):
    """--compile-model where PATH holds no C compiler (torch.compile needs one to build kernels): one line, and
    nothing written, instead of a failure at the first step."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    r = pgt("train", "--data", data / "seq", "--out", tmp_path / "run", "--resident-data", "--static-width", 16,
            "--compile-model", env={**os.environ, "PATH": str(bare)})
    assert refused(r, "compile_model", "C compiler", "without --compile-model"), r.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_a_tracking_store_mlflow_cannot_open_is_refused_in_one_line(data, tmp_path):
    """An unknown scheme, or a database whose driver is not installed: one line naming the URI and MLflow's reason."""
    for uri, reason in (("ftp://nowhere/x", "UnsupportedModelRegistryStoreURIException"),
                        ("mssql://user@127.0.0.1:1/db", "ModuleNotFoundError")):
        r = pgt_here("train", "--data", data / "seq", "--out", tmp_path / "run", "--tracking-uri", uri)
        assert refused(r, f"MLflow tracking store {uri} cannot be opened", reason), r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_a_tracking_store_that_hangs_is_given_up_on_in_time(monkeypatch):
    """A database that never answers (none is at hand to hang for real: its client stands in) is given up on
    within the timeout, in one line."""
    from pgt.tracking import store as tracking

    monkeypatch.setattr(tracking, "mlflow_client", lambda uri: time.sleep(30))
    began = time.monotonic()
    with pytest.raises(ValueError, match=r"^MLflow tracking store postgresql://h/db did not answer within 1 s"):
        tracking.check_tracking_store("postgresql://h/db", 1.0)
    assert time.monotonic() - began < 5


def test_an_unreachable_tracking_server_or_ray_cluster_fails_in_seconds(data, tmp_path):
    nobody = f"127.0.0.1:{free_port()}"
    for args, words in (
        (["train", "--data", data / "seq", "--out", tmp_path / "run", "--tracking-uri", f"http://{nobody}"],
         (f"http://{nobody}", "not reachable", "start-mlflow.sh")),
        (["train", "--data", data / "seq", "--out", tmp_path / "run", "--workers", 2, "--address", nobody],
         (nobody, "not reachable", "ray start --head")),
        (["tune", "--data", data / "seq", "--out", tmp_path / "sweep", "--address", nobody], (nobody, "not reachable")),
        # Ray Client, which Ray Train and Tune no longer take: the Ray Job that does it instead
        (["tune", "--data", data / "seq", "--out", tmp_path / "sweep", "--address", f"ray://{nobody}"],
         ("Ray Client (ray://) does not run Ray Train or Tune", "ray job submit --address http://HEAD:8265")),
        (["evaluate", "--model", "models:/x@champion", "--data", data / "seq", "--tracking-uri", f"http://{nobody}"],
         ("not reachable",)),
        (["preprocess", "--input", data / "points.parquet", "--format", "positionfixes", "--out", tmp_path / "p",
          "--engine", "ray", "--address", nobody], (nobody, "not reachable")),
    ):
        began = time.monotonic()
        r = pgt_here(*args)
        assert refused(r, *words), (args[0], r.stderr[-2000:])
        assert time.monotonic() - began < 30, args[0]
    assert list(tmp_path.iterdir()) == []  # nothing made before the check

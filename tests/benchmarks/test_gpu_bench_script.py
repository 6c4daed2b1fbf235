"""scripts/gpu_bench.sh on the CPU (DEVICE=cpu): it unpacks each part that has come once, runs the stages asked
for into the results folder, and refuses what it does not know."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "gpu_bench.sh"


def bench(tmp_path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEVICE": "cpu", "PYTHON": sys.executable, "PGT_DEPS": str(tmp_path / "deps"),
           "GPU_DEPS": str(tmp_path / "parts"), **env_vars}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_part_is_unpacked_once_until_it_is_packed_again(tmp_path):
    (tmp_path / "parts").mkdir()
    with tarfile.open(tmp_path / "parts" / "extra.tar.xz", "w:xz") as tar:
        data = b"WHERE = 'unpacked'\n"
        info = tarfile.TarInfo("extra_module.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    first = bench(tmp_path, "unused-data", str(tmp_path / "results"), "unpack")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("unpacking") == 1 and (tmp_path / "deps" / "extra_module.py").is_file()
    (tmp_path / "deps" / "extra_module.py").write_text("WHERE = 'kept'\n")
    again = bench(tmp_path, "unused-data", str(tmp_path / "results"), "unpack")
    assert again.returncode == 0 and "unpacking" not in again.stdout  # not unpacked over itself
    assert (tmp_path / "deps" / "extra_module.py").read_text() == "WHERE = 'kept'\n"
    os.utime(tmp_path / "parts" / "extra.tar.xz", (1, 1))  # the part packed again: unpacked over the old one
    repacked = bench(tmp_path, "unused-data", str(tmp_path / "results"), "unpack")
    assert repacked.returncode == 0 and repacked.stdout.count("unpacking") == 1
    assert (tmp_path / "deps" / "extra_module.py").read_text() == "WHERE = 'unpacked'\n"


def test_the_profile_stage_writes_its_json_and_log(tiny_sequences, tmp_path):
    done = bench(tmp_path, str(tiny_sequences), str(tmp_path / "results"), "profile")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    profile = json.loads((tmp_path / "results" / "profile_gpu.json").read_text())
    assert profile["device"] == "cpu" and profile["options"] == {"resident_data": True, "static_width": 16}
    assert "top ops by self time on the host" in (tmp_path / "results" / "profile.log").read_text()
    # its baseline first, in the same call: every table an embedding lookup
    baseline = json.loads((tmp_path / "results" / "profile_gpu_embedding.json").read_text())
    assert (baseline["one_hot_rows"], profile["one_hot_rows"]) == (0, 256)
    assert baseline["options"] == profile["options"]
    assert "top ops by self time on the host" in (tmp_path / "results" / "profile-embedding.log").read_text()


def test_the_check_stage_runs_first_and_names_test_files_that_exist():
    """With no stage named, the GPU's own tests run before any benchmark; they are files of the suite (a moved test
    file breaks the GPU check)."""
    script = (PROJECT_ROOT / "scripts" / "gpu_bench.sh").read_text()
    default = re.search(r"^stages=\$\{\*:-([a-z ]+)\}$", script, re.MULTILINE)
    assert default is not None and default.group(1).split() == ["check", "profile", "train", "sweep"]
    named = set(re.findall(r"tests/[\w/]+\.py", script))
    assert named >= {"tests/pgt/training/test_step.py", "tests/pgt/network/test_model.py"}
    assert [path for path in sorted(named) if not (PROJECT_ROOT / path).is_file()] == []


@pytest.mark.slow
def test_compile_profiles_the_compiled_model_into_files_of_its_own(tiny_sequences, tmp_path):
    """COMPILE=1 (one width, STATIC_WIDTH=64, and the paper's smaller model: one small graph to compile on the CPU):
    the profile of the compiled training pass goes to profile_gpu_compiled.json and profile-compiled.log, beside
    where the eager one goes."""
    done = bench(tmp_path, str(tiny_sequences), str(tmp_path / "results"), "profile", COMPILE="1",
                 STATIC_WIDTH="64", RECIPE="paper", PROFILE_LIMIT_S="400")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "profile-compiled-embedding.log", "profile-compiled.log", "profile_gpu_compiled.json",
        "profile_gpu_compiled_embedding.json"]
    profile = json.loads((tmp_path / "results" / "profile_gpu_compiled.json").read_text())
    assert profile["options"] == {"resident_data": True, "static_width": 64, "compile_model": True}
    assert profile["recipe"] == "paper"
    assert profile["compiled_steps"] == profile["steps"] > 0  # every step's forward ran compiled
    assert list(profile["compiled_forward_samples_per_s"]) == ["4096"]
    assert profile["compiled_forward_samples_per_s"]["4096"] > 0


def test_capture_fuses_one_three_and_five_seeds_into_files_of_their_own(tiny_sequences, tmp_path):
    """CAPTURE=1 fused: 1, 3 and 5 seeds of the tuned recipe fused with the whole step (run as it is on a CPU),
    their cost against separate runs, into fused_seeds_gpu_captured.json and fused-captured.log."""
    done = bench(tmp_path, str(tiny_sequences), str(tmp_path / "results"), "fused", CAPTURE="1", FUSED_EPOCHS="2")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["fused-captured.log",
                                                                        "fused_seeds_gpu_captured.json"]
    record = json.loads((tmp_path / "results" / "fused_seeds_gpu_captured.json").read_text())
    assert record["options"] == {"resident_data": True, "static_width": 16, "capture_step": True}
    assert [r["seeds"] for r in record["runs"]] == [1, 3, 5]
    assert [len(r["validation_strict_acc@1"]) for r in record["runs"]] == [1, 3, 5]
    assert record["runs"][0]["cost_vs_separate"] == 1.0 and all(r["cost_vs_separate"] > 0 for r in record["runs"])
    assert all(r["epochs"] == 2 for r in record["runs"])


def test_usage_and_unknown_stages_are_refused(tmp_path):
    usage = bench(tmp_path)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: scripts/gpu_bench.sh DATA_DIR RESULTS_DIR")
    unknown = bench(tmp_path, "data", str(tmp_path / "results"), "warp")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == ("error: unknown stage 'warp' (expected unpack, check, profile, fused, train or "
                                      "sweep)")

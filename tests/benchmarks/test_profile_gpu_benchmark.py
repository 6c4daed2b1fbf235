"""benchmarks/profile_gpu.py on the CPU (the same code as on a GPU, less the CUDA activity): one profiled epoch of
the resident, static-shape path, its JSON and its refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_gpu.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_one_epoch_is_profiled_on_the_cpu(tiny_sequences, tmp_path):
    results = tmp_path / "profile.json"
    done = run("--data-dir", str(tiny_sequences), "--device", "cpu", "--recipe", "paper", "--resident-data",
               "--static-width", "8", "--results", str(results))
    assert done.returncode == 0, done.stderr[-3000:]
    profile = json.loads(results.read_text())
    train_rows = json.loads((tiny_sequences / "manifest.json").read_text())["counts"]["samples"]["train"]
    # static_width fills short batches to the full 128: every step trains a full batch
    assert profile["steps"] == math.ceil(train_rows / 128) and profile["samples"] == 128 * profile["steps"]
    assert profile["compiled_steps"] == profile["cuda_graph_launches"] == 0  # the eager model, on a CPU
    assert profile["options"] == {"resident_data": True, "static_width": 8} and profile["device"] == "cpu"
    assert profile["one_hot_rows"] == 256  # pgt.network.model.ONE_HOT_ROWS, unless --one-hot-rows says otherwise
    assert profile["loop_s"] > 0 and profile["validation_s"] > 0 and profile["host_ms_per_step"] > 0
    assert profile["kernels"] == 0 and profile["device_busy_fraction"] is None  # no CUDA activity on a CPU
    test_rows = json.loads((tiny_sequences / "manifest.json").read_text())["counts"]["samples"]["test"]
    assert profile["test_samples"] == test_rows and set(profile["forward_samples_per_s"]) == {"1024", "4096"}
    assert min(profile["forward_samples_per_s"].values()) > 0 and profile["evaluation_samples_per_s"] > 0
    assert profile["compiled_forward_samples_per_s"] == {}  # measured with --compile-model only
    assert "test forward" in done.stdout
    ops = [op["op"] for op in profile["top_host_ops"]]
    assert len(ops) == 15 and ("aten::mm" in ops or "aten::addmm" in ops)
    assert "top ops by self time on the host" in done.stdout


def test_a_cpu_dry_run_must_name_its_results(tiny_sequences):
    done = run("--data-dir", str(tiny_sequences), "--device", "cpu")
    assert done.returncode != 0
    assert done.stderr.strip() == ("error: --device cpu is a dry run of the GPU harness: name its --results file "
                                   "(it never writes benchmarks/results/profile_gpu.json)")


def test_a_negative_one_hot_row_count_is_refused(tiny_sequences, tmp_path):
    done = run("--data-dir", str(tiny_sequences), "--device", "cpu", "--one-hot-rows", "-1", "--results",
               str(tmp_path / "p.json"))
    assert done.returncode != 0 and done.stderr.strip() == "error: --one-hot-rows -1: expected 0 or more"
    assert not (tmp_path / "p.json").exists()


def test_a_folder_without_a_manifest_is_refused(tmp_path):
    done = run("--data-dir", str(tmp_path), "--device", "cpu", "--results", str(tmp_path / "p.json"))
    assert done.returncode != 0 and done.stderr.strip() == (
        f"error: {tmp_path}: no manifest.json; expected a `pgt preprocess` output")

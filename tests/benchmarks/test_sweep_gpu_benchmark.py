"""benchmarks/sweep_gpu.py: its refusals, and a dry run of the harness on the CPU in its fixed form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sweep_gpu.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=600)


def test_refusals_are_one_line(tiny_sequences, tmp_path):
    done = run("--data-dir", tmp_path)
    assert done.returncode != 0 and done.stderr.strip().endswith("expected the output of `pgt preprocess`")
    done = run("--data-dir", tiny_sequences, "--device", "cpu")
    assert done.returncode != 0 and "--device cpu is a dry run of the GPU harness" in done.stderr
    done = run("--data-dir", tiny_sequences, "--device", "cpu", "--results", tmp_path / "r.json", "--static-width", 8)
    assert done.returncode != 0 and "--static-width pads the batches of --resident-data" in done.stderr
    done = run("--data-dir", tiny_sequences, "--device", "cpu", "--results", tmp_path / "r.json", "--resident-data",
               "--compile-model")
    assert done.returncode != 0 and done.stderr.strip() == ("error: --compile-model compiles one graph per batch shape: "
                                                            "give --static-width (and --resident-data) too")


@pytest.mark.slow
def test_a_dry_run_on_the_cpu_writes_the_fixed_form(tiny_sequences, tmp_path, on_shared_ray):
    """2 trials of 1 epoch, 2 at once, resident data and the whole step in every trial, then 1 finalist and the base
    recipe on 2 fresh seeds and the winner's final run: trials, wall_s (the whole sweep), search_wall_s,
    trials_per_hour (the search's), seeds_per_trial, finalists, gpus (none here) and the best trial's validation
    strict Acc@1, beside the CPU sweep's trials per hour."""
    results = tmp_path / "sweep_gpu.json"
    done = run("--data-dir", tiny_sequences, "--device", "cpu", "--results", results, "--work", tmp_path / "work",
               "--trials", 2, "--epochs", 2, "--concurrent", 2, "--resident-data", "--static-width", 8,
               "--capture-step", "--finalists", 1, "--confirm-seeds", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(results.read_text())
    assert result["trials"] == 2 and result["gpus"] == {"count": 0, "per_trial": 0.0}
    assert 0 < result["search_wall_s"] < result["wall_s"]
    assert result["trials_per_hour"] == pytest.approx(2 / result["search_wall_s"] * 3600, rel=0.01)
    assert result["seeds_per_trial"] == 1 and result["finalists"] == len(result["confirmation"]["finalists"]) == 2
    assert result["confirmation"]["winner"] in {f["name"] for f in result["confirmation"]["finalists"]}
    assert all(f["seeds"] == [1, 2] for f in result["confirmation"]["finalists"])
    assert 0 < result["final"]["test"]["strict"]["acc@1"] <= 100
    assert set(result["meets_target"]) == {"trials_per_hour", "confirmed_sweep"}
    assert 0 < result["best_validation_strict_acc@1"] <= 100
    assert result["options"] == {"resident_data": True, "static_width": 8, "capture_step": True}
    assert result["machine"]["ray"] and result["machine"]["gpu"] is None
    times = result["time_breakdown"]  # the search's slot-seconds, reconciled
    assert times["trials"] == 2 and times["epochs"] >= 2
    assert times["slot_s"] == pytest.approx(2 * result["search_wall_s"], abs=0.1)
    assert times["train_loop_s"] > 0 and times["in_trial_other_s"] > 0 and times["outside_trials_s"] > 0
    assert times["after_last_report_s"] > 0  # a finished trial closes its run after its last report (milliseconds)
    assert times["train_loop_s"] + times["in_trial_other_s"] + times["after_last_report_s"] + times[
        "outside_trials_s"] == pytest.approx(times["slot_s"], abs=0.4)
    assert "slot-seconds: training loops" in done.stdout
    trial = next((tmp_path / "work").rglob("trials/*/metrics.json"))
    assert json.loads(trial.read_text())["config"]["resident_data"] is True  # the trials trained that way

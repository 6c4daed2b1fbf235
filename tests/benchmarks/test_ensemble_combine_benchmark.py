"""benchmarks/ensemble_combine.py on the members benchmarks/ensemble_size.py trains on the synthetic sequences: three
ways to combine them, on validation only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks.conftest import BENCHMARKS, load_benchmark

SCRIPT = BENCHMARKS / "ensemble_combine.py"


@pytest.fixture(scope="module")
def members(tiny_sequences, tmp_path_factory) -> tuple[Path, dict]:
    """Three networks of two epochs (seeds 0-2) trained by ensemble_size.py: (its --work, its results)."""
    root = tmp_path_factory.mktemp("members")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "ensemble_size.py"), "--seeds", "0", "1", "2", "--set",
                           "epochs=2", "--data-dir", str(tiny_sequences), "--work", str(root / "work"), "--results",
                           str(root / "sizes.json")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "work", json.loads((root / "sizes.json").read_text())


def combine(tiny_sequences, work: Path, results: Path, *given: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--work", str(work), "--seeds", "0", "1", "2", "--data-dir",
                           str(tiny_sequences), "--results", str(results), *given],
                          capture_output=True, text=True, timeout=600)


def test_each_way_is_scored_for_one_network_and_for_the_ensemble(tiny_sequences, members, tmp_path):
    work, sizes = members
    done = combine(tiny_sequences, work, tmp_path / "combine.json", "--members", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "combine.json").read_text())
    rows = {(r["members"], r["way"]): r for r in saved["rows"]}
    assert sorted(rows) == sorted((k, way) for k in (1, 2) for way in ("mean", "geometric", "last epochs"))
    assert {r["combinations"] for r in saved["rows"] if r["members"] == 1} == {3}
    key = "protocol_validation_strict_acc@1"
    # the mean is the ensemble ensemble_size.py scores, one network alone that network
    for k in (1, 2):
        assert rows[(k, "mean")][key] == sizes["sizes"][k - 1][key]
        assert rows[(k, "mean")]["deployment_validation_strict_acc@1"] == \
            sizes["sizes"][k - 1]["deployment_validation_strict_acc@1"]
    assert rows[(1, "geometric")][key] == rows[(1, "mean")][key]  # one network: the same distribution
    assert "Combining K networks" in done.stdout and "last epochs" in done.stdout
    for seed in (0, 1, 2):  # test is never scored
        assert json.loads((work / f"seed_{seed}" / "metrics.json").read_text())["test"] is None


def test_an_epoch_checkpoint_gives_its_own_weights_not_the_best_so_far(members):
    import torch

    from pgt.network.checkpoint import load_checkpoint, read_checkpoint

    work, _ = members
    bench = load_benchmark("ensemble_combine")
    for seed in (0, 1, 2):
        run = work / f"seed_{seed}"
        first, last = bench.epoch_checkpoints(run, 2)
        assert (first.parent.name, last.parent.name) == ("epoch_000", "epoch_001")
        own = read_checkpoint(first, "cpu", ("model",))["model"]
        loaded = load_checkpoint(first, epoch_weights=True)[0].state_dict()
        assert all(torch.equal(loaded[name], own[name]) for name in own)


@pytest.mark.parametrize(("given", "said"), [
    (["--members", "4"], "--members 4: expected 1 to 3, the seeds given"),
    (["--members", "2", "--snapshots", "3"], "epoch checkpoints kept, 3 wanted"),
    (["--seeds", "0", "9"], "no trained network in"),
])
def test_bad_options_are_one_line_before_any_scoring(tiny_sequences, members, tmp_path, given, said):
    work, _ = members
    done = combine(tiny_sequences, work, tmp_path / "out.json", *given)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert said in done.stderr.splitlines()[-1] and done.stderr.splitlines()[-1].startswith("ensemble_combine.py: error:")
    assert not (tmp_path / "out.json").exists()

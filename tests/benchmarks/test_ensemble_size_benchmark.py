"""benchmarks/ensemble_size.py on the synthetic sequences: every ensemble size of the seeds it trains, on validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ensemble_size.py"


def test_each_size_is_scored_over_its_combinations_on_validation_only(tiny_sequences, tmp_path):
    results = tmp_path / "ensemble_size.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0", "1", "2", "--set", "epochs=2", "dropout=0.3",
                           "--data-dir",
                           str(tiny_sequences), "--work", str(tmp_path / "work"), "--results", str(results)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads(results.read_text())
    assert [r["members"] for r in saved["sizes"]] == [1, 2, 3]
    assert [r["combinations"] for r in saved["sizes"]] == [3, 3, 1]
    assert saved["sizes"][2]["protocol_validation_strict_acc@1"]["std"] == 0.0  # one combination
    trained = {m["seed"]: m for m in saved["members_trained"]}
    assert sorted(trained) == [0, 1, 2]
    # one member's ensemble is that member: the mean over the single seeds is the mean of their own validation scores
    alone = [trained[s]["validation_strict_acc@1"] for s in (0, 1, 2)]
    assert abs(saved["sizes"][0]["protocol_validation_strict_acc@1"]["mean"] - sum(alone) / 3) < 0.01
    deployed = [trained[s]["deployment_validation_strict_acc@1"] for s in (0, 1, 2)]
    assert abs(saved["sizes"][0]["deployment_validation_strict_acc@1"]["mean"] - sum(deployed) / 3) < 0.01
    for s in (0, 1, 2):  # test is never scored
        assert json.loads((tmp_path / "work" / f"seed_{s}" / "metrics.json").read_text())["test"] is None
    assert saved["recipe"] == "tuned" and saved["settings"] == {"epochs": 2, "dropout": 0.3}
    for s in (0, 1, 2):  # the settings reached the members over the recipe's
        config = json.loads((tmp_path / "work" / f"seed_{s}" / "metrics.json").read_text())["config"]
        assert (config["epochs"], config["dropout"], config["arrival_head"]) == (2, 0.3, 1.0)
    assert "Ensembles of K `tuned`, epochs 2, dropout 0.3 networks" in done.stdout

    # the members kept in --work are reused only for the settings they were trained with
    other = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0", "1", "--set", "epochs=2", "dropout=0.35",
                            "--data-dir", str(tiny_sequences), "--work", str(tmp_path / "work"), "--results",
                            str(tmp_path / "other.json")], capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert other.stderr.splitlines()[-1] == (f"ensemble_size.py: error: {tmp_path / 'work' / 'seed_0'} holds a member "
                                             "trained with other settings (dropout); give another --work, or remove it")
    assert not (tmp_path / "other.json").exists()


@pytest.mark.parametrize(("given", "said"), [
    (["--set", "dropout"], "--set takes KEY=VALUE, got 'dropout'"),
    (["--set", "dropuot=0.3"], "unknown training setting(s): dropuot"),
    (["--set", "dropout=7"], "dropout must be in [0.0, 1.0), got 7"),
    (["--set", "dropout=["], "--set dropout: '[' is not a YAML value"),
    (["--recipe", "tunde"], "recipe must be one of paper, tuned"),
])
def test_bad_settings_are_one_line_before_any_member_trains(tiny_sequences, tmp_path, given, said):
    done = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0", "--data-dir", str(tiny_sequences), "--work",
                           str(tmp_path / "work"), "--results", str(tmp_path / "out.json"), *given],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(f"ensemble_size.py: error: {said}")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "out.json").exists()

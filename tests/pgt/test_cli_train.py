"""`pgt train` and `pgt explain` as users run them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PGT = [sys.executable, "-m", "pgt.cli"]


def run(*args):
    return subprocess.run([*PGT, *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("model", ["markov", "most-frequent"])
def test_baselines(synthetic_sequences, tmp_path, model):
    r = run("train", "--data", synthetic_sequences, "--model", model, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["model"] == model and 0 < m["test"]["acc@1"] <= 100 and m["test"]["n"] > 0
    assert m["test"]["acc@10"] >= m["test"]["acc@5"] >= m["test"]["acc@1"]
    assert "acc@1" in r.stdout  # the printed table


def test_train_then_explain(synthetic_sequences, tmp_path):
    out = tmp_path / "run"
    r = run("train", "--data", synthetic_sequences, "--model", "pgt", "--epochs", "2", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "val acc@1" in r.stdout and "best epoch" in r.stdout
    m = json.loads((out / "metrics.json").read_text())
    assert m["epochs_run"] == 2 and m["samples_per_second"] > 0
    plots = tmp_path / "plots"
    r = run("explain", "--checkpoint", out / "best.pt", "--data", synthetic_sequences, "--out", plots)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in plots.iterdir())
    assert names == ["attention_entropy.png", "gate.png", "pointer_attention.png", "position_bias.png"]
    assert all((plots / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (plots / n).stat().st_size > 10_000 for n in names)


def test_train_refuses_a_folder_without_manifest(tmp_path):
    r = run("train", "--data", tmp_path, "--out", tmp_path / "o")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no manifest.json" in r.stderr


def test_recipe_sets_what_the_command_line_leaves(synthetic_sequences, tmp_path):
    out = tmp_path / "tuned"
    r = run("train", "--data", synthetic_sequences, "--recipe", "tuned", "--d-model", "32", "--dim-feedforward", "64",
            "--epochs", "1", "--out", out)
    assert r.returncode == 0, r.stderr
    config = json.loads((out / "metrics.json").read_text())["config"]
    # from the recipe
    assert (config["dropout"], config["lr"], config["select_on"], config["simulate_unseen"]) == (0.6, 3e-4, "loss", True)
    assert (config["d_model"], config["dim_feedforward"]) == (32, 64)  # given on the command line
    assert config["nhead"] == 4  # neither: the default
    r = run("train", "--data", synthetic_sequences, "--recipe", "fast", "--out", tmp_path / "x")
    assert r.returncode == 2 and "fast" in r.stderr


def test_the_command_offers_every_recipe():
    from pgt.cli import RecipeName
    from pgt.train import RECIPES

    assert [r.value for r in RecipeName] == list(RECIPES)

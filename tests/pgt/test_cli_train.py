"""`pgt train` and `pgt explain` as users run them, in this process (tests/in_process.py): what reaches the config,
what is written and what is refused; runs with signals, Ray or a tracking server are in their own modules."""

from __future__ import annotations

import json

import pytest

from tests.in_process import pgt_here


@pytest.mark.parametrize("model", ["markov", "most-frequent"])
def test_baselines(synthetic_sequences, tmp_path, model):
    r = pgt_here("train", "--data", synthetic_sequences, "--model", model, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["model"] == model and 0 < m["test"]["acc@1"] <= 100 and m["test"]["n"] > 0
    assert m["test"]["acc@10"] >= m["test"]["acc@5"] >= m["test"]["acc@1"]
    assert m["test"]["strict"]["acc@1"] <= m["test"]["acc@1"] and m["test"]["strict"]["n"] == m["test"]["n"]
    assert "acc@1" in r.stdout and "strict" in r.stdout  # the printed table


def test_train_then_explain(synthetic_sequences, tmp_path):
    out = tmp_path / "run"
    r = pgt_here("train", "--data", synthetic_sequences, "--model", "pgt", "--epochs", "2", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "val strict@1" in r.stdout and "best epoch" in r.stdout
    m = json.loads((out / "metrics.json").read_text())
    assert m["epochs_run"] == 2 and m["samples_per_second"] > 0
    plots = tmp_path / "plots"
    r = pgt_here("explain", "--checkpoint", out / "best.pt", "--data", synthetic_sequences, "--out", plots)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in plots.iterdir())
    assert names == ["attention_entropy.png", "gate.png", "pointer_attention.png", "position_bias.png"]
    assert all((plots / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (plots / n).stat().st_size > 10_000 for n in names)


@pytest.mark.parametrize("options, words", [
    (["--d-model", "30", "--nhead", "4"], "d_model (30) must be divisible by nhead (4)"),
    (["--relation-inputs", "--no-visit-relations"], "relation_inputs embeds the visit relations"),
    (["--model", "lstm-pg", "--visit-relations"], "visit_relations biases the transformer's pointer"),
    (["--recipe", "tuned", "--fused-seeds", "3"], "fused_seeds trains seeds side by side"),
    (["--fused-seeds", "2", "--register", "x"], "--register needs one model; --fused-seeds"),
    (["--capture-step"], "capture_step captures one graph per batch shape"),
])
def test_a_model_that_cannot_be_built_is_refused_before_anything_exists(synthetic_sequences, tmp_path, options, words):
    """Checked when the config is built: before the data is read, an MLflow run exists or --out is made."""
    r = pgt_here("train", "--data", synthetic_sequences, "--out", tmp_path / "run", *options)
    assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_a_folder_without_manifest(tmp_path):
    r = pgt_here("train", "--data", tmp_path, "--out", tmp_path / "o")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no manifest.json" in r.stderr


def test_recipe_sets_what_the_command_line_leaves(synthetic_sequences, tmp_path):
    out = tmp_path / "tuned"
    r = pgt_here("train", "--data", synthetic_sequences, "--recipe", "tuned", "--d-model", "32", "--dim-feedforward", "64",
            "--epochs", "1", "--patience", "9", "--out", out)
    assert r.returncode == 0, r.stderr
    config = json.loads((out / "metrics.json").read_text())["config"]
    # from the recipe
    assert (config["dropout"], config["lr"], config["select_on"], config["simulate_unseen"]) == (
        pytest.approx(0.449, abs=1e-3), 4e-3, "strict_acc@1", True)
    assert (config["unseen_slots"], config["new_place_weight"], config["nhead"]) == (True, 0.05, 1)
    assert (config["visit_relations"], config["relation_inputs"]) == (True, True)
    assert (config["d_model"], config["dim_feedforward"], config["patience"]) == (32, 64, 9)  # given on the command line
    assert config["num_layers"] == 2 and config["epochs"] == 1  # the default; the command line over the recipe's 10
    r = pgt_here("train", "--data", synthetic_sequences, "--recipe", "fast", "--out", tmp_path / "x")
    assert r.returncode == 2 and "fast" in r.stderr


def choices(command: str, option: str) -> list[str]:
    """The values the `pgt` command accepts for an option."""
    import typing

    import typer.main

    from pgt.cli import app

    params = typer.main.get_command(app).get_command(None, command).params
    annotation = next(p for p in params if p.name == option).type_descriptor.annotation  # Literal[...] or Literal | None
    literal = next(a for a in (annotation, *typing.get_args(annotation)) if typing.get_origin(a) is typing.Literal)
    return list(typing.get_args(literal))


def test_the_command_offers_every_recipe():
    from pgt.recipes import RECIPES

    assert choices("train", "recipe") == list(RECIPES)


def test_the_command_offers_every_selection_score_and_sweep_objective():
    from pgt.config import MODELS, SELECT_ON
    from tune.config import OBJECTIVES

    assert choices("train", "select_on") == list(SELECT_ON) and choices("tune", "objective") == list(OBJECTIVES)
    assert choices("train", "model") == list(MODELS)


def test_slot_options_reach_the_config(synthetic_sequences, tmp_path):
    out = tmp_path / "slots"
    r = pgt_here("train", "--data", synthetic_sequences, "--epochs", "1", "--out", out, "--unseen-slots", "--simulate-unseen",
            "--new-place-weight", "0.25", "--no-slot-identity", "--select-on", "strict_acc@1", "--previous-location",
            "--weight-average", "0.9", "--visit-relations", "--relation-inputs", "--relation-order", "2")
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "metrics.json").read_text())
    config = m["config"]
    assert (config["unseen_slots"], config["slot_identity"], config["new_place_weight"]) == (True, False, 0.25)
    assert (config["previous_location"], config["weight_average"]) == (True, 0.9)
    assert m["model_config"]["previous_location"] is True
    assert [m["model_config"][k] for k in ("visit_relations", "relation_inputs", "relation_order")] == [True, True, 2]
    assert config["select_on"] == "strict_acc@1" and m["model_config"]["unseen_slots"] is True
    assert "strict" in r.stdout and "new places:" in r.stdout  # the printed tables lead with strict
    r = pgt_here("train", "--data", synthetic_sequences, "--epochs", "1", "--out", tmp_path / "x", "--select-on", "f1")
    assert r.returncode == 2 and "f1" in r.stderr


def test_any_valid_preprocessing_config_trains(tmp_path):
    """10-minute slots, 3 history days, hourly duration buckets: the model's tables follow the manifest's vocab
    (before, 144 slots overflowed a 97-row table and `pgt train` died with an IndexError)."""
    from preprocessing.config import PreprocessConfig, SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes

    generate_positionfixes(SynthConfig(users=4, days=60, seed=3)).write_parquet(tmp_path / "fixes.parquet")
    config = PreprocessConfig(time_slot_min=10, history_days=3, duration_bucket_min=60)
    vocab = preprocess(tmp_path / "fixes.parquet", "positionfixes", tmp_path / "seq", config, progress=False).manifest["vocab"]
    r = pgt_here("train", "--data", tmp_path / "seq", "--epochs", "1", "--d-model", "16", "--nhead", "2",
                 "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr[-2000:]
    model_config = json.loads((tmp_path / "run" / "metrics.json").read_text())["model_config"]
    assert (model_config["time_slots"], model_config["recency_days"], model_config["duration_buckets"]) == (
        vocab["time_slots"], vocab["recency"], vocab["durations"]) == (144, 4, 48)


def _one_line(r, *needles):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert all(n in lines[0] for n in needles), lines[0]


def test_corrupt_or_foreign_files_are_named_in_one_line(synthetic_sequences, tmp_path):
    import shutil

    import polars as pl

    data = tmp_path / "seq"
    shutil.copytree(synthetic_sequences, data)
    (data / "manifest.json").write_text("{oops")
    _one_line(pgt_here("train", "--data", data, "--out", tmp_path / "a"), str(data / "manifest.json"), "corrupt manifest")
    (data / "manifest.json").write_text('{"vocab": {"locations": 30}}')
    _one_line(pgt_here("train", "--data", data, "--out", tmp_path / "a"), "manifest.json",
              "vocab.users must be a positive integer")
    shutil.copy(synthetic_sequences / "manifest.json", data / "manifest.json")
    (data / "test.parquet").write_bytes((synthetic_sequences / "test.parquet").read_bytes()[:2000])
    _one_line(pgt_here("train", "--data", data, "--out", tmp_path / "a"), str(data / "test.parquet"), "unreadable Parquet")
    pl.read_parquet(synthetic_sequences / "test.parquet").with_columns(pl.col("target").cast(pl.String)).write_parquet(
        data / "test.parquet")
    _one_line(pgt_here("train", "--data", data, "--out", tmp_path / "a"), "test.parquet", "column target has type")
    shutil.copy(synthetic_sequences / "test.parquet", data / "test.parquet")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    _one_line(pgt_here("explain", "--checkpoint", tmp_path / "garbage.pt", "--data", data, "--out", tmp_path / "p"),
              str(tmp_path / "garbage.pt"), "unreadable checkpoint")

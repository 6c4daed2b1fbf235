"""What tune.json keeps of a trial's test metrics (no Ray needed)."""

from __future__ import annotations

import json

from pgt.config import selection_score
from tune.config import SweepConfig
from tune.results import headline_metrics


def test_headline_keeps_protocol_and_strict_overall_metrics():
    metrics = {"acc@1": 50.0, "n": 10, "in_history": {"acc@1": 70.0},
               "strict": {"acc@1": 40.0, "n": 10, "in_history": {"acc@1": 60.0}},
               "new_place": {"rate": 15.0, "predicted": 5.0, "precision": 50.0, "recall": 20.0}}
    assert headline_metrics(metrics) == {"acc@1": 50.0, "n": 10, "strict": {"acc@1": 40.0, "n": 10},
                                  "new_place": {"rate": 15.0, "predicted": 5.0, "precision": 50.0, "recall": 20.0}}


def test_the_objective_picks_the_strict_or_the_protocol_score():
    validation = {"acc@1": 50.0, "strict": {"acc@1": 40.0}}
    assert selection_score(validation, SweepConfig(data_dir=".", out_dir=".").objective) == 40.0
    assert selection_score(validation, SweepConfig(data_dir=".", out_dir=".", objective="acc@1").objective) == 50.0
    assert SweepConfig(data_dir=".", out_dir=".").metric == "validation_strict_acc@1"


def test_an_unknown_objective_is_refused():
    import pytest

    with pytest.raises(ValueError, match="objective must be one of strict_acc@1, acc@1"):
        SweepConfig(data_dir=".", out_dir=".", objective="f1")


def test_confirmation_seeds_follow_the_search_and_group_by_what_can_be_fused():
    """After a search on seed 4, three confirmation seeds 5, 6, 7: one run of three fused seeds for a one-network
    recipe, one run per seed for an ensemble (its members already train side by side); each run's config trains
    its group from its first seed, on validation only."""
    from pathlib import Path

    from pgt.recipes import recipe_settings

    one = SweepConfig(data_dir=".", out_dir=".", recipe=recipe_settings("tuned"), seed=4, confirm_seeds=3)
    assert one.confirmation_seeds() == [[5, 6, 7]]
    cfg = one.confirmation_config(one.base_hyper(), Path("f"), [5, 6, 7])
    assert (cfg.seed, cfg.fused_seeds, cfg.evaluate_test, cfg.refit) == (5, 3, False, False)
    ensemble = SweepConfig(data_dir=".", out_dir=".", recipe=recipe_settings("ensemble"), seed=4, confirm_seeds=3)
    assert ensemble.confirmation_seeds() == [[5], [6], [7]]
    assert ensemble.confirmation_config({}, Path("f"), [6]).fused_seeds == 1


def test_a_sweep_on_an_empty_split_is_refused_before_anything_starts(tmp_path):
    """`pgt tune` on sequences whose train split is empty (a preprocess that kept no one): one line naming the split,
    before the sweep's folder, a tracking run or Ray starts, instead of every trial failing max_failures + 1 times."""
    import polars as pl
    import pytest

    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes
    from tune.sweep import run_sweep

    generate_positionfixes(SynthConfig(users=3, days=40, seed=2)).write_parquet(tmp_path / "fixes.parquet")
    data = tmp_path / "seq"
    preprocess(tmp_path / "fixes.parquet", "positionfixes", data, progress=False)
    pl.read_parquet(data / "train.parquet").head(0).write_parquet(data / "train.parquet")
    out = tmp_path / "sweep"
    counts = json.loads((data / "manifest.json").read_text())["counts"]
    with pytest.raises(ValueError, match=r"train\.parquet: the train split has no samples; nothing to train on") as refused:
        run_sweep(SweepConfig(data_dir=str(data), out_dir=str(out), trials=2, epochs=1))
    # the line says what the preprocessing kept and made
    assert f"kept {counts['users_kept']} users tracked more than" in str(refused.value)
    assert f"made samples train {counts['samples']['train']:,}, validation" in str(refused.value)
    assert not out.exists()


def test_register_without_the_final_run_is_refused_at_the_door(tmp_path):
    """--register names the sweep's final run's model: with --no-final there is none, so `pgt tune` refuses the pair in
    one line before any folder, tracking run or Ray starts."""
    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes
    from tests.in_process import pgt_here

    generate_positionfixes(SynthConfig(users=3, days=40, seed=2)).write_parquet(tmp_path / "fixes.parquet")
    preprocess(tmp_path / "fixes.parquet", "positionfixes", tmp_path / "seq", progress=False)
    r = pgt_here("tune", "--data", tmp_path / "seq", "--out", tmp_path / "sweep", "--no-final", "--register", "m",
                 "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert r.returncode == 2 and r.stderr.strip() == ("error: --register m registers the sweep's final run, and "
                                                      "--no-final skips it: drop one of them"), r.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_stopped_trial_s_best_score_is_the_best_its_checkpoints_reported(tmp_path):
    """A trial ASHA stopped has no metrics.json: its row's best score is the best objective its events recorded
    (the driver writes one per registered checkpoint), None where it reported none."""
    from infra.storage import open_storage
    from tune.records import TRIAL_EVENTS, read_trial_events
    from tune.results import best_seen

    events = [{"event": "checkpoint", "epoch": 0, "score": 41.5}, {"event": "checkpoint", "epoch": 1, "score": 44.25},
              {"event": "restarted", "epoch": 1, "score": 44.25}, {"event": "checkpoint", "epoch": 2, "score": 43.0},
              {"event": "completed", "epoch": 2, "score": None}]
    (tmp_path / TRIAL_EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
    assert best_seen(read_trial_events(open_storage(tmp_path))) == 44.25
    assert best_seen(read_trial_events(open_storage(tmp_path / "none"))) is None

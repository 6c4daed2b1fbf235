"""benchmarks/new_place_odds.py scores one network's validation split at a grid of a new place's log-odds: the strict
figures are the network's own at every point, the point of the run's own odds is what training's validation
reported, and the forecast of a new place rises with its odds."""

from __future__ import annotations

import json
import math

from tests.benchmarks.conftest import load_benchmark


def test_the_curve_shares_the_strict_figures_and_its_run_s_own_point_is_trainings(tiny_sequences, tmp_path):

    from pgt.config import TrainConfig
    from pgt.data.dataset import SequenceDataset
    from pgt.training.train import train_loop_per_worker
    from preprocessing.sequences import UNSEEN

    odds = load_benchmark("new_place_odds")
    cfg = TrainConfig.from_recipe("paper", data_dir=str(tiny_sequences), out_dir=str(tmp_path / "run"), epochs=2,
                                  d_model=16, nhead=2, unseen_slots=True, new_place_weight=0.05, threads=1,
                                  evaluate_test=False)
    train_loop_per_worker(cfg.to_dict())
    grid = [0.0, 1.0, math.log(20), 4.0]  # log 20: the odds the run's own weight gives (TrainConfig's default)
    figures = odds.validation_curve(tmp_path / "run", tiny_sequences, grid)
    curve = figures["curve"]
    assert [point["log_odds"] for point in curve] == [round(x, 4) for x in grid]
    assert len({point["strict_acc@1"] for point in curve}) == 1  # strict ranks never see the odds
    forecasts = [point["forecast"] for point in curve]
    assert forecasts == sorted(forecasts) and forecasts[0] < forecasts[-1]
    recorded = json.loads((tmp_path / "run" / "metrics.json").read_text())["validation"]
    own = curve[2]
    assert own["acc@1"] == round(recorded["acc@1"], 2) and own["mrr"] == round(recorded["mrr"], 2)
    assert own["strict_acc@1"] == round(recorded["strict"]["acc@1"], 2)
    targets = SequenceDataset.from_parquet(tiny_sequences / "validation.parquet", cfg.network.max_len).targets
    assert figures["rate"] == round(100 * float((targets == UNSEEN).float().mean()), 2)
    assert all(point["log_loss"] > 0 for point in curve)


def test_the_configurations_it_scores_are_those_that_weigh_new_place_targets():
    odds = load_benchmark("new_place_odds")
    search = load_benchmark("recipe_search")
    assert odds.CONFIG in odds.WEIGHTED and "tuned-vd01-wa98" in odds.WEIGHTED
    assert "paper" not in odds.WEIGHTED and "tuned-2025" not in odds.WEIGHTED
    assert all(search.CONFIGS[name][1]["new_place_weight"] < 1 for name in odds.WEIGHTED)

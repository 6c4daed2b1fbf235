"""benchmarks/new_place_odds.py scores one network's validation split in both protocol views: the strict figures are
the network's own in both, and the restored view is what training's validation reports."""

from __future__ import annotations

import json
import math

from tests.benchmarks.conftest import load_benchmark


def test_both_views_share_the_strict_figures_and_the_restored_one_is_trainings(tiny_sequences, tmp_path):
    from pgt.config import TrainConfig
    from pgt.training.train import train_loop_per_worker

    odds = load_benchmark("new_place_odds")
    cfg = TrainConfig.from_recipe("paper", data_dir=str(tiny_sequences), out_dir=str(tmp_path / "run"), epochs=2,
                                  d_model=16, nhead=2, unseen_slots=True, new_place_weight=0.05, threads=1,
                                  evaluate_test=False)
    train_loop_per_worker(cfg.to_dict())
    figures = odds.validation_figures(tmp_path / "run", tiny_sequences)
    own, restored = (figures[view] for view in odds.VIEWS)
    assert figures["new_place_log_odds"] == round(math.log(20), 4)
    assert own["strict_acc@1"] == restored["strict_acc@1"]
    recorded = json.loads((tmp_path / "run" / "metrics.json").read_text())["validation"]
    assert restored["acc@1"] == round(recorded["acc@1"], 2) and restored["mrr"] == round(recorded["mrr"], 2)
    assert restored["strict_acc@1"] == round(recorded["strict"]["acc@1"], 2)

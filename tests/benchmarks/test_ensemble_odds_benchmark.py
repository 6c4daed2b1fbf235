"""benchmarks/ensemble_odds.py scores ensembles at a grid of a new place's log-odds: one network alone at its own odds
is what its training's validation reported, strict figures never move, and odds that outweigh every other answer
find the targets outside the history (places unseen in train, all id 1) that the network's own odds miss."""

from __future__ import annotations

import itertools
import json
import math

from tests.benchmarks.conftest import load_benchmark


def test_rows_keep_strict_figures_and_one_member_at_its_own_odds_is_its_training_s(tiny_sequences, tmp_path):
    from pgt.config import TrainConfig
    from pgt.network.checkpoint import load_checkpoint
    from pgt.training.train import train_loop_per_worker

    odds = load_benchmark("ensemble_odds")
    runs = [tmp_path / f"seed_{seed}" for seed in (0, 1)]
    for seed, run in zip((0, 1), runs):
        cfg = TrainConfig.from_recipe("paper", data_dir=str(tiny_sequences), out_dir=str(run), epochs=2, d_model=16,
                                      nhead=2, unseen_slots=True, new_place_weight=0.05, threads=1, seed=seed,
                                      evaluate_test=False)
        train_loop_per_worker(cfg.to_dict())
    model_cfg = load_checkpoint(runs[0] / "best.pt")[1]
    assert model_cfg.new_place_log_odds == math.log(20)  # the weight's odds, TrainConfig's default
    validation = odds.validation_split(tiny_sequences, model_cfg)
    cached = odds.member_log_probs(runs, validation)
    grid = [0.0, math.log(20), 12.0]  # at 12 a new place outweighs almost any answer

    alone = odds.odds_rows(cached, [(0,)], validation, model_cfg, grid)
    recorded = json.loads((runs[0] / "metrics.json").read_text())["validation"]
    assert alone[1]["acc@1"]["mean"] == round(recorded["acc@1"], 2)
    assert alone[1]["mrr"]["mean"] == round(recorded["mrr"], 2)

    both = odds.odds_rows(cached, list(itertools.combinations(range(2), 2)), validation, model_cfg, grid)
    for rows in (alone, both):
        assert len({row["strict_acc@1"]["mean"] for row in rows}) == 1  # strict ranks never see the odds
        outside = [row["outside_history_acc@1"]["mean"] for row in rows]
        assert outside[0] < outside[-1]
    assert [row["log_odds"] for row in both] == grid and all(row["combinations"] == 1 for row in both)

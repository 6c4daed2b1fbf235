"""The search space: heads always divide d_model; a trial's draw becomes TrainConfig settings."""

from __future__ import annotations

import optuna
import pytest

from tune.space import SearchSpace


def test_optuna_draws_only_heads_that_divide_d_model():
    space = SearchSpace(d_model=(12, 32, 48), nhead=(1, 3, 4, 8))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    define = space.optuna_space()
    seen = set()
    for _ in range(60):
        trial = study.ask()
        define(trial)
        hyper = SearchSpace.resolve(trial.params)
        assert hyper["d_model"] % hyper["nhead"] == 0 and hyper["dim_feedforward"] == 2 * hyper["d_model"]
        seen.add((hyper["d_model"], hyper["nhead"]))
        study.tell(trial, 0.0)
    # 12: 1, 3, 4; 32: 1, 4, 8; 48: 1, 3, 4, 8 -> ten pairs, and no others
    assert seen <= {(12, 1), (12, 3), (12, 4), (32, 1), (32, 4), (32, 8), (48, 1), (48, 3), (48, 4), (48, 8)}
    assert len(seen) >= 8


def test_resolve_maps_the_conditional_name_and_rejects_a_bad_pair():
    hyper = SearchSpace.resolve({"d_model": 96, "nhead_d96": 8, "num_layers": 2, "dropout": 0.2, "lr": 1e-3,
                                 "weight_decay": 0.01})
    assert hyper == {"d_model": 96, "nhead": 8, "num_layers": 2, "dim_feedforward": 192, "dropout": 0.2, "lr": 1e-3,
                     "weight_decay": 0.01}
    with pytest.raises(ValueError, match="no nhead dividing d_model 64"):
        SearchSpace.resolve({"d_model": 64, "nhead": 3, "num_layers": 2, "dropout": 0.2, "lr": 1e-3, "weight_decay": 0.01})


def test_a_space_without_a_valid_head_is_refused():
    with pytest.raises(ValueError, match="d_model 30 must be divisible by 4"):
        SearchSpace(d_model=(30,))
    with pytest.raises(ValueError, match="d_model 20 must be divisible by 4 and by one of the nhead choices"):
        SearchSpace(d_model=(20,), nhead=(3, 6))
    with pytest.raises(ValueError, match="lr range"):
        SearchSpace(lr=(1e-2, 1e-4))

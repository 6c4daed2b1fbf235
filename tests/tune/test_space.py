"""The search space: declared once (tune.space.RULES), centred on the recipe a sweep starts from; heads always
divide d_model; a trial's draw becomes TrainConfig settings."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from pgt.config import TrainConfig
from pgt.recipes import RECIPES
from tune.space import Dimension, SearchSpace


def space_of(**dimensions) -> SearchSpace:
    kinds = {"d_model": "choice", "nhead": "choice", "num_layers": "int", "dropout": "uniform", "lr": "log"}
    return SearchSpace(tuple(Dimension(name, kinds[name], tuple(values)) for name, values in dimensions.items()))


def test_optuna_draws_only_heads_that_divide_d_model():
    space = space_of(d_model=(12, 32, 48), nhead=(1, 3, 4, 8), dropout=(0.0, 0.4))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    define = space.optuna_space()
    seen = set()
    for _ in range(60):
        trial = study.ask()
        define(trial)
        hyper = space.resolve(trial.params)
        assert hyper["d_model"] % hyper["nhead"] == 0 and hyper["dim_feedforward"] == 2 * hyper["d_model"]
        assert 0.0 <= hyper["dropout"] <= 0.4
        seen.add((hyper["d_model"], hyper["nhead"]))
        study.tell(trial, 0.0)
    # 12: 1, 3, 4; 32: 1, 4, 8; 48: 1, 3, 4, 8 -> ten pairs, and no others
    assert seen <= {(12, 1), (12, 3), (12, 4), (32, 1), (32, 4), (32, 8), (48, 1), (48, 3), (48, 4), (48, 8)}
    assert len(seen) >= 8


def test_resolve_maps_the_conditional_name_and_rejects_a_bad_pair():
    space = space_of(d_model=(64, 96), nhead=(1, 2, 4, 8), num_layers=(1, 3), dropout=(0.0, 0.4), lr=(1e-4, 1e-2))
    hyper = space.resolve({"d_model": 96, "nhead_d96": 8, "num_layers": 2, "dropout": 0.2, "lr": 1e-3})
    assert hyper == {"d_model": 96, "nhead": 8, "num_layers": 2, "dim_feedforward": 192, "dropout": 0.2, "lr": 1e-3}
    with pytest.raises(ValueError, match="no nhead dividing d_model 64"):
        space.resolve({"d_model": 64, "nhead": 3, "num_layers": 2, "dropout": 0.2, "lr": 1e-3})


def test_a_space_without_a_valid_head_or_range_is_refused():
    with pytest.raises(ValueError, match="d_model 30 must be divisible by 4"):
        space_of(d_model=(30,))
    with pytest.raises(ValueError, match="d_model 20 must be divisible by 4 and by one of the nhead choices"):
        space_of(d_model=(20,), nhead=(3, 6))
    with pytest.raises(ValueError, match="lr: a log dimension needs \\(low, high\\) with low <= high"):
        space_of(lr=(1e-2, 1e-4))
    with pytest.raises(ValueError, match="lr: a log range must be positive"):
        space_of(lr=(0.0, 1e-4))
    with pytest.raises(ValueError, match="kind must be one of"):
        Dimension("lr", "normal", (0.0, 1.0))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_space_is_centred_on_the_base_recipe(recipe):
    """Every searched setting's range holds the recipe's own value; the relation and new-place options are searched
    only where the recipe uses them; the feed-forward width keeps the recipe's ratio."""
    base = TrainConfig.from_recipe(recipe, data_dir="d", out_dir="o").to_dict()
    space = SearchSpace.around(base)
    assert space.names[:6] == ("d_model", "nhead", "num_layers", "dropout", "lr", "weight_decay")
    for d in space.dimensions:
        if d.kind == "choice":
            assert base[d.name] in d.values, d
        else:
            low, high = d.values
            assert low < base[d.name] < high or (d.kind == "int" and low <= base[d.name] <= high), d
    assert ("new_place_weight" in space.names) == base["unseen_slots"]
    assert ("relation_order" in space.names) == base["visit_relations"]
    assert space.feedforward_ratio == base["dim_feedforward"] / base["d_model"]
    wide = SearchSpace.around({**base, "d_model": 96, "dim_feedforward": 384})
    assert wide.dimension("d_model").values == (48, 72, 96, 144, 192, 288) and wide.feedforward_ratio == 4.0
    assert SearchSpace.from_dict(space.to_dict()) == space  # the sweep's saved state


def test_widths_around_a_recipe_reach_three_times_its_width():
    """Around d_model 64 a trial may draw 32 to 192: the last sweep's good trials sat at its old edge, 128."""
    space = SearchSpace.around(TrainConfig.from_dict({"data_dir": ".", "out_dir": "."}).to_dict())
    assert space.dimension("d_model").values == (32, 48, 64, 96, 128, 192)
    assert 1 in space.dimension("nhead").values


def test_a_recipe_that_remembers_searches_fewer_more_or_no_remembered_places():
    base = TrainConfig.from_recipe("tuned", data_dir="d", out_dir="o", memory_size=8, visit_dropout=0.0).to_dict()
    assert SearchSpace.around(base).dimension("memory_size").values == (0, 4, 8, 16)
    plain = TrainConfig.from_recipe("tuned", data_dir="d", out_dir="o").to_dict()
    assert SearchSpace.around(plain).dimension("memory_size") is None  # a recipe without memory keeps none


def test_random_search_draws_only_heads_that_divide_d_model_from_plain_numbers():
    """Random search's space holds Ray samplers of plain values only (a `sample_from` function is left as Ray's
    placeholder in a trial restored before it started); its nhead draw picks among the heads dividing d_model."""
    from ray.tune.search.sample import Domain, Function

    space = space_of(d_model=(12, 32, 48), nhead=(1, 3, 4, 8), dropout=(0.0, 0.4))
    samplers = space.random_space()
    assert all(isinstance(d, Domain) and not isinstance(d, Function) for d in samplers.values())
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(200):
        config = {name: domain.sample(random_state=rng) for name, domain in samplers.items()}
        hyper = space.resolve(config)
        assert hyper["d_model"] % hyper["nhead"] == 0
        seen.add((hyper["d_model"], hyper["nhead"]))
    assert seen == {(12, 1), (12, 3), (12, 4), (32, 1), (32, 4), (32, 8), (48, 1), (48, 3), (48, 4), (48, 8)}
    assert space.resolve({"d_model": 48, "dropout": 0.1, "nhead_draw": 0.999999})["nhead"] == 8
    assert space.resolve({"d_model": 48, "dropout": 0.1, "nhead_draw": 0.0})["nhead"] == 1

"""The flows' parameters are typed: choices from the packages' registries (a dropdown in the Prefect UI),
keyword-only, and their defaults those of the config dataclasses."""

from __future__ import annotations

import inspect

import pytest
from prefect.utilities.callables import parameter_schema

from flows.predict import predict_next_places
from flows.preprocess_and_train import preprocess_and_train
from pgt.config import RECIPES
from preprocessing.config import FORMATS, SynthConfig


@pytest.mark.parametrize("flow", [preprocess_and_train, predict_next_places])
def test_choices_are_dropdowns_of_the_registries(flow):
    properties = parameter_schema(flow.fn).model_dump()["properties"]
    assert properties["input_format"]["enum"] == list(FORMATS)
    if flow is preprocess_and_train:
        assert properties["recipe"]["enum"] == list(RECIPES)
    params = inspect.signature(flow.fn).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    defaults = {p.name: p.default for p in params}
    assert (defaults["synthetic_users"], defaults["synthetic_days"]) == (SynthConfig.users, SynthConfig.days)


def test_epochs_and_trials_left_empty_take_the_configs_defaults(tmp_path):
    from flows.settings import FlowSettings
    from pgt.config import TrainConfig
    from tune.config import SweepConfig

    s = FlowSettings.resolve(input_path=None, input_format="positionfixes", config_file=None, workers=0, gpu=None,
                             tune=False, trials=None, epochs=None, tracking_uri=None, ray_address=None, model_name="m",
                             state_dir=str(tmp_path))
    assert s.train_config()["epochs"] == TrainConfig.epochs
    sweep = s.sweep_config()
    assert (sweep["epochs"], sweep["trials"]) == (SweepConfig.epochs, SweepConfig.trials)
    with pytest.raises(TypeError):
        FlowSettings.resolve(None, "positionfixes")  # keyword-only

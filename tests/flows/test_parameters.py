"""The flows' parameters are typed: choices from the packages' registries (a dropdown in the Prefect UI),
keyword-only, and their defaults those of the config dataclasses."""

from __future__ import annotations

import inspect
from typing import Annotated

import pytest
from prefect.utilities.callables import parameter_schema

from flows.predict import predict_next_places
from flows.preprocess_and_train import preprocess_and_train
from flows.settings import flow_defaults
from infra.settings import settings_of
from pgt.recipes import RECIPES
from preprocessing.config import FORMATS, SynthConfig


@pytest.mark.parametrize("flow", [preprocess_and_train, predict_next_places])
def test_choices_are_dropdowns_of_the_registries(flow):
    properties = parameter_schema(flow.fn).model_dump()["properties"]
    assert properties["input_format"]["enum"] == list(FORMATS)
    if flow is preprocess_and_train:
        assert properties["recipe"]["enum"] == list(RECIPES)
    params = inspect.signature(flow.fn).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    defaults = flow_defaults(flow.fn)
    assert (defaults["synthetic_users"], defaults["synthetic_days"]) == (SynthConfig.users, SynthConfig.days)


def parameters(flow, **given) -> dict:
    """A flow's parameters as a run gets them: the signature's defaults, then `given`."""
    return flow_defaults(flow.fn) | given


def test_epochs_and_trials_left_empty_take_the_configs_defaults(tmp_path):
    from flows.settings import FlowSettings
    from pgt.config import TrainConfig
    from tune.config import SweepConfig

    s = FlowSettings.resolve(parameters(preprocess_and_train, workers=0, state_dir=str(tmp_path)))
    assert isinstance(s.train_config, TrainConfig) and s.train_config is s.train_config  # typed, built once
    assert s.train_config.epochs == TrainConfig.epochs
    sweep = s.sweep_config
    assert (sweep.epochs, sweep.trials) == (SweepConfig.epochs, SweepConfig.trials)


@pytest.mark.parametrize("flow", [preprocess_and_train, predict_next_places])
def test_a_flow_s_parameters_are_its_model_s_fields(flow, tmp_path):
    """The parameter model defines each parameter once: the flow's signature (what Prefect builds its form and
    validation from) is the model's fields, by name, type, default and description; the function receives the
    model; an unknown name is refused with the known ones."""
    model = flow.fn.parameters_model
    signature = inspect.signature(flow.fn).parameters
    assert list(signature) == list(model.model_fields)
    for name, field in model.model_fields.items():
        annotation = signature[name].annotation  # the type, with the field's bounds where it has any
        assert (Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation) == annotation, name
        assert flow_defaults(flow.fn)[name] == field.default, name
    schema = parameter_schema(flow.fn).model_dump()["properties"]
    assert {n: p["description"] for n, p in schema.items()} == {n: f.description for n, f in model.model_fields.items()}

    from flows.settings import FlowSettings, PredictSettings

    settings = FlowSettings if flow is preprocess_and_train else PredictSettings
    resolved = settings.resolve(parameters(flow, state_dir=str(tmp_path)))
    assert isinstance(resolved.parameters, model)
    assert resolved.state_dir == tmp_path.resolve() and resolved.tracking_uri.startswith("sqlite:")
    assert resolved.synthetic_users == model.model_fields["synthetic_users"].default  # read through to the model
    with pytest.raises(ValueError, match="unknown parameter unknown"):
        settings.resolve(parameters(flow, state_dir=str(tmp_path), unknown=1))


@pytest.mark.parametrize("given, message", [
    ({"workers": -1}, "workers must be in [0, 4096], got -1"),
    ({"epochs": 0}, "epochs must be in [1, 1048576], got 0"),
    ({"tune": True, "trials": 0}, "trials must be in [1, 1048576], got 0"),
    ({"tune": True, "finalists": -1}, "finalists must be in [0, 64], got -1"),
    ({"recipe": "fast"}, "recipe must be one of paper, tuned, tuned-deployed, ensemble, tuned-2026-12-05b, "
                         "ensemble-2026-12-05b, tuned-2026-12-05, ensemble-2026-12-05, tuned-2026-12-04, "
                         "ensemble-2026-12-04, tuned-2026-11-28, ensemble-2026-11-28, tuned-2026-11, ensemble-2026-11, "
                         "got 'fast'"),
    ({"input_format": "staypoints"}, "the synthetic default input is positionfixes"),
    ({"input_format": "gpx"}, "input_format must be one of geolife-plt, positionfixes, staypoints, got 'gpx'"),
    ({"synthetic_users": "many"}, "synthetic_users: input should be a valid integer"),
    ({"config_file": "s3://team/protocol.yaml"}, "s3://team/protocol.yaml: a local path here"),
    ({"input_path": "ftp://team/fixes.parquet"}, "storage URIs are s3:// or gs://"),
    ({"storage": "s3://team/pgt"}, "storage keeps a cluster's data and runs: give cluster"),
    ({"cluster": "http://127.0.0.2:8265"}, "cluster needs storage"),
    ({"cluster": "http://127.0.0.2:8265", "storage": "rel/folder"}, "storage rel/folder: a URI or an absolute path"),
    ({"cluster": "http://127.0.0.2:8265", "storage": "s3://team/pgt", "address": "127.0.0.2:6379"},
     "give one of them"),
    ({"cluster": "http://127.0.0.2:8265", "storage": "s3://team/pgt", "recipe_file": "r.yaml"},
     "recipe_file is a file of this machine"),
    ({"cluster": "http://127.0.0.2:8265", "storage": "s3://team/pgt", "workers": 0}, "give workers 1 or more"),
])
def test_a_bad_parameter_fails_before_anything_runs_with_its_config_s_message(given, message, tmp_path):
    from flows.settings import FlowSettings

    with pytest.raises(ValueError) as info:
        FlowSettings.resolve(parameters(preprocess_and_train, state_dir=str(tmp_path), **given))
    assert message in str(info.value)
    assert not (tmp_path / "sequences").exists()


def test_deployments_set_only_what_differs_from_the_flow_s_defaults():
    """prefect.yaml holds a parameter only where its deployment differs: not the flow's default, nor the config
    default that the flow's None stands for (epochs, trials)."""
    import yaml

    from pgt.config import TrainConfig
    from tests.conftest import PROJECT_ROOT
    from tune.config import SweepConfig

    flows = {"preprocess_and_train": preprocess_and_train, "predict_next_places": predict_next_places}
    same = []
    for deployment in yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())["deployments"]:
        flow = flows[deployment["entrypoint"].rsplit(":", 1)[1]]
        given = deployment.get("parameters") or {}
        defaults = parameters(flow)
        assert set(given) <= set(defaults), deployment["name"]
        config = SweepConfig if given.get("tune") else TrainConfig
        for name, value in given.items():
            sweep_or_run = ("epochs", "trials", "finalists", "confirm_seeds")  # None: the config's own default
            fallback = getattr(config, name, None) if defaults[name] is None and name in sweep_or_run else None
            if value == defaults[name] or value == fallback:
                same.append(f"{deployment['name']}: {name}")
    assert same == []


@pytest.mark.parametrize("flow", [preprocess_and_train, predict_next_places])
def test_a_setting_s_bounds_are_its_parameter_s_minimum_and_maximum(flow):
    """The parameter schema (the deployment's, which Prefect's server checks a run against before the run exists,
    and the UI's form) bounds each parameter that is a config's setting as the setting does, nullable or not, and
    the flow refuses a value outside them with the setting's words."""
    from pgt.config import LaunchConfig, PredictConfig, TrainConfig
    from tune.config import SweepConfig

    properties = parameter_schema(flow.fn).model_dump()["properties"]
    settings = {"workers": (LaunchConfig, "workers"), "trials": (SweepConfig, "trials"),
                "finalists": (SweepConfig, "finalists"), "confirm_seeds": (SweepConfig, "confirm_seeds"),
                "epochs": (TrainConfig, "epochs"), "top_k": (PredictConfig, "top_k"),
                "synthetic_users": (SynthConfig, "users"), "synthetic_days": (SynthConfig, "days")}
    checked = 0
    for name, (config, setting) in settings.items():
        if name not in properties:
            continue
        meta = settings_of(config)[setting].metadata
        schema = next((s for s in properties[name].get("anyOf", [properties[name]]) if s["type"] != "null"))
        assert (schema.get("minimum"), schema.get("maximum")) == (meta["low"], meta["high"]), name
        with pytest.raises(ValueError, match=rf"^{name} must be in \[{meta['low']}, {meta['high']}\], got -7$"):
            flow.fn.parameters_model.checked({name: -7})
        checked += 1
    assert checked == (7 if flow is preprocess_and_train else 3)
    # besides the settings, only the predict flow's recent_days is bounded: more than 0 days
    bounded = {n for n, p in properties.items() if n not in settings and
               any(k in str(p) for k in ("'minimum'", "'maximum'", "exclusiveMinimum", "exclusiveMaximum"))}
    assert bounded == (set() if flow is preprocess_and_train else {"recent_days"})
    if flow is predict_next_places:
        assert properties["recent_days"]["exclusiveMinimum"] == 0
        for bad in (0.0, -5.0, float("nan")):
            with pytest.raises(ValueError, match=r"^recent_days must be in \(0, inf\), got "):
                flow.fn.parameters_model.checked({"recent_days": bad})


@pytest.mark.parametrize("flow", [preprocess_and_train, predict_next_places])
def test_every_parameter_is_described_and_a_setting_s_description_is_its_help(flow):
    """The Prefect UI shows each parameter's description; a parameter that is a config's setting takes the
    setting's help from its one definition."""
    from infra.settings import help_of
    from pgt.config import LaunchConfig, TrainConfig
    from tune.config import SweepConfig

    properties = parameter_schema(flow.fn).model_dump()["properties"]
    assert all(p.get("description") for p in properties.values()), [n for n, p in properties.items()
                                                                     if not p.get("description")]
    settings = {"workers": (LaunchConfig, "workers"), "gpu": (LaunchConfig, "gpu"),
                "address": (LaunchConfig, "address"), "trials": (SweepConfig, "trials"),
                "finalists": (SweepConfig, "finalists"), "confirm_seeds": (SweepConfig, "confirm_seeds"),
                "epochs": (TrainConfig, "epochs"), "synthetic_users": (SynthConfig, "users"),
                "synthetic_days": (SynthConfig, "days")}
    for name, (config, setting) in settings.items():
        if name in properties:
            assert properties[name]["description"].startswith(help_of(config, setting)), name


def test_on_a_cluster_the_flow_s_job_is_the_command_a_user_would_submit(tmp_path):
    """cluster and storage: `pgt train` (or `pgt tune`, resumed where its record is kept) with the flow's settings,
    its data and output under storage."""
    from flows.settings import FlowSettings

    common = {"cluster": "http://127.0.0.2:8265", "storage": "s3://team/pgt", "state_dir": str(tmp_path),
              "tracking_uri": "http://127.0.0.4:5055"}
    train = FlowSettings.resolve(parameters(preprocess_and_train, **common, epochs=3, gpu=False)).cluster_job
    assert train.start == ["train", "--data", "s3://team/pgt/sequences/synthetic", "--out", "s3://team/pgt/runs/synthetic",
                           "--recipe", "paper", "--workers", "2", "--no-gpu", "--epochs", "3", "--tracking-uri",
                           "http://127.0.0.4:5055", "--experiment", "pgt"]
    assert (train.out, train.record, train.resume) == ("s3://team/pgt/runs/synthetic", "metrics.json", None)
    sweep = FlowSettings.resolve(parameters(preprocess_and_train, **common, tune=True, trials=4, recipe="tuned")).cluster_job
    assert sweep.start[:8] == ["tune", "--data", "s3://team/pgt/sequences/synthetic", "--out",
                               "s3://team/pgt/sweeps/synthetic", "--recipe", "tuned", "--trials"]
    assert sweep.resume == ["tune", "--resume", "s3://team/pgt/sweeps/synthetic"] and sweep.record == "tune.json"

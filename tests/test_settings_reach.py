"""Every setting is defined once (a config dataclass's `setting(...)`, with its help, bounds and choices) and is
reachable, with that one default, wherever a user gives it: training's from the command line, the Prefect flow and
a Ray Tune sweep; preprocessing's from a config file of the command and the flow; tracking's, prediction's, the
engine's, the served model's and the synthetic city's as options of their commands. The tests walk the configs'
fields: a setting added to one is covered without touching this file."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import typer.main
import yaml

from flows.preprocess_and_train import preprocess_and_train
from flows.settings import FlowSettings, PredictSettings, flow_defaults
from infra.settings import CHOICES, HIGH, help_of, settings_of
from pgt.cli import app, train_config
from pgt.config import (
    LaunchConfig,
    ModelSettings,
    PredictConfig,
    TrackingConfig,
    TrainConfig,
    load_recipe_file,
)
from pgt.options import typed_from
from pgt.recipes import RECIPE_FREE
from pgt.serving.config import ServeConfig
from preprocessing.config import PreprocessConfig, SynthConfig, load_config
from preprocessing.engine import EngineConfig
from tune.config import TRIAL_FIXED, SweepConfig
from tune.results import winner_recipe

SETTINGS = settings_of(TrainConfig)
# settings that only train beside another
NEEDS = {"relation_inputs": {"visit_relations": True}, "static_width": {"resident_data": True},
         "compile_model": {"resident_data": True, "static_width": 16},
         "capture_step": {"resident_data": True, "static_width": 16},
         "train_on": {"stop_after_epochs": 1}, "arrival_days": {"arrival_head": 1.0},
         "arrival_classes": {"arrival_head": 1.0}}
# what a sweep sets in each trial, and the SweepConfig field that does (threads follow the CPUs a trial reserves)
SWEEP_OWN = {"epochs": "epochs", "seed": "seed", "select_on": "select_on", "threads": "cpus_per_trial"}


def other_value(field: dataclasses.Field):
    """A valid value other than the setting's default."""
    default, meta = field.default, field.metadata
    if meta.get(CHOICES):
        return next(choice for choice in meta[CHOICES] if choice != default)
    if isinstance(default, bool):
        return not default
    if field.name in ("d_model", "nhead"):
        return 2 * default  # d_model stays divisible by the heads and by 4
    if isinstance(default, int):
        return default + 1 if meta.get(HIGH) is None or default + 1 <= meta[HIGH] else default - 1
    if field.name == "known_fraction_max":
        return 0.9
    if default is None:  # an optional number, derived from other settings unless given
        return 1.0
    return default / 2 if default > 0 else 0.5


def recipe_file(tmp_path, name: str):
    value = other_value(SETTINGS[name])
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({name: value, **NEEDS.get(name, {})}))
    return path, value


def parse(*args: str) -> dict:
    command = typer.main.get_command(app).get_command(None, "train")
    return command.make_context("train", list(args)).params


def resolve_flow(tmp_path, **given) -> FlowSettings:
    return FlowSettings.resolve({**flow_defaults(preprocess_and_train.fn), "workers": 0, "state_dir": str(tmp_path),
                                 **given})


def test_every_field_but_the_run_s_folders_is_a_setting_with_help():
    """The network's settings are TrainConfig's through its nested ModelSettings, defined there once."""
    own = {f.name for f in dataclasses.fields(TrainConfig)} - {"data_dir", "out_dir", "network"}
    assert set(SETTINGS) == own | {f.name for f in dataclasses.fields(ModelSettings)}
    assert not own & {f.name for f in dataclasses.fields(ModelSettings)}  # flat names stay unique
    assert all(help_of(TrainConfig, name).endswith((".", ")")) for name in SETTINGS)


@pytest.mark.parametrize("name", sorted(set(SETTINGS) - set(RECIPE_FREE)))
def test_each_setting_reaches_a_run_from_the_cli_the_flow_and_a_sweep(tmp_path, name):
    path, value = recipe_file(tmp_path, name)
    # the command line: `pgt train --recipe-file FILE`
    assert train_config(parse("--data", "d", "--out", "o", "--recipe-file", str(path))).to_dict()[name] == value
    # the flow: its recipe_file parameter
    assert "recipe_file" in inspect.signature(preprocess_and_train.fn).parameters
    assert resolve_flow(tmp_path, recipe_file=str(path)).train_config.to_dict()[name] == value
    # a sweep: every trial starts from the recipe; the few settings a sweep sets itself are its own fields
    sweep = SweepConfig(data_dir="d", out_dir="o", recipe=load_recipe_file(path), recipe_name=str(path))
    trial = sweep.train_config({}, tmp_path / "trial")
    if name in SWEEP_OWN:
        assert SWEEP_OWN[name] in {f.name for f in dataclasses.fields(SweepConfig)}
    elif name in TRIAL_FIXED:  # never in a trial, which validation scores; the winner's recipe file keeps it
        assert trial.to_dict()[name] == TRIAL_FIXED[name] != value
        assert winner_recipe(sweep, {})[name] == value
    else:
        assert trial.to_dict()[name] == value


@pytest.mark.parametrize("name", sorted(set(SETTINGS) & set(RECIPE_FREE)))
def test_a_run_s_own_setting_is_a_cli_option(name):
    options = {p.name for p in typer.main.get_command(app).get_command(None, "train").params}
    assert name in options


def test_one_default_everywhere(tmp_path):
    defaults = {name: field.default for name, field in SETTINGS.items()}
    # the command line: untyped options leave them, and --help shows them with the definition's help
    cli = train_config(parse("--data", "d", "--out", "o"))
    assert {name: cli.to_dict()[name] for name in SETTINGS} == defaults
    options = {p.name: p for p in typer.main.get_command(app).get_command(None, "train").params}
    for name in SETTINGS.keys() & options.keys():
        assert options[name].help.startswith(help_of(TrainConfig, name)), name
        assert options[name].show_default == str(defaults[name]), name
    # the flow, with the paper's recipe
    flow = resolve_flow(tmp_path).train_config.to_dict()
    assert {name: flow[name] for name in SETTINGS} == defaults
    # a sweep's trial: the defaults but for the sweep's own settings
    trial = SweepConfig(data_dir="d", out_dir="o").train_config({}, tmp_path / "trial")
    assert {name for name in SETTINGS if trial.to_dict()[name] != defaults[name]} <= SWEEP_OWN.keys()


def test_the_walk_covers_a_new_setting(monkeypatch):
    """other_value gives every setting a valid value that differs from its default (else the walk proves nothing)."""
    for name, field in SETTINGS.items():
        value = other_value(field)
        assert value != field.default, name
        TrainConfig.from_dict({"data_dir": "d", "out_dir": "o", name: value, **NEEDS.get(name, {})})


# every command's configs: each setting is one of its options, with the setting's help and default (what a command
# sets itself is not an option)
COMMAND_SETTINGS = {
    "train": ((TrainConfig, LaunchConfig, TrackingConfig), ()),
    "tune": ((SweepConfig, TrackingConfig), ("select_on", "run_name", "log_model", "system_metrics_interval_s")),
    "preprocess": ((EngineConfig,), ()),
    "synth": ((SynthConfig,), ()),
    "serve": ((ServeConfig,), ("model_uri",)),
    "predict": ((PredictConfig,), ()),
}


@pytest.mark.parametrize("command", sorted(COMMAND_SETTINGS))
def test_every_setting_of_a_command_s_configs_is_its_option(command):
    configs, skipped = COMMAND_SETTINGS[command]
    options = {p.name: p for p in typer.main.get_command(app).get_command(None, command).params}
    for config in configs:
        for name, field in settings_of(config).items():
            if name in skipped:
                assert name not in options, (command, name)
                continue
            assert name in options, (command, name)
            assert options[name].help.startswith(field.metadata["help"]), (command, name)
            assert options[name].show_default == str(field.default), (command, name)
            assert options[name].envvar == field.metadata.get("env"), (command, name)
            assert options[name].default is None, (command, name)  # not typed: the config's default applies


def test_the_tracking_uri_and_the_ray_address_are_read_from_their_environment_variables():
    command = typer.main.get_command(app).get_command(None, "train")
    params = command.make_context("train", ["--data", "d", "--out", "o"], auto_envvar_prefix=None).params
    assert params["tracking_uri"] is None  # not set here: the default store
    options = {p.name: p for p in command.params}
    assert (options["tracking_uri"].envvar, options["address"].envvar) == ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")


PREPROCESS_SETTINGS = settings_of(PreprocessConfig)


def other_preprocess_value(name: str, field: dataclasses.Field):
    """A valid value other than the default of a preprocessing setting."""
    special = {"timezone": "Asia/Shanghai", "earliest_valid_time": "2000-01-01", "latest_valid_time": "2030-01-01",
               "min_mean_window_quality": 0.5, "train_fraction": 0.5, "validation_fraction": 0.25}
    if name in special:
        return special[name]
    return other_value(field)


@pytest.mark.parametrize("name", sorted(PREPROCESS_SETTINGS))
def test_each_preprocessing_setting_reaches_a_run_from_a_config_file_the_cli_and_the_flow(tmp_path, name):
    """`pgt preprocess --config FILE` and the flow's config_file both read the file with load_config: each setting
    there reaches the PreprocessConfig a run uses (and its manifest records), with its help defined once."""
    value = other_preprocess_value(name, PREPROCESS_SETTINGS[name])
    assert value != PREPROCESS_SETTINGS[name].default
    path = tmp_path / "preprocess.yaml"
    path.write_text(yaml.safe_dump({name: value}))
    assert getattr(load_config(path), name) == value
    assert load_config(path).to_dict()[name] == value  # what the manifest records
    assert help_of(PreprocessConfig, name).endswith((".", ")"))
    flow = resolve_flow(tmp_path, config_file=str(path))
    assert getattr(load_config(flow.config_file), name) == value


def test_prediction_settings_reach_the_command_and_the_flow_with_one_default():
    from flows.predict import predict_next_places

    flow = flow_defaults(predict_next_places.fn)
    options = {p.name: p for p in typer.main.get_command(app).get_command(None, "predict").params}
    for name, field in settings_of(PredictConfig).items():
        assert flow[name] == field.default and options[name].show_default == str(field.default), name
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 1000\], got 0"):
        PredictSettings.resolve({**flow, "top_k": 0})


def test_tracking_settings_reach_the_run_s_tracking_config_from_the_cli(monkeypatch):
    command = typer.main.get_command(app).get_command(None, "train")
    params = command.make_context("train", ["--data", "d", "--out", "o", "--experiment", "e", "--run-name", "r",
                                            "--no-log-model", "--system-metrics-interval-s", "0"]).params
    typed = typed_from(params, TrackingConfig)
    tracking = TrackingConfig(**typed.values)
    assert (tracking.experiment, tracking.run_name, tracking.log_model, tracking.system_metrics_interval_s) == \
        ("e", "r", False, 0.0)


def test_a_renamed_setting_typed_in_a_recipe_or_a_settings_file_is_refused_naming_its_new_name(tmp_path):
    """memory_places is memory_size now: a training recipe and a preprocessing settings file that type the old name
    are refused in one line naming the new one; the new name is taken."""
    with pytest.raises(ValueError, match=r"unknown training setting\(s\): memory_places \(memory_places is "
                                         r"memory_size now\)"):
        TrainConfig.from_dict({"data_dir": "d", "out_dir": "o", "memory_places": 8})
    settings = tmp_path / "preprocess.yaml"
    settings.write_text("memory_places: 16\n")
    with pytest.raises(ValueError, match=r"preprocess.yaml.*memory_places \(memory_places is memory_size now\)"):
        load_config(settings)
    settings.write_text("memory_size: 16\n")
    assert load_config(settings).memory_size == 16

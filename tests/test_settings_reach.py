"""Every training setting is defined once (pgt.config.TrainConfig, with its help, bounds and choices) and is
reachable, with that one default, from the command line, the Prefect flow and a Ray Tune sweep. The test walks
the config's fields: a setting added to TrainConfig is covered without touching this file."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import typer.main
import yaml

from flows.preprocess_and_train import preprocess_and_train
from flows.settings import FlowSettings, flow_defaults
from pgt.cli import app, train_config
from pgt.config import RECIPE_FREE, ModelSettings, TrainConfig, load_recipe_file
from preprocessing.settings import CHOICES, HIGH, help_of, settings_of
from tune.config import TRIAL_FIXED, SweepConfig
from tune.sweep import winner_recipe

SETTINGS = settings_of(TrainConfig)
# settings that only train beside another
NEEDS = {"relation_inputs": {"visit_relations": True}, "static_width": {"resident_data": True},
         "compile_model": {"resident_data": True, "static_width": 16},
         "capture_step": {"resident_data": True, "static_width": 16},
         "train_on": {"stop_after_epochs": 1}}
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
    assert resolve_flow(tmp_path, recipe_file=str(path)).train_config()[name] == value
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
    flow = resolve_flow(tmp_path).train_config()
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

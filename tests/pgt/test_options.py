"""Every default lives in its config dataclass: options the user does not type stay None and leave the
config's (or the recipe's) value; typed ones win. Parsed by the real `pgt` command, not run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import typer.main

from infra.settings import settings_of
from pgt.cli import app, launch_config, train_config
from pgt.config import LaunchConfig, TrainConfig
from pgt.data.dataset import Vocab
from pgt.recipes import RECIPES
from preprocessing.config import SynthConfig
from preprocessing.engine import EngineConfig
from tune.cli import sweep_config
from tune.config import SweepConfig


def parse(command: str, *args: str) -> dict:
    """The options `pgt COMMAND ARGS` parses to, as its function receives them."""
    click_command = typer.main.get_command(app).get_command(None, command)
    return click_command.make_context(command, list(args)).params


def test_options_that_are_not_typed_are_none():
    for command in ("train", "tune", "synth", "preprocess"):
        params = typer.main.get_command(app).get_command(None, command).params
        defaults = {p.name: p.default for p in params if not p.required}
        # the only defaults the command line holds: flags that are not settings of a config
        own = {"recipe": "paper", "progress": True, "force": False, "help": False}
        assert {k: v for k, v in defaults.items() if v is not None and k not in own} == {}, command


def test_untyped_train_options_leave_the_config_defaults():
    params = parse("train", "--data", "d", "--out", "o")
    assert train_config(params) == TrainConfig(data_dir="d", out_dir="o")
    assert launch_config(params) == LaunchConfig()


def test_a_recipe_keeps_what_is_not_typed_and_typed_options_win(monkeypatch):
    tuned = train_config(parse("train", "--data", "d", "--out", "o", "--recipe", "tuned"))
    assert (tuned.network.nhead, tuned.epochs, tuned.select_on) == (1, 10, "strict_acc@1")  # RECIPES["tuned"]
    assert tuned.lr == 4e-3 and tuned.network.dropout == pytest.approx(0.449, abs=1e-3)
    typed = train_config(parse("train", "--data", "d", "--out", "o", "--recipe", "tuned", "--dropout", "0.2",
                               "--no-simulate-unseen", "--known-fraction-min", "0.5", "--known-fraction-max", "0.9"))
    assert (typed.network.dropout, typed.simulate_unseen, typed.lr) == (0.2, False, tuned.lr)
    older = train_config(parse("train", "--data", "d", "--out", "o", "--recipe", "tuned-2026-11"))
    assert (older.network.nhead, older.network.dropout, older.lr, older.epochs) == (4, 0.4, 1e-3, 50)  # kept to compare
    assert (typed.known_fraction_min, typed.known_fraction_max) == (0.5, 0.9)
    # a recipe that sets patience keeps it unless --patience is typed (a CLI default used to override it)
    monkeypatch.setitem(RECIPES, "patient", {"patience": 9, "epochs": 80})
    params = parse("train", "--data", "d", "--out", "o")
    patient = train_config({**params, "recipe": "patient"})
    assert (patient.patience, patient.epochs) == (9, 80)
    params = parse("train", "--data", "d", "--out", "o", "--patience", "3")
    assert train_config({**params, "recipe": "patient"}).patience == 3


def test_untyped_sweep_synth_and_engine_options_leave_the_config_defaults():
    assert sweep_config(parse("tune", "--data", "d", "--out", "o")) == SweepConfig(data_dir="d", out_dir="o")
    typed = sweep_config(parse("tune", "--data", "d", "--out", "o", "--objective", "acc@1", "--trials", "3"))
    assert (typed.objective, typed.select_on, typed.trials) == ("acc@1", "acc@1", 3)
    synth = parse("synth", "--out", "x.parquet")
    assert [synth[name] for name in settings_of(SynthConfig)] == [None] * len(settings_of(SynthConfig))
    pre = parse("preprocess", "--input", "i", "--format", "positionfixes", "--out", "o")
    assert (pre["engine"], pre["partitions"], pre["tile_deg"]) == (None, None, None)
    assert EngineConfig() == EngineConfig(engine="local", partitions=0, tile_deg=None)


@pytest.mark.parametrize("command, option, config, field", [
    ("train", "--lr", TrainConfig, "lr"), ("train", "--d-model", TrainConfig, "d_model"),
    ("train", "--workers", LaunchConfig, "workers"), ("tune", "--trials", SweepConfig, "trials"),
    ("synth", "--users", SynthConfig, "users"), ("preprocess", "--partitions", EngineConfig, "partitions")])
def test_help_shows_the_config_default(command, option, config, field):
    params = typer.main.get_command(app).get_command(None, command).params
    shown = next(p for p in params if option in p.opts).show_default
    assert shown == str({**{f.name: f for f in dataclasses.fields(config)}, **settings_of(config)}[field].default)


def test_a_recipe_file_trains_what_the_named_recipe_trains(tmp_path):
    """`--recipe-file` of a YAML holding a recipe's settings gives the same TrainConfig as `--recipe`; options typed
    on the command line still win; a bad file is refused naming it."""
    import yaml

    recipe = tmp_path / "tuned.yaml"
    recipe.write_text(yaml.safe_dump(RECIPES["tuned"]))
    named = train_config(parse("train", "--data", "d", "--out", "o", "--recipe", "tuned"))
    from_file = train_config(parse("train", "--data", "d", "--out", "o", "--recipe-file", str(recipe)))
    assert from_file == named and from_file.network.visit_relations and from_file.network.dropout == RECIPES["tuned"]["dropout"]
    typed = train_config(parse("train", "--data", "d", "--out", "o", "--recipe-file", str(recipe), "--dropout", "0.1"))
    assert typed.network.dropout == 0.1 and typed.network.relation_inputs
    # a sweep's winner nests the settings under `train`
    (tmp_path / "winner.yaml").write_text(yaml.safe_dump({"train": RECIPES["tuned"], "sweep": {"trials": 4}}))
    assert train_config(parse("train", "--data", "d", "--out", "o", "--recipe-file", str(tmp_path / "winner.yaml"))) == named
    for text, words in (("[1, 2]", "found list"), ("dropuot: 0.2", "unknown training setting(s): dropuot"),
                        ("out_dir: x", "out_dir belong to a run"), ("d_model: 30", "d_model (30) must be divisible"),
                        ("a: [", "not valid YAML")):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(ValueError, match=f"{tmp_path / 'bad.yaml'}: .*" + words.replace("(", r"\(").replace(")", r"\)")):
            train_config(parse("train", "--data", "d", "--out", "o", "--recipe-file", str(tmp_path / "bad.yaml")))
    with pytest.raises(ValueError, match="give one"):
        train_config(parse("train", "--data", "d", "--out", "o", "--recipe", "tuned", "--recipe-file", str(recipe)))


def test_every_trial_of_a_sweep_trains_its_recipe_with_only_the_searched_settings_replaced():
    spec = sweep_config(parse("tune", "--data", "d", "--out", "o", "--recipe", "tuned", "--epochs", "7"))
    hyper = {"d_model": 96, "nhead": 8, "num_layers": 3, "dim_feedforward": 192, "dropout": 0.1, "lr": 3e-4,
             "weight_decay": 0.02}
    cfg = spec.train_config(hyper, "trial")
    expected = TrainConfig.from_recipe("tuned", data_dir="d", out_dir="trial", epochs=7, seed=spec.seed,
                                       select_on=spec.select_on, threads=1, **hyper, refit=False)
    assert RECIPES["tuned"]["refit"] and not cfg.refit  # a trial is scored on held-out validation: it never refits
    assert cfg == expected and cfg.network.visit_relations and cfg.network.relation_inputs
    assert cfg.new_place_weight == RECIPES["tuned"]["new_place_weight"] and cfg.network.nhead == 8  # searched
    assert spec.recipe_name == "tuned" and SweepConfig.from_dict(spec.to_dict()) == spec  # the Ray boundary
    paper = sweep_config(parse("tune", "--data", "d", "--out", "o")).train_config(hyper, "trial")
    assert not paper.network.visit_relations and not paper.network.unseen_slots


@pytest.mark.parametrize(("settings", "log_odds"), [
    ({"unseen_slots": True, "new_place_weight": 0.05}, math.log(20)),  # tuned's: the loss weighed new places 1/20
    ({"unseen_slots": True, "new_place_weight": 1.0}, 0.0),  # every target alike: nothing to undo
    ({"unseen_slots": True, "new_place_weight": 0.0}, 0.0),  # a loss that never asked for a new place
    ({"unseen_slots": False, "new_place_weight": 0.05}, 0.0),  # the weight applies with slots only
    ({"unseen_slots": True, "new_place_weight": 0.05, "new_place_log_odds": 2.5}, 2.5),  # set: it, not the weight's
    ({"unseen_slots": True, "new_place_weight": 0.05, "new_place_log_odds": 0.0}, 0.0),  # set to the network's own
])
def test_the_model_carries_the_odds_its_settings_give(settings, log_odds):
    cfg = TrainConfig.from_recipe("paper", **settings, data_dir="data", out_dir="runs")
    model_cfg = cfg.model_config(Vocab(locations=10, users=3))
    assert model_cfg.new_place_log_odds == pytest.approx(log_odds)

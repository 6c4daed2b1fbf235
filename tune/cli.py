"""`pgt tune`: the sweep command. It sits in the tune package, above pgt, and joins the `pgt` command through
the entry-point group "pgt.commands" (pyproject.toml), so that pgt never imports tune."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import typer

from pgt.config import RECIPES, TrackingConfig, base_settings, recipe_label
from pgt.options import default_of, fail, given, option_for
from preprocessing.process import listed
from tune.config import OBJECTIVES, SEARCH_ALGS, SweepConfig

Objective = Literal[OBJECTIVES]
SearchAlg = Literal[SEARCH_ALGS]
Recipe = Literal[tuple(RECIPES)]

# SweepConfig fields the command line may set; the rest keep SweepConfig's defaults
SWEEP_OPTIONS = ("trials", "epochs", "max_concurrent", "workers_per_trial", "cpus_per_trial", "cpus_per_worker",
                 "gpus_per_worker", "search", "grace_period", "reduction_factor", "seed", "max_failures",
                 "time_budget_s", "finalists", "confirm_seeds")


def sweep_config(params: dict) -> SweepConfig:
    """`pgt tune`'s SweepConfig from its parsed options: the typed ones over SweepConfig's defaults, every trial
    starting from the recipe (--recipe or --recipe-file). A typed --objective is also what early stopping inside
    each trial follows."""
    typed = given(params, *SWEEP_OPTIONS)
    if params.get("objective") is not None:
        typed["objective"] = typed["select_on"] = params["objective"]
    recipe_file = params.get("recipe_file")
    recipe = base_settings(params.get("recipe"), recipe_file)
    return SweepConfig(data_dir=str(params["data"]), out_dir=str(params["out"]), recipe=recipe,
                       recipe_name=recipe_label(params.get("recipe"), recipe_file),
                       **typed)


def saved_sweep(path: Path) -> tuple[SweepConfig, TrackingConfig | None, str | None]:
    """The sweep, its tracking and its model name from an earlier sweep's sweep.json; ValueError naming the file."""
    from preprocessing.process import read_small_file, shorten

    try:
        state = json.loads(read_small_file(path, "sweep record"))
        spec = SweepConfig.from_dict(state["sweep"])
        tracking = TrackingConfig.from_dict(state["tracking"]) if state.get("tracking") else None
        register = state.get("register")
        if register is not None and not isinstance(register, str):
            raise TypeError(f"register is {type(register).__name__}")
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        problem = shorten(" ".join(str(exc).split()), 160) or type(exc).__name__
        raise ValueError(f"{path}: damaged sweep record ({type(exc).__name__}: {problem}); it is written by "
                         "`pgt tune`: restore it or start a new sweep in another --out") from None
    return spec, tracking, register


def tune(
    data: Path | None = typer.Option(None, "--data", help="A `pgt preprocess` output folder."),
    out: Path | None = typer.Option(None, "--out", help="Sweep folder: tune.json, trials/, the Tune experiment under ray/."),
    trials: int | None = option_for(SweepConfig, "trials"),
    epochs: int | None = option_for(SweepConfig, "epochs"),
    address: str | None = typer.Option(None, "--address", envvar="RAY_ADDRESS",
                                       help="Ray cluster to run on; default a local Ray."),
    recipe: Recipe | None = typer.Option(None, "--recipe", show_default="paper",
                                         help="Every trial trains this recipe (pgt.config.RECIPES) with only the "
                                              "searched settings replaced."),
    recipe_file: Path | None = typer.Option(None, "--recipe-file",
                                            help="The same from a YAML file of training settings (a sweep's winner)."),
    max_concurrent: int | None = option_for(SweepConfig, "max_concurrent"),
    workers_per_trial: int | None = option_for(SweepConfig, "workers_per_trial"),
    cpus_per_trial: float | None = option_for(SweepConfig, "cpus_per_trial"),
    cpus_per_worker: float | None = option_for(SweepConfig, "cpus_per_worker"),
    gpus_per_worker: float | None = option_for(SweepConfig, "gpus_per_worker"),
    search: SearchAlg | None = option_for(SweepConfig, "search"),
    grace_period: int | None = option_for(SweepConfig, "grace_period"),
    reduction_factor: int | None = option_for(SweepConfig, "reduction_factor"),
    objective: Objective | None = option_for(SweepConfig, "objective"),
    seed: int | None = option_for(SweepConfig, "seed"),
    max_failures: int | None = option_for(SweepConfig, "max_failures"),
    time_budget_s: float | None = option_for(SweepConfig, "time_budget_s"),
    finalists: int | None = option_for(SweepConfig, "finalists"),
    confirm_seeds: int | None = option_for(SweepConfig, "confirm_seeds"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                            help="MLflow tracking URI; default a SQLite store under .state/mlflow."),
    experiment: str | None = typer.Option(None, "--experiment", show_default=default_of(TrackingConfig, "experiment"),
                                          help="MLflow experiment."),
    register: str | None = typer.Option(None, "--register", help="Register the best trial's model under this name."),
    resume: Path | None = typer.Option(None, "--resume", help="Resume the interrupted sweep in this folder."),
) -> None:
    """Search d_model, nhead, dropout, learning rate, weight decay and layers with Ray Tune (ASHA + TPE), confirm the
    best few and the base recipe on fresh seeds, and train the winner's recipe as `pgt train` would."""
    from pgt.registry import champion_verdict
    from pgt.tracking import RECIPE_TAG, check_tracking_server, resolve_tracking_uri, run_url
    from preprocessing.engine import check_ray_address
    from preprocessing.errors import InputError
    from preprocessing.output import check_apart, check_output_entries
    from tune.report import print_sweep
    from tune.sweep import OUTPUTS, SweepInterrupted, run_sweep

    try:
        if resume is not None:
            saved = resume / "sweep.json"
            if not saved.is_file():
                raise FileNotFoundError(f"{resume}: no sweep.json; expected the --out folder of an earlier `pgt tune`")
            typed = sorted(given(locals(), "data", "out", "recipe", "recipe_file", "objective", *SWEEP_OPTIONS))
            if typed:  # Tune restores the experiment it saved: its search space, trial count and scheduler
                raise ValueError(f"--resume continues {resume} as it was started; "
                                 f"{listed('--' + name.replace('_', '-') for name in typed)} cannot change a started "
                                 "sweep: drop them, or start a new sweep in another --out")
            spec, tracking, saved_register = saved_sweep(saved)
            register = register or saved_register
        else:
            if data is None or out is None:
                raise ValueError("--data and --out are required (or --resume DIR)")
            check_apart(out, {"--data": data})
            check_output_entries(out, "pgt tune", OUTPUTS)
            spec = sweep_config(locals())
            tracking = TrackingConfig(resolve_tracking_uri(tracking_uri), source="pgt tune",
                                      tags={RECIPE_TAG: spec.recipe_name}, **given(locals(), "experiment"))

            from pgt.data import Vocab

            Vocab.from_manifest(data)  # a wrong --data fails here, not inside every trial
        if tracking:  # services answer before any work, or one line says what to start
            check_tracking_server(tracking.tracking_uri)
        check_ray_address(address or os.environ.get("RAY_ADDRESS"))
        result = run_sweep(spec, tracking, address=address, resume=resume is not None, register=register)
    except SweepInterrupted as exc:
        typer.echo(f"interrupted: {exc}", err=True)
        raise typer.Exit(code=130)
    except (ValueError, FileNotFoundError, RuntimeError, InputError) as exc:
        fail(str(exc))
    print_sweep(result)
    typer.echo(f"wrote {Path(spec.out_dir) / 'tune.json'}")
    if "mlflow" in result:
        typer.echo(f"mlflow: {run_url(result['mlflow']['tracking_uri'], result['mlflow']['run_id'])}")
        registered = result["mlflow"].get("registered")
        if registered:
            typer.echo(f"registered {registered['name']} version {registered['version']}: {champion_verdict(registered)}")

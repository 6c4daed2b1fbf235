"""`pgt tune`: the sweep command. It sits in the tune package, above pgt, and joins the `pgt` command through
the entry-point group "pgt.commands" (pyproject.toml), so that pgt never imports tune."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import typer

from infra.errors import InputError, SettingsError
from infra.process import listed
from pgt.config import LaunchConfig, TrackingConfig, base_settings
from pgt.options import Typed, fail, flag_of, option_for, settings_options, typed_from
from pgt.recipes import RECIPES, recipe_label
from tune.config import SweepConfig

Recipe = Literal[tuple(RECIPES)]

def sweep_config(params: dict) -> SweepConfig:
    """`pgt tune`'s SweepConfig from its parsed options (None: not typed): the typed settings over SweepConfig's
    defaults, every trial starting from the recipe (--recipe or --recipe-file). A typed --objective is also what
    early stopping inside each trial follows."""
    settings = typed_from(params, SweepConfig).values
    if "objective" in settings:
        settings.setdefault("select_on", settings["objective"])
    recipe, recipe_file = params.get("recipe"), params.get("recipe_file")
    return SweepConfig(data_dir=str(params["data"]), out_dir=str(params["out"]), recipe=base_settings(recipe, recipe_file),
                       recipe_name=recipe_label(recipe, recipe_file), **settings)


def saved_sweep(folder: str) -> tuple[SweepConfig, TrackingConfig | None, str | None]:
    """The sweep, its tracking and its model name from the sweep.json of an earlier sweep's folder (a path or a URI);
    InputError naming the file."""
    from infra.process import read_small_file, shorten
    from infra.storage import open_storage

    kept = open_storage(folder)
    if kept.local is None:
        kept.check()
    path = kept.uri_of("sweep.json")
    if not kept.exists("sweep.json"):
        raise InputError(folder, "no sweep.json; expected the --out folder of an earlier `pgt tune`")
    try:
        state = json.loads(read_small_file(Path(path), "sweep record") if kept.local else kept.read_bytes("sweep.json"))
        spec = SweepConfig.from_dict(state["sweep"])
        tracking = TrackingConfig.from_dict(state["tracking"]) if state.get("tracking") else None
        register = state.get("register")
        if register is not None and not isinstance(register, str):
            raise TypeError(f"register is {type(register).__name__}")
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        problem = shorten(" ".join(str(exc).split()), 160) or type(exc).__name__
        raise InputError(path, f"damaged sweep record ({type(exc).__name__}: {problem}); it is written by "
                               "`pgt tune`: restore it or start a new sweep in another --out") from None
    return spec, tracking, register


@settings_options(SweepConfig, TrackingConfig, skip=("select_on", "run_name", "log_model", "system_metrics_interval_s"))
def tune(
    data: str | None = typer.Option(None, "--data", help="A `pgt preprocess` output folder, or its URI (s3://BUCKET/"
                                                       "FOLDER, gs://...) from which each node copies it."),
    out: str | None = typer.Option(None, "--out", help="Sweep folder: tune.json, trials/, the Tune experiment under ray/. "
                                                     "On a cluster, object storage (s3://BUCKET/FOLDER, gs://...) or "
                                                     "a mount every node has at the same path."),
    recipe: Recipe | None = typer.Option(None, "--recipe", show_default="paper",
                                         help="Every trial trains this recipe (pgt.recipes.RECIPES) with only the "
                                              "searched settings replaced."),
    recipe_file: Path | None = typer.Option(None, "--recipe-file",
                                            help="The same from a YAML file of training settings (a sweep's winner)."),
    address: str | None = option_for(LaunchConfig, "address"),
    resume: str | None = typer.Option(None, "--resume", help="Resume the interrupted sweep in this folder (or URI), "
                                                           "from any machine."),
    typed: Typed = None,
) -> None:
    """Search d_model, nhead, dropout, learning rate, weight decay and layers with Ray Tune (ASHA + TPE), confirm the
    best few and the base recipe on fresh seeds, and train the winner's recipe as `pgt train` would."""
    from infra.output import check_apart, check_output_entries
    from infra.ray_session import check_ray_address
    from infra.storage import is_uri, open_storage
    from pgt.tracking.registry import champion_verdict
    from pgt.tracking.runs import RECIPE_TAG, run_url
    from pgt.tracking.store import check_tracking_server, resolve_tracking_uri
    from tune.records import OUTPUTS
    from tune.report import print_sweep
    from tune.sweep import SweepInterrupted, run_sweep

    try:
        if resume is not None:
            changed = sorted({*typed.of(SweepConfig), *(name for name, value in
                              (("data", data), ("out", out), ("recipe", recipe), ("recipe_file", recipe_file))
                              if value is not None)})
            if changed:  # Tune restores the experiment it saved: its search space, trial count and scheduler
                raise SettingsError(f"--resume continues {resume} as it was started; "
                                    f"{listed(flag_of(name) for name in changed)} cannot change a started "
                                    "sweep: drop them, or start a new sweep in another --out")
            spec, tracking, saved_register = saved_sweep(resume)
            register = typed.values.get("register") or saved_register
        else:
            if data is None or out is None:
                raise SettingsError("--data and --out are required (or --resume DIR)")
            check_apart(out, {"--data": data})
            check_output_entries(out, "pgt tune", OUTPUTS)
            spec = sweep_config({**typed.values, "data": data, "out": out, "recipe": recipe, "recipe_file": recipe_file})
            settings = {**typed.of(TrackingConfig), "tracking_uri": resolve_tracking_uri(typed.values.get("tracking_uri"))}
            register = settings.pop("register", None)  # the winner's, after the sweep: its trials register nothing
            tracking = TrackingConfig(**settings, source="pgt tune", tags={RECIPE_TAG: spec.recipe_name})

            from pgt.data.dataset import Vocab

            if not is_uri(data):  # a wrong --data fails here, not inside every trial (a URI: in run_sweep)
                Vocab.from_manifest(data)
        if tracking:  # services answer before any work, or one line says what to start
            check_tracking_server(tracking.tracking_uri)
        check_ray_address(address or os.environ.get("RAY_ADDRESS"))
        result = run_sweep(spec, tracking, address=address, resume=resume is not None, register=register)
    except SweepInterrupted as exc:
        typer.echo(f"interrupted: {exc}", err=True)
        raise typer.Exit(code=130)
    except RuntimeError as exc:  # Ray's own, about the cluster
        fail(str(exc))
    print_sweep(result)
    typer.echo(f"wrote {open_storage(spec.out_dir).uri_of('tune.json')}")
    if "mlflow" in result:
        typer.echo(f"mlflow: {run_url(result['mlflow']['tracking_uri'], result['mlflow']['run_id'])}")
        registered = result["mlflow"].get("registered")
        if registered:
            typer.echo(f"registered {registered['name']} version {registered['version']}: {champion_verdict(registered)}")

"""The `pgt` command. Heavy modules (torch, Ray, MLflow) are imported inside the commands that need them.

Options default to "not given" (None) and only typed ones reach the configs, whose dataclasses hold every
default (pgt.options). Commands of packages above this one (`pgt tune`) join through the entry-point group
"pgt.commands", so that pgt never imports them."""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

import typer

from infra.errors import SettingsError
from pgt.config import (
    BASELINES,
    LaunchConfig,
    PredictConfig,
    TrackingConfig,
    TrainConfig,
    base_settings,
)
from pgt.options import USER_ERRORS, Typed, fail, one_line_errors, option_for, settings_options, typed_from
from pgt.recipes import RECIPES, recipe_label
from pgt.serving.config import ServeConfig
from preprocessing.config import APPLIED_SPLIT, FORMATS, SPLITS, SynthConfig
from preprocessing.engine import EngineConfig

# MLflow's download bars would bury a command's one line of output or error on stderr
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

app = typer.Typer(
    name="pgt",
    help="Next-location prediction with the Pointer Generator Transformer: preprocessing, training, tuning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def command(**kwargs: Any):
    """app.command, the function's user errors ending it in one line (one_line_errors)."""
    return lambda function: app.command(**kwargs)(one_line_errors(function))


InputFormat = Literal[FORMATS]
Recipe = Literal[tuple(RECIPES)]
ScoredSplit = Literal[(*SPLITS, APPLIED_SPLIT)]


@command()
@settings_options(EngineConfig)
def preprocess(
    input: str = typer.Option(..., "--input", help="A GeoLife folder, or a Parquet/CSV file of GPS points or staypoints; "
                                                   "a path, or its URI on object storage (s3://BUCKET/KEY, gs://)."),
    format: InputFormat = typer.Option(..., "--format", help="What --input holds."),
    out: str = typer.Option(..., "--out", help="Output folder: train/validation/test.parquet, quarantine.parquet, "
                                               "manifest.json; a path, or a URI (s3://BUCKET/FOLDER, gs://)."),
    config: Path | None = typer.Option(None, "--config", help="YAML, JSON or TOML file of PreprocessConfig settings."),
    force: bool = typer.Option(False, "--force", help="Recompute even if --out holds the result for this input and config."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar per stage."),
    fitted: str | None = typer.Option(None, "--fitted",
                                      help="Apply the preprocessing fitted in this folder (the output a model was trained "
                                           "on) to new data: its places, users and settings; writes latest.parquet "
                                           "(one sample per user) and evaluation.parquet."),
    typed: Typed = None,
) -> None:
    """Raw GPS points or staypoints -> Parquet sequences, by the reference protocol."""
    from infra.errors import InputError
    from infra.output import check_apart
    from infra.ray_session import check_ray_address
    from infra.storage import is_uri, without_query
    from preprocessing.config import load_config
    from preprocessing.pipeline import preprocess_fitted
    from preprocessing.stored import preprocess_stored

    engine = typed.of(EngineConfig)
    if engine.get("engine") != "ray":  # $RAY_ADDRESS is for Ray's engine only
        engine.pop("address", None)
    check_apart(out, {"--input": input, "--fitted": fitted, "--config": config})  # --work-dir is scratch space
    work_dir = engine.get("work_dir")
    if work_dir is not None and work_dir.exists() and not work_dir.is_dir():
        raise InputError(work_dir, "--work-dir is a file; it names a folder for the input's partitions")
    if fitted is not None:
        if config is not None:
            raise InputError(config, "--config cannot be combined with --fitted: the fitted run's settings apply")
        if engine.get("engine", "local") != "local" or engine.get("partitions") or "tile_deg" in engine:
            raise InputError(fitted, "--engine, --partitions and --tile-deg apply to a full run, not to --fitted "
                                     "(new data is scored in memory)")
        if is_uri(input) or is_uri(out) or is_uri(fitted):
            raise InputError(fitted, "--fitted reads and writes local files: give --input, --out and --fitted as "
                                     "paths")
        result = preprocess_fitted(input, format, fitted, out, force=force, progress=progress)
    else:
        engine = EngineConfig(**engine)
        if engine.engine == "ray":
            check_ray_address(engine.address)
        result = preprocess_stored(input, format, out, load_config(config), force=force, progress=progress,
                                   engine=engine)
    counts = result.manifest["counts"]
    if fitted is not None:
        samples = counts["samples"]
        typer.echo(
            f"{'reused' if result.reused else 'wrote'} {result.out_dir}: {counts['positionfixes_read']:,} rows read, "
            f"{counts['positionfixes_quarantined']:,} quarantined, {counts['staypoints']:,} staypoints "
            f"({counts['staypoints_on_fitted_places']:,} at fitted places, {counts['staypoints_on_new_places']:,} at "
            f"{counts['new_places']:,} new places), {counts['users']} users ({counts['users_unknown']} unknown), "
            f"samples latest {samples['latest']:,} / evaluation {samples['evaluation']:,}")
        return
    if min(counts["samples"].values()) == 0:
        typer.echo(f"warning: {without_query(result.out_dir)}: a split has no samples: {counts['users_kept']} users track "
                   f"more than {result.manifest['config']['min_tracking_days']} days, "
                   f"{result.manifest['details']['users_with_samples_in_all_splits']} have samples in all splits", err=True)
    state = "reused" if result.reused else "wrote"
    samples = counts["samples"]
    typer.echo(
        f"{state} {without_query(result.out_dir)}: {counts['positionfixes_read']:,} rows read, "
        f"{counts['positionfixes_quarantined']:,} quarantined, {counts['staypoints']:,} staypoints, "
        f"{counts['users_kept']} users kept, {counts['locations']:,} locations, samples "
        f"train {samples['train']:,} / validation {samples['validation']:,} / test {samples['test']:,}"
    )


@command()
@settings_options(SynthConfig)
def synth(
    out: Path = typer.Option(..., "--out", help="Parquet file of GPS points (user_id, tracked_at, latitude, longitude)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar over the people."),
    typed: Typed = None,
) -> None:
    """Write synthetic GPS points: homes, workplaces, routines, exploration, noise, gaps, phone-off days.
    A city k times larger: k times --users and --public-places, sqrt(k) times --city-radius-m."""
    import pyarrow.parquet as pq

    from infra.output import check_output_file
    from preprocessing.synthetic import SYNTHESISER, write_positionfixes

    check_output_file(out, SYNTHESISER, (".parquet",))
    cfg = SynthConfig(**typed.of(SynthConfig))
    write_positionfixes(cfg, out, progress=progress)
    typer.echo(f"wrote {out}: {pq.read_metadata(out).num_rows:,} GPS points of {cfg.users} users over {cfg.days} days")


def train_config(params: dict) -> TrainConfig:
    """`pgt train`'s TrainConfig from its parsed options (None: not typed): the recipe's settings, and over them the
    typed ones."""
    base = base_settings(params.get("recipe"), params.get("recipe_file"))
    return TrainConfig.from_recipe(base, **typed_from(params, TrainConfig).values, data_dir=str(params["data"]),
                                   out_dir=str(params["out"]))


def launch_config(params: dict) -> LaunchConfig:
    """`pgt train`'s LaunchConfig: the typed options over LaunchConfig's defaults."""
    return LaunchConfig(**typed_from(params, LaunchConfig).values)


@command()
@settings_options(TrainConfig, LaunchConfig, TrackingConfig, flags={"num_layers": ("--num-layers", "--layers")})
def train(
    data: str = typer.Option(..., "--data", help="A `pgt preprocess` output folder, or its URI (s3://BUCKET/FOLDER, "
                                              "gs://...) from which each node copies it."),
    out: str = typer.Option(..., "--out", help="Output folder: metrics.json, best.pt, checkpoints/ (and ray/ with "
                                                "--workers); with --workers, a URI too (s3://BUCKET/FOLDER, gs://...) "
                                                "where Ray keeps the checkpoints and the run's files go."),
    recipe: Recipe = typer.Option("paper", "--recipe",
                                  help="paper: the published settings (the defaults below). tuned: ours for GeoLife. "
                                       "ensemble: tuned as an ensemble of networks trained side by side "
                                       "(pgt.recipes.RECIPES). Options given on the command line override it."),
    recipe_file: Path | None = typer.Option(None, "--recipe-file",
                                            help="A YAML file of training settings (as a sweep writes its winner), "
                                                 "instead of --recipe; options given here override it."),
    typed: Typed = None,
) -> None:
    """Train a model (by default with the paper's settings, as published), log it to MLflow, write --out/metrics.json."""
    from infra.output import check_apart, check_output_entries
    from infra.ray_session import check_ray_address
    from infra.storage import is_uri
    from pgt.data.dataset import Vocab
    from pgt.tracking.registry import champion_verdict
    from pgt.tracking.runs import RECIPE_TAG, run_url
    from pgt.tracking.store import check_tracking_server, resolve_tracking_uri
    from pgt.training.compilation import check_compile_toolchain
    from pgt.training.report import EpochPrinter, print_metrics
    from pgt.training.run import run_training
    from pgt.training.train import OUTPUTS

    # a folder without manifest.json fails in Vocab.from_manifest with an InputError
    if not is_uri(data):  # what --data is comes first, then where --out may go (a URI: in run_training)
        Vocab.from_manifest(data)
    if not is_uri(out):  # a URI's storage is checked by the run, before any work (pgt.training.run.check_remote)
        check_apart(Path(out), {"--data": data})
        check_output_entries(Path(out), "pgt train", OUTPUTS)
    params = {**typed.values, "recipe": recipe, "recipe_file": recipe_file, "data": data, "out": out}
    cfg, launch = train_config(params), launch_config(params)
    tracking = TrackingConfig(**{**typed.of(TrackingConfig),
                                 "tracking_uri": resolve_tracking_uri(typed.values.get("tracking_uri"))},
                              source="pgt train", tags={RECIPE_TAG: recipe_label(recipe, recipe_file)})
    register = tracking.register
    if register and cfg.model in BASELINES:
        raise SettingsError(f"--register needs a neural model; {cfg.model} has no checkpoint to register")
    if register and cfg.fused_seeds > 1:
        raise SettingsError("--register needs one model; --fused-seeds trains several seeds' networks for their "
                            "evidence and writes no best.pt: register a run of one seed")
    check_tracking_server(tracking.tracking_uri)  # services answer before any work, or one line says what to start
    if launch.workers:
        check_ray_address(launch.address or os.environ.get("RAY_ADDRESS"))
    if cfg.compile_model:
        check_compile_toolchain()  # before any data is read: the run would fail at its first step
    result = run_training(cfg, launch, tracking, on_epoch=EpochPrinter())
    print_metrics(result.to_dict())
    typer.echo(f"wrote metrics.json and best.pt to {result.kept}" if is_uri(out) else f"wrote {Path(out) / 'metrics.json'}")
    typer.echo(f"mlflow: {run_url(result.mlflow.tracking_uri, result.mlflow.run_id)}")
    registered = result.mlflow.registered
    if registered:
        typer.echo(f"registered {registered['name']} version {registered['version']} "
                   f"(strict validation acc@1 {registered['validation_strict_acc@1']:.2f}): {champion_verdict(registered)}")


@command()
def evaluate(
    model: str = typer.Option(..., "--model", help="An MLflow model URI: models:/NAME@champion, runs:/RUN_ID/model, ..."),
    data: str = typer.Option(..., "--data", help="A `pgt preprocess` folder, or its URI (s3://, gs://): its test split "
                                              "is scored."),
    split: ScoredSplit = typer.Option("test", "--split", help="test, validation or train; evaluation for an output of "
                                                              "`pgt preprocess --fitted`."),
    tracking_uri: str | None = option_for(TrackingConfig, "tracking_uri"),
) -> None:
    """Load a logged or registered model and print its metrics on a split as JSON."""
    from pgt.data.fetch import local_data
    from pgt.serving.evaluate import evaluate_model

    try:
        metrics = evaluate_model(model, local_data(data), split, tracking_uri)
    except USER_ERRORS:
        raise  # one line, by one_line_errors
    except Exception as exc:  # MLflow's errors (unknown model, alias, run) in one line
        fail(f"{model}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    json.dump(metrics, sys.stdout, indent=2)
    typer.echo()


@command()
@settings_options(PredictConfig)
def predict(
    model: str = typer.Option(..., "--model", help="An MLflow model URI: models:/NAME@champion, runs:/RUN_ID/model, ..."),
    input: Path = typer.Option(..., "--input", help="Raw GPS points or staypoints (with --format), or Parquet of sequences "
                                                    "in the columns of a `pgt preprocess` split."),
    format: InputFormat | None = typer.Option(None, "--format",
                                              help="What --input holds, as for `pgt preprocess`; it then goes through "
                                                   "the model's own fitted preprocessing. Without it: sequences."),
    out: Path = typer.Option(..., "--out", help="With --format: .parquet or .csv, one row per user (and evaluation "
                                                "sample) and rank, with the place's coordinates. Else Parquet: the "
                                                "input's row, top-k locations and probabilities."),
    tracking_uri: str | None = option_for(TrackingConfig, "tracking_uri"),
    typed: Typed = None,
) -> None:
    """Where each person goes next: the top-k next places, with coordinates and probabilities."""
    from infra.process import disk_problem
    from pgt.serving.inference import prediction_time
    from pgt.serving.predict import predict_file, predict_raw, predict_summary

    try:
        wanted = PredictConfig(**typed.of(PredictConfig))
        top_k, at = wanted.top_k, wanted.at
        if at is not None and format is None:
            raise SettingsError("--at applies to raw GPS points or staypoints (--format); sequences carry their own recency")
        if format is not None:
            result = predict_raw(model, input, format, out, top_k, tracking_uri, prediction_time(at))
            if result.model_uri != model:  # an alias: the version that answered, also in the output's metadata
                typer.echo(f"{model} is {result.model_uri}")
            typer.echo(predict_summary(result, top_k))
            if result.counts["samples"]["latest"] == 0:
                typer.echo(f"warning: {input}: no user has a recent history to predict from (at least "
                           "min_history_staypoints visits at places in the history_days days before their last "
                           "visit); give more days of data", err=True)
            return
        rows, answered = predict_file(model, input, out, top_k, tracking_uri)
        if answered != model:
            typer.echo(f"{model} is {answered}")
    except USER_ERRORS:
        raise  # one line, by one_line_errors
    except Exception as exc:  # a full or read-only disk is the output's problem, not the model's
        if disk_problem(exc, str(out)) is not None:
            raise
        fail(f"{model}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    typer.echo(f"wrote {out}: top-{top_k} locations for {rows:,} sequences")


@command()
@settings_options(ServeConfig)
def serve(
    model: str = typer.Option(..., "--model", help="An MLflow model URI: models:/NAME@champion, runs:/RUN_ID/model, ..."),
    typed: Typed = None,
) -> None:
    """Serve a logged model over HTTP with MLflow's scoring protocol (POST /invocations), with a request size limit,
    one-line 400s for bad requests and a warm model."""
    from pgt.serving.models import check_model_uri
    from pgt.serving.server import check_port_free
    from pgt.serving.server import serve as run

    config = ServeConfig(model_uri=model, **typed.of(ServeConfig))
    check_port_free(config.host, config.port)
    check_model_uri(config.model_uri, config.tracking_uri)
    run(config)


@command()
def explain(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="best.pt or checkpoints/epoch_NNN/checkpoint.pt."),
    data: str = typer.Option(..., "--data", help="The `pgt preprocess` folder the model was trained on, or its URI "
                                              "(s3://, gs://)."),
    out: Path = typer.Option(..., "--out", help="Folder for the PNGs."),
    samples: int = typer.Option(6, "--samples", min=1, help="Test samples in the attention plot."),
) -> None:
    """Plots of a trained model: pointer attention, gate, position bias, attention entropy."""
    from pgt.data.fetch import local_data
    from pgt.serving.explain import explain as run

    written = run(checkpoint, local_data(data), out, samples=samples)
    for path in written:
        typer.echo(f"wrote {path}")


@command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    cluster: str = typer.Option(..., "--cluster", help="The Ray head's Jobs API (its dashboard): http://HEAD:8265."),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE for the job's environment (repeatable); the storage "
                                                    "keys and endpoints and the MLflow variables set here travel "
                                                    "with it anyway (infra.jobs.FORWARDED)."),
    args: list[str] = typer.Argument(..., help="The pgt command to run on the cluster, after --: "
                                               "pgt submit --cluster URL -- train --data s3://... --out s3://..."),
) -> None:
    """Run a pgt command on a Ray cluster as a Ray Job: its logs here as they come, its end as the exit code (0
    succeeded, 1 failed), and Ctrl+C stops the job."""
    from infra.jobs import job_environment, run_job

    if args[0] == "submit" or args[0].startswith("-"):
        raise SettingsError(f"pgt submit -- {' '.join(args[:2])}: expected a pgt command after -- (train, tune, "
                            "preprocess, evaluate, ...)")
    outcome = run_job(cluster, args, job_environment(env), write=typer.echo)
    typer.echo(f"{outcome.job_id}: {outcome.status}", err=outcome.exit_code != 0)
    raise typer.Exit(outcome.exit_code)


@command()
def manifest(folder: Path = typer.Argument(..., help="A `pgt preprocess` output folder.")) -> None:
    """Print the counts and vocabulary sizes of a preprocessed folder."""
    from preprocessing.output import is_own_manifest, read_manifest

    data = read_manifest(folder)
    if data is None:
        fail(f"{folder}: no manifest.json; expected a `pgt preprocess` output folder")
    if not is_own_manifest(data) or not isinstance(data.get("counts"), dict) or not isinstance(data.get("vocab"), dict):
        fail(f"{folder / 'manifest.json'}: not the manifest of a `pgt preprocess` output (no counts and vocab)")
    json.dump({"counts": data["counts"], "vocab": data["vocab"]}, sys.stdout, indent=2)
    typer.echo()


def _add_commands_of_installed_packages() -> None:
    """Commands that packages above pgt register under the entry-point group "pgt.commands" (`pgt tune`)."""
    for command in entry_points(group="pgt.commands"):
        app.command(name=command.name)(one_line_errors(command.load()))


_add_commands_of_installed_packages()


def main() -> None:
    """The `pgt` command as installed: SIGTERM and SIGHUP stop a command as Ctrl+C does (its checkpoint kept
    consistent, its MLflow run marked KILLED, Ray stopped), and it exits 128 + the signal (130, 143, 129); a full,
    read-only or forbidden disk is one line naming the path, exit 1. A command that ends, however it ends but by
    a bug's traceback, exits without the interpreter's teardown (infra.process.exit_process): seconds of freeing
    torch, Ray and MLflow's modules one by one that nobody waits for."""
    import signal

    from infra.process import disk_problem, exit_process, handled_signals

    with handled_signals() as caught:
        try:
            app()
            code: object = 0
        except SystemExit as exit_:
            code = exit_.code
            if caught.received is not None:
                typer.echo(f"stopped by {signal.Signals(caught.received).name}", err=True)
                code = caught.exit_code
        except Exception as exc:
            args = sys.argv[1:]
            out = args[args.index("--out") + 1] if "--out" in args[:-1] else None  # the path a command writes
            line = disk_problem(exc, out)
            if line is None:
                raise
            typer.echo(f"error: {line}", err=True)
            code = 1
    exit_process(code)


if __name__ == "__main__":
    main()

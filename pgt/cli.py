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
from typing import Literal

import typer

from pgt.config import (
    BASELINES,
    DATA_ENGINES,
    MAX_TOP_K,
    MODELS,
    RECIPES,
    REFIT_EPOCHS,
    SELECT_ON,
    TOP_K,
    LaunchConfig,
    ServeConfig,
    TrackingConfig,
    TrainConfig,
    base_settings,
    recipe_label,
)
from pgt.options import default_of, fail, given, option_for
from preprocessing.config import ANCHORS, APPLIED_SPLIT, FORMATS, SPLITS, SynthConfig
from preprocessing.engine import ENGINES, EngineConfig

# MLflow's download bars would bury a command's one line of output or error on stderr
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

app = typer.Typer(
    name="pgt",
    help="Next-location prediction with the Pointer Generator Transformer: preprocessing, training, tuning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


InputFormat = Literal[FORMATS]
PreprocessEngine = Literal[ENGINES]
Model = Literal[MODELS]
Recipe = Literal[tuple(RECIPES)]
SelectOn = Literal[SELECT_ON]
Anchor = Literal[ANCHORS]
DataEngine = Literal[DATA_ENGINES]
RefitEpochs = Literal[REFIT_EPOCHS]
ScoredSplit = Literal[(*SPLITS, APPLIED_SPLIT)]


@app.command()
def preprocess(
    input: Path = typer.Option(..., "--input", help="A GeoLife folder, or a Parquet/CSV file of GPS points or staypoints."),
    format: InputFormat = typer.Option(..., "--format", help="What --input holds."),
    out: Path = typer.Option(..., "--out",
                             help="Output folder: train/validation/test.parquet, quarantine.parquet, manifest.json."),
    config: Path | None = typer.Option(None, "--config", help="YAML, JSON or TOML file of PreprocessConfig settings."),
    force: bool = typer.Option(False, "--force", help="Recompute even if --out holds the result for this input and config."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar per stage."),
    fitted: Path | None = typer.Option(None, "--fitted",
                                       help="Apply the preprocessing fitted in this folder (the output a model was trained "
                                            "on) to new data: its places, users and settings; writes latest.parquet "
                                            "(one sample per user) and evaluation.parquet."),
    engine: PreprocessEngine | None = option_for(EngineConfig, "engine"),
    partitions: int | None = option_for(EngineConfig, "partitions"),
    tile_deg: float | None = option_for(EngineConfig, "tile_deg"),
    address: str | None = option_for(EngineConfig, "address", envvar="RAY_ADDRESS"),
    work_dir: Path | None = option_for(EngineConfig, "work_dir"),
) -> None:
    """Raw GPS points or staypoints -> Parquet sequences, by the reference protocol."""
    from preprocessing.config import load_config
    from preprocessing.engine import check_ray_address
    from preprocessing.errors import InputError
    from preprocessing.output import check_apart
    from preprocessing.pipeline import preprocess as run
    from preprocessing.pipeline import preprocess_fitted

    try:
        check_apart(out, {"--input": input, "--fitted": fitted, "--config": config})  # --work-dir is scratch space
        if work_dir is not None and work_dir.exists() and not work_dir.is_dir():
            raise InputError(work_dir, "--work-dir is a file; it names a folder for the input's partitions")
        if fitted is not None:
            if config is not None:
                raise InputError(config, "--config cannot be combined with --fitted: the fitted run's settings apply")
            if engine not in (None, "local") or partitions or tile_deg is not None:
                raise InputError(fitted, "--engine, --partitions and --tile-deg apply to a full run, not to --fitted "
                                         "(new data is scored in memory)")
            result = preprocess_fitted(input, format, fitted, out, force=force, progress=progress)
        else:
            typed = given(locals(), "engine", "partitions", "tile_deg", "work_dir")
            if typed.get("engine") == "ray" and address:
                typed["address"] = address
            if typed.get("engine") == "ray":
                check_ray_address(address)
            result = run(input, format, out, load_config(config), force=force, progress=progress,
                         engine=EngineConfig(**typed))
    except (InputError, ValueError) as exc:
        fail(str(exc))
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
        typer.echo(f"warning: {result.out_dir}: a split has no samples: {counts['users_kept']} users track more than "
                   f"{result.manifest['config']['min_tracking_days']} days, "
                   f"{result.manifest['details']['users_with_samples_in_all_splits']} have samples in all splits", err=True)
    state = "reused" if result.reused else "wrote"
    samples = counts["samples"]
    typer.echo(
        f"{state} {result.out_dir}: {counts['positionfixes_read']:,} rows read, "
        f"{counts['positionfixes_quarantined']:,} quarantined, {counts['staypoints']:,} staypoints, "
        f"{counts['users_kept']} users kept, {counts['locations']:,} locations, samples "
        f"train {samples['train']:,} / validation {samples['validation']:,} / test {samples['test']:,}"
    )


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", help="Parquet file of GPS points (user_id, tracked_at, latitude, longitude)."),
    users: int | None = option_for(SynthConfig, "users"),
    days: int | None = option_for(SynthConfig, "days"),
    seed: int | None = option_for(SynthConfig, "seed"),
    public_places: int | None = option_for(SynthConfig, "public_places"),
    city_radius_m: float | None = option_for(SynthConfig, "city_radius_m"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar over the people."),
) -> None:
    """Write synthetic GPS points: homes, workplaces, routines, exploration, noise, gaps, phone-off days.
    A city k times larger: k times --users and --public-places, sqrt(k) times --city-radius-m."""
    import pyarrow.parquet as pq

    from preprocessing.errors import InputError
    from preprocessing.output import check_output_file
    from preprocessing.synthetic import SYNTHESISER, write_positionfixes

    try:
        check_output_file(out, SYNTHESISER, (".parquet",))
    except InputError as exc:
        fail(str(exc))
    cfg = SynthConfig(**given(locals(), "users", "days", "seed", "public_places", "city_radius_m"))
    write_positionfixes(cfg, out, progress=progress)
    typer.echo(f"wrote {out}: {pq.read_metadata(out).num_rows:,} GPS points of {cfg.users} users over {cfg.days} days")


# TrainConfig fields the command line may set; what is not typed comes from the recipe, then the defaults
TRAIN_OPTIONS = ("model", "epochs", "seed", "batch_size", "lr", "d_model", "nhead", "num_layers", "dim_feedforward",
                 "dropout", "patience", "select_on", "unseen_slots", "slot_identity", "new_place_weight",
                 "previous_location", "visit_relations", "relation_inputs", "relation_order", "memory_places",
                 "memory_gate", "members",
                 "weight_average", "simulate_unseen", "anchor", "refit", "refit_epochs", "resume", "threads", "resident_data",
                 "static_width", "compile_model", "capture_step", "fused_seeds")
LAUNCH_OPTIONS = ("workers", "max_failures", "data_engine")


def train_config(params: dict) -> TrainConfig:
    """`pgt train`'s TrainConfig from its parsed options: the recipe's settings, and over them the typed ones."""
    typed = given(params, *TRAIN_OPTIONS)
    if params.get("known_fraction") is not None:
        typed["known_fraction_min"], typed["known_fraction_max"] = params["known_fraction"]
    base = base_settings(params.get("recipe"), params.get("recipe_file"))
    return TrainConfig.from_recipe(base, **typed, data_dir=str(params["data"]),
                                   out_dir=str(params["out"]))


def launch_config(params: dict) -> LaunchConfig:
    """`pgt train`'s LaunchConfig: the typed options over LaunchConfig's defaults."""
    typed = given(params, *LAUNCH_OPTIONS, "address")
    if params.get("gpu") is not None:
        typed["use_gpu"] = params["gpu"]
    return LaunchConfig(**typed)


@app.command()
def train(
    data: Path = typer.Option(..., "--data", help="A `pgt preprocess` output folder."),
    out: Path = typer.Option(..., "--out", help="Output folder: metrics.json, best.pt, checkpoints/ (and ray/ with --workers)."),
    recipe: Recipe = typer.Option("paper", "--recipe",
                                  help="paper: the published settings (the defaults below). tuned: ours for GeoLife. "
                                       "ensemble: tuned as an ensemble of networks trained side by side "
                                       "(pgt.config.RECIPES). Options given on the command line override it."),
    recipe_file: Path | None = typer.Option(None, "--recipe-file",
                                            help="A YAML file of training settings (as a sweep writes its winner), "
                                                 "instead of --recipe; options given here override it."),
    model: Model | None = option_for(TrainConfig, "model"),
    epochs: int | None = option_for(TrainConfig, "epochs"),
    seed: int | None = option_for(TrainConfig, "seed"),
    batch_size: int | None = option_for(TrainConfig, "batch_size"),
    lr: float | None = option_for(TrainConfig, "lr"),
    d_model: int | None = option_for(TrainConfig, "d_model"),
    nhead: int | None = option_for(TrainConfig, "nhead"),
    num_layers: int | None = option_for(TrainConfig, "num_layers", "--layers"),
    dim_feedforward: int | None = option_for(TrainConfig, "dim_feedforward"),
    dropout: float | None = option_for(TrainConfig, "dropout"),
    patience: int | None = option_for(TrainConfig, "patience"),
    select_on: SelectOn | None = option_for(TrainConfig, "select_on"),
    unseen_slots: bool | None = option_for(TrainConfig, "unseen_slots", "--unseen-slots/--no-unseen-slots"),
    slot_identity: bool | None = option_for(TrainConfig, "slot_identity", "--slot-identity/--no-slot-identity"),
    new_place_weight: float | None = option_for(TrainConfig, "new_place_weight"),
    previous_location: bool | None = option_for(TrainConfig, "previous_location", "--previous-location/--no-previous-location"),
    visit_relations: bool | None = option_for(TrainConfig, "visit_relations", "--visit-relations/--no-visit-relations"),
    relation_inputs: bool | None = option_for(TrainConfig, "relation_inputs", "--relation-inputs/--no-relation-inputs"),
    relation_order: int | None = option_for(TrainConfig, "relation_order"),
    memory_places: int | None = option_for(TrainConfig, "memory_places"),
    memory_gate: bool | None = option_for(TrainConfig, "memory_gate", "--memory-gate/--no-memory-gate"),
    members: int | None = option_for(TrainConfig, "members"),
    weight_average: float | None = option_for(TrainConfig, "weight_average"),
    simulate_unseen: bool | None = option_for(TrainConfig, "simulate_unseen", "--simulate-unseen/--no-simulate-unseen"),
    anchor: Anchor | None = option_for(TrainConfig, "anchor"),
    known_fraction: tuple[float, float] | None = typer.Option(
        None, "--known-fraction", show_default=(f"{default_of(TrainConfig, 'known_fraction_min')} "
                                                f"{default_of(TrainConfig, 'known_fraction_max')}"),
        help="With --simulate-unseen: the cutoff's range, as fractions of the user's days before each sample."),
    refit: bool | None = option_for(TrainConfig, "refit", "--refit/--no-refit"),
    refit_epochs: RefitEpochs | None = option_for(TrainConfig, "refit_epochs"),
    resume: bool | None = option_for(TrainConfig, "resume", "--resume/--no-resume"),
    threads: int | None = option_for(TrainConfig, "threads"),
    resident_data: bool | None = option_for(TrainConfig, "resident_data", "--resident-data/--no-resident-data"),
    static_width: int | None = option_for(TrainConfig, "static_width"),
    compile_model: bool | None = option_for(TrainConfig, "compile_model", "--compile-model/--no-compile-model"),
    capture_step: bool | None = option_for(TrainConfig, "capture_step", "--capture-step/--no-capture-step"),
    fused_seeds: int | None = option_for(TrainConfig, "fused_seeds"),
    workers: int | None = option_for(LaunchConfig, "workers"),
    gpu: bool | None = option_for(LaunchConfig, "use_gpu", "--gpu/--no-gpu"),
    address: str | None = option_for(LaunchConfig, "address", envvar="RAY_ADDRESS"),
    max_failures: int | None = option_for(LaunchConfig, "max_failures"),
    data_engine: DataEngine | None = option_for(LaunchConfig, "data_engine"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                            help="MLflow tracking URI; default a SQLite store under .state/mlflow."),
    experiment: str | None = typer.Option(None, "--experiment", show_default=default_of(TrackingConfig, "experiment"),
                                          help="MLflow experiment."),
    register: str | None = typer.Option(None, "--register", help="Register the best checkpoint under this model name."),
) -> None:
    """Train a model (by default with the paper's settings, as published), log it to MLflow, write --out/metrics.json."""
    from pgt.data import Vocab
    from pgt.distributed import run_training
    from pgt.registry import champion_verdict
    from pgt.report import EpochPrinter, print_metrics
    from pgt.tracking import RECIPE_TAG, check_tracking_server, resolve_tracking_uri, run_url
    from pgt.train import OUTPUTS, check_compile_toolchain
    from preprocessing.engine import check_ray_address
    from preprocessing.errors import InputError
    from preprocessing.output import check_apart, check_output_entries

    try:  # a folder without manifest.json fails in Vocab.from_manifest with a FileNotFoundError
        Vocab.from_manifest(data)  # what --data is comes first, then where --out may go
        check_apart(out, {"--data": data})
        check_output_entries(out, "pgt train", OUTPUTS)
        cfg, launch = train_config(locals()), launch_config(locals())
        if register and cfg.model in BASELINES:
            raise ValueError(f"--register needs a neural model; {cfg.model} has no checkpoint to register")
        if register and cfg.fused_seeds > 1:
            raise ValueError("--register needs one model; --fused-seeds trains several seeds' networks for their "
                             "evidence and writes no best.pt: register a run of one seed")
        tracking = TrackingConfig(resolve_tracking_uri(tracking_uri), register=register, source="pgt train",
                                  tags={RECIPE_TAG: recipe_label(recipe, recipe_file)},
                                  **given(locals(), "experiment"))
        check_tracking_server(tracking.tracking_uri)  # services answer before any work, or one line says what to start
        if launch.workers:
            check_ray_address(launch.address or os.environ.get("RAY_ADDRESS"))
        if cfg.compile_model:
            check_compile_toolchain()  # before any data is read: the run would fail at its first step
        result = run_training(cfg, launch, tracking, on_epoch=EpochPrinter())
    except (ValueError, FileNotFoundError, InputError) as exc:
        fail(str(exc))
    print_metrics(result)
    typer.echo(f"wrote {out / 'metrics.json'}")
    typer.echo(f"mlflow: {run_url(result['mlflow']['tracking_uri'], result['mlflow']['run_id'])}")
    registered = result["mlflow"].get("registered")
    if registered:
        typer.echo(f"registered {registered['name']} version {registered['version']} "
                   f"(strict validation acc@1 {registered['validation_strict_acc@1']:.2f}): {champion_verdict(registered)}")


@app.command()
def evaluate(
    model: str = typer.Option(..., "--model", help="An MLflow model URI: models:/NAME@champion, runs:/RUN_ID/model, ..."),
    data: Path = typer.Option(..., "--data", help="A `pgt preprocess` folder (its test split is scored)."),
    split: ScoredSplit = typer.Option("test", "--split", help="test, validation or train; evaluation for an output of "
                                                              "`pgt preprocess --fitted`."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI"),
) -> None:
    """Load a logged or registered model and print its metrics on a split as JSON."""
    from pgt.evaluate import evaluate_model

    try:
        metrics = evaluate_model(model, data, split, tracking_uri)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    except Exception as exc:  # MLflow's errors (unknown model, alias, run) in one line
        fail(f"{model}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    json.dump(metrics, sys.stdout, indent=2)
    typer.echo()


@app.command()
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
    top_k: int = typer.Option(TOP_K, "--top-k", help=f"Places per prediction, 1 to {MAX_TOP_K}."),
    at: str | None = typer.Option(None, "--at", help="With --format: the moment the prediction is for (ISO 8601, UTC "
                                                      "unless it names an offset); recency and the weekday count from "
                                                      "its day. Default: the end of each user's last visit."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI"),
) -> None:
    """Where each person goes next: the top-k next places, with coordinates and probabilities."""
    from pgt.inference import prediction_time
    from pgt.predict import predict_file, predict_raw, predict_summary
    from preprocessing.errors import InputError
    from preprocessing.process import disk_problem

    try:
        if at is not None and format is None:
            raise ValueError("--at applies to raw GPS points or staypoints (--format); sequences carry their own recency")
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
    except (ValueError, FileNotFoundError, InputError) as exc:
        fail(str(exc))
    except Exception as exc:  # a full or read-only disk is the output's problem, not the model's
        if disk_problem(exc, str(out)) is not None:
            raise
        fail(f"{model}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    typer.echo(f"wrote {out}: top-{top_k} locations for {rows:,} sequences")


@app.command()
def serve(
    model: str = typer.Option(..., "--model", help="An MLflow model URI: models:/NAME@champion, runs:/RUN_ID/model, ..."),
    host: str | None = option_for(ServeConfig, "host"),
    port: int | None = option_for(ServeConfig, "port"),
    workers: int | None = option_for(ServeConfig, "workers"),
    max_request_mb: float | None = option_for(ServeConfig, "max_request_mb"),
    max_in_flight: int | None = option_for(ServeConfig, "max_in_flight"),
    max_buffered_mb: float | None = option_for(ServeConfig, "max_buffered_mb"),
    tracking_uri: str | None = option_for(ServeConfig, "tracking_uri", envvar="MLFLOW_TRACKING_URI"),
    torch_threads: int | None = option_for(ServeConfig, "torch_threads"),
) -> None:
    """Serve a logged model over HTTP with MLflow's scoring protocol (POST /invocations), with a request size limit,
    one-line 400s for bad requests and a warm model."""
    from pgt.serving import check_port_free
    from pgt.serving import serve as run
    from pgt.tracking import check_model_uri

    try:
        config = ServeConfig(model_uri=model, tracking_uri=tracking_uri,
                             **given(locals(), "host", "port", "workers", "max_request_mb", "max_in_flight",
                                     "max_buffered_mb", "torch_threads"))
        check_port_free(config.host, config.port)
        check_model_uri(config.model_uri, config.tracking_uri)
    except ValueError as exc:
        fail(str(exc))
    run(config)


@app.command()
def explain(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="best.pt or checkpoints/epoch_NNN/checkpoint.pt."),
    data: Path = typer.Option(..., "--data", help="The `pgt preprocess` folder the model was trained on."),
    out: Path = typer.Option(..., "--out", help="Folder for the PNGs."),
    samples: int = typer.Option(6, "--samples", min=1, help="Test samples in the attention plot."),
) -> None:
    """Plots of a trained model: pointer attention, gate, position bias, attention entropy."""
    from pgt.explain import explain as run
    from preprocessing.errors import InputError

    try:
        written = run(checkpoint, data, out, samples=samples)
    except (ValueError, FileNotFoundError, InputError) as exc:
        fail(str(exc))
    for path in written:
        typer.echo(f"wrote {path}")


@app.command()
def manifest(folder: Path = typer.Argument(..., help="A `pgt preprocess` output folder.")) -> None:
    """Print the counts and vocabulary sizes of a preprocessed folder."""
    from preprocessing.errors import InputError
    from preprocessing.output import is_own_manifest, read_manifest

    try:
        data = read_manifest(folder)
    except InputError as exc:
        fail(str(exc))
    if data is None:
        fail(f"{folder}: no manifest.json; expected a `pgt preprocess` output folder")
    if not is_own_manifest(data) or not isinstance(data.get("counts"), dict) or not isinstance(data.get("vocab"), dict):
        fail(f"{folder / 'manifest.json'}: not the manifest of a `pgt preprocess` output (no counts and vocab)")
    json.dump({"counts": data["counts"], "vocab": data["vocab"]}, sys.stdout, indent=2)
    typer.echo()


def _add_commands_of_installed_packages() -> None:
    """Commands that packages above pgt register under the entry-point group "pgt.commands" (`pgt tune`)."""
    for command in entry_points(group="pgt.commands"):
        app.command(name=command.name)(command.load())


_add_commands_of_installed_packages()


def main() -> None:
    """The `pgt` command as installed: SIGTERM and SIGHUP stop a command as Ctrl+C does (its checkpoint kept
    consistent, its MLflow run marked KILLED, Ray stopped), and it exits 128 + the signal (130, 143, 129); a full,
    read-only or forbidden disk is one line naming the path, exit 1."""
    import signal

    from preprocessing.process import disk_problem, handled_signals

    with handled_signals() as caught:
        try:
            app()
        except SystemExit:
            if caught.received is not None:
                typer.echo(f"stopped by {signal.Signals(caught.received).name}", err=True)
                raise SystemExit(caught.exit_code) from None
            raise
        except Exception as exc:
            args = sys.argv[1:]
            out = args[args.index("--out") + 1] if "--out" in args[:-1] else None  # the path a command writes
            line = disk_problem(exc, out)
            if line is None:
                raise
            typer.echo(f"error: {line}", err=True)
            raise SystemExit(1) from None


if __name__ == "__main__":
    main()

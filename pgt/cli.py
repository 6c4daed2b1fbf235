"""The `pgt` command. Heavy modules (torch, Ray, MLflow) are imported inside the commands that need them."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path

import typer

app = typer.Typer(
    name="pgt",
    help="Next-location prediction with the Pointer Generator Transformer: preprocessing, training, tuning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class InputFormat(str, Enum):
    geolife_plt = "geolife-plt"
    positionfixes = "positionfixes"
    staypoints = "staypoints"


class DataEngine(str, Enum):
    memory = "memory"
    ray = "ray"


class PreprocessEngine(str, Enum):
    local = "local"
    ray = "ray"


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the option `name` was typed (not left at its default). Compared by name: typer may carry
    its own copy of click's ParameterSource enum."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _fail(message: str) -> None:
    """One line on stderr, exit code 2, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


@app.command()
def preprocess(
    input: Path = typer.Option(..., "--input", help="A GeoLife folder, or a Parquet/CSV file of GPS points or staypoints."),
    format: InputFormat = typer.Option(..., "--format", help="What --input holds."),
    out: Path = typer.Option(..., "--out", help="Output folder: train/validation/test.parquet, quarantine.parquet, manifest.json."),
    config: Path | None = typer.Option(None, "--config", help="YAML, JSON or TOML file of PreprocessConfig settings."),
    force: bool = typer.Option(False, "--force", help="Recompute even if --out holds the result for this input and config."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar per stage."),
    fitted: Path | None = typer.Option(None, "--fitted",
                                       help="Apply the preprocessing fitted in this folder (the output a model was trained "
                                            "on) to new data: its places, users and settings; writes latest.parquet "
                                            "(one sample per user) and evaluation.parquet."),
    engine: PreprocessEngine = typer.Option(PreprocessEngine.local, "--engine",
                                            help="local: partitions one after another in this process; ray: as Ray "
                                                 "tasks on a local Ray or the cluster at --address. Same outputs."),
    partitions: int = typer.Option(0, "--partitions", min=0,
                                   help="Users hashed into this many partitions; memory follows the largest. "
                                        "0 = one per ~4M input rows."),
    tile_deg: float | None = typer.Option(None, "--tile-deg", min=0.0,
                                          help="DBSCAN by spatial tiles of this many degrees (0 = whole-data DBSCAN; "
                                               "default: 0.05 past 200,000 staypoints); the same labels either way."),
    address: str | None = typer.Option(None, "--address", envvar="RAY_ADDRESS",
                                       help="--engine ray: the Ray cluster to run on (host:port or auto); default a local Ray."),
    work_dir: Path | None = typer.Option(None, "--work-dir",
                                         help="Where the input's partitions are written (default a temporary folder); "
                                              "on a multi-machine Ray cluster, a path every node can read, like --input."),
) -> None:
    """Raw GPS points or staypoints -> Parquet sequences, by the reference protocol (SPEC §2)."""
    from preprocessing.config import load_config
    from preprocessing.engine import EngineConfig
    from preprocessing.errors import InputError
    from preprocessing.pipeline import preprocess as run
    from preprocessing.pipeline import preprocess_fitted

    try:
        if fitted is not None:
            if config is not None:
                raise InputError(config, "--config cannot be combined with --fitted: the fitted run's settings apply")
            if engine.value != "local" or partitions or tile_deg is not None:
                raise InputError(fitted, "--engine, --partitions and --tile-deg apply to a full run, not to --fitted "
                                         "(new data is scored in memory)")
            result = preprocess_fitted(input, format.value, fitted, out, force=force, progress=progress)
        else:
            where = EngineConfig(engine.value, partitions, tile_deg, address if engine.value == "ray" else None, work_dir)
            result = run(input, format.value, out, load_config(config), force=force, progress=progress, engine=where)
    except InputError as exc:
        _fail(str(exc))
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
    users: int = typer.Option(50, "--users", min=1, help="People to simulate."),
    days: int = typer.Option(120, "--days", min=1, help="Days of tracking per person."),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed writes the same file."),
    out: Path = typer.Option(..., "--out", help="Parquet file of GPS points (user_id, tracked_at, latitude, longitude)."),
    public_places: int = typer.Option(400, "--public-places", min=1, help="Shops, parks and restaurants everybody shares."),
    city_radius_m: float = typer.Option(12_000.0, "--city-radius-m", min=100.0,
                                        help="Homes and public places lie within about this radius (m)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar over the people."),
) -> None:
    """Write synthetic GPS points: homes, workplaces, routines, exploration, noise, gaps, phone-off days.
    A city k times larger: k times --users and --public-places, sqrt(k) times --city-radius-m."""
    import pyarrow.parquet as pq

    from preprocessing.synthetic import SynthConfig, write_positionfixes

    if out.suffix != ".parquet":
        _fail(f"{out}: --out must name a .parquet file")
    write_positionfixes(SynthConfig(users=users, days=days, seed=seed, public_places=public_places,
                                    city_radius_m=city_radius_m), out, progress=progress)
    typer.echo(f"wrote {out}: {pq.read_metadata(out).num_rows:,} GPS points of {users} users over {days} days")


class ModelName(str, Enum):
    pgt = "pgt"
    mhsa = "mhsa"
    pointer = "pointer"
    lstm_pg = "lstm-pg"
    markov = "markov"
    most_frequent = "most-frequent"


class RecipeName(str, Enum):
    paper = "paper"
    tuned = "tuned"


class SelectOn(str, Enum):
    acc1 = "acc@1"
    strict_acc1 = "strict_acc@1"
    loss = "loss"


class Objective(str, Enum):
    strict_acc1 = "strict_acc@1"
    acc1 = "acc@1"


@app.command()
def train(
    ctx: typer.Context,
    data: Path = typer.Option(..., "--data", help="A `pgt preprocess` output folder."),
    model: ModelName = typer.Option(ModelName.pgt, "--model", help="The model or baseline to train."),
    recipe: RecipeName = typer.Option(RecipeName.paper, "--recipe",
                                      help="paper: SPEC §3.8's settings (the defaults below). tuned: ours for GeoLife "
                                           "(pgt.train.RECIPES). Options given on the command line override it."),
    out: Path = typer.Option(..., "--out", help="Output folder: metrics.json, best.pt, checkpoints/ (and ray/ with --workers)."),
    epochs: int = typer.Option(50, "--epochs", min=1, help="At most this many epochs (early stopping may end sooner)."),
    seed: int = typer.Option(42, "--seed"),
    batch_size: int = typer.Option(128, "--batch-size", min=1, help="Global batch, split over the workers."),
    lr: float = typer.Option(6.5e-4, "--lr", help="Peak learning rate."),
    d_model: int = typer.Option(64, "--d-model"),
    nhead: int = typer.Option(4, "--nhead"),
    num_layers: int = typer.Option(2, "--layers"),
    dim_feedforward: int = typer.Option(128, "--dim-feedforward"),
    dropout: float = typer.Option(0.15, "--dropout"),
    patience: int = typer.Option(5, "--patience", help="Epochs without a better validation score before stopping."),
    select_on: SelectOn = typer.Option("acc@1", "--select-on",
                                       help="Validation score for early stopping and the best epoch: acc@1 (protocol), "
                                            "strict_acc@1 (the exact place) or loss."),
    unseen_slots: bool = typer.Option(False, "--unseen-slots/--no-unseen-slots",
                                      help="Extended vocabulary: the pointer names the unseen places of the history "
                                           "(each its own slot) and the generator's id 1 means a new place."),
    slot_identity: bool = typer.Option(True, "--slot-identity/--no-slot-identity",
                                       help="With --unseen-slots: visits to the same unseen place share a learned slot "
                                            "embedding in the input."),
    new_place_weight: float = typer.Option(1.0, "--new-place-weight",
                                           help="With --unseen-slots: loss weight of train samples whose target is a new place."),
    previous_location: bool = typer.Option(False, "--previous-location/--no-previous-location",
                                           help="Each visit also embeds the location visited before it."),
    weight_average: float = typer.Option(0.0, "--weight-average",
                                         help="Decay of a moving average of the weights, evaluated and kept instead "
                                              "of them (e.g. 0.99); 0 = off."),
    simulate_unseen: bool = typer.Option(False, "--simulate-unseen/--no-simulate-unseen",
                                         help="Train on samples where locations first visited after a random cutoff are id 1 "
                                              "(unseen in train), as in later splits."),
    known_fraction: tuple[float, float] = typer.Option((0.8, 1.0), "--known-fraction",
                                                       help="With --simulate-unseen: the cutoff's range, as fractions of the "
                                                            "user's days before each sample."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from the latest checkpoint in --out."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads per worker; 0 = the cores / workers."),
    workers: int = typer.Option(0, "--workers", min=0, help="DDP workers under Ray Train; 0 = in this process, without Ray."),
    gpu: bool | None = typer.Option(None, "--gpu/--no-gpu", help="One GPU per worker (default: when Ray sees enough GPUs)."),
    address: str | None = typer.Option(None, "--address", envvar="RAY_ADDRESS", help="Ray cluster to join; default a local Ray."),
    max_failures: int = typer.Option(0, "--max-failures", min=-1, help="Restarts from the last checkpoint when a worker dies (-1: no limit)."),
    data_engine: DataEngine = typer.Option(DataEngine.memory, "--data-engine",
                                           help="memory: each worker loads the train split; ray (with --workers >= 1): "
                                                "each streams its shard with Ray Data, for splits larger than a "
                                                "worker's memory (a local shuffle buffer, no length bucketing)."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                            help="MLflow tracking URI; default a SQLite store under .state/mlflow."),
    experiment: str = typer.Option("pgt", "--experiment", help="MLflow experiment."),
    register: str | None = typer.Option(None, "--register", help="Register the best checkpoint under this model name."),
) -> None:
    """Train a model (by default with the paper's settings, SPEC §3.8), log it to MLflow, write --out/metrics.json."""
    from pgt.distributed import LaunchConfig, run_training
    from pgt.report import EpochPrinter, print_metrics
    from pgt.tracking import TrackingConfig, champion_verdict, resolve_tracking_uri, run_url
    from pgt.train import BASELINES, TrainConfig

    try:  # a folder without manifest.json fails in Vocab.from_manifest with a FileNotFoundError
        # the options a recipe sets: those typed on the command line win
        given = {"lr": lr, "d_model": d_model, "nhead": nhead, "num_layers": num_layers, "dim_feedforward": dim_feedforward,
                 "dropout": dropout, "select_on": select_on.value, "simulate_unseen": simulate_unseen,
                 "unseen_slots": unseen_slots, "slot_identity": slot_identity, "new_place_weight": new_place_weight,
                 "previous_location": previous_location, "weight_average": weight_average,
                 "patience": patience, "epochs": epochs}
        overrides = {k: v for k, v in given.items() if _on_command_line(ctx, k)}
        cfg = TrainConfig.from_recipe(
            recipe.value, **overrides, data_dir=str(data), out_dir=str(out), model=model.value,
            seed=seed, batch_size=batch_size, resume=resume, threads=threads,
            known_fraction_min=known_fraction[0], known_fraction_max=known_fraction[1])
        if register and model.value in BASELINES:
            raise ValueError(f"--register needs a neural model; {model.value} has no checkpoint to register")
        launch = LaunchConfig(workers=workers, use_gpu=gpu, address=address, max_failures=max_failures,
                              data_engine=data_engine.value)
        tracking = TrackingConfig(resolve_tracking_uri(tracking_uri), experiment=experiment, register=register)
        result = run_training(cfg, launch, tracking, on_epoch=EpochPrinter())
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
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
    split: str = typer.Option("test", "--split", help="test, validation or train; evaluation for an output of "
                                                      "`pgt preprocess --fitted`."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI"),
) -> None:
    """Load a logged or registered model and print its metrics on a split as JSON."""
    from pgt.serve import evaluate_model

    if split not in ("train", "validation", "test", "evaluation"):
        _fail(f"--split must be train, validation, test or evaluation, got {split!r}")
    try:
        metrics = evaluate_model(model, data, split, tracking_uri)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    except Exception as exc:  # MLflow's errors (unknown model, alias, run) in one line
        _fail(f"{model}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
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
    top_k: int = typer.Option(5, "--top-k", min=1),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI"),
) -> None:
    """Where each person goes next: the top-k next places, with coordinates and probabilities."""
    from pgt.serve import predict_file, predict_raw
    from preprocessing.errors import InputError

    try:
        if format is not None:
            frame = predict_raw(model, input, format.value, out, top_k, tracking_uri)
            latest = frame.filter(frame["sample"] == "latest")
            if latest.height == 0:
                typer.echo(f"warning: {input}: no user has a recent history to predict from (at least "
                           "min_history_staypoints visits at places in the history_days days before their last "
                           "visit); give more days of data", err=True)
            unknown = latest.filter(latest["user"] == 0)["sample_index"].n_unique()
            typer.echo(f"wrote {out}: top-{top_k} next places of {latest['sample_index'].n_unique():,} users "
                       f"({unknown:,} unknown to the model, scored as user 0), and of "
                       f"{frame.filter(frame['sample'] == 'evaluation')['sample_index'].n_unique():,} "
                       "evaluation samples")
            return
        rows = predict_file(model, input, out, top_k, tracking_uri)
    except (ValueError, FileNotFoundError, InputError) as exc:
        _fail(str(exc))
    except Exception as exc:
        _fail(f"{model}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    typer.echo(f"wrote {out}: top-{top_k} locations for {rows:,} sequences")


class SearchAlg(str, Enum):
    optuna = "optuna"
    random = "random"


@app.command()
def tune(
    data: Path | None = typer.Option(None, "--data", help="A `pgt preprocess` output folder."),
    out: Path | None = typer.Option(None, "--out", help="Sweep folder: tune.json, trials/, the Tune experiment under ray/."),
    trials: int = typer.Option(20, "--trials", min=1, help="Configurations to try."),
    epochs: int = typer.Option(30, "--epochs", min=1, help="At most this many epochs per trial (ASHA may stop it sooner)."),
    address: str | None = typer.Option(None, "--address", envvar="RAY_ADDRESS", help="Ray cluster to run on; default a local Ray."),
    max_concurrent: int = typer.Option(2, "--max-concurrent", min=1, help="Trials at once."),
    workers_per_trial: int = typer.Option(1, "--workers-per-trial", min=1, help="W > 1 runs a TorchTrainer of W workers per trial."),
    cpus_per_trial: float = typer.Option(1.0, "--cpus-per-trial", help="Ray CPUs a one-worker trial reserves."),
    cpus_per_worker: float = typer.Option(1.0, "--cpus-per-worker", help="With W > 1: Ray CPUs per training worker."),
    gpus_per_worker: float = typer.Option(0.0, "--gpus-per-worker", help="GPUs per training worker (fractions share one)."),
    search: SearchAlg = typer.Option(SearchAlg.optuna, "--search", help="optuna (TPE) or random."),
    grace_period: int = typer.Option(3, "--grace-period", min=1, help="ASHA: epochs before a trial may be stopped."),
    simulate_unseen: bool = typer.Option(False, "--simulate-unseen/--no-simulate-unseen",
                                         help="Trials train on samples that show unseen locations as later splits do."),
    unseen_slots: bool = typer.Option(False, "--unseen-slots/--no-unseen-slots",
                                      help="Trials point at unseen places of the history (extended vocabulary)."),
    objective: Objective = typer.Option("strict_acc@1", "--objective",
                                        help="The validation score the sweep maximises and early stopping follows: "
                                             "strict_acc@1 (the exact place) or acc@1 (the protocol's)."),
    seed: int = typer.Option(0, "--seed"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                            help="MLflow tracking URI; default a SQLite store under .state/mlflow."),
    experiment: str = typer.Option("pgt", "--experiment", help="MLflow experiment."),
    register: str | None = typer.Option(None, "--register", help="Register the best trial's model under this name."),
    resume: Path | None = typer.Option(None, "--resume", help="Resume the interrupted sweep in this folder."),
) -> None:
    """Search d_model, nhead, dropout, learning rate, weight decay and layers with Ray Tune (ASHA + TPE)."""
    from pgt.tracking import TrackingConfig, champion_verdict, resolve_tracking_uri, run_url
    from tune.report import print_sweep
    from tune.sweep import SweepConfig, SweepInterrupted, run_sweep

    try:
        if resume is not None:
            saved = resume / "sweep.json"
            if not saved.is_file():
                raise FileNotFoundError(f"{resume}: no sweep.json; expected the --out folder of an earlier `pgt tune`")
            state = json.loads(saved.read_text())
            spec = SweepConfig.from_dict(state["sweep"])
            tracking = TrackingConfig.from_dict(state["tracking"]) if state["tracking"] else None
            register = register or state.get("register")
        else:
            if data is None or out is None:
                raise ValueError("--data and --out are required (or --resume DIR)")
            spec = SweepConfig(data_dir=str(data), out_dir=str(out), trials=trials, epochs=epochs,
                               max_concurrent=max_concurrent, workers_per_trial=workers_per_trial,
                               cpus_per_trial=cpus_per_trial, cpus_per_worker=cpus_per_worker,
                               gpus_per_worker=gpus_per_worker, search=search.value, grace_period=grace_period, seed=seed,
                               simulate_unseen=simulate_unseen, unseen_slots=unseen_slots,
                               objective=objective.value, select_on=objective.value)
            tracking = TrackingConfig(resolve_tracking_uri(tracking_uri), experiment=experiment)
            from pgt.data import Vocab

            Vocab.from_manifest(data)  # a wrong --data fails here, not inside every trial
        result = run_sweep(spec, tracking, address=address, resume=resume is not None, register=register)
    except SweepInterrupted as exc:
        typer.echo(f"interrupted: {exc}", err=True)
        raise typer.Exit(code=130)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        _fail(str(exc))
    print_sweep(result)
    typer.echo(f"wrote {Path(spec.out_dir) / 'tune.json'}")
    if "mlflow" in result:
        typer.echo(f"mlflow: {run_url(result['mlflow']['tracking_uri'], result['mlflow']['run_id'])}")
        registered = result["mlflow"].get("registered")
        if registered:
            typer.echo(f"registered {registered['name']} version {registered['version']}: {champion_verdict(registered)}")


@app.command()
def explain(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="best.pt or checkpoints/epoch_NNN/checkpoint.pt."),
    data: Path = typer.Option(..., "--data", help="The `pgt preprocess` folder the model was trained on."),
    out: Path = typer.Option(..., "--out", help="Folder for the PNGs."),
    samples: int = typer.Option(6, "--samples", min=1, help="Test samples in the attention plot."),
) -> None:
    """Plots of a trained model: pointer attention, gate, position bias, attention entropy."""
    from pgt.explain import explain as run

    try:
        written = run(checkpoint, data, out, samples=samples)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    for path in written:
        typer.echo(f"wrote {path}")


@app.command()
def manifest(folder: Path = typer.Argument(..., help="A `pgt preprocess` output folder.")) -> None:
    """Print the counts and vocabulary sizes of a preprocessed folder."""
    path = folder / "manifest.json"
    if not path.is_file():
        _fail(f"{folder}: no manifest.json; expected a `pgt preprocess` output folder")
    data = json.loads(path.read_text())
    json.dump({"counts": data["counts"], "vocab": data["vocab"]}, sys.stdout, indent=2)
    typer.echo()


if __name__ == "__main__":
    app()

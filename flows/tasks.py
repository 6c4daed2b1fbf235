"""Prefect tasks of the pipeline: thin, typed, each calling one function of preprocessing/, pgt/ or tune/.

Configs reach the tasks typed (they run in the flow's process); they become dicts only at Ray's and MLflow's doors.

Only tasks doing I/O that can fail transiently retry (reading the input, publishing the artifact), and only
on an OSError or a server that does not answer; bad input fails at once with its one-line message.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import polars as pl
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.settings import ClusterJob
from infra.jobs import job_environment, run_job
from infra.process import interruptible
from infra.storage import open_storage, without_query
from pgt.config import LaunchConfig, TrackingConfig, TrainConfig
from pgt.serving.evaluate import evaluate_model
from pgt.serving.predict import last_days, plot_predicted_places, predict_raw, predict_summary, prediction_summary
from pgt.tracking.lineage import model_version
from pgt.tracking.registry import Evidence
from pgt.tracking.runs import log_predictions as log_prediction_run
from pgt.training.run import TrackedRun, run_training
from pgt.training.run import register as register_run
from preprocessing.config import SynthConfig, load_config
from preprocessing.engine import EngineConfig, mapper
from preprocessing.pipeline import STEPS, StageRun, cached_stage, reusable_manifest, run_step, stage_input, write_stages
from preprocessing.stages import Stage
from preprocessing.stored import kept_input, publish_output
from preprocessing.synthetic import write_positionfixes
from tune.config import SweepConfig
from tune.sweep import run_sweep

if TYPE_CHECKING:
    from preprocessing.stages import Stage


def _transient_io(task, task_run, state) -> bool:
    """Retry condition: an OSError other than a missing or unreadable path, or a server that did not answer (the
    Prefect API's client, httpx, says so with a TransportError, which is no OSError)."""
    exc = state.result(raise_on_failure=False)
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError))


@task(name="synthetic input", cache_policy=NO_CACHE)
def synthetic_input(out_file: Path, users: int, days: int, seed: int) -> Path:
    """The synthetic GPS default; the same (users, days, seed) writes the same bytes, so preprocessing is reused."""
    return write_positionfixes(SynthConfig(users=users, days=days, seed=seed), out_file)


@task(name="fetch input", retries=2, retry_delay_seconds=3, retry_condition_fn=_transient_io, cache_policy=NO_CACHE)
def fetch_input(uri: str, input_format: str, folder: Path) -> Path:
    """An input on object storage copied to this machine (one folder per content, shared by runs of the same)."""
    return kept_input(uri, input_format, folder)


@task(name="hash input", retries=2, retry_delay_seconds=3, retry_condition_fn=_transient_io, cache_policy=NO_CACHE)
def hash_input(input_path: Path, input_format: str) -> Stage:
    """The first stage: the input's sha256, with its stage log entry."""
    return stage_input(input_path, input_format)


@task(name="cached sequences", cache_policy=NO_CACHE)
def cached_sequences(out_dir: Path, hashed: Stage, input_format: str, config_file: Path | None) -> dict | None:
    """The manifest of out_dir when it already holds this input's sequences under this config."""
    return reusable_manifest(out_dir, hashed.details["input_sha256"], input_format, load_config(config_file))


def cached_steps() -> list[str]:
    """The stages of preprocessing.pipeline.STEPS the flow keeps in folders, in order (they come first)."""
    return [step.name for step in STEPS if step.cached]


def _stage_run(input_path: Path, input_format: str, config_file: Path | None, engine: EngineConfig, map_fn,
               source: str | None):
    return StageRun(input_path, input_format, load_config(config_file), engine, map_fn,
                    source=without_query(source) if source else None)


@task(name="preprocess stage", retries=2, retry_delay_seconds=3, retry_condition_fn=_transient_io, cache_policy=NO_CACHE)
def preprocess_stage(step_name: str, previous: Stage | Path, input_path: Path, input_format: str,
                     config_file: Path | None, engine: EngineConfig, work_dir: Path, key: str,
                     source: str | None = None) -> Path:
    """One cached stage of the table (preprocessing.pipeline.STEPS), locally or as Ray tasks: its folder
    under work_dir, reused when complete, so that a rerun continues after the last finished stage. `source`: the
    URI input_path is a copy of."""
    step = next(step for step in STEPS if step.name == step_name)

    def compute():
        before = Stage.load(previous) if isinstance(previous, Path) else previous
        with mapper(engine) as map_fn:
            return run_step(step, _stage_run(input_path, input_format, config_file, engine, map_fn, source), before)

    return cached_stage(work_dir, step.name, key, compute)


@task(name="sequences", cache_policy=NO_CACHE)
def sequences(previous: Path, input_path: Path, input_format: str, config_file: Path | None, engine: EngineConfig,
              out_dir: Path, source: str | None = None) -> dict:
    """The stages of the table the flow does not keep, then the output folder, written atomically: its manifest."""
    stage = Stage.load(previous)
    with mapper(engine) as map_fn:
        run = _stage_run(input_path, input_format, config_file, engine, map_fn, source)
        for step in STEPS:
            if not step.cached:
                stage = run_step(step, run, stage)
    write_stages(out_dir, stage, run)
    return json.loads((out_dir / "manifest.json").read_text())


@task(name="train", cache_policy=NO_CACHE)
def train(train_config: TrainConfig, launch_config: LaunchConfig, tracking_config: TrackingConfig) -> dict:
    """Ray Train (or one process with workers=0); the run is logged to MLflow, not registered yet."""
    return run_training(train_config, launch_config, tracking_config).to_dict()


@task(name="tune", cache_policy=NO_CACHE)
def tune(sweep_config: SweepConfig, tracking_config: TrackingConfig, address: str | None) -> dict:
    """A Ray Tune sweep; its best trial's model is logged to the sweep's MLflow run, not registered yet."""
    resume = (Path(sweep_config.out_dir) / "sweep.json").is_file()  # a rerun continues an interrupted sweep
    return run_sweep(sweep_config, tracking_config, address=address, resume=resume)


@task(name="publish sequences", retries=2, retry_delay_seconds=3, retry_condition_fn=_transient_io,
      cache_policy=NO_CACHE)
def publish_sequences(folder: Path, location: str) -> str:
    """The sequences copied where the cluster's nodes read them (unless they are there already)."""
    return publish_output(folder, location)


@task(name="ray job", cache_policy=NO_CACHE)
def ray_job(cluster: str, job: ClusterJob) -> dict:
    """`pgt` run on the cluster as a Ray Job (a sweep kept there already is resumed), its logs in the flow run's;
    the result the job kept (metrics.json or tune.json). A cancelled flow run stops the job."""
    log = get_run_logger()
    kept = open_storage(job.out)
    args = job.resume if job.resume and kept.exists("sweep.json") else job.start
    with interruptible():  # Prefect's cancel (SIGTERM) stops the job, as Ctrl+C stops `pgt submit`'s
        outcome = run_job(cluster, args, job_environment([]), write=log.info)
    if outcome.status != "SUCCEEDED":
        raise RuntimeError(f"Ray Job {outcome.job_id} on {cluster} ended {outcome.status}; its logs are above, and "
                           f"with `ray job logs --address {cluster} {outcome.job_id}`")
    return kept.read_json(job.record)


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(model_uri: str, data_dir: Path, tracking_uri: str) -> dict:
    """The logged model loaded back from MLflow and scored on the test split."""
    return evaluate_model(model_uri, data_dir, "test", tracking_uri)


@task(name="register", cache_policy=NO_CACHE)
def register(tracking_uri: str, name: str, model_uri: str, run_id: str, evidence: dict) -> dict:
    """A new registry version with its evidence (pgt.tracking.registry.Evidence as a dict); the alias champion moves to it
    only if that beats the champion's by more than seed noise (pgt.tracking.registry.promotion_decision)."""
    return register_run(TrackedRun(tracking_uri, run_id, model_uri), name, Evidence(**evidence))


# a run's last step, its model trained and registered (or its predictions logged): worth waiting out a Prefect
# server's restart
PUBLISH_RETRY_DELAYS_S = [3, 10, 30]


@task(name="publish", retries=len(PUBLISH_RETRY_DELAYS_S), retry_delay_seconds=PUBLISH_RETRY_DELAYS_S,
      retry_condition_fn=_transient_io, cache_policy=NO_CACHE)
def publish(markdown: str) -> str:
    """The run's metrics table and MLflow address as a Prefect markdown artifact."""
    return str(create_markdown_artifact(key="pgt-metrics", markdown=markdown, description="PGT test metrics"))


@task(name="recent input", retries=2, retry_delay_seconds=3, retry_condition_fn=_transient_io, cache_policy=NO_CACHE)
def recent_input(source: Path, days: float, out_file: Path) -> Path:
    """Each user's last `days` days of a positionfixes Parquet file (the demo's stand-in for new data)."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    last_days(pl.read_parquet(source), days).write_parquet(out_file)
    return out_file


@task(name="predict places", cache_policy=NO_CACHE)
def predict_places(model_uri: str, input_path: Path, input_format: str, out_file: Path, top_k: int,
                   tracking_uri: str, at: datetime | None = None) -> Path:
    """Raw GPS through the model's fitted preprocessing: the top-k next places of every user at the moment `at`
    (None: each user's last visit's end), with coordinates."""
    result = predict_raw(model_uri, input_path, input_format, out_file, top_k, tracking_uri, at)
    get_run_logger().info(predict_summary(result, top_k))
    return out_file


@task(name="map", cache_policy=NO_CACHE)
def map_png(predictions_file: Path, out_png: Path) -> Path:
    return plot_predicted_places(pl.read_parquet(predictions_file), out_png)


@task(name="resolve model version", retries=2, retry_delay_seconds=3, retry_condition_fn=_transient_io,
      cache_policy=NO_CACHE)
def resolve_model_version(tracking_uri: str, model_uri: str) -> dict | None:
    """The registered version an alias names now (None for a URI of no registered model): the one that answers."""
    return model_version(tracking_uri, model_uri)


@task(name="log predictions", retries=2, retry_delay_seconds=3, retry_condition_fn=_transient_io, cache_policy=NO_CACHE)
def log_predictions(tracking_uri: str, model_uri: str, predictions_file: Path, png: Path, input_path: Path,
                    top_k: int, version: dict | None) -> dict:
    """An MLflow run holding the predictions and the map, the version that answered and the input as a dataset;
    the summary (users, strict Acc@1 on evaluation samples)."""
    summary = prediction_summary(pl.read_parquet(predictions_file))
    logged = log_prediction_run(tracking_uri, model_uri, [predictions_file, png], {"input": input_path, "top_k": top_k},
                                summary, source="predict-next-places flow", input_path=input_path, version=version)
    return {**logged, "summary": summary, "model_version": version}


@task(name="publish predictions", retries=len(PUBLISH_RETRY_DELAYS_S), retry_delay_seconds=PUBLISH_RETRY_DELAYS_S,
      retry_condition_fn=_transient_io, cache_policy=NO_CACHE)
def publish_predictions(predictions_file: Path, logged: dict, model_uri: str, max_rows: int = 500) -> list[str]:
    """Prefect artifacts: a table of each user's next places, the map as an image, a summary with the MLflow run."""
    from prefect.artifacts import create_image_artifact, create_table_artifact

    latest = pl.read_parquet(predictions_file).filter(sample="latest").head(max_rows)
    rows = latest.select("source_user_id", "rank", "place_id", pl.col("latitude").round(6), pl.col("longitude").round(6),
                         pl.col("probability").round(4), pl.col("new_place_probability").round(4)).to_dicts()
    made = [str(create_table_artifact(rows, key="pgt-predictions",
                                      description=f"next places per user from {model_uri} (first {max_rows} rows)"))]
    png = logged["artifact_urls"].get("map.png")
    if png:
        made.append(str(create_image_artifact(png, key="pgt-predictions-map", description="predicted next places")))
    s = logged["summary"]
    strict = "n/a" if s["evaluation_strict_acc@1"] is None else f"{s['evaluation_strict_acc@1']:.2f}"
    made.append(str(create_markdown_artifact(key="pgt-predictions-summary", markdown=(
        f"# predict: {model_uri}\n\n| users scored | evaluation samples | strict Acc@1 | mean P(new place) |\n"
        f"|---|---|---|---|\n| {s['users']} | {s['evaluation_samples']} | {strict} | "
        f"{s['mean_new_place_probability']:.3f} |\n\nMLflow run: {logged['run_url']}\n\nmap: {png or 'logged to the run'}\n"),
        description="prediction summary")))
    return made

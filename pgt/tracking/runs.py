"""MLflow tracking and the Model Registry's champion rule.

A run logs the whole training config as params, per-epoch train loss and validation metrics, the
test metrics, the dataset manifest, the `pgt explain` PNGs and the best checkpoint as a pickle-free
models-from-code pyfunc (`pgt/serving/mlflow_model.py` around `pgt.network.packed.PackedModel`: one (B, 7, T) int64
tensor in, (B, V + S) log-probabilities out). The driver creates the run; rank 0 of the training logs into it.

Lineage: every run logs its train, validation and test Parquet as MLflow dataset inputs (a digest of the
file, its path, its rows and the preprocessing settings: the UI's Datasets column), carries the command and
the git commit it ran from (the Source column), and samples system metrics (CPU, memory, GPU where present)
while it trains. A registered version carries its run's recipe, sweep and commit as tags. Experiments are
marked as model development, so the UI opens on their training runs.

MLflow names allow no "@", so metric keys read `validation_acc_at_1`, `test_ndcg_at_10`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import warnings
from pathlib import Path

from infra.process import shorten, uninterrupted
from pgt.config import TrackingConfig
from pgt.tracking.lineage import input_dataset, log_datasets, model_version, source_tags
from pgt.tracking.store import check_tracking_server, experiment_id, mlflow_client, open_sqlite_store, use_tracking_uri

CHAMPION = "champion"
SCORE_TAG = "validation_strict_acc_at_1"  # the registered version's own strict validation Acc@1
RIVAL_TAG = "champion_validation_strict_acc_at_1"  # the champion's, when the version was compared
RECIPE_TAG = "pgt.recipe"  # a run's recipe: its name, or the recipe file it trained
OUT_DIR_TAG = "pgt.out_dir"  # where a run is kept: its --out folder or URI (a sweep's trial: its folder there)
UI_VIEW = "workflowType=machine_learning"  # links open MLflow 3's UI on runs, datasets and models, not its GenAI view
# a registered version's tags, copied from its run's: what made it
VERSION_TAGS = {RECIPE_TAG: "recipe", "mlflow.parentRunId": "sweep_run_id", "mlflow.source.git.commit": "git_commit"}


class SystemMetrics:
    """MLflow's system metrics (CPU, memory, disk, network, GPU where present) sampled into a run while a
    process trains: `with SystemMetrics(tracking_uri, run_id): ...`."""

    def __init__(self, tracking_uri: str, run_id: str, interval_s: float):
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.run_id = run_id
        self.monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True,
                                            tracking_uri=tracking_uri)

    def __enter__(self) -> SystemMetrics:
        self.monitor.start()
        return self

    def __exit__(self, kind, error, traceback) -> None:
        from mlflow.exceptions import MlflowException

        self.monitor.finish()
        last = self.monitor.aggregate_metrics()  # the samples of the last, shorter window (or of a short run)
        if not last:
            return
        try:
            with uninterrupted():
                self.monitor.publish_metrics(last)
                self.monitor.mlflow_logger.flush()
        except MlflowException as exc:
            if kind is None:
                raise
            # what stopped the training is the news (a signal, a server gone): the last samples are said lost
            warnings.warn(f"the last system metrics of run {self.run_id} were not logged: "
                          f"{shorten(' '.join(str(exc).split()), 200)}", stacklevel=2)


def system_metrics(tracking: TrackingConfig | None):
    """SystemMetrics into the tracked run (at tracking.system_metrics_interval_s), or nothing untracked."""
    if tracking is None or tracking.run_id is None or not tracking.system_metrics_interval_s:
        return contextlib.nullcontext()
    return SystemMetrics(tracking.tracking_uri, tracking.run_id, tracking.system_metrics_interval_s)


def start_run(tracking: TrackingConfig, params: dict, run_name: str | None = None, tags: dict | None = None,
              parent_run_id: str | None = None) -> str:
    """Create a run, log `params` (flattened, every value as text), and return its id."""
    from mlflow.entities import Param, RunTag

    check_tracking_server(tracking.tracking_uri)
    if tracking.tracking_uri.startswith("sqlite:///"):
        open_sqlite_store(tracking.tracking_uri)  # a new store's schema, made once when runs start together
    client = mlflow_client(tracking.tracking_uri)
    all_tags = dict(tags or {})
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(experiment_id(tracking.tracking_uri, tracking.experiment), run_name=run_name,
                            tags=all_tags)
    flat = _flatten(params)
    items = [Param(k, str(v)[:6000]) for k, v in flat.items()]
    for start in range(0, len(items), 100):
        client.log_batch(run.info.run_id, params=items[start:start + 100], tags=[RunTag("pgt.kind", "train")]
                         if start == 0 and "pgt.kind" not in all_tags else [])
    return run.info.run_id


def open_run(tracking: TrackingConfig, saved: dict | None, resume: bool, params: dict, run_name: str, tags: dict,
             data_dir: Path, data_source: str | None = None) -> TrackingConfig:
    """The MLflow run a command logs into, as `tracking` with its run_id: the run `saved` records (an earlier
    invocation's {"tracking_uri", "experiment", "run_id"}) reopened when resuming it, unless it finished or is gone;
    else a new one with the params, the tags and the data's splits as dataset inputs (the saved run, left RUNNING by a
    process that died, closed as FAILED first). Every training run and sweep starts here. `data_source`: the data's
    URI where data_dir is this node's copy of object storage."""
    if saved and saved.get("tracking_uri") == tracking.tracking_uri and saved.get("experiment") == tracking.experiment:
        if resume and reopen_run(tracking.tracking_uri, saved["run_id"]):
            return dataclasses.replace(tracking, run_id=saved["run_id"])
        close_abandoned_run(tracking.tracking_uri, saved["run_id"])
    run_id = start_run(tracking, params, run_name=run_name, tags=tags, parent_run_id=tracking.parent_run_id)
    log_datasets(tracking.tracking_uri, run_id, data_dir, data_source, tracking.split_digests)
    return dataclasses.replace(tracking, run_id=run_id)


def run_status(tracking_uri: str, run_id: str) -> str | None:
    """The run's status (RUNNING, FINISHED, FAILED, KILLED), None if it is gone or deleted."""
    from mlflow.exceptions import MlflowException

    try:
        run = mlflow_client(tracking_uri).get_run(run_id)
    except MlflowException:
        return None
    return None if run.info.lifecycle_stage == "deleted" else run.info.status


def reopen_run(tracking_uri: str, run_id: str) -> bool:
    """Mark an earlier run RUNNING again (a resumed training or sweep logs into it); False if it is gone, or
    finished: a finished run is never reopened or changed by a later command."""
    from mlflow.exceptions import MlflowException

    if run_status(tracking_uri, run_id) in (None, "FINISHED"):
        return False
    try:
        mlflow_client(tracking_uri).update_run(run_id, status="RUNNING")
    except MlflowException:
        return False
    return True


def close_abandoned_run(tracking_uri: str, run_id: str) -> bool:
    """A run left RUNNING by a process that died (SIGKILL, a tracking server that went away mid-run) and that a
    new run replaces: marked FAILED. True if it was closed."""
    if run_status(tracking_uri, run_id) != "RUNNING":
        return False
    terminate_run(tracking_uri, run_id, "FAILED")
    return True


def end_run(tracking: TrackingConfig, status: str = "FINISHED") -> None:
    terminate_run(tracking.tracking_uri, tracking.run_id, status)


def terminate_run(tracking_uri: str, run_id: str, status: str) -> None:
    """The run closed with `status` (FINISHED, FAILED, KILLED), a signal meanwhile taking effect after the write."""
    with uninterrupted():
        mlflow_client(tracking_uri).set_terminated(run_id, status=status)


def metric_key(name: str) -> str:
    return name.replace("@", "_at_")


def metrics_of(prefix: str, metrics: dict) -> dict[str, float]:
    """`{prefix}_{metric}` for the numeric entries of a compute_all dict (n and the history splits included)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update(metrics_of(f"{prefix}_{key}", value))
        elif isinstance(value, (int, float)) and value == value:  # NaN (an empty split) is left out
            out[f"{prefix}_{metric_key(key)}"] = float(value)
    return out


class EpochLogger:
    """on_epoch callback for rank 0: train loss, learning rate, throughput and validation metrics, step = epoch."""

    def __init__(self, tracking: TrackingConfig):
        self.tracking = tracking
        self.client = mlflow_client(tracking.tracking_uri)
        # the epochs the run holds already: a resumed run sends only those it missed (logged while its tracking
        # server was away, or after the last checkpoint), so that every epoch has one value
        self.logged = {m.step for m in self.client.get_metric_history(tracking.run_id, "train_loss")}

    def backfill(self, history: list[dict]) -> None:
        """Log the epochs of a resumed run's history that the run misses."""
        for row in history:
            self(row)

    def __call__(self, row: dict, checkpoint_dir=None) -> None:
        from mlflow.entities import Metric

        if row["epoch"] in self.logged:
            return

        values = {"train_loss": row["train_loss"], "lr": row["lr"], "samples_per_second": row["samples_per_second"],
                  "epoch_seconds": row["seconds"]}
        # a refit's epochs learn from validation: their scores of it are logged apart from held-out ones
        prefix = "validation_learned_from" if row.get("learned_from_validation") else "validation"
        values |= {k: v for k, v in metrics_of(prefix, row["validation"]).items() if "history" not in k}
        now = int(time.time() * 1000)
        with uninterrupted():  # a signal takes effect once the epoch is logged and known to be
            self.client.log_batch(self.tracking.run_id,
                                  metrics=[Metric(k, float(v), now, row["epoch"]) for k, v in values.items()])
            self.logged.add(row["epoch"])


def log_result(tracking: TrackingConfig, result: dict, out_dir: Path, data_dir: Path) -> None:
    """After training (rank 0): test and final validation metrics, metrics.json and the data's manifest. The model
    and its plots are the caller's to log (pgt.training.finish.log_model)."""
    from mlflow.entities import Metric

    client = mlflow_client(tracking.tracking_uri)
    now = int(time.time() * 1000)
    # a selection run (evaluate_test off) has no test metrics; a refit's validation ones are its selection run's
    final = (metrics_of("test", result["test"]) if result["test"] is not None else {}) \
        | metrics_of("best_validation", result["validation"])
    for split, metrics in result.get("deployment", {}).items():  # inputs anchored at the last visit, as served
        final |= {k: v for k, v in metrics_of(f"deployment_{split}", metrics).items() if "history" not in k}
    final |= {"best_epoch": result["best_epoch"], "epochs_run": result["epochs_run"],
              "train_seconds": result["train_seconds"], "parameters": result["parameters"]}
    with uninterrupted():
        client.log_batch(tracking.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in final.items()])
    client.log_artifact(tracking.run_id, str(out_dir / "metrics.json"))
    client.log_artifact(tracking.run_id, str(Path(data_dir) / "manifest.json"), artifact_path="data")


def run_url(tracking_uri: str, run_id: str) -> str:
    """Where a person finds the run: the UI address for a server, the store URI otherwise."""
    if tracking_uri.startswith("http"):
        client = mlflow_client(tracking_uri)
        run = client.get_run(run_id)
        return f"{tracking_uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run_id}?{UI_VIEW}"
    return f"{tracking_uri} run {run_id}"


def _flatten(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else value
    return out


def log_predictions(tracking_uri: str, model_uri: str, files: list[Path], params: dict, metrics: dict, source: str,
                    experiment: str = "pgt-predictions", input_path: Path | None = None,
                    version: dict | None = None) -> dict:
    """An MLflow run for one scoring of new data: the model URI, the registered version that answered (`version`,
    model_version's, resolved before the prediction; else resolved now) and the inputs as params, the input file
    as the run's dataset, the summary as metrics, the prediction table and map as artifacts; `source` (the flow or
    command that scored) is the run's Source, not the interpreter's entry file. Returns the run id,
    its UI address and, for a tracking server, the download address of each artifact (what a Prefect image or
    link artifact can show)."""
    import mlflow

    use_tracking_uri(tracking_uri)
    version = version or model_version(tracking_uri, model_uri)
    answered = {"model_name": version["name"], "model_version": version["version"],
                "model_version_uri": version["version_uri"]} if version else {}
    with mlflow.start_run(experiment_id=experiment_id(tracking_uri, experiment),
                          run_name=f"predict {version['version_uri'] if version else model_uri}",
                          tags=source_tags(source)) as run:
        mlflow.log_params({"model_uri": model_uri, **answered, **{k: str(v) for k, v in params.items()}})
        if version:
            mlflow.set_tag("pgt.model_version", version["version_uri"])
        if input_path is not None and Path(input_path).is_file():
            mlflow_client(tracking_uri).log_inputs(run.info.run_id, datasets=[input_dataset(input_path)])
        mlflow.log_metrics({metric_key(k): float(v) for k, v in metrics.items() if v is not None})
        for path in files:
            mlflow.log_artifact(str(path))
    run_id = run.info.run_id
    served = tracking_uri.startswith(("http://", "https://"))
    urls = {Path(p).name: f"{tracking_uri.rstrip('/')}/get-artifact?path={Path(p).name}&run_uuid={run_id}"
            for p in files} if served else {}
    return {"run_id": run_id, "run_url": run_url(tracking_uri, run_id), "artifact_urls": urls}

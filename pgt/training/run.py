"""The run layer: one training run, the same for `pgt train`, a sweep's trials, finalists and final run, and the
flow's tasks, in five steps:

    data = open_data(cfg.data_dir)                  # the folder checked once: a DataFolder
    tracking = open_run(cfg, launch, tracking, folder, data)  # the MLflow run: new, or reopened by --resume
    metrics = fit(cfg, launch, folder, listeners)   # the loop in this process, or under Ray Train (from its Result)
    logged = log(tracking, metrics, folder.work, data)  # metrics, metrics.json, plots and the model into the run
    register(logged, name, evidence)                # a registry version under the champion rule

`run_training` strings them together (a refit: its selection run first) and returns a typed `RunResult`. The loop
reports every epoch through one channel; MLflow's epoch logger listens there on the driver's side (in this
process, or in Ray Train's controller), so the loop knows neither MLflow nor Ray. The run's storage under Ray is
`<out>/ray/train`: a rerun with the same --out resumes from its latest checkpoint, and FailureConfig(max_failures)
restarts the worker group from it when a worker dies. --out may be a URI (s3://, gs://; infra.storage) for runs
under Ray Train: the checkpoints go there from the workers, and the driver's files (metrics.json, best.pt, plots,
mlflow_run.json) are uploaded from its local work folder; a rerun on any machine resumes from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from infra.errors import InputError, ServiceError, SettingsError
from infra.output import check_output_entries, output_lock
from infra.process import interruptible, shorten
from infra.ray_session import cluster_nodes, ray_session
from infra.storage import Storage, is_uri, open_storage
from pgt.config import BASELINES, LaunchConfig, TrackingConfig, TrainConfig
from pgt.data.dataset import SequenceDataset, Vocab
from pgt.data.fetch import local_data
from pgt.network.checkpoint import check_resumable, latest_checkpoint, read_checkpoint
from pgt.serving.models import log_pytorch_model
from pgt.tracking.lineage import source_tags
from pgt.tracking.registry import Evidence, register_model
from pgt.tracking.runs import OUT_DIR_TAG, EpochLogger, end_run, log_result, system_metrics
from pgt.tracking.runs import open_run as open_tracked_run
from pgt.tracking.store import check_tracking_reaches, mlflow_client, server_answers, use_tracking_uri
from pgt.training.baselines import evaluate_baseline
from pgt.training.finish import write_json
from pgt.training.ray_train import RUN_NAME, epoch_listeners, fit_with_ray, ray_result
from pgt.training.state import check_streamable, refit_epoch_count
from pgt.training.train import OUTPUTS, SELECTION_DIR, train_loop_per_worker
from preprocessing.config import SPLITS

# what a refit's own two runs set from the user's settings (the selection and refit configs)
REFIT_DERIVED = frozenset({"refit", "train_on", "stop_after_epochs"})


@dataclass(frozen=True)
class DataFolder:
    """A `pgt preprocess` output folder, checked: its manifest, and three splits with samples and the columns a
    run reads."""

    path: Path  # the folder on this machine (for a URI, this node's copy: pgt.data.fetch)
    rows: dict[str, int]  # samples per split, from the Parquet footers
    summary: dict  # what a run's params say of it: the input's digest, its samples and vocabulary
    source: str  # where it is kept: the absolute path, or the URI that every node copies it from


@dataclass(frozen=True)
class RunFolder:
    """Where a run writes: `work`, the driver's local folder, and `kept`, where the run is kept: the same folder for
    a local --out; for a URI, object storage that Ray Train's checkpoints go to and the driver's files are uploaded
    to (`keep`)."""

    work: Path
    kept: Storage

    @property
    def remote(self) -> bool:
        return self.kept.local is None

    def child(self, name: str) -> RunFolder:
        return RunFolder(self.work / name, self.kept.child(name))

    def keep(self, *names: str) -> None:
        """The driver's files (or folders) `names` copied to the storage, where it is not the work folder."""
        for name in names:
            if self.remote and (self.work / name).exists():
                self.kept.upload(self.work / name, name)

    def read_json(self, name: str) -> dict | None:
        """A JSON record the run keeps, None if absent or damaged (the program's own note: a new run replaces it)."""
        try:
            saved = json.loads(self.kept.read_bytes(name) or b"null")
        except ValueError:
            return None
        return saved if isinstance(saved, dict) else None


def run_folder(out: str | Path) -> RunFolder:
    """The RunFolder of --out: a local folder, or a URI's storage with a new local work folder."""
    kept = open_storage(out)
    return RunFolder(kept.local or Path(tempfile.mkdtemp(prefix="pgt-run-")), kept)


@dataclass
class TrackedRun:
    """Where a run is in MLflow, and what it logged and registered."""

    tracking_uri: str
    run_id: str
    model_uri: str | None = None  # None: no model logged (baselines, fused seeds, log_model off)
    registered: dict | None = None  # register_model's answer, when registered


@dataclass
class RunResult:
    """What one run ends with."""

    metrics: dict  # metrics.json's scores, selection, history and configs
    out_dir: Path  # the driver's folder of the run's files (for a run kept on object storage, its work folder,
    # removed once the run has ended)
    kept: str = ""  # where the run is kept: --out, a folder or a URI
    evidence: Evidence | None = None  # what the model would be registered on (None: baselines, fused seeds)
    mlflow: TrackedRun | None = None  # None untracked

    @property
    def validation(self) -> dict:
        return self.metrics["validation"]

    @property
    def test(self) -> dict | None:
        return self.metrics["test"]

    @property
    def best_checkpoint(self) -> Path | None:
        best = self.out_dir / "best.pt"
        return best if best.is_file() else None

    def to_dict(self) -> dict:
        """metrics.json's content: the metrics, with the evidence and the MLflow run where there are."""
        out = dict(self.metrics)
        if self.evidence is not None:
            out["evidence"] = dataclasses.asdict(self.evidence)
        if self.mlflow is not None:
            out["mlflow"] = dataclasses.asdict(self.mlflow)
        return out


def open_data(data_dir: Path | str) -> DataFolder:
    """InputError, before any run or Ray starts, unless data_dir (a path, or a URI: s3://, gs://) is a
    `pgt preprocess` folder holding the three splits, each with samples and the columns a run reads."""
    source = str(data_dir) if is_uri(data_dir) else str(Path(data_dir).resolve())
    path = local_data(source).resolve()
    Vocab.from_manifest(path)  # not a `pgt preprocess` folder: one line that says so
    rows = {}
    for split in SPLITS:
        file = path / f"{split}.parquet"
        if not file.is_file():
            raise InputError(file, "no such file; --data names a `pgt preprocess` output folder")
        try:
            rows[split] = pq.read_metadata(file).num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputError(file, f"unreadable Parquet ({str(exc).strip().splitlines()[0]})") from None
        if rows[split] == 0:
            raise InputError(file, f"the {split} split has no samples; nothing to train on (the preprocessing "
                                   f"{_preprocessing_counts(path)}; preprocess more people or more days)")
        SequenceDataset.check_columns(file)
    manifest = json.loads((path / "manifest.json").read_text())
    counts = manifest.get("counts") if isinstance(manifest.get("counts"), dict) else {}
    summary = {"input_sha256": manifest.get("input_sha256"), "samples": counts.get("samples"), "vocab": manifest["vocab"]}
    return DataFolder(path, rows, summary, source)


def _preprocessing_counts(data_dir: Path) -> str:
    """What a `pgt preprocess` manifest says of its people and samples, in words (its manifest was read already)."""
    manifest = json.loads((data_dir / "manifest.json").read_text())
    counts, details = manifest.get("counts") or {}, manifest.get("details") or {}
    days = (manifest.get("config") or {}).get("min_tracking_days")
    said = [f"kept {counts.get('users_kept', '?')} users tracked more than {days} days"]
    if "users_with_samples_in_all_splits" in details:
        said.append(f"{details['users_with_samples_in_all_splits']} of them with samples in all splits")
    samples = counts.get("samples") or {}
    said.append("made samples " + ", ".join(f"{name} {n:,}" for name, n in samples.items()))
    return ", ".join(said)


def check_resume_settings(cfg: TrainConfig, folder: RunFolder) -> None:
    """SettingsError, before an MLflow run or Ray starts, when a resumption would pick up a checkpoint of the run (or of
    its refit's selection run) trained with other settings: a refused rerun creates no run and changes none. The
    loop checks every setting again when it resumes."""
    if not cfg.resume:
        return
    for where in (folder, folder.child(SELECTION_DIR)):
        found = [(latest_checkpoint(where.work),) * 2] if not where.remote else []
        found.append(_latest_kept(where.kept.child("ray", RUN_NAME), where.work))
        for checkpoint, named in filter(lambda pair: pair[0] is not None, found):
            check_resumable(read_checkpoint(checkpoint, "cpu", ("config",))["config"], cfg, named, ignore=REFIT_DERIVED)


def _latest_kept(storage: Storage, work: Path) -> tuple[Path | None, str | Path | None]:
    """Ray Train's newest checkpoint.pt in `storage` as a local file (downloaded into `work` off object storage), and
    its name for a message (its URI there)."""
    if storage.local is not None:
        return (latest_checkpoint(storage.local, "."),) * 2
    found = sorted(f for f in storage.files() if f.startswith("epoch_") and f.endswith("/checkpoint.pt"))
    if not found:
        return None, None
    local = work / "resumed-from" / found[-1]
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(storage.read_bytes(*found[-1].split("/")))
    return local, storage.uri_of(*found[-1].split("/"))


def open_run(cfg: TrainConfig, launch: LaunchConfig, tracking: TrackingConfig | None, folder: RunFolder,
             data: DataFolder) -> TrackingConfig | None:
    """The run's MLflow run (pgt.tracking.runs.open_run): the one the run's mlflow_run.json records when resuming it,
    else a new one with the settings as params, the data as dataset inputs and the source as tags; recorded there."""
    if tracking is None:
        return None
    params = cfg.to_dict() | {"workers": max(1, launch.workers), "data_manifest": data.summary}
    tags = {"pgt.network.model": cfg.model, OUT_DIR_TAG: folder.kept.uri, **source_tags(tracking.source),
            **tracking.tags}
    saved = folder.read_json("mlflow_run.json")
    opened = open_tracked_run(tracking, saved if saved and isinstance(saved.get("run_id"), str) else None, cfg.resume,
                              params, tracking.run_name or f"{cfg.model}-{Path(folder.kept.path).name}", tags, data.path,
                              data.source if is_uri(data.source) else None)
    folder.work.mkdir(parents=True, exist_ok=True)
    write_json(folder.work / "mlflow_run.json",
               {"tracking_uri": opened.tracking_uri, "experiment": opened.experiment, "run_id": opened.run_id})
    folder.keep("mlflow_run.json")
    return opened


def epoch_logging(tracking: TrackingConfig | None) -> list[Callable]:
    """The listeners of a tracked run's epochs: MLflow's epoch logger (an epoch the run holds already is not sent
    again; the first epoch after a resumption brings those the run missed)."""
    if tracking is None:
        return []
    logger = EpochLogger(tracking)

    def log_epoch(row: dict, checkpoint=None) -> None:
        logger.backfill(row.get("earlier", []))
        logger(row)

    return [log_epoch]


def fit(cfg: TrainConfig, launch: LaunchConfig, folder: RunFolder, tracking: TrackingConfig | None = None,
        on_epoch: Callable | None = None, callbacks: list | None = None) -> dict:
    """The loop in this process (launch.workers 0), or under Ray Train on launch.workers workers: every epoch to
    MLflow's logger (tracked) and to `on_epoch` (in this process) or `callbacks` (Ray Train's); the driver's machine
    (CPU, memory, GPU) sampled into the run meanwhile. Returns metrics.json's content; best.pt is in the work folder."""
    with system_metrics(tracking):
        return _fit(cfg, launch, folder, tracking, on_epoch, callbacks)


def _fit(cfg: TrainConfig, launch: LaunchConfig, folder: RunFolder, tracking: TrackingConfig | None,
         on_epoch: Callable | None, callbacks: list | None) -> dict:
    if launch.workers == 0:
        listeners = [*epoch_logging(tracking), *([on_epoch] if on_epoch else [])]

        def report(row: dict, checkpoint_dir: Path | None) -> None:
            for listener in listeners:
                listener(row, checkpoint_dir)

        return train_loop_per_worker(cfg.to_dict(), on_epoch=report)
    listening = [epoch_listeners(lambda: epoch_logging(tracking))] if tracking else []
    with ray_session(launch.address, num_cpus=local_ray_cpus(launch)):  # run_training's, where it started one
        result = fit_with_ray(cfg, launch, folder.kept.child("ray"), callbacks=listening + (callbacks or []))
    metrics = ray_result(result, folder.work)
    write_json(folder.work / "metrics.json", metrics)
    return metrics


def local_ray_cpus(launch: LaunchConfig) -> int:
    """A local Ray's CPUs: one per worker, and one more for Ray Data's read tasks when it streams the train split."""
    return max(os.cpu_count() or 1, launch.workers) + (1 if launch.data_engine == "ray" else 0)


def log(tracking: TrackingConfig, metrics: dict, out_dir: Path, data: DataFolder) -> TrackedRun:
    """After the run: test and final validation metrics, metrics.json and the data's manifest; then, unless
    tracking.log_model is off or there is no best.pt, `pgt explain`'s plots and best.pt as the logged pyfunc."""
    log_result(tracking, metrics, out_dir, data.path)
    logged = TrackedRun(tracking.tracking_uri, tracking.run_id)
    if not tracking.log_model or not (out_dir / "best.pt").is_file():
        return logged
    import mlflow

    from pgt.serving.explain import explain

    client = mlflow_client(tracking.tracking_uri)
    for png in explain(out_dir / "best.pt", data.path, out_dir / "plots"):
        client.log_artifact(tracking.run_id, str(png), artifact_path="plots")
    use_tracking_uri(tracking.tracking_uri)
    with mlflow.start_run(run_id=tracking.run_id):
        logged.model_uri = log_pytorch_model(out_dir / "best.pt", data.path).model_uri
    return logged


def register(logged: TrackedRun, name: str, evidence: Evidence) -> dict:
    """A new version of `name` from the run's logged model, with its evidence; the alias champion moves to it only
    under the champion rule (pgt.tracking.registry). Sets and returns logged.registered."""
    logged.registered = register_model(logged.tracking_uri, name, logged.model_uri, logged.run_id, evidence)
    return logged.registered


def run_training(cfg: TrainConfig, launch: LaunchConfig | None = None, tracking: TrackingConfig | None = None,
                 on_epoch: Callable | None = None, callbacks: list | None = None) -> RunResult:
    """Train (or fit a baseline) as `pgt train` does: open the data, open the MLflow run when `tracking` is given,
    fit, log, and register when tracking names a model. With cfg.refit, two runs: the selection run, then the
    refit on train + validation, which is the run's model."""
    launch = launch or LaunchConfig()
    if launch.data_engine == "ray" and cfg.model not in BASELINES:
        check_streamable(cfg)  # before a run or Ray starts
    data = open_data(cfg.data_dir)
    folder = run_folder(cfg.out_dir)
    try:
        if folder.remote:
            check_remote(cfg, launch, folder)
        cfg = dataclasses.replace(cfg, out_dir=folder.kept.uri, data_dir=data.source)
        if launch.workers and cfg.model not in BASELINES:  # every node reaches the run's folder, data and tracking
            nodes = cluster_nodes(launch.address, out=None if folder.remote else folder.work, data=cfg.data_dir)
            if tracking:
                check_tracking_reaches(tracking.tracking_uri, nodes)
        # SIGTERM stops the run as Ctrl+C does whoever handles it (a Prefect flow run's cancel included), and takes
        # its handler's effect only once the run is closed and its lock released; one writer of a local folder: a
        # second is refused, naming the first (object storage has no lock: one run per URI is the user's to keep).
        # Ray starts once the lock is held (a refused second writer starts none) and stops after the lock is
        # released and the MLflow run closed: a stop signal to the whole process group (Prefect's cancel gives 30 s
        # before SIGKILL) kills the local Ray's head too, and shutting Ray down then takes seconds the cleanup must
        # not wait on.
        with interruptible(), contextlib.ExitStack() as after_the_lock:
            with output_lock(folder.work, command="pgt train"):
                check_resume_settings(cfg, folder)
                if launch.workers and cfg.model not in BASELINES:
                    after_the_lock.enter_context(ray_session(launch.address, num_cpus=local_ray_cpus(launch)))
                return _run(cfg, launch, tracking, data, folder, on_epoch, callbacks)
    finally:
        if folder.remote:  # the driver's scratch: what the run keeps is in the storage
            shutil.rmtree(folder.work, ignore_errors=True)


def check_remote(cfg: TrainConfig, launch: LaunchConfig, folder: RunFolder) -> None:
    """SettingsError or ServiceError in one line, before any work, unless a run can be kept at this URI: Ray Train's
    workers write the checkpoints there, the storage answers, and it holds nothing but a run's files."""
    if launch.workers == 0 or cfg.model in BASELINES:
        raise SettingsError(f"--out {folder.kept.uri}: a run kept on object storage trains under Ray Train, whose "
                            "workers write its checkpoints there: give --workers 1 or more (or a local --out)")
    check_output_entries(folder.kept.uri, "pgt train", OUTPUTS)


def _run(cfg: TrainConfig, launch: LaunchConfig, tracking: TrackingConfig | None, data: DataFolder,
         folder: RunFolder, on_epoch: Callable | None, callbacks: list | None) -> RunResult:
    out_dir = folder.work
    if not cfg.resume:  # a fresh start: no checkpoint of an earlier run may be picked up
        for local in (out_dir / "checkpoints", out_dir / "ray"):
            shutil.rmtree(local, ignore_errors=True)
        if folder.remote and folder.kept.exists("ray"):
            folder.kept.filesystem.delete_dir(folder.kept.join("ray"))
    tracking = open_run(cfg, launch, tracking, folder, data)
    status = "FAILED"
    try:
        result = RunResult({}, out_dir, folder.kept.uri)
        if cfg.model in BASELINES:
            result.metrics = evaluate_baseline(cfg.to_dict())
        else:
            if cfg.refit:  # the epoch chosen on validation first, then train + validation for that many epochs
                result.metrics = _refit(cfg, launch, tracking, data, folder, on_epoch, callbacks)
            else:
                result.metrics = fit(cfg, launch, folder, tracking, on_epoch, callbacks)
            if not cfg.fused_seeds > 1:  # what the model would be registered on
                result.evidence = Evidence.of_run(result.metrics, data.path)
        write_json(out_dir / "metrics.json", result.to_dict())
        if tracking:
            result.mlflow = log(tracking, result.metrics, out_dir, data)
            if tracking.register and result.mlflow.model_uri:
                register(result.mlflow, tracking.register, result.evidence)
            write_json(out_dir / "metrics.json", result.to_dict())
        folder.keep("metrics.json", "best.pt", "plots")
        status = "FINISHED"
        return result
    except BaseException as exc:  # SystemExit: a Tune scheduler stopped the trial; Ctrl+C, SIGTERM: the user did
        status = "FAILED" if isinstance(exc, Exception) else "KILLED"
        if tracking and isinstance(exc, Exception) and not server_answers(tracking.tracking_uri):
            raise ServiceError(f"MLflow tracking server {tracking.tracking_uri} stopped answering during the run "
                               f"({shorten(' '.join(str(exc).split()), 120)}); the checkpoints in {folder.kept.uri} stay: once "
                               "it is back, rerun with --resume (the run's missing epochs are sent, and a run left "
                               "RUNNING is closed as FAILED)") from None
        raise
    finally:
        if tracking:
            try:
                end_run(tracking, status)
            except Exception:  # noqa: BLE001 - the server went away: the rerun closes the run (close_abandoned_run)
                if status == "FINISHED":
                    raise


def _refit(cfg: TrainConfig, launch: LaunchConfig, tracking: TrackingConfig | None, data: DataFolder,
           folder: RunFolder, on_epoch: Callable | None, callbacks: list | None) -> dict:
    """A refit: first the same settings on train alone, the best epoch chosen on validation, in out_dir/selection
    (an MLflow run nested under the refit's; test is not scored); then train + validation for the selected number
    of epochs. The refit's validation figures are the selection run's (held out); those of the validation it
    learned from are kept apart."""
    child = None
    if tracking:
        name = tracking.run_name or f"{cfg.model}-{Path(folder.kept.path).name}"
        child = dataclasses.replace(tracking, run_id=None, parent_run_id=tracking.run_id, register=None,
                                    log_model=False, run_name=f"{name}-selection")
    inner = folder.child(SELECTION_DIR)
    selection_cfg = dataclasses.replace(cfg, refit=False, out_dir=inner.kept.uri, evaluate_test=False)
    with output_lock(inner.work, command="pgt train"):
        selection = _run(selection_cfg, launch, child, data, inner, on_epoch, callbacks)
    refit = dataclasses.replace(cfg, refit=False, train_on="train+validation",
                                stop_after_epochs=refit_epoch_count(cfg, selection.metrics["best_epoch"]))
    metrics = fit(refit, launch, folder, tracking, on_epoch, callbacks)
    learned = metrics["validation"]
    metrics["validation"] = selection.validation
    metrics["deployment"] = {"validation": selection.metrics["deployment"]["validation"], **metrics["deployment"]}
    metrics["refit"] = {"selected_epoch": selection.metrics["best_epoch"], "selection_dir": selection.kept,
                        "selection_run_id": selection.mlflow.run_id if selection.mlflow else None,
                        "trained_on": refit.train_on, "epochs": refit.stop_after_epochs, "epochs_rule": cfg.refit_epochs,
                        "validation_learned_from": {"acc@1": learned["acc@1"], "strict_acc@1": learned["strict"]["acc@1"]}}
    return metrics

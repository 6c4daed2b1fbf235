"""Launch `train_loop_per_worker` in this process or as DDP under Ray Train, tracked in MLflow.

Under Ray, `ray_train_loop` is what every TorchTrainer worker runs: it takes rank, world size and
device from Ray, resumes from `ray.train.get_checkpoint()` after a failure, and calls the same
`train_loop_per_worker` as a single process does. Rank 0 writes each epoch's checkpoint and hands
it to `ray.train.report`; every rank reports. The run's storage is `<out>/ray/train`: a rerun with
the same --out resumes from its latest checkpoint, and FailureConfig(max_failures) restarts the
worker group from it when a worker dies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from infra.errors import InputError, ServiceError
from infra.output import output_lock
from infra.process import interruptible, shorten
from infra.ray_session import ray_session
from pgt.config import (
    BASELINES,
    LaunchConfig,
    TrainConfig,
)
from pgt.data.dataset import LIST_COLUMNS, PLACE_COLUMNS, SequenceDataset, Vocab
from pgt.network.checkpoint import check_resumable, latest_checkpoint, read_checkpoint
from pgt.tracking.lineage import log_datasets, source_tags
from pgt.tracking.registry import Evidence, register_model
from pgt.tracking.runs import close_abandoned_run, end_run, log_result, reopen_run, start_run
from pgt.tracking.store import server_answers
from pgt.training.baselines import evaluate_baseline
from pgt.training.finish import write_json
from pgt.training.report import EpochPrinter
from pgt.training.state import HELD_OUT_KEY, check_streamable, refit_epoch_count
from pgt.training.train import SELECTION_DIR, train_loop_per_worker
from pgt.training.worker import Worker
from preprocessing.config import SPLITS

RUN_NAME = "train"  # the Ray Train run's name under <out>/ray
STREAM_KEY = "_stream_train"  # in the train loop's config: the workers stream their shard of the "train" dataset
STREAMED_COLUMNS = ("user", *LIST_COLUMNS, *PLACE_COLUMNS, "target")  # what --data-engine ray reads of train


def flat_metrics(row: dict) -> dict:
    """An epoch row as Ray reports it: scalars, validation metrics prefixed."""
    out = {k: v for k, v in row.items() if isinstance(v, (int, float, bool)) and k != "validation"}
    out |= {f"validation_{k}": v for k, v in row["validation"].items() if isinstance(v, (int, float))}
    out |= {f"validation_strict_{k}": v for k, v in row["validation"]["strict"].items() if isinstance(v, (int, float))}
    return out


def ray_train_loop(config: dict) -> None:
    """The TorchTrainer's train_loop_per_worker: `train_loop_per_worker` with Ray's rank, device and checkpoint."""
    import ray.train
    import ray.train.torch
    from ray.train import Checkpoint, CheckpointConsistencyMode

    config = dict(config)
    streamed = config.pop(STREAM_KEY, False)  # --data-engine ray: the trainer holds a "train" dataset
    context = ray.train.get_context()
    rank = context.get_world_rank()
    printer = None
    if rank == 0:  # rank 0 prints the epoch table (Ray forwards it to the driver)
        printer = EpochPrinter()

    def report(row: dict, checkpoint_dir: Path | None) -> None:
        if printer is not None:
            printer(row)
        metrics = flat_metrics(row)
        if checkpoint_dir is None:
            ray.train.report(metrics)
        else:
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(str(checkpoint_dir)),
                             checkpoint_dir_name=Path(checkpoint_dir).name)
            # until Ray's controller has committed it, a restarted group would resume from the one before
            ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED)

    restored = ray.train.get_checkpoint()
    with restored.as_directory() if restored is not None else contextlib.nullcontext() as folder:
        worker = Worker(rank=rank, world_size=context.get_world_size(), device=ray.train.torch.get_device(),
                        restored=Path(folder) / "checkpoint.pt" if folder else None, ray_owned=True,
                        train_shard=ray.train.get_dataset_shard("train") if streamed else None)
        train_loop_per_worker(config, worker=worker, on_epoch=report)


def fit_with_ray(config: dict, launch: LaunchConfig, out_dir: Path, callbacks: list | None = None):
    """Run `ray_train_loop` on launch.workers workers (inside an existing Ray session); returns Ray's Result."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    use_gpu = launch.gpu  # Ray's own name at its door
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) >= launch.workers
    resources = {"CPU": launch.cpus_per_worker} | ({"GPU": launch.gpus_per_worker} if use_gpu else {})
    if not config.get("threads"):  # a worker uses the CPUs it reserved, as Ray's OMP_NUM_THREADS says
        config = {**config, "threads": max(1, int(launch.cpus_per_worker))}
    datasets = None
    if launch.data_engine == "ray":  # each worker streams an equal shard of the train split
        datasets = {"train": ray.data.read_parquet(str(Path(config["data_dir"]) / "train.parquet"))
                    .select_columns(list(STREAMED_COLUMNS))}
        config = {**config, STREAM_KEY: True}
    trainer = TorchTrainer(
        ray_train_loop,
        train_loop_config=config,
        datasets=datasets,
        scaling_config=ScalingConfig(num_workers=launch.workers, use_gpu=use_gpu, resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(name=RUN_NAME, storage_path=str((out_dir / "ray").resolve()),
                             failure_config=FailureConfig(max_failures=launch.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=config.get("keep_checkpoints", 2)),
                             callbacks=callbacks or []),
    )
    return trainer.fit()


def check_splits(data_dir: Path) -> None:
    """InputError, before any run or Ray starts, unless data_dir holds the three splits, each with samples
    (read from the Parquet footers)."""
    Vocab.from_manifest(data_dir)  # not a `pgt preprocess` folder: one line that says so
    for split in SPLITS:
        path = data_dir / f"{split}.parquet"
        if not path.is_file():
            raise InputError(path, "no such file; --data names a `pgt preprocess` output folder")
        try:
            rows = pq.read_metadata(path).num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputError(path, f"unreadable Parquet ({str(exc).strip().splitlines()[0]})") from None
        if rows == 0:
            raise InputError(path, f"the {split} split has no samples; nothing to train on (the preprocessing "
                                   f"{_preprocessing_counts(data_dir)}; preprocess more people or more days)")


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


def run_training(cfg: TrainConfig, launch: LaunchConfig | None = None, tracking=None,
                 on_epoch: Callable | None = None, callbacks: list | None = None) -> dict:
    """Train (or fit a baseline) as `pgt train` does: in this process or under Ray Train, logged to MLflow
    when `tracking` (a TrackingConfig) is given, registered under the champion rule when it names a model.
    With cfg.refit, two runs: the selection run (`_selection_run`), then the refit on train + validation, which
    is the run's model. Returns the metrics.json dict, with "mlflow" (run id, model URI, registration) when tracked."""
    launch = launch or LaunchConfig()
    if launch.data_engine == "ray" and cfg.model not in BASELINES:
        check_streamable(cfg)  # before a run or Ray starts
    check_splits(Path(cfg.data_dir))
    out_dir = Path(cfg.out_dir).resolve()
    cfg = dataclasses.replace(cfg, out_dir=str(out_dir), data_dir=str(Path(cfg.data_dir).resolve()))
    # SIGTERM stops the run as Ctrl+C does whoever handles it (a Prefect flow run's cancel included), and takes
    # its handler's effect only once the run is closed and its lock released
    with interruptible(), output_lock(out_dir, command="pgt train"):  # one writer: a second is refused, naming the first
        check_resume_settings(cfg, out_dir)
        return _run_training(cfg, launch, tracking, out_dir, on_epoch, callbacks)


# what a refit's own two runs set from the user's settings (train.py's selection and refit configs)
REFIT_DERIVED = frozenset({"refit", "train_on", "stop_after_epochs"})


def check_resume_settings(cfg: TrainConfig, out_dir: Path) -> None:
    """SettingsError, before an MLflow run or Ray starts, when a resumption would pick up a checkpoint of out_dir (or of
    its refit's selection run) trained with other settings: a refused rerun creates no run and changes none. The
    loop checks every setting again when it resumes."""
    if not cfg.resume:
        return
    for folder in (out_dir, out_dir / SELECTION_DIR):
        for found in (latest_checkpoint(folder), latest_checkpoint(folder, Path("ray") / RUN_NAME)):
            if found is not None:
                check_resumable(read_checkpoint(found, "cpu", ("config",))["config"], cfg, found, ignore=REFIT_DERIVED)


def _run_training(cfg: TrainConfig, launch: LaunchConfig, tracking, out_dir: Path, on_epoch: Callable | None,
                  callbacks: list | None) -> dict:
    if not cfg.resume:  # a fresh start: no checkpoint of an earlier run may be picked up
        for folder in (out_dir / "checkpoints", out_dir / "ray"):
            shutil.rmtree(folder, ignore_errors=True)
    tracking = _start_tracking(cfg, launch, tracking, out_dir)
    status = "FAILED"
    try:
        tracked = {"tracking": tracking.to_dict()} if tracking else {}  # what rank 0 logs into
        config = cfg.to_dict() | tracked
        if cfg.model in BASELINES:
            result = evaluate_baseline(cfg.to_dict())
            if tracking:
                log_result(tracking, result, out_dir, Path(cfg.data_dir))
                result["mlflow"] = {"tracking_uri": tracking.tracking_uri, "run_id": tracking.run_id, "model_uri": None}
        else:
            if cfg.refit:  # the epoch chosen on validation first, then train + validation for that many epochs
                held_out = _selection_run(cfg, launch, tracking, out_dir, on_epoch, callbacks)
                refit = dataclasses.replace(cfg, refit=False, train_on="train+validation",
                                            stop_after_epochs=refit_epoch_count(cfg, held_out["selected_epoch"]))
                config = refit.to_dict() | {HELD_OUT_KEY: held_out} | tracked
            result = _launch(config, launch, out_dir, on_epoch, callbacks)
        if cfg.model not in BASELINES and not cfg.fused_seeds > 1:  # what the model would be registered on
            result["evidence"] = dataclasses.asdict(Evidence.of_run(result, cfg.data_dir))
            write_json(out_dir / "metrics.json", result)
        if tracking and tracking.register and result["mlflow"]["model_uri"]:
            result["mlflow"]["registered"] = register_model(
                tracking.tracking_uri, tracking.register, result["mlflow"]["model_uri"], tracking.run_id,
                Evidence(**result["evidence"]))
            write_json(out_dir / "metrics.json", result)
        status = "FINISHED"
        return result
    except BaseException as exc:  # SystemExit: a Tune scheduler stopped the trial; Ctrl+C, SIGTERM: the user did
        status = "FAILED" if isinstance(exc, Exception) else "KILLED"
        if tracking and isinstance(exc, Exception) and not server_answers(tracking.tracking_uri):
            raise ServiceError(f"MLflow tracking server {tracking.tracking_uri} stopped answering during the run "
                               f"({shorten(' '.join(str(exc).split()), 120)}); the checkpoints in {out_dir} stay: once "
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


def _launch(config: dict, launch: LaunchConfig, out_dir: Path, on_epoch: Callable | None,
            callbacks: list | None) -> dict:
    """The train loop in this process, or under Ray Train on launch.workers workers; its metrics.json dict."""
    if launch.workers == 0:
        return train_loop_per_worker(config, on_epoch=on_epoch)
    # a local Ray: a CPU per worker, and one more for Ray Data's read tasks when it streams the train split
    cpus = max(os.cpu_count() or 1, launch.workers) + (1 if launch.data_engine == "ray" else 0)
    with ray_session(launch.address, num_cpus=cpus):
        fit_with_ray(config, launch, out_dir, callbacks=callbacks)
    return json.loads((out_dir / "metrics.json").read_text())


def _selection_run(cfg: TrainConfig, launch: LaunchConfig, tracking, out_dir: Path, on_epoch: Callable | None,
                   callbacks: list | None) -> dict:
    """A refit's first run: the same settings on train alone, the best epoch chosen on validation, in
    out_dir/selection (an MLflow run nested under the refit's; test is not scored). What the refit run carries
    of it (HELD_OUT_KEY): the selected epoch, where the run is, and its held-out validation metrics."""
    folder = out_dir / SELECTION_DIR
    child = None
    if tracking:
        name = tracking.run_name or f"{cfg.model}-{out_dir.name}"
        child = dataclasses.replace(tracking, run_id=None, parent_run_id=tracking.run_id, register=None,
                                    log_model=False, run_name=f"{name}-selection")
    selection = dataclasses.replace(cfg, refit=False, out_dir=str(folder), evaluate_test=False)
    result = run_training(selection, launch, child, on_epoch, callbacks)
    return {"selected_epoch": result["best_epoch"], "selection_dir": str(folder),
            "selection_run_id": (result.get("mlflow") or {}).get("run_id"),
            "validation": result["validation"], "deployment_validation": result["deployment"]["validation"]}


def _start_tracking(cfg: TrainConfig, launch: LaunchConfig, tracking, out_dir: Path):
    """The MLflow run: the one recorded in out_dir/mlflow_run.json when resuming it, else a new one."""
    if tracking is None:
        return None

    record = out_dir / "mlflow_run.json"
    saved = _run_record(record)
    if saved and saved.get("tracking_uri") == tracking.tracking_uri and saved.get("experiment") == tracking.experiment:
        # a resumed run logs into its run again, unless that one finished (never reopened) or is gone
        if cfg.resume and reopen_run(tracking.tracking_uri, saved["run_id"]):
            return dataclasses.replace(tracking, run_id=saved["run_id"])
        close_abandoned_run(tracking.tracking_uri, saved["run_id"])  # left RUNNING by a run that died
    params = cfg.to_dict() | {"workers": max(1, launch.workers), "data_manifest": _manifest_summary(cfg.data_dir)}
    tags = {"pgt.network.model": cfg.model, "pgt.out_dir": str(out_dir), **source_tags(tracking.source), **tracking.tags}
    run_id = start_run(tracking, params, run_name=tracking.run_name or f"{cfg.model}-{out_dir.name}", tags=tags,
                       parent_run_id=tracking.parent_run_id)
    log_datasets(tracking.tracking_uri, run_id, Path(cfg.data_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(record, {"tracking_uri": tracking.tracking_uri, "experiment": tracking.experiment, "run_id": run_id})
    return dataclasses.replace(tracking, run_id=run_id)


def _run_record(record: Path) -> dict | None:
    """out_dir/mlflow_run.json (the run an earlier `pgt train` logged into), None if absent or damaged: it is this
    program's own note, and a new run replaces it."""
    try:
        saved = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and isinstance(saved.get("run_id"), str) else None


def _manifest_summary(data_dir: str) -> dict:
    """What the run's params say of its data; the manifest and the splits' columns are checked first, so that
    a bad --data fails in one line before an MLflow run or Ray starts."""
    Vocab.from_manifest(data_dir)
    for split in SPLITS:
        SequenceDataset.check_columns(Path(data_dir) / f"{split}.parquet")
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    counts = manifest.get("counts") if isinstance(manifest.get("counts"), dict) else {}
    return {"input_sha256": manifest.get("input_sha256"), "samples": counts.get("samples"), "vocab": manifest["vocab"]}

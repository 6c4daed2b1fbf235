"""`train_loop_per_worker` under Ray Train: what each TorchTrainer worker runs, and the driver-side listeners of its
one reporting channel.

Every rank calls `ray.train.report` once per epoch (rank 0 with the epoch's checkpoint) and once at the end: that
last report carries the run's result (`RESULT_KEY`) and a checkpoint holding best.pt, metrics.json and the last
epoch's checkpoint.pt. Ray Train V2 keeps, in the `Result` that `TorchTrainer.fit()` returns, the metrics and
checkpoint of the last report that had a checkpoint, so the driver gets the run's result from Ray and never reads a
file a worker wrote on its own disk. A rerun resumes from the latest reported checkpoint (the final one included:
it holds checkpoint.pt, so more epochs can follow).

The epoch's row travels as JSON (`ROW_KEY`) beside its flat metrics, so that listeners on the driver's side
(`EpochListeners`, a Ray Train callback run by Ray's controller) see the row the loop made: MLflow's epoch logger is
one of them. `TuneEpochs` forwards epochs, not the final result, to the Tune trial that runs the trainer.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from infra.output import write_file_atomically
from infra.storage import Storage, open_storage
from pgt.config import LaunchConfig, TrainConfig
from pgt.data.dataset import LIST_COLUMNS, PLACE_COLUMNS
from pgt.training.report import EpochPrinter
from pgt.training.train import train_loop_per_worker
from pgt.training.worker import Worker

RUN_NAME = "train"  # the Ray Train run's name under <out>/ray
ROW_KEY = "pgt_epoch_row"  # in an epoch's report: the loop's row, as JSON
RESULT_KEY = "pgt_result"  # in the final report: the run's result (metrics.json's content), as JSON
STREAMED_COLUMNS = ("user", *LIST_COLUMNS, *PLACE_COLUMNS, "target")  # what --data-engine ray reads of train


def flat_metrics(row: dict) -> dict:
    """An epoch row as Ray reports it: scalars, validation metrics prefixed."""
    out = {k: v for k, v in row.items() if isinstance(v, (int, float, bool)) and k != "validation"}
    out |= {f"validation_{k}": v for k, v in row["validation"].items() if isinstance(v, (int, float))}
    out |= {f"validation_strict_{k}": v for k, v in row["validation"]["strict"].items() if isinstance(v, (int, float))}
    return out


def ray_train_loop(config: dict) -> None:
    """The TorchTrainer's train_loop_per_worker: `train_loop_per_worker` with Ray's rank, device and checkpoint.
    `config`: {"train": TrainConfig as a dict, "streamed": whether the trainer holds a "train" dataset to stream}."""
    import ray.train
    import ray.train.torch
    from ray.train import Checkpoint, CheckpointConsistencyMode

    context = ray.train.get_context()
    rank = context.get_world_rank()
    printer = EpochPrinter() if rank == 0 else None  # rank 0 prints the epoch table (Ray forwards it to the driver)
    outputs = Path(tempfile.mkdtemp(prefix="pgt-result-")) if rank == 0 else None  # the final checkpoint's folder

    def report(row: dict, checkpoint_dir: Path | None) -> None:
        if printer is not None:
            printer(row)
        metrics = flat_metrics(row) | {ROW_KEY: json.dumps(row, default=float)}
        if checkpoint_dir is None:
            ray.train.report(metrics)
            return
        shutil.copyfile(Path(checkpoint_dir) / "checkpoint.pt", outputs / "checkpoint.pt")  # the latest epoch's
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(str(checkpoint_dir)),
                         checkpoint_dir_name=Path(checkpoint_dir).name)
        # until Ray's controller has committed it, a restarted group would resume from the one before
        ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED)

    restored = ray.train.get_checkpoint()
    try:
        with restored.as_directory() if restored is not None else contextlib.nullcontext() as folder:
            if folder and outputs is not None:  # a run that trains no further epoch still ends with a checkpoint.pt
                shutil.copyfile(Path(folder) / "checkpoint.pt", outputs / "checkpoint.pt")
            worker = Worker(rank=rank, world_size=context.get_world_size(), device=ray.train.torch.get_device(),
                            restored=Path(folder) / "checkpoint.pt" if folder else None, ray_owned=True,
                            outputs=outputs,
                            train_shard=ray.train.get_dataset_shard("train") if config["streamed"] else None)
            result = train_loop_per_worker(config["train"], worker=worker, on_epoch=report)
        final = {RESULT_KEY: json.dumps(result, default=float)}
        if outputs is None:
            ray.train.report(final)
        else:
            ray.train.report(final, checkpoint=Checkpoint.from_directory(str(outputs)),
                             checkpoint_dir_name=f"epoch_{result['epochs_run'] - 1:03d}_final")
    finally:
        if outputs is not None:
            shutil.rmtree(outputs, ignore_errors=True)


def epoch_listeners(make_listeners: Callable[[], list]):
    """A Ray Train callback, run by Ray's controller on the driver's side of the reports: each epoch's row, as the
    loop made it, handed to every listener (`listener(row, checkpoint)`). `make_listeners()` makes them there, at
    the first report, so that nothing unpicklable travels."""
    from ray.train import UserCallback

    class EpochListeners(UserCallback):
        def __init__(self):
            self.listeners = None

        def __getstate__(self):
            return {"listeners": None}

        def after_report(self, run_context, metrics, checkpoint):
            if ROW_KEY not in metrics[0]:
                return  # the final report: a result, not an epoch
            if self.listeners is None:
                self.listeners = make_listeners()
            row = json.loads(metrics[0][ROW_KEY])
            for listener in self.listeners:
                listener(row, checkpoint)

    return EpochListeners()


def tune_epochs():
    """Ray Tune's TuneReportCallback for a trial that runs a TorchTrainer: each epoch's flat metrics go to Tune
    (ASHA decides on them), the final report's result does not (it is no epoch)."""
    from ray.tune.integration.ray_train import TuneReportCallback

    class TuneEpochs(TuneReportCallback):
        def after_report(self, run_context, metrics, checkpoint):
            if ROW_KEY in metrics[0]:
                super().after_report(run_context, [{k: v for k, v in metrics[0].items() if k != ROW_KEY}], checkpoint)

    return TuneEpochs()


def fit_with_ray(cfg: TrainConfig, launch: LaunchConfig, storage: Storage, callbacks: list | None = None):
    """Run `ray_train_loop` on launch.workers workers (inside an existing Ray session), its checkpoints kept in
    storage/RUN_NAME (a local folder, or object storage as Ray's storage_filesystem); returns Ray's Result (raises
    Ray's error when the run failed)."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    use_gpu = launch.gpu  # Ray's own name at its door
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) >= launch.workers
    resources = {"CPU": launch.cpus_per_worker} | ({"GPU": launch.gpus_per_worker} if use_gpu else {})
    train = cfg.to_dict()
    if not cfg.threads:  # a worker uses the CPUs it reserved, as Ray's OMP_NUM_THREADS says
        train["threads"] = max(1, int(launch.cpus_per_worker))
    datasets = None
    if launch.data_engine == "ray":  # each worker streams an equal shard of the train split
        data = open_storage(cfg.data_dir)  # read where it is kept: a local folder or object storage
        datasets = {"train": ray.data.read_parquet(data.join("train.parquet"), filesystem=data.filesystem)
                    .select_columns(list(STREAMED_COLUMNS))}
    trainer = _trainer_class()(
        ray_train_loop,
        train_loop_config={"train": train, "streamed": datasets is not None},
        datasets=datasets,
        scaling_config=ScalingConfig(num_workers=launch.workers, use_gpu=use_gpu, resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(name=RUN_NAME, storage_path=storage.path,
                             storage_filesystem=None if storage.local is not None else storage.filesystem,
                             failure_config=FailureConfig(max_failures=launch.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints + 1),
                             callbacks=callbacks or []),
    )
    return trainer.fit()


def _trainer_class():
    from ray.train.torch import TorchTrainer

    class Trainer(TorchTrainer):
        """TorchTrainer whose fit() leaves the process's Ctrl+C handler alone. Ray Train's own asks the controller
        actor to abort and waits for its answer: where the signal went to the whole process group (a terminal's
        SIGHUP, `kill -- -PGID`, systemd's stop, Prefect's cancel), the local Ray's head died of it too, the answer
        never comes, and Ray ends the process 60 s later without its cleanup (MLflow run left RUNNING, lock file
        left). Here the signal raises KeyboardInterrupt in the driver's wait instead; the local Ray is shut down on
        the way out, and a cluster ends the job's actors with its driver."""

        def _register_sigint_handler(self, controller) -> None:
            pass

    return Trainer


def ray_result(result, out_dir: Path) -> dict:
    """From Ray Train's Result: the run's result (metrics.json's content), its best.pt copied to out_dir (fused
    seeds have none)."""
    if result.metrics is None or RESULT_KEY not in result.metrics:
        raise RuntimeError(f"Ray Train's run at {result.path} ended without its final report")
    with result.checkpoint.as_directory() as folder:
        best = Path(folder) / "best.pt"
        if best.is_file():
            write_file_atomically(out_dir / "best.pt", lambda tmp: shutil.copyfile(best, tmp))
    return json.loads(result.metrics[RESULT_KEY])

"""What runs inside a Ray Tune trial actor: a trial, a finalist or the final run, each one `run_training` with its
result and checkpoints reported to Tune, resumed from the checkpoint Tune hands back."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.output import process_alive
from infra.storage import Storage, open_storage
from pgt.config import LaunchConfig, TrackingConfig, TrainConfig
from pgt.network.checkpoint import read_checkpoint
from pgt.tracking.runs import OUT_DIR_TAG
from pgt.training.ray_train import RESULT_KEY, flat_metrics, tune_epochs
from pgt.training.run import run_training
from tune.config import SweepConfig
from tune.records import FINAL, FINALISTS


def run_trial(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable: one training run with the drawn hyper-parameters."""
    import ray
    import ray.tune

    spec = SweepConfig.from_dict(sweep)
    trial_id = ray.tune.get_context().get_trial_id()
    kept = open_storage(spec.out_dir).child("trials", trial_id)
    kept.write_json({"node_id": ray.get_runtime_context().get_node_id(), "hostname": os.uname().nodename,
                     "pid": os.getpid(), "started_at": time.time()}, "node.json")
    # a trial is chosen on validation: test is read once, by the winner's final run
    train_in_trial(spec, lambda out_dir: dataclasses.replace(spec.train_config(spec.space.resolve(config), out_dir),
                                                             evaluate_test=False),
                   kept, tracking, f"trial-{trial_id}")


def run_finalist(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable of the confirmation: one finalist's configuration on a group of the seeds the
    search did not use (several side by side: fused_seeds), scored on validation."""
    spec = SweepConfig.from_dict(sweep)
    finalist, seeds = config["finalist"], config["finalist"]["seeds"]
    train_in_trial(spec, lambda out_dir: spec.confirmation_config(finalist["config"], out_dir, seeds),
                   finalist_folder(open_storage(spec.out_dir), finalist["name"], seeds), tracking,
                   f"finalist-{finalist['name']}-seeds-{'-'.join(map(str, seeds))}")


def finalist_folder(out: Storage, name: str, seeds: list[int]) -> Storage:
    """A finalist's run on a group of seeds: --out/finalists/<name>/seeds-<first>[-<next>...]."""
    return out.child(FINALISTS, name, f"seeds-{'-'.join(map(str, seeds))}")


def run_final(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable of the final run: the winner's recipe (best_recipe.yaml's settings) trained on the
    sweep's seed, refit and test included, as `pgt train --recipe-file best_recipe.yaml` trains it (resumed from its
    own checkpoints), its model logged to its own MLflow run. Its result goes back to the driver in its report
    (RESULT_KEY)."""
    import ray.tune

    spec = SweepConfig.from_dict(sweep)
    kept = open_storage(spec.out_dir).child(FINAL)
    child = child_tracking(tracking, "final", kept)
    child = dataclasses.replace(child, log_model=True) if child else None
    if spec.workers_per_trial == 1:
        with trial_folder(kept) as out_dir:
            result = run_training(final_config(spec, config["recipe"], out_dir), LaunchConfig(workers=0), child)
    else:
        result = run_training(final_config(spec, config["recipe"], kept.uri), trial_workers(spec), child)
    ray.tune.report({"validation_strict_acc@1": result.validation["strict"]["acc@1"],
                     RESULT_KEY: json.dumps(result.to_dict(), default=float)})


def final_config(spec: SweepConfig, recipe: dict, out_dir: Path | str):
    """The final run's TrainConfig: the recipe's settings on the sweep's data and seed, nothing else."""
    threads = max(1, int(spec.cpus_per_trial)) if spec.workers_per_trial == 1 else 0
    return TrainConfig.from_recipe(recipe, data_dir=spec.data_dir, out_dir=str(out_dir), seed=spec.seed, threads=threads)


def child_tracking(tracking: dict | None, run_name: str, kept: Storage):
    """A trial's MLflow run, a child of the sweep's (no model logged or registered there), tagged with where the
    trial is kept; None untracked."""
    if not tracking:
        return None
    parent = TrackingConfig.from_dict(tracking)
    return dataclasses.replace(parent, run_id=None, parent_run_id=parent.run_id, log_model=False, register=None,
                               run_name=run_name, tags={**parent.tags, OUT_DIR_TAG: kept.uri})


def trial_workers(spec: SweepConfig) -> LaunchConfig:
    """The TorchTrainer of spec.workers_per_trial workers a trial runs inside itself."""
    return LaunchConfig(workers=spec.workers_per_trial, cpus_per_worker=spec.cpus_per_worker,
                        gpu=spec.gpus_per_worker > 0, gpus_per_worker=spec.gpus_per_worker or 1.0,
                        max_failures=spec.max_failures)


KEPT_RECORDS = ("mlflow_run.json", "metrics.json", "best.pt", "plots")  # what a one-worker trial's run keeps


@contextmanager
def trial_folder(kept: Storage) -> Iterator[Path]:
    """The local folder a one-worker trial trains in (its checkpoints go to Tune's storage through its reports): the
    trial's own folder in a local sweep. In a sweep on object storage, a folder on this node that starts with the
    records kept there (the MLflow run a restarted trial reopens, a finished result) and whose records are kept there
    when the run ends; the folder is removed then. A trial that ASHA stops never returns here (Tune drops its
    thread): its MLflow run's record was kept at its first epoch, and its folder goes when this node's next trial
    of the same process, or of a process that has ended, starts."""
    if kept.local is not None:
        kept.local.mkdir(parents=True, exist_ok=True)
        yield kept.local
        return
    scratch = Path(tempfile.gettempdir()) / "pgt-trials"
    scratch.mkdir(parents=True, exist_ok=True)
    for entry in scratch.iterdir():  # a trial stopped by ASHA ends without its `finally`; a killed process, too
        pid = entry.name.partition("-")[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not process_alive(int(pid))):
            shutil.rmtree(entry, ignore_errors=True)
    work = scratch / f"{os.getpid()}-{hashlib.sha256(kept.uri.encode()).hexdigest()[:16]}"
    work.mkdir()
    try:
        for name in ("mlflow_run.json", "metrics.json"):
            data = kept.read_bytes(name)
            if data is not None:
                (work / name).write_bytes(data)
        yield work
    finally:
        try:
            keep_records(work, kept)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def keep_records(work: Path, kept: Storage, names: tuple[str, ...] = KEPT_RECORDS) -> None:
    """The run's records `names` in `work` copied to `kept`, where it is another place."""
    if kept.local is not None and kept.local.resolve() == work.resolve():
        return
    for name in names:
        if (work / name).exists():
            kept.upload(work / name, name)


def train_in_trial(spec: SweepConfig, make_config: Callable[[Path | str], TrainConfig], kept: Storage,
                   tracking: dict | None, run_name: str) -> None:
    """Train make_config(out_dir) inside a Tune trial kept in `kept`, reporting every epoch (with its checkpoint) to
    Tune, resumed from the checkpoint Tune restores; an MLflow child run of the sweep's when tracked."""
    import ray.tune

    child = child_tracking(tracking, run_name, kept)
    if spec.workers_per_trial > 1:  # the TorchTrainer restarts its own workers, and keeps the run in `kept`
        run_training(make_config(kept.uri), trial_workers(spec), child, callbacks=[tune_epochs()])
        return
    with trial_folder(kept) as out_dir:  # Tune restarts the trial, from the checkpoint it restores
        cfg = make_config(out_dir)
        restored = restore_trial_checkpoint(ray.tune.get_checkpoint(), out_dir)
        if restored is not None and finished_before(cfg, out_dir, restored):
            return  # Tune's state predates the trial's end (the driver was killed): its result is kept already
        reported = []

        def report(row: dict, checkpoint_dir: Path | None) -> None:
            if not reported:  # the MLflow run, kept for a restart on another node to reopen
                keep_records(out_dir, kept, ("mlflow_run.json",))
                reported.append(True)
            checkpoint = ray.tune.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
            ray.tune.report(flat_metrics(row), checkpoint=checkpoint)

        run_training(cfg, LaunchConfig(workers=0), child, on_epoch=report)


def finished_before(cfg, out_dir: Path, checkpoint: Path) -> bool:
    """Whether out_dir holds the finished result (metrics.json) of this very configuration, ending at the epoch of
    the checkpoint Tune restored (its folder epoch_NNN, as restore_trial_checkpoint put it): then nothing is trained,
    scored or logged again."""
    try:
        done = json.loads((out_dir / "metrics.json").read_text())
        epoch = int(checkpoint.parent.name.removeprefix("epoch_"))
    except (OSError, ValueError):
        return False
    # the same settings; its folder may be another node's (a sweep on object storage trains in node-local folders)
    same = {k: v for k, v in done.get("config", {}).items() if k not in ("resume", "out_dir")} == \
        {k: v for k, v in cfg.to_dict().items() if k not in ("resume", "out_dir")}
    return same and done.get("epochs_run") == epoch + 1


def restore_trial_checkpoint(checkpoint, out_dir: Path) -> Path | None:
    """Put the checkpoint Tune hands a restarted trial back under out_dir/checkpoints/epoch_NNN (unless it is
    there already) and drop later epochs written after Tune's last registered report, so that training resumes
    exactly where Tune's iteration count does. Returns its path, None without one."""
    if checkpoint is None:
        return None

    with checkpoint.as_directory() as folder:
        source = Path(folder) / "checkpoint.pt"
        epoch = int(read_checkpoint(source, "cpu", ("epoch",))["epoch"])
        target = out_dir / "checkpoints" / f"epoch_{epoch:03d}" / "checkpoint.pt"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    for later in (out_dir / "checkpoints").glob("epoch_*"):
        if later.name > target.parent.name:
            shutil.rmtree(later, ignore_errors=True)
    return target

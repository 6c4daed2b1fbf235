"""What runs inside a Ray Tune trial actor: a trial, a finalist or the final run, each one `run_training` with its
result and checkpoints reported to Tune, resumed from the checkpoint Tune hands back."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from infra.output import write_json_atomically
from pgt.config import LaunchConfig, TrackingConfig, TrainConfig, load_recipe_file
from pgt.network.checkpoint import read_checkpoint
from pgt.training.ray_train import RESULT_KEY, flat_metrics, tune_epochs
from pgt.training.run import run_training
from tune.config import SweepConfig
from tune.records import FINAL, FINALISTS


def run_trial(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable: one training run with the drawn hyper-parameters."""
    import ray
    import ray.tune

    spec = SweepConfig.from_dict(sweep)
    context = ray.tune.get_context()
    trial_id = context.get_trial_id()
    out_dir = Path(spec.out_dir) / "trials" / trial_id
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomically(out_dir / "node.json", {"node_id": ray.get_runtime_context().get_node_id(),
                                                  "hostname": os.uname().nodename, "pid": os.getpid(),
                                                  "started_at": time.time()})
    # a trial is chosen on validation: test is read once, by the winner's final run
    cfg = dataclasses.replace(spec.train_config(spec.space.resolve(config), out_dir), evaluate_test=False)
    train_in_trial(spec, cfg, out_dir, tracking, f"trial-{trial_id}")


def run_finalist(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable of the confirmation: one finalist's configuration on a group of the seeds the
    search did not use (several side by side: fused_seeds), scored on validation."""
    spec = SweepConfig.from_dict(sweep)
    finalist, seeds = config["finalist"], config["finalist"]["seeds"]
    out_dir = finalist_dir(Path(spec.out_dir), finalist["name"], seeds)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_in_trial(spec, spec.confirmation_config(finalist["config"], out_dir, seeds), out_dir, tracking,
                   f"finalist-{finalist['name']}-seeds-{'-'.join(map(str, seeds))}")


def finalist_dir(out: Path, name: str, seeds: list[int]) -> Path:
    """A finalist's run on a group of seeds: --out/finalists/<name>/seeds-<first>[-<next>...]."""
    return out / FINALISTS / name / f"seeds-{'-'.join(map(str, seeds))}"


def run_final(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable of the final run: the winner's recipe file trained on the sweep's seed, refit and
    test included, as `pgt train --recipe-file best_recipe.yaml` trains it (resumed from its own checkpoints), its
    model logged to its own MLflow run. Its result goes back to the driver in its report (RESULT_KEY)."""
    import ray.tune

    spec = SweepConfig.from_dict(sweep)
    out_dir = Path(spec.out_dir) / FINAL
    cfg = final_config(spec, Path(config["recipe_file"]), out_dir)
    launch = LaunchConfig(workers=0) if spec.workers_per_trial == 1 else trial_workers(spec)
    child = child_tracking(tracking, "final")
    result = run_training(cfg, launch, dataclasses.replace(child, log_model=True) if child else None)
    ray.tune.report({"validation_strict_acc@1": result.validation["strict"]["acc@1"],
                     RESULT_KEY: json.dumps(result.to_dict(), default=float)})


def final_config(spec: SweepConfig, recipe_file: Path, out_dir: Path):
    """The final run's TrainConfig: the recipe file's settings on the sweep's data and seed, nothing else."""
    threads = max(1, int(spec.cpus_per_trial)) if spec.workers_per_trial == 1 else 0
    return TrainConfig.from_recipe(load_recipe_file(recipe_file), data_dir=spec.data_dir, out_dir=str(out_dir),
                                   seed=spec.seed, threads=threads)


def child_tracking(tracking: dict | None, run_name: str):
    """A trial's MLflow run, a child of the sweep's (no model logged or registered there); None untracked."""
    if not tracking:
        return None
    parent = TrackingConfig.from_dict(tracking)
    return dataclasses.replace(parent, run_id=None, parent_run_id=parent.run_id, log_model=False, register=None,
                               run_name=run_name)


def trial_workers(spec: SweepConfig) -> LaunchConfig:
    """The TorchTrainer of spec.workers_per_trial workers a trial runs inside itself."""
    return LaunchConfig(workers=spec.workers_per_trial, cpus_per_worker=spec.cpus_per_worker,
                        gpu=spec.gpus_per_worker > 0, gpus_per_worker=spec.gpus_per_worker or 1.0,
                        max_failures=spec.max_failures)


def train_in_trial(spec: SweepConfig, cfg, out_dir: Path, tracking: dict | None, run_name: str) -> None:
    """Train cfg inside a Tune trial, reporting every epoch (with its checkpoint) to Tune, resumed from the
    checkpoint Tune restores; an MLflow child run of the sweep's when tracked."""
    import ray.tune

    child = child_tracking(tracking, run_name)
    if spec.workers_per_trial == 1:
        restored = restore_trial_checkpoint(ray.tune.get_checkpoint(), out_dir)
        if restored is not None and finished_before(cfg, out_dir, restored):
            return  # Tune's state predates the trial's end (the driver was killed): its result is on disk already

        def report(row: dict, checkpoint_dir: Path | None) -> None:
            checkpoint = ray.tune.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
            ray.tune.report(flat_metrics(row), checkpoint=checkpoint)

        run_training(cfg, LaunchConfig(workers=0), child, on_epoch=report)
    else:  # the TorchTrainer restarts its own workers; Tune restarts the trial's driver
        run_training(cfg, trial_workers(spec), child, callbacks=[tune_epochs()])


def finished_before(cfg, out_dir: Path, checkpoint: Path) -> bool:
    """Whether out_dir holds the finished result (metrics.json) of this very configuration, ending at the epoch of
    the checkpoint Tune restored (its folder epoch_NNN, as restore_trial_checkpoint put it): then nothing is trained,
    scored or logged again."""
    try:
        done = json.loads((out_dir / "metrics.json").read_text())
        epoch = int(checkpoint.parent.name.removeprefix("epoch_"))
    except (OSError, ValueError):
        return False
    same = {k: v for k, v in done.get("config", {}).items() if k != "resume"} == \
        {k: v for k, v in cfg.to_dict().items() if k != "resume"}
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

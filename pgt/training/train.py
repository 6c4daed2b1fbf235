"""`train_loop_per_worker(config)`: the training loop, the same in one process and under Ray Train.

AdamW, linear warmup then cosine decay (per epoch), label smoothing, gradient clipping, early stopping
on validation Acc@1, mixed precision on CUDA, seeded and deterministic on CPU. Every epoch ends with a
checkpoint (model, optimizer, scheduler, epoch, best metric, RNG states); a rerun resumes from the
latest one. The best epoch's weights are evaluated on test and written to metrics.json (state.py starts a run,
finish.py ends it). Every epoch's row goes to one channel, `on_epoch(row, checkpoint_dir)`: Ray's report, Tune's,
and the driver's MLflow logger listen there (pgt.training.run); the loop itself knows neither MLflow nor Ray.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import torch

from pgt.config import TrainConfig, selection_score
from pgt.data.scoring import evaluate, model_scores
from pgt.network.checkpoint import save_checkpoint
from pgt.network.model import networks
from pgt.training.finish import finish, mean_metrics
from pgt.training.state import TrainState, setup
from pgt.training.step import train_step
from pgt.training.worker import Worker, all_reduce_mean, local_worker, replicas_in_sync

SELECTION_DIR = "selection"  # a refit's selection run, inside the run's folder
# what a run writes in its --out folder (names or glob patterns): a folder holding anything else is refused
OUTPUTS = ("metrics.json", "best.pt", "checkpoints", "ray", "plots", "mlflow_run.json", SELECTION_DIR, ".*.tmp-*",
           ".*.lock")

def eager_steps(state: TrainState) -> tuple[torch.Tensor, int]:
    """An epoch's steps, each launched op by op: (the summed loss, on the device; the samples seen)."""
    worker = state.worker
    loss_sum, seen = torch.zeros((), device=worker.device), 0
    for batch in state.loader:
        batch = batch.to(worker.device, non_blocking=True)
        loss_sum += train_step(state, batch) * len(batch.targets) / state.side_by_side  # one network's mean loss
        seen += len(batch.targets)
    return loss_sum, seen


def whole_steps(state: TrainState) -> tuple[torch.Tensor, int]:
    """An epoch's steps as whole units (capture_step): (the summed loss, on the device; the samples seen)."""
    step, seen = state.whole_step, 0
    step.loss_sum.zero_()
    for idx, width in state.loader.indices():
        step(idx, width)
        seen += len(idx)
    return step.loss_sum, seen


def train_epoch(state: TrainState, epoch: int) -> dict:
    """One epoch: train on every batch, validate, keep the best weights; the epoch's row of the history."""
    cfg, worker = state.cfg, state.worker
    (state.loader if state.streamed else state.loader.batch_sampler).set_epoch(epoch)
    state.ddp_model.train()
    began = time.perf_counter()
    # the same step either way: one unit per batch, captured on CUDA (capture_step), or launched op by op
    loss_sum, seen = whole_steps(state) if state.whole_step is not None else eager_steps(state)
    train_loss, seen = all_reduce_mean(loss_sum, seen, worker)  # reads the loss: the epoch's kernels are done
    seconds = time.perf_counter() - began
    lr = float(state.optimizer.param_groups[0]["lr"])
    state.scheduler.step()
    if state.seeds is None:
        validation = evaluate(model_scores(state.evaluated), state.splits["validation"], cfg.eval_batch_size,
                              worker.device, state.validation_loss(), worker)
        for key, value in selection(state.best_metric, state.bad_epochs, state.evaluated, epoch, validation,
                                    cfg).items():
            setattr(state, key, value)
        seed_rows = None
    else:  # fused seeds: each network scored and selected apart; the row shows their mean
        each = [evaluate(model_scores(net), state.splits["validation"], cfg.eval_batch_size, worker.device,
                         state.validation_loss(), worker) for net in networks(state.evaluated)]
        for net, mine, validation in zip(networks(state.evaluated), state.seeds, each):
            mine.update(selection(mine["best_metric"], mine["bad_epochs"], net, epoch, validation, cfg))
        state.best_epoch = max(mine["best_epoch"] for mine in state.seeds)
        state.bad_epochs = min(mine["bad_epochs"] for mine in state.seeds)  # stops once every seed would
        validation = mean_metrics(each)
        seed_rows = [{"seed": cfg.seed + i, "validation_strict_acc@1": v["strict"]["acc@1"],
                      "validation_acc@1": v["acc@1"], "best_epoch": mine["best_epoch"]}
                     for i, (v, mine) in enumerate(zip(each, state.seeds))]
    stop = epoch + 1 >= cfg.stop_after_epochs if cfg.stop_after_epochs else \
        epoch + 1 >= cfg.min_epochs and state.bad_epochs >= cfg.patience
    row = {"epoch": epoch, "train_loss": train_loss, "lr": lr, "seconds": seconds, "samples": seen,
           "samples_per_second": seen / seconds, "validation": validation, "best_epoch": state.best_epoch,
           "stop": stop, "learned_from_validation": cfg.train_on != "train"}
    if seed_rows is not None:
        row["seeds"] = seed_rows
    if worker.world_size > 1:
        row["replicas_in_sync"] = replicas_in_sync(state.model, worker.device)
    state.history.append(row)
    return row


def selection(best_metric: float, bad_epochs: int, evaluated: torch.nn.Module, epoch: int, validation: dict,
              cfg: TrainConfig) -> dict:
    """What an epoch changes of a selection (best_metric, best_epoch, bad_epochs, best_state): its weights when its
    validation score is the best so far, else one more bad epoch."""
    # stop_after_epochs: the last epoch is the one kept (validation may be in the training data)
    score = epoch if cfg.stop_after_epochs else selection_score(validation, cfg.select_on)
    if score > best_metric:
        return {"best_metric": score, "best_epoch": epoch, "bad_epochs": 0,
                "best_state": {k: v.detach().clone() for k, v in evaluated.state_dict().items()}}
    return {"bad_epochs": bad_epochs + 1}


def train_loop_per_worker(config: dict, worker: Worker | None = None, on_epoch=None) -> dict:
    """Train one model: setup, one epoch at a time, finish. `config` is TrainConfig as a dict (the Ray
    boundary). Rank 0 alone writes the checkpoints; `on_epoch(row, checkpoint_dir)` is called on every worker
    after each epoch, once rank 0 has written the epoch's checkpoint (checkpoint_dir: its folder on rank 0, else
    None). The first row after a resumption carries the rows before it under "earlier", for listeners that missed
    them. Returns the final metrics."""
    state = setup(config, worker or local_worker())
    for epoch in state.epochs():
        row = train_epoch(state, epoch)
        if epoch == state.start_epoch and state.resumed_at:
            row = {**row, "earlier": state.history[:-1]}
        checkpoint_dir, staging = None, None
        if state.worker.is_chief:  # under Ray Train, a staging folder that Ray copies into its storage
            staging = Path(tempfile.mkdtemp(prefix="pgt-checkpoint-")) if state.worker.ray_owned else None
            checkpoint_dir = save_checkpoint(state.checkpoint(epoch), staging or Path(state.cfg.out_dir), epoch,
                                             state.cfg.keep_checkpoints)
        try:
            if on_epoch is not None:
                on_epoch(row, checkpoint_dir)
        finally:
            if staging is not None:  # reported: the one copy is Ray's
                shutil.rmtree(staging, ignore_errors=True)
        if row["stop"]:
            state.early_stopped = True
            break
    return finish(state)

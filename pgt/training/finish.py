"""The end of a training run: the best epoch's weights scored on validation (and test), with the inputs serving
has too; best.pt and metrics.json written by rank 0 (the run layer, pgt.training.run, logs them). Fused seeds end as
several seeds' evidence."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from infra.output import write_json_atomically
from pgt.data.scoring import evaluate, model_scores
from pgt.network.checkpoint import write_torch_file
from pgt.network.model import networks
from pgt.training.state import TrainState


def mean_metrics(each: list[dict]) -> dict:
    """The mean of several metric dicts of one shape (numbers averaged, nested dicts in turn; anything else the
    first's)."""
    first = each[0]
    mean = {}
    for key, value in first.items():
        if isinstance(value, dict):
            mean[key] = mean_metrics([e[key] for e in each])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            mean[key] = sum(e[key] for e in each) / len(each)
        else:
            mean[key] = value
    return mean


def finish(state: TrainState) -> dict:
    """The best epoch's weights scored on validation (and test), best.pt and metrics.json written by rank 0 into
    worker.outputs (else the run's out_dir): the run's result."""
    cfg, worker = state.cfg, state.worker
    if state.seeds is not None:
        return finish_fused(state)
    state.model.load_state_dict(state.best_state)
    scores, live = model_scores(state.model), model_scores(state.model, live=True)
    result = {
        "model": cfg.model,
        "test": evaluate(scores, state.splits["test"], cfg.eval_batch_size, worker.device, state.validation_loss(),
                         worker) if cfg.evaluate_test else None,
        "validation": evaluate(scores, state.splits["validation"], cfg.eval_batch_size, worker.device,
                               state.validation_loss(), worker),
        # the inputs a live prediction has: recency from the last visit's day, the target's day unknown (not of a
        # validation split the run learned from: a refit's held-out figures are its selection run's)
        "deployment": {split: evaluate(live, state.splits[split].anchored_at_last_visit(), cfg.eval_batch_size,
                                       worker.device, worker=worker)
                       for split in ("validation", "test")
                       if (split == "validation" and cfg.train_on == "train") or (split == "test" and cfg.evaluate_test)},
        **run_summary(state),
    }
    if worker.is_chief:
        out_dir = worker.outputs or Path(cfg.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_torch_file({"model": state.best_state, "model_config": dataclasses.asdict(state.model_cfg),
                          "config": cfg.to_dict(), "best_epoch": state.best_epoch}, out_dir / "best.pt")
        write_json(out_dir / "metrics.json", result)
    return result


def run_summary(state: TrainState) -> dict:
    """What metrics.json says of a run beside its scores: selection, epochs, speed, size, resumptions, the epochs'
    history and the configs."""
    cfg, history = state.cfg, state.history
    train_seconds = sum(row["seconds"] for row in history)
    samples_seen = sum(row["samples"] for row in history)
    return {
        "select_on": cfg.select_on,
        "best_epoch": state.best_epoch + 1,  # 1-based, as epochs_run
        "epochs_run": len(history),
        "early_stopped": state.early_stopped,
        "workers": state.worker.world_size,
        "train_seconds": round(train_seconds, 3),
        "samples_per_second": round(samples_seen / train_seconds, 1) if train_seconds else 0.0,
        "parameters": state.parameters,
        "resumed_at_epochs": [e + 1 for e in state.resumed_at],  # 1-based epochs a resumption started with
        "history": [{k: v for k, v in row.items() if k != "validation"}
                    | {"validation_acc@1": row["validation"]["acc@1"],
                       "validation_strict_acc@1": row["validation"]["strict"]["acc@1"]} for row in history],
        "config": cfg.to_dict(),
        "model_config": dataclasses.asdict(state.model_cfg),
    }


def finish_fused(state: TrainState) -> dict:
    """fused_seeds: each seed's network at its own best epoch, scored on validation (and test) and with the inputs
    serving has; metrics.json lists them under `seeds`, and its figures are their mean. No best.pt: the run is
    several seeds' evidence, not one model to serve."""
    cfg, worker = state.cfg, state.worker
    nets = networks(state.model)
    seeds = []
    for i, (net, mine) in enumerate(zip(nets, state.seeds)):
        net.load_state_dict(mine["best_state"])
        scores, live = model_scores(net), model_scores(net, live=True)
        scored = {"seed": cfg.seed + i, "best_epoch": mine["best_epoch"] + 1,
                  "validation": evaluate(scores, state.splits["validation"], cfg.eval_batch_size, worker.device,
                                         state.validation_loss(), worker),
                  "test": evaluate(scores, state.splits["test"], cfg.eval_batch_size, worker.device,
                                   state.validation_loss(), worker) if cfg.evaluate_test else None,
                  "deployment": {split: evaluate(live, state.splits[split].anchored_at_last_visit(),
                                                 cfg.eval_batch_size, worker.device, worker=worker)
                                 for split in ("validation", "test") if split == "validation" or cfg.evaluate_test}}
        seeds.append(scored)
    result = {
        "model": cfg.model,
        "fused_seeds": cfg.fused_seeds,
        "seeds": seeds,
        "validation": mean_metrics([s["validation"] for s in seeds]),
        "test": mean_metrics([s["test"] for s in seeds]) if cfg.evaluate_test else None,
        "deployment": {split: mean_metrics([s["deployment"][split] for s in seeds]) for split in seeds[0]["deployment"]},
        **run_summary(state),  # its best_epoch: the latest of the seeds' best epochs
    }
    if worker.is_chief:
        out_dir = worker.outputs or Path(cfg.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / "metrics.json", result)
    return result


def write_json(path: Path, data: dict) -> None:
    """Atomically, through a uniquely named temporary file (two writers never share one)."""
    write_json_atomically(path, data, indent=2, default=float)


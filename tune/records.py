"""What a sweep writes under its folder (--out: a local folder, or object storage by URI; infra.storage), and the
driver's own record of each trial: the events Tune's driver saw (checkpoint registered, completed, restarted,
failed), written as they happen, read to resume."""

from __future__ import annotations

import json
import time
from pathlib import Path

from infra.storage import Storage, open_storage

EXPERIMENT_NAME = "sweep"  # the Tune experiment's folder under DIR/ray
CONFIRMATION = "confirmation"  # the finalists' Tune experiment under DIR/ray, and their runs under DIR/finalists
FINALISTS = "finalists"
FINAL = "final"  # the winner's recipe trained as `pgt train --recipe-file best_recipe.yaml` would: DIR/final, and its
# Tune experiment under DIR/ray; its best.pt is the sweep's model
BASE = "base"  # the finalist that is the base recipe itself
WINNER = "best_recipe.yaml"  # the winning configuration as a recipe file
# what a sweep writes
OUTPUTS = ("sweep.json", "tune.json", WINNER, "trials", FINALISTS, FINAL, "trials.png", "ray", ".*.tmp-*", ".*.lock")


TRIAL_EVENTS = "tune_events.jsonl"  # trials/<id>/: what the sweep's driver recorded of the trial (TrialEvents)


def make_trial_events(out: Storage, metric: str):
    """A Tune callback (built here so that ray is imported late) that appends to trials/<id>/tune_events.jsonl,
    in the driver, once Tune itself has acted: `checkpoint` after Tune registered a reported checkpoint (the one a
    restart restores), `restarted` when a failed trial is scheduled again (with the epoch it will resume after),
    `failed` when it errors for good, `completed` when it ended (finished, or stopped by ASHA). One JSON object per
    line: event, time, epoch (0-based, or null), training_iteration, score (the reported `metric` of that
    checkpoint, or null)."""
    from ray.tune import Callback

    written: dict[str, bytes] = {}  # on object storage, each trial's events so far (the driver is their one writer)

    class TrialEvents(Callback):
        def on_trial_save(self, iteration, trials, trial, **info):
            append_event(out, trial, "checkpoint", written, metric)

        def on_trial_recover(self, iteration, trials, trial, **info):
            append_event(out, trial, "restarted", written, metric)

        def on_trial_error(self, iteration, trials, trial, **info):
            append_event(out, trial, "failed", written, metric)

        def on_trial_complete(self, iteration, trials, trial, **info):
            append_event(out, trial, "completed", written, metric)

    return TrialEvents()


def append_event(out: Storage, trial, event: str, written: dict[str, bytes] | None = None,
                 metric: str | None = None) -> None:
    """One event appended to the trial's record. On object storage the object is replaced whole, with the events
    so far: those `written` holds (this driver's), else read back once (a resumed sweep's)."""
    registered = trial.latest_checkpoint_result  # what Tune restores the trial from
    metrics = registered.metrics if registered is not None else {}
    line = json.dumps({"event": event, "time": time.time(), "epoch": metrics.get("epoch"),
                       "training_iteration": metrics.get("training_iteration"),
                       "score": metrics.get(metric) if metric else None}) + "\n"
    folder = out.child("trials", trial.trial_id)
    if folder.local is None:
        written = {} if written is None else written
        if trial.trial_id not in written:
            written[trial.trial_id] = folder.read_bytes(TRIAL_EVENTS) or b""
        written[trial.trial_id] += line.encode()
        folder.write_bytes(written[trial.trial_id], TRIAL_EVENTS)
        return
    folder.local.mkdir(parents=True, exist_ok=True)
    with open(folder.local / TRIAL_EVENTS, "a") as fh:  # the driver is its one writer; one whole line per event
        fh.write(line)
        fh.flush()


def trial_ended(out: Storage, trial) -> bool:
    """Whether Tune ended the trial itself (finished, stopped by ASHA, or failed for good): its driver recorded that
    event. Its status alone does not say: on Ctrl+C Tune marks the trials it cleans up, pending ones included,
    TERMINATED without ending them."""
    return any(e["event"] in ("completed", "failed") for e in read_trial_events(out.child("trials", trial.trial_id)))


def read_trial_events(trial_dir: Storage | Path) -> list[dict]:
    """The events the driver recorded of a trial (make_trial_events) in its folder, oldest first; [] when none."""
    folder = trial_dir if isinstance(trial_dir, Storage) else open_storage(trial_dir)
    lines = (folder.read_bytes(TRIAL_EVENTS) or b"").decode().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # a line being written is left out


def trial_dirname(trial) -> str:
    """Tune's folder of a trial: trial_<id>, the id also naming our trials/<id> folder."""
    return f"trial_{trial.trial_id}"

"""Interrupted sweeps resume (Ctrl+C, SIGTERM, SIGKILL of the driver) and a crashed trial restarts from its last
registered checkpoint: real Ray, `pgt tune` in a subprocess (signals and exit codes are the point), --no-final (the
final run is test_sweep.py's subject). Apart from test_sweep.py so that the two test workers
share the slow sweep files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.tune.commands import PGT, tune_cli
from tune.records import read_trial_events

pytestmark = pytest.mark.slow  # on GeoLife where ../shared/data is, else synthetic (training_sequences)
# `pgt tune` joins the test process's shared Ray (on_shared_ray) where its own Ray is not the point: a driver that is
# stopped or killed takes its trials with it (Ray ends a job whose driver is gone). Ctrl+C keeps a Ray of the sweep's
# own, started in the terminal's process group, so that its trials get the SIGINT too, as a user's would.


@pytest.mark.parametrize(("search", "stop", "status"), [("random", signal.SIGINT, 130), ("optuna", signal.SIGTERM, 143),
                                                        ("optuna", signal.SIGKILL, -signal.SIGKILL)],
                         ids=["random-ctrl-c", "optuna-sigterm", "optuna-sigkill"])
def test_interrupted_sweep_resumes_without_rerunning_finished_trials(training_sequences, tmp_path, search, stop, status,
                                                                     request):
    """Ctrl+C (SIGINT to the whole process group, as a terminal sends it: the trials' processes get it too), or
    SIGTERM (handled as Ctrl+C) or SIGKILL of the driver, after the first trial: the sweep stops, says how to resume,
    and `--resume` runs the rest without training the finished trial again, whatever the search. (Random search's
    trial created but not started at Ctrl+C once came back holding Ray's placeholder for its nhead.)"""
    if stop != signal.SIGINT:
        request.getfixturevalue("on_shared_ray")
    out = tmp_path / "sweep"
    proc = subprocess.Popen([*PGT, "tune", "--data", str(training_sequences), "--out", str(out), "--trials", "2",
                             "--epochs", "2", "--max-concurrent", "1", "--grace-period", "2", "--finalists", "0", "--no-final",
                             "--search", search],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=stop == signal.SIGINT)  # a group of its own, as a terminal's job
    deadline = time.monotonic() + 300
    # Tune's own record that it has ended the first trial (its driver's event, after the trial returned)
    while not any(e["event"] == "completed" for trial in (out / "trials").glob("*") for e in read_trial_events(trial)):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    if stop == signal.SIGINT:
        os.killpg(proc.pid, stop)
    else:
        proc.send_signal(stop)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == status, output[-3000:]
    if stop != signal.SIGKILL:  # a killed sweep says nothing; its lock and Tune's saved state are enough to resume
        assert "resume it with `pgt tune --resume" in output
    done_before = {p.parent.name: p.stat().st_mtime_ns for p in (out / "trials").glob("*/metrics.json")}
    assert len(done_before) == 1

    r = tune_cli("--resume", out)
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads((out / "tune.json").read_text())
    assert len(result["trials"]) == 2 and {row["status"] for row in result["trials"]} <= {"finished", "stopped (ASHA)"}
    assert set(done_before) <= {row["trial_id"] for row in result["trials"] if row["status"] == "finished"}
    for trial_id, mtime in done_before.items():  # finished trials were not trained again
        assert (out / "trials" / trial_id / "metrics.json").stat().st_mtime_ns == mtime


def _registered_epochs(trial_dir: Path) -> list[int]:
    """The 0-based epochs whose checkpoints Tune's driver has registered, in order (its own record of them)."""
    return [e["epoch"] for e in read_trial_events(trial_dir) if e["event"] == "checkpoint"]


@pytest.mark.usefixtures("on_shared_ray")
def test_a_crashed_trial_restarts_from_its_last_checkpoint(training_sequences, tmp_path):
    """SIGKILL the trial's process once Tune has registered the checkpoint of its second epoch: Tune's FailureConfig
    restarts the trial from the last checkpoint it registered, the trial loses at most the one epoch it was
    training, and it finishes every epoch."""
    out, epochs = tmp_path / "sweep", 4
    proc = subprocess.Popen([*PGT, "tune", "--data", str(training_sequences), "--out", str(out), "--trials", "1",
                             "--epochs", str(epochs), "--grace-period", str(epochs), "--search", "random",
                             "--finalists", "0", "--no-final"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        # trigger on what Tune has committed (its driver's record, written after it registered the checkpoint),
        # never on a checkpoint folder's appearance: a folder exists before its report is registered
        trial_dir = _only_trial(out)
        while max(_registered_epochs(trial_dir), default=-1) < 1:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "Tune registered no checkpoint of the second epoch within 300 s"
            time.sleep(0.2)
            trial_dir = _only_trial(out)
        node = json.loads((trial_dir / "node.json").read_text())
        registered_at_kill = _registered_epochs(trial_dir)[-1]
        os.kill(node["pid"], signal.SIGKILL)
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    result = json.loads((out / "tune.json").read_text())
    assert [(row["status"], row["restarts"]) for row in result["trials"]] == [("finished", 1)]
    events = read_trial_events(trial_dir)
    restarts = [e for e in events if e["event"] == "restarted"]
    assert len(restarts) == 1 and not any(e["event"] == "failed" for e in events)
    restored = restarts[0]["epoch"]  # the checkpoint Tune registered last before the restart: what it restores
    # the trial blocks in its report until the driver has taken it, so it ran at most one epoch past that
    assert registered_at_kill <= restored <= registered_at_kill + 1
    m = json.loads((trial_dir / "metrics.json").read_text())
    assert m["resumed_at_epochs"] == [restored + 2]  # 1-based: the epoch right after the restored one
    assert m["epochs_run"] == epochs and [row["epoch"] for row in m["history"]] == list(range(epochs))
    assert json.loads((trial_dir / "node.json").read_text())["pid"] != node["pid"]  # a new process took over
    assert _registered_epochs(trial_dir)[-1] == epochs - 1  # and Tune registered every later epoch


def _only_trial(out: Path) -> Path:
    """The one trial's folder under out/trials (out/trials/none until it exists)."""
    found = sorted((out / "trials").glob("*/node.json"))
    return found[0].parent if found else out / "trials" / "none"

"""The stop scripts stop what the project started and nothing else: a server's whole process tree (children in
other process groups included), and the orphans a killed run left, never a process someone still runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, descendant_processes
from tests.conftest import running as alive

SLEEPER = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], " \
          "start_new_session=True); time.sleep(300)"  # a process whose child lives in another session


def wait_for(condition, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def environment(tmp_path):
    """A stand-in for the project's environment: tmp/env/bin/python runs this interpreter; PGT_VENV_BIN names it."""
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    return bin_dir, {**os.environ, "PGT_VENV_BIN": str(bin_dir), "PGT_STATE_DIR": str(tmp_path / "state")}


def orphan_of(bin_dir: Path, env: dict) -> int:
    """A killed run's leftover: a process of the environment whose starter exited (so init adopted it), with a
    child in another session; its pid."""
    started = subprocess.run(["bash", "-c", f"setsid {bin_dir}/python -c \"{SLEEPER}\" >/dev/null 2>&1 & echo $!"],
                             env=env, capture_output=True, text=True, check=True)
    orphan = int(started.stdout.split()[-1])
    assert wait_for(lambda: len(descendant_processes(orphan)) == 1)
    return orphan


def test_stop_leftovers_stops_orphans_of_the_environment_and_their_trees_only(environment, tmp_path):
    """Stopped: an orphan of this environment and state folder, with its tree, whatever the terminal's width
    ($COLUMNS=40 would cut the command line). Left alone: a process of the environment that someone still runs,
    and an orphan of the same environment that another state folder's stack started."""
    bin_dir, env = environment
    env = {**env, "COLUMNS": "40"}
    orphan = orphan_of(bin_dir, env)
    grandchild = list(descendant_processes(orphan))[0]
    other_state = orphan_of(bin_dir, {**env, "PGT_STATE_DIR": str(tmp_path / "another-state")})
    # a process of the same environment that someone still runs (its parent, this test, is alive)
    running = subprocess.Popen([bin_dir / "python", "-c", "import time; time.sleep(300)"], env=env)
    try:
        r = subprocess.run([PROJECT_ROOT / "scripts" / "stop-leftovers.sh"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert f"leftover: pid {orphan}" in r.stdout and "stopped 1 (and 1 processes they started)" in r.stdout, r.stdout
        assert wait_for(lambda: not alive(orphan) and not alive(grandchild))
        assert running.poll() is None and alive(other_state)  # untouched
        again = subprocess.run([PROJECT_ROOT / "scripts" / "stop-leftovers.sh"], env=env, capture_output=True,
                               text=True, timeout=60)
        assert again.stdout.strip() == "leftovers: none"
        # the other state folder's own stop finds its orphan
        theirs = subprocess.run([PROJECT_ROOT / "scripts" / "stop-leftovers.sh"], capture_output=True, text=True,
                                env={**env, "PGT_STATE_DIR": str(tmp_path / "another-state")}, timeout=60)
        assert f"leftover: pid {other_state}" in theirs.stdout, theirs.stdout
        assert wait_for(lambda: not alive(other_state))
    finally:
        running.kill()
        for pid in (orphan, grandchild, other_state, *descendant_processes(other_state)):
            if alive(pid):
                os.kill(pid, 9)


def test_a_stopped_server_takes_its_children_in_other_sessions_along(environment, tmp_path):
    """What a Prefect worker does: its flow runs live in their own process groups. Stopping the worker by its PID
    file stops them too (here: stop-serve.sh and a stand-in server with a child in another session)."""
    bin_dir, env = environment
    server = subprocess.Popen([bin_dir / "python", "-c", SLEEPER], start_new_session=True)
    try:
        assert wait_for(lambda: len(descendant_processes(server.pid)) == 1)
        child = list(descendant_processes(server.pid))[0]
        (tmp_path / "state" / "serve").mkdir(parents=True)
        (tmp_path / "state" / "serve" / "server.pid").write_text(f"{server.pid}\n")
        r = subprocess.run([PROJECT_ROOT / "scripts" / "stop-serve.sh"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and "serve: stopped" in r.stdout and "and 1 processes it started" in r.stdout, r.stdout
        server.wait(10)
        assert wait_for(lambda: not alive(child))
        assert not (tmp_path / "state" / "serve" / "server.pid").exists()
    finally:
        if server.poll() is None:
            server.kill()

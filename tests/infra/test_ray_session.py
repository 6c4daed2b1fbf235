"""The environment of the Ray a command starts or joins, and the signals a local one's processes take (the
sessions themselves run in tests/pgt/training and tests/tune, with real Ray)."""

from __future__ import annotations

import os

import pytest

from infra.ray_session import PREEMPTION_WATCHER, TRAIN_POLL_INTERVAL_S, prepare_ray_env

RAY_SWITCHES = ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_enable_metrics_collection",
                "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_ADDRESS", PREEMPTION_WATCHER)


@pytest.fixture
def bare_env(monkeypatch):
    """None of Ray's switches set; each put back as it was after the test (setenv records it first)."""
    for name in RAY_SWITCHES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def test_ray_train_s_controller_polls_its_workers_often_on_a_local_ray_and_a_cluster(bare_env):
    """Ray's 2 s poll made each epoch wait for the controller: the driver's environment, which Ray Train hands on
    to its controller, says 0.2 s, on a local Ray and on a cluster alike; a value the user set is kept."""
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    assert TRAIN_POLL_INTERVAL_S == 0.2
    prepare_ray_env("127.0.0.1:6379")
    assert get_env_vars_to_propagate()["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.2"
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ  # a cluster's nodes listen beyond loopback
    bare_env.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "1.5")
    prepare_ray_env()
    assert get_env_vars_to_propagate()["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "1.5"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # a local Ray: loopback only
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and os.environ["RAY_enable_metrics_collection"] == "0"


def test_ray_train_watches_for_drained_nodes_on_a_cluster_only(bare_env):
    """Ray Train's preemption watcher, an actor of its own per run, watches for nodes a cloud or an autoscaler
    drains: on a cluster it is Ray's default (on), on a local Ray, whose one node is this machine, the driver's
    environment turns it off, which Ray Train hands on to its controller; a value the user set is kept."""
    from ray.train.v2._internal.constants import (
        DEFAULT_ENABLE_PREEMPTION_WATCHER,
        ENABLE_PREEMPTION_WATCHER_ENV_VAR,
        get_env_vars_to_propagate,
    )

    assert ENABLE_PREEMPTION_WATCHER_ENV_VAR == PREEMPTION_WATCHER and DEFAULT_ENABLE_PREEMPTION_WATCHER
    prepare_ray_env("127.0.0.1:6379")
    assert PREEMPTION_WATCHER not in get_env_vars_to_propagate()
    prepare_ray_env()
    assert get_env_vars_to_propagate()[PREEMPTION_WATCHER] == "0"
    bare_env.setenv(PREEMPTION_WATCHER, "1")
    prepare_ray_env()
    assert get_env_vars_to_propagate()[PREEMPTION_WATCHER] == "1"


@pytest.mark.slow
def test_a_local_ray_leaves_stop_signals_to_the_process_that_started_it():
    """The processes of the local Ray that ray_session starts (its raylet and GCS, and a task's worker, which the
    raylet starts) have SIGTERM and SIGHUP blocked, so that a signal to the whole process group stops the driver
    alone (what it then does: tests/test_faults.py, tests/flows/test_deployment.py); the driver's own mask is as
    before. In a fresh interpreter, which starts a Ray of its own."""
    import json
    import signal
    import subprocess
    import sys

    from tests.conftest import PROJECT_ROOT

    probe = """
import json, os, signal, psutil, ray
from infra.ray_session import ray_session

def blocked(pid):
    mask = next(int(line.split()[1], 16) for line in open(f"/proc/{pid}/status") if line.startswith("SigBlk:"))
    return sorted(s for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM) if mask >> (s - 1) & 1)

def pid():
    return os.getpid()

with ray_session(num_cpus=1):
    task_pid = ray.get(ray.remote(pid).remote())
    head = {p.name(): p.pid for p in psutil.Process().children(recursive=True)}
    print(json.dumps([blocked(head["raylet"]), blocked(head["gcs_server"]), blocked(task_pid), blocked(os.getpid())]))
"""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    r = subprocess.run([sys.executable, "-c", probe], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    raylet, gcs, worker, driver = json.loads(r.stdout.strip().splitlines()[-1])
    stop = {int(signal.SIGHUP), int(signal.SIGTERM)}
    assert all(stop <= set(mask) for mask in (raylet, gcs, worker)), r.stdout
    assert driver == []  # the driver takes every stop signal


@pytest.mark.slow
def test_ray_shuts_down_with_the_garbage_cycles_holding_its_handles_collected_and_no_collection_meanwhile():
    """Ray ends the process when a Ray handle is released while its core worker shuts down, which the cyclic
    collector does in whatever thread allocates then (an MLflow sampler, Prefect's workers): ray_session collects
    such cycles before ray.shutdown, runs it with the collector off, and turns the collector back on after. In a
    fresh interpreter, which starts a Ray of its own."""
    import json
    import subprocess
    import sys

    from tests.conftest import PROJECT_ROOT

    probe = """
import gc, json, weakref, ray
from infra.ray_session import ray_session

class Holder:
    pass

seen = {}
shutdown = ray.shutdown

def watched_shutdown(*args, **kwargs):
    seen["collector on during the shutdown"] = gc.isenabled()
    seen["cycle alive at the shutdown"] = cycle() is not None
    return shutdown(*args, **kwargs)

ray.shutdown = watched_shutdown
with ray_session(num_cpus=1):
    holder = Holder()
    holder.me, holder.refs = holder, [ray.put(i) for i in range(3)]  # a garbage cycle once the name is gone
    cycle = weakref.ref(holder)
    del holder
    seen["cycle alive in the session"] = cycle() is not None
seen["collector on after"] = gc.isenabled()
print(json.dumps(seen))
"""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    r = subprocess.run([sys.executable, "-c", probe], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {
        "cycle alive in the session": True, "collector on during the shutdown": False,
        "cycle alive at the shutdown": False, "collector on after": True}

"""A sweep over a two-node Ray cluster (`ray start` nodes on loopback): each node runs a trial."""

from __future__ import annotations

import json

import pytest

from tests.conftest import MULTI_NODE_IP, ray_cluster
from tests.tune.commands import tune_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def two_node_cluster():
    """A head and a worker node on loopback, each with 1 CPU and its own custom resource; stopped afterwards."""
    with ray_cluster('{"node_a": 1}', '{"node_b": 1}') as cluster:
        yield cluster


def test_sweep_spreads_over_a_two_node_cluster(training_sequences, tmp_path, two_node_cluster, mlflow_server):
    """Each node runs a trial, logged to a tracking server both nodes reach; the default store (SQLite on one disk)
    is refused in one line before the sweep writes anything."""
    address, env = two_node_cluster
    out = tmp_path / "sweep"
    refused = tune_cli("--data", training_sequences, "--out", out, "--trials", 2, "--epochs", 2, "--address", address,
                       env=env)
    assert refused.returncode == 2 and not out.exists()
    said = refused.stderr.strip().splitlines()  # Ray's own lines of joining the cluster, then the one line
    assert "Traceback" not in refused.stderr and "store on this machine's disk, and the Ray cluster has 2 nodes" in said[-1]
    r = tune_cli("--data", training_sequences, "--out", out, "--trials", 2, "--epochs", 2, "--max-concurrent", 2,
                 "--grace-period", 2, "--address", address, "--finalists", 0, "--no-final",
                 "--tracking-uri", mlflow_server, "--experiment", "two-nodes", env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads((out / "tune.json").read_text())
    nodes = {row["node_id"] for row in result["trials"]}
    assert len(nodes) == 2 and None not in nodes  # one trial on each node (1 CPU each, 1 CPU per trial)
    # the nodes advertise the loopback address they were started on, not the machine's network address
    assert {row["node_address"] for row in result["trials"]} == {MULTI_NODE_IP}
    assert all(row["epochs"] >= 1 for row in result["trials"])
    assert {row["status"] for row in result["trials"]} <= {"finished", "stopped (ASHA)"}

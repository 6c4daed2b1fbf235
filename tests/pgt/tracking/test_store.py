"""Which tracking stores a Ray cluster's runs can all log to (pgt.tracking.store.check_tracking_reaches)."""

from __future__ import annotations

import pytest

from infra.errors import SettingsError
from pgt.tracking.store import check_tracking_reaches


def test_one_node_logs_anywhere():
    for uri in ("sqlite:////tmp/x/mlflow.db", "/tmp/mlruns", "http://127.0.0.1:5055"):
        check_tracking_reaches(uri, ["10.0.0.5"])
        check_tracking_reaches(uri, [])


def test_a_cluster_refuses_a_store_on_one_disk_and_a_loopback_server_its_machines_do_not_share():
    nodes = ["127.0.0.2", "127.0.0.3"]
    for uri in ("sqlite:////tmp/x/mlflow.db", "/tmp/mlruns", "file:///tmp/mlruns"):
        with pytest.raises(SettingsError, match=r"store on this machine's disk, and the Ray cluster has 2 nodes"):
            check_tracking_reaches(uri, nodes)
    # nodes of one machine (loopback addresses) all reach its loopback server
    check_tracking_reaches("http://127.0.0.4:5055", nodes)
    check_tracking_reaches("http://localhost:5055", nodes)
    with pytest.raises(SettingsError, match=r"loopback address, which on the Ray cluster's other machines \(10.0.0.5\)"):
        check_tracking_reaches("http://127.0.0.1:5055", ["127.0.0.1", "10.0.0.5"])
    check_tracking_reaches("http://mlflow.internal:5000", ["10.0.0.4", "10.0.0.5"])
    check_tracking_reaches("https://10.0.0.9", ["10.0.0.4", "10.0.0.5"])

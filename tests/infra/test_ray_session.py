"""The environment of the Ray a command starts or joins (the sessions themselves run in tests/pgt/training and
tests/tune, with real Ray)."""

from __future__ import annotations

import os

import pytest

from infra.ray_session import TRAIN_POLL_INTERVAL_S, prepare_ray_env

RAY_SWITCHES = ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_enable_metrics_collection",
                "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_ADDRESS")


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

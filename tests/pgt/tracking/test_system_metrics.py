"""System metrics sampled into a run while it trains, on a SQLite store in this process."""

from __future__ import annotations

import time

import pytest

from pgt.tracking.runs import SystemMetrics


@pytest.fixture
def store(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("system-metrics"))
    return uri, client, run.info.run_id


def sampled(uri: str, run_id: str, seconds: float = 0.5) -> SystemMetrics:
    metrics = SystemMetrics(uri, run_id, interval_s=60)
    metrics.__enter__()
    time.sleep(seconds)  # the monitor takes its first sample as it starts
    return metrics


def test_the_last_samples_are_logged_as_the_run_ends(store):
    uri, client, run_id = store
    sampled(uri, run_id).__exit__(None, None, None)
    assert "system/cpu_utilization_percentage" in client.get_run(run_id).data.metrics


def test_samples_that_cannot_be_logged_fail_a_run_that_ended_well(store):
    from mlflow.exceptions import MlflowException

    uri, client, run_id = store
    metrics = sampled(uri, run_id)
    client.delete_run(run_id)  # a run that no longer takes metrics
    with pytest.raises(MlflowException):
        metrics.__exit__(None, None, None)


def test_they_never_hide_what_stopped_the_run(store):
    uri, client, run_id = store
    with pytest.warns(UserWarning, match=f"the last system metrics of run {run_id} were not logged"):
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with SystemMetrics(uri, run_id, interval_s=60):
                time.sleep(0.5)
                client.delete_run(run_id)
                raise KeyboardInterrupt("SIGTERM")  # as a signal stops training


def test_a_signal_while_epochs_are_logged_leaves_the_store_writable(store):
    """SIGTERM at random moments while a SQLite run takes one epoch after another: each stops the logging, and
    the store still takes the run's KILLED and more metrics (a signal inside a commit used to leave it locked)."""
    import os
    import random
    import signal
    import threading

    from infra.process import handled_signals
    from pgt.config import TrackingConfig
    from pgt.tracking.runs import EpochLogger, end_run

    uri, client, _ = store
    experiment = client.get_experiment_by_name("system-metrics").experiment_id
    rng = random.Random(0)
    row = {"train_loss": 1.0, "lr": 1e-3, "samples_per_second": 100.0, "seconds": 0.1,
           "validation": {"acc@1": 0.5, "strict": {"acc@1": 0.4, "mrr": 0.5}}}
    for _ in range(15):
        tracking = TrackingConfig(tracking_uri=uri, run_id=client.create_run(experiment).info.run_id)
        logger = EpochLogger(tracking)
        with handled_signals() as caught:
            threading.Timer(rng.uniform(0.02, 0.2), os.kill, (os.getpid(), signal.SIGTERM)).start()
            with pytest.raises(KeyboardInterrupt):
                for epoch in range(10**6):
                    logger(row | {"epoch": epoch})
        epochs = len(logger.logged)
        assert caught.received == signal.SIGTERM and epochs > 0
        end_run(tracking, "KILLED")
        run = client.get_run(tracking.run_id)
        assert run.info.status == "KILLED"
        assert sorted(m.step for m in client.get_metric_history(tracking.run_id, "train_loss")) == list(range(epochs))

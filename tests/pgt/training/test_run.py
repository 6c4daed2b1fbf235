"""DDP under Ray Train with real Ray: 2 CPU workers against 1 process, and a killed worker's recovery."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pgt.config import LaunchConfig, TrainConfig
from pgt.training.run import run_training
from tests.conftest import PROJECT_ROOT, descendant_processes, ray_cluster

pytestmark = pytest.mark.slow  # on GeoLife where ../shared/data is, else synthetic (training_sequences)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for this module's in-process runs, as a notebook that trains several times keeps one:
    run_training's ray_session joins a Ray already initialised in the process instead of starting its own
    (about 10 s each) and leaves it running. 3 CPUs: 2 workers, and one for Ray Data's read tasks."""
    from infra.ray_session import ray_session

    with ray_session(num_cpus=3):
        yield


def test_two_workers_train_like_one_process(training_sequences, tmp_path, local_ray):
    """Same seed, same global batch, no dropout and no bucketing: the 2 workers' shards of a batch are the
    one process's batch, so losses and metrics agree within float noise (and one padded duplicate per epoch)."""
    common = dict(data_dir=str(training_sequences), epochs=3, batch_size=64, dropout=0.0, bucket_by_length=False,
                  seed=3, min_epochs=3)
    one = run_training(TrainConfig.from_dict({"out_dir": str(tmp_path / "one"), **common})).metrics
    two = run_training(TrainConfig.from_dict({"out_dir": str(tmp_path / "two"), **common}), LaunchConfig(workers=2)).metrics

    assert one["workers"] == 1 and two["workers"] == 2
    assert json.loads((tmp_path / "two" / "metrics.json").read_text())["workers"] == 2
    losses = [row["train_loss"] for row in two["history"]]
    assert losses[-1] < losses[0] - 0.3  # it learns
    assert all(row["replicas_in_sync"] for row in two["history"])  # bit-identical parameters on both ranks
    for a, b in zip(one["history"], two["history"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=0.01)
        assert b["samples"] >= a["samples"]  # the whole split per epoch (DistributedSampler pads to even shards)
    # validation and test metrics cover the whole split, not one shard
    assert two["validation"]["n"] == one["validation"]["n"] and two["test"]["n"] == one["test"]["n"]
    for split in ("validation", "test"):
        assert abs(two[split]["acc@1"] - one[split]["acc@1"]) <= 1.5
        assert abs(two[split]["mrr"] - one[split]["mrr"]) <= 1.5
    # rank 0 wrote one checkpoint per epoch, Ray keeps the latest two in the run's storage under --out, and the
    # final report's (best.pt, metrics.json and the last epoch's checkpoint.pt): the driver's result came from it
    storage = tmp_path / "two" / "ray" / "train"
    assert sorted(p.name for p in storage.glob("epoch_*")) == ["epoch_001", "epoch_002", "epoch_002_final"]
    assert sorted(p.name for p in (storage / "epoch_002_final").iterdir()) == ["best.pt", "checkpoint.pt", "metrics.json"]
    assert (tmp_path / "two" / "best.pt").read_bytes() == (storage / "epoch_002_final" / "best.pt").read_bytes()


def _train_worker_pids(root: int) -> list[int]:
    """PIDs of the Ray Train worker processes (Ray titles them `ray::RayTrainWorker...`) below process `root`: the
    run this test started (its local Ray's raylet starts them), never another Ray training on the machine."""
    return sorted(pid for pid, args in descendant_processes(root).items() if args.startswith("ray::RayTrainWorker"))


def _registered_epoch(run: Path) -> int:
    """The 0-based epoch of the newest checkpoint Ray Train's controller has registered (-1 for none yet):
    what a restarted worker group gets from `ray.train.get_checkpoint()`."""
    try:
        snapshot = json.loads((run / "checkpoint_manager_snapshot.json").read_text())
        return int(snapshot["latest_checkpoint_result"]["checkpoint_dir_name"].removeprefix("epoch_"))
    except (OSError, ValueError, KeyError, TypeError):  # not written yet, or being replaced
        return -1


def test_killed_worker_resumes_from_last_checkpoint(training_sequences, tmp_path, mlflow_server):
    """SIGKILL a worker process once Ray Train's controller has registered the first epoch's checkpoint: Ray restarts
    the group, the loop resumes from `ray.train.get_checkpoint()` (the last registered checkpoint), loses at most
    the epoch it was training, and the run still finishes every epoch; MLflow holds each epoch once."""
    out, epochs = tmp_path / "run", 4
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgt.cli", "train", "--data", str(training_sequences), "--out", str(out),
         "--epochs", str(epochs), "--patience", "50", "--workers", "2", "--max-failures", "1",
         "--tracking-uri", mlflow_server, "--experiment", "kill-test"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while _registered_epoch(out / "ray" / "train") < 0:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint of epoch 1 within 240 s"
            time.sleep(0.1)
        registered_at_kill = _registered_epoch(out / "ray" / "train")
        victims = _train_worker_pids(proc.pid)
        assert len(victims) == 2
        os.kill(victims[-1], signal.SIGKILL)
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["epochs_run"] == epochs and [row["epoch"] for row in m["history"]] == list(range(epochs))
    # the resumption started right after the last checkpoint Ray had registered when the worker died (Ray owns the
    # checkpoints). Rank 0 waits in each report until Ray has committed it, so by the time the group died Ray had
    # registered the epoch seen at the kill or, at most, the one after; 1-based, resumption is 2 epochs later
    assert len(m["resumed_at_epochs"]) == 1
    assert registered_at_kill + 2 <= m["resumed_at_epochs"][0] <= registered_at_kill + 3

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    history = client.get_metric_history(m["mlflow"]["run_id"], "validation_acc_at_1")
    assert sorted(h.step for h in history) == list(range(epochs))
    run = client.get_run(m["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["workers"] == "2"


def test_a_running_ray_cluster_does_not_capture_a_local_run():
    """A `ray start` cluster on the machine (someone else's, or one a killed run left) is what a bare
    ray.init() joins, and it then refuses num_cpus: a run without an address starts its own Ray instead, on
    127.0.0.1 only, even in a process that imported ray before asking for it (a flow that imported Tune first)."""
    probe = ("import ray\nfrom infra.ray_session import ray_session\nwith ray_session(num_cpus=2):\n"
             "    print(ray.cluster_resources().get('someone_else', 0), ray.cluster_resources()['CPU'],\n"
             "          ray.util.get_node_ip_address(), ray.get_runtime_context().gcs_address)")
    with ray_cluster('{"someone_else": 1}') as (address, env):
        env = {k: v for k, v in env.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}  # as a user's shell has it
        r = subprocess.run([sys.executable, "-c", probe], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True,
                           timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cluster_thing, cpus, node_ip, gcs = r.stdout.split()[-4:]
    assert (cluster_thing, cpus) == ("0", "2.0")  # a Ray of its own: 2 CPUs, none of the cluster's resources
    assert node_ip == "127.0.0.1" and gcs.startswith("127.0.0.1:")  # never the machine's network address


def test_ray_data_streams_the_train_split_to_two_workers(training_sequences, tmp_path, local_ray):
    """--data-engine ray: each of 2 workers streams its Ray Data shard of train.parquet. Every epoch sees the
    whole split (an equal split drops at most one sample), the replicas stay in sync, the loss falls, and
    validation lands where the in-memory path's does (other batches, so not to the digit)."""

    common = dict(data_dir=str(training_sequences), epochs=2, seed=3, min_epochs=2)
    memory = run_training(TrainConfig(out_dir=str(tmp_path / "memory"), **common)).metrics
    streamed = run_training(TrainConfig(out_dir=str(tmp_path / "ray"), **common),
                            LaunchConfig(workers=2, data_engine="ray")).metrics
    n = pq.read_metadata(training_sequences / "train.parquet").num_rows
    assert streamed["workers"] == 2 and len(streamed["history"]) == 2
    assert all(n - 1 <= row["samples"] <= n and row["replicas_in_sync"] for row in streamed["history"])
    assert streamed["history"][-1]["train_loss"] < streamed["history"][0]["train_loss"]
    assert abs(streamed["validation"]["acc@1"] - memory["validation"]["acc@1"]) <= 5.0
    with pytest.raises(ValueError, match="simulate_unseen needs the train split in memory"):
        run_training(TrainConfig(out_dir=str(tmp_path / "x"), simulate_unseen=True, **common),
                     LaunchConfig(workers=2, data_engine="ray"))
    with pytest.raises(ValueError, match="needs workers >= 1"):
        LaunchConfig(data_engine="ray")


def test_ray_owns_the_checkpoints_on_object_storage_and_a_rerun_resumes_from_there(synthetic_sequences, tmp_path,
                                                                                  local_ray, s3_server, mlflow_server,
                                                                                  monkeypatch):
    """Data and run on object storage (--data and --out s3://...): the driver and each rank read the data from
    their node's copy of the bucket's folder, and the run's config names the bucket. Under Ray Train the
    checkpoints exist once, in Ray's storage (reported and committed), here the bucket: the workers write them
    there, the driver's files (metrics.json, best.pt, plots, mlflow_run.json) are uploaded from its own work
    folder, removed at the end, and nothing is written to a local folder named after the URI, nor to the
    checkpoints folder of runs without Ray. A rerun with more epochs, from a new work folder, resumes from the
    bucket, as Ray restores a run of the same name and storage; other settings are refused before Ray Train
    starts, naming the bucket's checkpoint. A run that cannot be kept there is refused in one line before any
    work."""
    from mlflow.tracking import MlflowClient

    from infra.errors import InputError, ServiceError, SettingsError
    from infra.storage import open_storage
    from pgt.config import TrackingConfig
    from tests.infra.test_storage import bucket

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.chdir(tmp_path)
    uri = bucket(s3_server, "pgt-train")
    storage = open_storage(uri)
    data = storage.uri_of("..", "sequences").replace("/run/../", "/")
    open_storage(data).upload(synthetic_sequences)
    tracking = TrackingConfig(tracking_uri=mlflow_server, experiment="kept-on-s3")
    cfg = TrainConfig(data_dir=data, out_dir=uri, epochs=2, min_epochs=3)
    first = run_training(cfg, LaunchConfig(workers=2), tracking)
    assert first.metrics["config"]["data_dir"] == data
    assert first.validation["n"] == pq.read_metadata(synthetic_sequences / "validation.parquet").num_rows
    files = storage.files()
    assert {"metrics.json", "best.pt", "mlflow_run.json"} <= set(files) and any(f.startswith("plots/") for f in files)
    assert {"ray/train/epoch_001/checkpoint.pt", "ray/train/epoch_001_final/best.pt"} <= set(files)
    assert storage.read_bytes("best.pt") == storage.read_bytes("ray", "train", "epoch_001_final", "best.pt")
    assert json.loads(storage.read_bytes("metrics.json"))["mlflow"]["run_id"] == first.mlflow.run_id
    assert not list(tmp_path.glob("s3*")) and first.kept == uri and first.metrics["epochs_run"] == 2
    client = MlflowClient(mlflow_server)
    assert client.get_run(first.mlflow.run_id).info.status == "FINISHED" and first.mlflow.model_uri
    assert [m.step for m in client.get_metric_history(first.mlflow.run_id, "train_loss")] == [0, 1]
    inputs = client.get_run(first.mlflow.run_id).inputs.dataset_inputs  # the splits named where they are kept
    assert sorted(json.loads(i.dataset.source)["uri"] for i in inputs) == \
        sorted(open_storage(data).uri_of(f"{split}.parquet") for split in ("train", "validation", "test"))
    assert {i.dataset.name for i in inputs} == {"sequences/train", "sequences/validation", "sequences/test"}

    second = run_training(dataclasses.replace(cfg, epochs=3), LaunchConfig(workers=2), tracking)
    assert second.out_dir != first.out_dir  # another work folder: what it resumed from came from the bucket
    assert second.metrics["epochs_run"] == 3 and second.metrics["resumed_at_epochs"] == [3]
    assert [row["epoch"] for row in second.metrics["history"]] == [0, 1, 2]
    assert json.loads(storage.read_bytes("metrics.json"))["epochs_run"] == 3
    assert sorted({f.split("/")[2] for f in storage.files("ray", "train") if f.count("/") == 3}) == \
        ["epoch_001_final", "epoch_002", "epoch_002_final"]
    assert not first.out_dir.exists() and not second.out_dir.exists()  # the driver's scratch, removed at the end
    with pytest.raises(ValueError, match=r"s3://pgt-train/run/ray/train/epoch_002_final/checkpoint.pt\?\S+ was trained "
                                         r"with other settings \(d_model="):
        run_training(TrainConfig.from_dict({**cfg.to_dict(), "epochs": 3, "d_model": 32}), LaunchConfig(workers=2))

    with pytest.raises(SettingsError, match="give --workers 1 or more"):
        run_training(cfg, LaunchConfig(workers=0))
    with pytest.raises(ServiceError, match="no such bucket"):
        run_training(dataclasses.replace(cfg, out_dir=uri.replace("pgt-train", "pgt-never")), LaunchConfig(workers=2))
    storage.child("other").write_bytes(b"x", "notes.txt")
    with pytest.raises(InputError, match=r"did not write \(notes.txt\)"):
        run_training(dataclasses.replace(cfg, out_dir=storage.child("other").uri), LaunchConfig(workers=2))

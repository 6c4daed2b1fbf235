"""A Ray cluster whose nodes share nothing but the network, used as a team uses one: the test process plays the
laptop, submits `pgt` commands as Ray Jobs, and checks the outcome from its own view only (the bucket, the MLflow
server, Ray's Jobs and State APIs).

Each node is `ray start --block` in its own mount namespace (`unshare --mount`) with private tmpfs over /tmp and
/dev/shm: its Ray session, work folders and data copies are its own, and neither sees the laptop's files (pytest's
temporary folders are under /tmp) nor the other node's. The head (127.0.0.2) runs no work (`--num-cpus 0`, as
KubeRay advises) and serves the Jobs API; the worker (127.0.0.3) has the CPUs. Data and runs live in an
S3-compatible bucket (moto's server), runs are tracked on an MLflow server bound to 127.0.0.4 with artifacts proxied.
The project itself is installed on the nodes as in an image (the same virtualenv path). Loopback addresses only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.cluster_rig import (
    BIN,
    HEAD,
    KEYS,
    RAY_UP_BARE,
    RAY_UP_HEAD,
    RAY_UP_WORKER,
    SHARED,
    WORKER,
    Cluster,
    SshNodes,
    actors_by_node,
    alive_nodes,
    cluster_env,
    ray_up_config,
    ssh_refused,
    start_tracking_server,
    stop_tracking_server,
    unshare_refused,
)

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3_server):
    refused = unshare_refused()
    if refused is None and not SHARED.is_dir():
        refused = f"no {SHARED} folder to mount the nodes' shared folder on"
    if refused:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the isolated-node tests need `unshare --mount` (CI runs as root): {refused}")
        pytest.skip(refused)
    rig = Cluster(cluster_env(tmp_path_factory.mktemp("cluster-logs")), tmp_path_factory.mktemp("shared"))
    try:
        rig.start()
        yield rig
    finally:
        rig.stop()


@pytest.fixture(autouse=True)
def tidy_cluster(request):
    """After each test on the cluster, its left-over jobs stopped and a lost worker node started again
    (Cluster.tidy): a failed test fails alone, not every test after it."""
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").tidy()


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """scripts/start-mlflow.sh bound to 127.0.0.4, artifacts proxied; stopped by scripts/stop-mlflow.sh."""
    uri, env = start_tracking_server(tmp_path_factory.mktemp("cluster-mlflow"))
    try:
        yield uri
    finally:
        stop_tracking_server(env)


@pytest.fixture(scope="module")
def stored_data(s3_server, tmp_path_factory):
    """The laptop's synthetic sequences, uploaded to a bucket: (the data's URI, a function naming a folder of the
    bucket by URI)."""
    import pyarrow.fs as pafs

    from infra.storage import open_storage
    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes

    root = tmp_path_factory.mktemp("laptop")
    generate_positionfixes(SynthConfig(users=8, days=70, seed=3)).write_parquet(root / "fixes.parquet")
    preprocess(root / "fixes.parquet", "positionfixes", root / "seq", progress=False)
    endpoint = s3_server.removeprefix("http://")
    os.environ.update(KEYS)
    pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir("team")

    def uri(folder: str) -> str:
        return f"s3://team/{folder}?endpoint_override={endpoint}&scheme=http&region=us-east-1"

    open_storage(uri("sequences")).upload(root / "seq")
    return uri("sequences"), uri


def ctrl_c_once_a_checkpoint_is_in(folder, command: list[str], env: dict) -> tuple[int, str]:
    """Run `command` (a `pgt submit`), press Ctrl+C once a checkpoint.pt is in `folder` of the bucket (within 300 s);
    its exit code and output."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not [f for f in folder.files() if f.endswith("/checkpoint.pt")]:
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            assert time.monotonic() < deadline, f"no checkpoint in {folder.uri} within 300 s"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # Ctrl+C
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, output


def test_pgt_train_as_a_ray_job_keeps_everything_in_the_bucket_and_a_stopped_job_resumes_from_there(
        cluster, tracking_server, stored_data):
    """`pgt submit -- train --workers 2` from the laptop, its logs streamed to the laptop's terminal, stopped with
    Ctrl+C once its first checkpoint is in the bucket (the job STOPPED, exit 130), then submitted again: the second
    job resumes from the bucket's checkpoints and succeeds (exit 0). Both ranks ran on the worker node (the head has
    no CPUs); the run's files and checkpoints are in the bucket; its one MLflow run, KILLED by the stop, is FINISHED
    with every epoch logged once and its model. Nothing was read from or written to a disk the laptop or the other
    node has: the storage keys travelled with the job from the laptop's environment."""
    from mlflow.tracking import MlflowClient

    from infra.storage import open_storage

    data, uri = stored_data
    out = uri("runs/train")
    kept = open_storage(out)
    submit = [str(BIN / "pgt"), "submit", "--cluster", cluster.dashboard, "--", "train", "--data", data, "--out", out,
              "--workers", "2", "--patience", "1000", "--tracking-uri", tracking_server, "--experiment", "cluster"]
    returncode, output = ctrl_c_once_a_checkpoint_is_in(kept.child("ray", "train"), [*submit, "--epochs", "60"],
                                                        cluster.env)
    assert returncode == 130, output[-4000:]
    job = output.split("submitted ")[1].split()[0]
    assert cluster.status(job) == "STOPPED" and "stopped by SIGINT" in output
    assert "world_rank=1" in output  # the job's logs (Ray Train's start of its worker group) reached the laptop
    run_id = json.loads(kept.read_bytes("mlflow_run.json"))["run_id"]
    client = MlflowClient(tracking_server)
    assert client.get_run(run_id).info.status == "KILLED", output[-4000:]
    done = max(int(f.split("/")[2].removeprefix("epoch_")[:3]) for f in kept.files("ray", "train")
               if f.split("/")[2].startswith("epoch_"))

    second = subprocess.run([*submit, "--epochs", str(done + 3)], env=cluster.env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0 and "SUCCEEDED" in second.stdout, second.stdout[-4000:] + second.stderr[-2000:]
    assert "val strict@1" in second.stdout  # rank 0's epoch table, through the job's logs
    assert cluster.actors_by_node("RayTrainWorker") == {WORKER: 4}  # two ranks in each job
    files = set(kept.files())
    assert {"metrics.json", "best.pt", "mlflow_run.json", f"ray/train/epoch_{done + 2:03d}_final/best.pt"} <= files
    metrics = json.loads(kept.read_bytes("metrics.json"))
    assert metrics["epochs_run"] == done + 3 and metrics["config"]["data_dir"] == data
    assert len(metrics["resumed_at_epochs"]) == 1 and metrics["resumed_at_epochs"][0] >= 2
    assert metrics["mlflow"]["run_id"] == run_id and metrics["mlflow"]["model_uri"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["workers"] == "2"
    assert sorted(m.step for m in client.get_metric_history(run_id, "train_loss")) == list(range(done + 3))
    # the laptop scores the logged model on the bucket's data: its own copy of it, the model from the server
    evaluated = subprocess.run([BIN / "pgt", "evaluate", "--model", metrics["mlflow"]["model_uri"], "--data", data,
                                "--tracking-uri", tracking_server], env={**cluster.env, "PGT_DATA_CACHE": str(
                                    cluster.shared.parent / "laptop-cache")}, capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout)["strict"]["acc@1"] == pytest.approx(metrics["test"]["strict"]["acc@1"])


def test_stores_on_one_disk_are_refused_on_a_cluster_of_two_nodes(cluster, stored_data):
    """A SQLite tracking store, and a run's or a sweep's --out on the head's own disk (its private /tmp), on the
    two-node cluster: each one line before any work, the job FAILED, nothing written to the bucket; a folder every
    node mounts (the NFS case) passes the same check (test_pgt_tune_as_a_ray_job_on_a_mount_every_node_shares)."""
    from infra.storage import open_storage

    data, uri = stored_data
    out = uri("runs/refused")
    status, logs = cluster.submit("pgt", "train", "--data", data, "--out", out, "--workers", "2", "--epochs", "1",
                                  "--tracking-uri", "sqlite:////tmp/mlflow.db", timeout_s=180)
    assert status == "FAILED"
    assert "is a store on this machine's disk, and the Ray cluster has 2 nodes" in logs and "Traceback" not in logs
    assert open_storage(out).files() == []
    for command in (["train", "--workers", "2"], ["tune", "--trials", "1"]):
        status, logs = cluster.submit("pgt", *command, "--data", data, "--out", "/tmp/on-the-head", "--epochs", "1",
                                      timeout_s=180)
        assert status == "FAILED" and "Traceback" not in logs, logs[-3000:]
        assert (f"--out /tmp/on-the-head is a folder on this machine's disk, which the Ray cluster's node(s) {WORKER} "
                "do not have") in logs, logs[-3000:]


def test_pgt_tune_as_a_ray_job_keeps_the_sweep_in_the_bucket_through_a_stopped_job_and_a_lost_node(
        cluster, tracking_server, stored_data):
    """`pgt submit -- tune` with --data and --out in the bucket, stopped with Ctrl+C once the first trial's first
    checkpoint is there; `--resume URI` submitted again, and mid-way the worker node is killed (SIGKILL to every
    process of it) and a new one started: the sweep finishes from the checkpoints in the bucket. Every trial ran on
    the worker's address, the killed trial restarted once, every record is in the bucket (a finalist's confirmation
    on a fresh seed included), each MLflow run is closed and names its folder there, and the final run's model is
    registered with the confirmation's evidence; the laptop evaluates the champion from the registry."""
    from mlflow.tracking import MlflowClient

    from infra.storage import open_storage
    from tune.records import read_trial_events

    data, uri = stored_data
    out = uri("runs/sweep")
    kept = open_storage(out)
    submit = [str(BIN / "pgt"), "submit", "--cluster", cluster.dashboard, "--", "tune"]
    returncode, output = ctrl_c_once_a_checkpoint_is_in(
        kept.child("ray", "sweep"),
        [*submit, "--data", data, "--out", out, "--trials", "2", "--epochs", "3", "--grace-period", "3",
         "--max-concurrent", "1", "--finalists", "1", "--confirm-seeds", "1", "--register", "iso-s3",
         "--tracking-uri", tracking_server, "--experiment", "cluster-sweep"], cluster.env)
    assert returncode == 130 and "stopped by SIGINT" in output, output[-4000:]
    assert kept.exists("sweep.json") and not kept.exists("tune.json")

    def events() -> dict[str, list[dict]]:
        return {trial: read_trial_events(kept.child("trials", trial)) for trial in kept.child("trials").entries()}

    second = subprocess.Popen([*submit, "--resume", out], env=cluster.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 400
        # the second trial's first checkpoint, registered by the resumed sweep: two epochs of it still to train
        while not [trial for trial, seen in events().items() if len(events()) == 2 and
                   not any(e["event"] == "completed" for e in seen) and any(e["event"] == "checkpoint" for e in seen)]:
            assert second.poll() is None, second.stdout.read()[-4000:]
            assert time.monotonic() < deadline, f"the second trial registered no checkpoint within 400 s: {events()}"
            time.sleep(0.5)
        cluster.kill_node("worker")  # the node's raylet, workers and trial with it
        cluster.start_worker()
        output, _ = second.communicate(timeout=600)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 0 and "SUCCEEDED" in output, output[-4000:]
    result = json.loads(kept.read_bytes("tune.json"))
    assert [row["status"] for row in result["trials"]] == ["finished"] * 2
    assert {row["node_address"] for row in result["trials"]} == {WORKER}
    assert sorted(row["restarts"] for row in result["trials"]) == [0, 1]
    files = set(kept.files())
    assert {"sweep.json", "best_recipe.yaml", "trials.png", "final/best.pt", "final/metrics.json"} <= files
    winner = result["confirmation"]["finalists"][0]  # confirmed on a fresh seed; test is read by the final run only
    assert kept.child("finalists", winner["name"], "seeds-1").read_json("metrics.json")["test"] is None
    assert result["best_recipe"] == kept.uri_of("best_recipe.yaml")
    assert result["best_checkpoint"] == kept.uri_of("final", "best.pt")
    client = MlflowClient(tracking_server)
    runs = client.search_runs([client.get_experiment_by_name("cluster-sweep").experiment_id])
    assert {r.info.run_name for r in runs} >= {f"trial-{row['trial_id']}" for row in result["trials"]} | {"final"}
    assert {r.info.status for r in runs} == {"FINISHED"}
    kept_at = {r.info.run_name: r.data.tags["pgt.out_dir"] for r in runs}  # each run names its folder in the bucket
    assert kept_at["final"] == kept.uri_of("final") and kept_at[f"sweep-{kept.path.rpartition('/')[2]}"] == out
    assert {kept_at[f"trial-{row['trial_id']}"] for row in result["trials"]} == \
        {kept.uri_of("trials", row["trial_id"]) for row in result["trials"]}
    for row in result["trials"]:  # every epoch of each trial logged, the restarted one's included
        assert sorted(m.step for m in client.get_metric_history(row["mlflow_run_id"], "train_loss")) == [0, 1, 2]
    version = client.get_model_version_by_alias("iso-s3", "champion")
    assert json.loads(version.tags["pgt.evidence_seeds"]) == [1] and version.tags["pgt.data_digest"]
    evaluated = subprocess.run([BIN / "pgt", "evaluate", "--model", "models:/iso-s3@champion", "--data", data,
                                "--tracking-uri", tracking_server], env={**cluster.env, "PGT_DATA_CACHE": str(
                                    cluster.shared.parent / "laptop-cache")}, capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout)["strict"]["acc@1"] == pytest.approx(
        json.loads(kept.read_bytes("final", "metrics.json"))["test"]["strict"]["acc@1"])


def test_pgt_tune_as_a_ray_job_on_a_mount_every_node_shares(cluster, tracking_server):
    """The NFS case: --data and --out on a folder every node mounts at one path (the check that every node sees
    them passes). `pgt tune` submitted from the laptop runs its trials on the worker node, each with its MLflow run
    closed, and the laptop reads tune.json and the winner's recipe from the share. Which of the two trials ASHA stops
    at its rung, if either, depends on which reports first (they run at once): a stopped one has no metrics.json
    and its run is KILLED."""
    from mlflow.tracking import MlflowClient

    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes

    laptop = cluster.shared
    generate_positionfixes(SynthConfig(users=8, days=70, seed=3)).write_parquet(laptop / "fixes.parquet")
    preprocess(laptop / "fixes.parquet", "positionfixes", laptop / "seq", progress=False)
    status, logs = cluster.submit("pgt", "tune", "--data", str(SHARED / "seq"), "--out", str(SHARED / "sweep"),
                                  "--trials", "2", "--epochs", "2", "--max-concurrent", "2", "--finalists", "0",
                                  "--no-final", "--tracking-uri", tracking_server, "--experiment", "cluster-tune")
    assert status == "SUCCEEDED", logs[-4000:]
    result = json.loads((laptop / "sweep" / "tune.json").read_text())
    finished = {row["trial_id"] for row in result["trials"] if row["status"] == "finished"}
    assert len(result["trials"]) == 2 and finished and {row["status"] for row in result["trials"]} <= {
        "finished", "stopped (ASHA)"}, result["trials"]
    assert {row["node_address"] for row in result["trials"]} == {WORKER}
    assert (laptop / "sweep" / "best_recipe.yaml").is_file() and result["final"] is None
    assert {row["trial_id"] for row in result["trials"]
            if (laptop / "sweep" / "trials" / row["trial_id"] / "metrics.json").is_file()} == finished
    client = MlflowClient(tracking_server)
    runs = {r.info.run_id: r.info.status for r in client.search_runs(
        [client.get_experiment_by_name("cluster-tune").experiment_id])}
    trial_runs = {row["mlflow_run_id"]: row["trial_id"] in finished for row in result["trials"]}
    assert len(runs) == 3 and runs[result["mlflow"]["run_id"]] == "FINISHED"  # the sweep's own run, and each trial's
    assert all(runs[run_id] == ("FINISHED" if done else "KILLED") for run_id, done in trial_runs.items()), runs


def test_preprocessing_s_ray_engine_reads_the_bucket_and_ships_each_partition_to_a_node_that_shares_no_disk(
        cluster, stored_data, tmp_path):
    """`pgt preprocess --engine ray` as a Ray Job whose input and output are in the bucket: the job's driver (on the
    head) copies the input to its own disk, the partitions' tasks run on the worker node, which never sees that copy
    (each gets its partition's bytes through Ray's object store), and the sequences it publishes to the bucket are
    those of the default engine on the laptop, byte for byte; the manifest names the input by its URI."""
    import hashlib

    from infra.storage import open_storage
    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes

    _, uri = stored_data
    generate_positionfixes(SynthConfig(users=8, days=70, seed=5)).write_parquet(tmp_path / "fixes-pp.parquet")
    preprocess(tmp_path / "fixes-pp.parquet", "positionfixes", tmp_path / "local", progress=False)
    open_storage(uri("raw")).upload(tmp_path / "fixes-pp.parquet", "fixes.parquet")
    out = open_storage(uri("pp-ray"))
    status, logs = cluster.submit(str(BIN / "pgt"), "preprocess", "--input", open_storage(uri("raw")).uri_of(
        "fixes.parquet"), "--format", "positionfixes", "--out", out.uri, "--engine", "ray", "--partitions", "3",
        "--no-progress", timeout_s=300)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "wrote s3://team/pp-ray:" in logs
    manifest = out.read_json("manifest.json")
    assert manifest["input"] == "s3://team/raw/fixes.parquet"
    assert manifest["engine"]["engine"] == "ray" and sum(manifest["engine"]["ray_tasks_per_node"].values()) >= 3
    assert len(manifest["engine"]["ray_tasks_per_node"]) == 1  # one node ran them: the worker (the head has no CPUs)
    for name in ("train.parquet", "validation.parquet", "test.parquet", "places.parquet"):
        assert hashlib.sha256(out.read_bytes(name)).digest() == \
            hashlib.sha256((tmp_path / "local" / name).read_bytes()).digest(), name


def test_ray_up_brings_up_the_committed_cluster_over_ssh_and_a_job_trains_on_its_worker(
        tracking_server, stored_data, tmp_path):
    """deploy/ray-cluster.yaml, as docs/cluster.md runs it. On a machine without the project, `ray up` stops at the
    file's setup command, naming the machine. Then `ray up` from the laptop reaches two machines over SSH
    (each an sshd in mount and PID namespaces of its own, on its own loopback address, its home and /tmp private);
    the head's setup command finds `pgt`, Ray starts there with no CPUs, and the head's own autoscaler starts Ray on
    the listed worker over SSH. `pgt submit -- train` then trains on the worker (the head has no CPUs) and keeps
    its run in the bucket; `ray down` stops Ray on both (the Jobs API no longer answers)."""
    import yaml

    from infra.storage import open_storage
    from tests.conftest import PROJECT_ROOT

    refused = ssh_refused()
    if refused:
        if os.environ.get("CI") == "true":
            pytest.fail(f"`ray up` needs SSH to its nodes (CI installs it): {refused}")
        pytest.skip(refused)
    logs = tmp_path / "logs"
    logs.mkdir()
    nodes = SshNodes(tmp_path, [RAY_UP_HEAD, RAY_UP_WORKER], logs)
    template = yaml.safe_load((PROJECT_ROOT / "deploy" / "ray-cluster.yaml").read_text())
    config, dashboard = ray_up_config(template, nodes, f"pgt-test-{os.getpid()}")
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(config))
    # the laptop's `ray up` keeps its cluster state and bootstrap files in TMPDIR; Ray 2.60's v2 autoscaler starts
    # no worker of the local provider (docs/cluster.md)
    (tmp_path / "laptop-tmp").mkdir()
    env = {**cluster_env(logs), "RAY_UP_enable_autoscaler_v2": "0", "TMPDIR": str(tmp_path / "laptop-tmp")}
    data, uri = stored_data
    # first a machine where the project was never installed: `ray up` stops at the setup command, naming it
    bare = SshNodes(tmp_path / "bare", [RAY_UP_BARE], logs, project_installed=False)
    bare_file = tmp_path / "bare.yaml"
    bare_file.write_text(yaml.safe_dump(ray_up_config(template, bare, f"pgt-bare-{os.getpid()}")[0]))
    bare.start()
    try:
        refused = subprocess.run([BIN / "ray", "up", "-y", "--no-config-cache", bare_file], env=env,
                                 capture_output=True, text=True, timeout=120)
    finally:
        bare.stop()
        remove_ssh_control_folder(f"pgt-bare-{os.getpid()}")
    assert refused.returncode != 0 and f"pgt is not installed on {socket.gethostname()}" in refused.stdout + refused.stderr, (
        refused.stdout[-3000:] + refused.stderr[-2000:])

    nodes.start()
    try:
        up = subprocess.run([BIN / "ray", "up", "-y", "--no-config-cache", cluster_file], env=env, capture_output=True,
                            text=True, timeout=300)
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-2000:]
        deadline = time.monotonic() + 120
        while sorted(n.node_ip for n in alive_nodes(dashboard)) != [RAY_UP_HEAD, RAY_UP_WORKER]:
            assert time.monotonic() < deadline, f"the worker did not join within 120 s: {alive_nodes(dashboard)}"
            time.sleep(1)

        out = uri("runs/ray-up")
        trained = subprocess.run([BIN / "pgt", "submit", "--cluster", dashboard, "--", "train", "--data", data,
                                  "--out", out, "--workers", "1", "--epochs", "2", "--tracking-uri", tracking_server,
                                  "--experiment", "ray-up"], env=env, capture_output=True, text=True, timeout=600)
        assert trained.returncode == 0 and "SUCCEEDED" in trained.stdout, "\n".join(
            (trained.stdout[-4000:], trained.stderr[-2000:], nodes.ray_log(RAY_UP_HEAD, "dashboard_agent.log")))
        assert actors_by_node(dashboard, "RayTrainWorker") == {RAY_UP_WORKER: 1}
        metrics = json.loads(open_storage(out).read_bytes("metrics.json"))
        assert metrics["epochs_run"] == 2 and metrics["mlflow"]["model_uri"]

        down = subprocess.run([BIN / "ray", "down", "-y", cluster_file], env=env, capture_output=True, text=True,
                              timeout=180)
        assert down.returncode == 0, down.stdout[-4000:] + down.stderr[-2000:]
        deadline = time.monotonic() + 60
        while alive_nodes(dashboard):
            assert time.monotonic() < deadline, "Ray still answers 60 s after `ray down`"
            time.sleep(1)
    finally:
        nodes.stop()
        remove_ssh_control_folder(config["cluster_name"])


def remove_ssh_control_folder(cluster_name: str) -> None:
    """`ray up`'s SSH connections share a folder of control sockets per user and cluster under /tmp, whatever TMPDIR
    says (ray.autoscaler._private.command_runner): the test's goes with it, and the user's folder if nothing is left."""
    import getpass
    import hashlib
    import shutil
    from pathlib import Path

    user = Path("/tmp", f"ray_ssh_{hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]}")
    shutil.rmtree(user / hashlib.sha256(cluster_name.encode()).hexdigest()[:10], ignore_errors=True)
    if user.is_dir() and not any(user.iterdir()):
        user.rmdir()


def test_a_head_whose_job_agent_finds_its_port_taken_is_refused_in_one_line_naming_its_log(tmp_path):
    """A head whose dashboard agent finds its port taken on 127.0.0.1 (Ray's agent binds it there beside the node's
    own address, whatever that is) stays up with no agent serving jobs, and Ray answers every submission "No
    available agent, try again later": `submit` asks again for its wait, then names the agent's log in one line."""
    from infra.errors import ServiceError
    from infra.jobs import connect, submit
    from tests.conftest import free_port

    refused = unshare_refused()
    if refused:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the isolated-node tests need `unshare --mount` (CI runs as root): {refused}")
        pytest.skip(refused)
    (tmp_path / "logs").mkdir()
    rig = Cluster(cluster_env(tmp_path / "logs"), tmp_path)
    held = socket.socket()
    held.bind(("127.0.0.1", free_port()))
    held.listen()
    try:
        rig.start_head(cpus=0, agent_port=held.getsockname()[1])
        rig.wait_for_nodes(1)
        began = time.monotonic()
        with pytest.raises(ServiceError) as refusal:
            submit(connect(rig.dashboard), rig.dashboard, "true", {}, wait_s=5)
        assert 5 <= time.monotonic() - began < 30
        assert "Failed to bind to port" in rig.ray_log("head", "dashboard_agent.log")
    finally:
        rig.stop()
        held.close()
    message = str(refusal.value)
    assert "\n" not in message and message.startswith(f"Ray cluster at {rig.dashboard} took no job within 5 s")
    assert "dashboard_agent.log" in message and "--dashboard-agent-listen-port" in message


def test_joining_the_cluster_from_a_machine_with_no_node_of_it_names_the_jobs_command(cluster, stored_data, tmp_path):
    """`pgt train --address HEAD:PORT` from the laptop, where no Ray node runs (its own PID namespace: none of the
    nodes' processes is visible, as on another machine): one line within seconds naming `pgt submit`, where Ray
    would search for a local node for a minute."""
    data, _ = stored_data
    began = time.monotonic()
    refused = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "pgt.cli", "train",
                              "--data", data, "--out", str(tmp_path / "run"), "--workers", "1",
                              "--address", f"{HEAD}:{cluster.port}"],
                             env={**cluster.env, "PGT_STATE_DIR": str(tmp_path / "state")}, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and time.monotonic() - began < 60, refused.stderr[-3000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Ray node runs on this machine" in lines[0]
    assert "pgt submit --cluster http://HEAD:8265" in lines[0] and "ray job submit" in lines[0]
    assert not (tmp_path / "run").exists()


def test_the_cluster_deployment_runs_through_a_prefect_worker_with_its_code_cloned_and_trains_as_a_ray_job(
        cluster, tracking_server, stored_data, tmp_path):
    """`prefect deployment run preprocess-and-train/cluster`, as a team runs it: a Prefect server and process worker
    started by the project's scripts on the laptop, the deployment of prefect.yaml deployed, its flow's code cloned
    from the repository (its git_clone pull step; this checkout's committed branch). The flow preprocesses on the
    laptop, publishes the sequences to the bucket, runs `pgt train --workers 2` on the cluster as a Ray Job (both
    ranks on the worker node), reads the job's result back from the bucket, evaluates the logged model on its own
    sequences and registers it."""
    from mlflow.tracking import MlflowClient

    from infra.storage import open_storage
    from tests.conftest import PROJECT_ROOT, free_port

    _, uri = stored_data
    storage, state = uri("flow"), tmp_path / "state"
    env = {**os.environ, **KEYS, "PGT_STATE_DIR": str(tmp_path / "stack"), "PREFECT_PORT": str(free_port()),
           "PGT_VENV_BIN": str(BIN), "PREFECT_WORKER_QUERY_SECONDS": "1", "RAY_AUTH_MODE": "disabled"}
    for key in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PGT_REPOSITORY", "PGT_BRANCH"):
        env.pop(key, None)
    scripts = PROJECT_ROOT / "scripts"
    before = cluster.actors_by_node("RayTrainWorker").get(WORKER, 0)

    def stack(command: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"source {scripts}/env.sh && cd {PROJECT_ROOT} && {command}"], env=env,
                              capture_output=True, text=True, timeout=timeout_s)

    try:
        started = stack(f"{scripts}/start-prefect.sh && prefect --no-prompt deploy --name cluster")
        assert started.returncode == 0, (started.stdout + started.stderr)[-3000:]
        params = dict(cluster=cluster.dashboard, storage=storage, tracking_uri=tracking_server, workers=2, epochs=2,
                      state_dir=str(state), synthetic_users=8, synthetic_days=70, model_name="flow-on-cluster")
        given = " ".join(f"--param {k}='{v}'" for k, v in params.items())
        ran = stack(f"prefect deployment run preprocess-and-train/cluster {given} --watch --watch-interval 1 "
                    "--watch-timeout 500", timeout_s=600)
        worker_log = (tmp_path / "stack" / "prefect" / "worker.log").read_text(errors="replace")
        assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:] + worker_log[-3000:]
    finally:
        stack(f"{scripts}/stop-prefect.sh", timeout_s=120)
    assert "git_clone" in worker_log and "set_working_directory" not in worker_log, worker_log[-3000:]
    kept = open_storage(storage)
    published = {name: kept.read_bytes("sequences", "synthetic", name) for name in ("manifest.json", "train.parquet")}
    local = state / "sequences" / "synthetic"
    assert published == {name: (local / name).read_bytes() for name in published}
    metrics = kept.child("runs", "synthetic").read_json("metrics.json")
    assert metrics["config"]["data_dir"] == kept.uri_of("sequences", "synthetic") and metrics["epochs_run"] == 2
    client = MlflowClient(tracking_server)
    version = client.get_model_version_by_alias("flow-on-cluster", "champion")
    assert version.version == "1" and version.run_id == metrics["mlflow"]["run_id"]
    assert cluster.actors_by_node("RayTrainWorker").get(WORKER, 0) == before + 2
    assert client.get_run(metrics["mlflow"]["run_id"]).info.status == "FINISHED"

"""The Ray this process starts or joins, for preprocessing's engine, Ray Train and Ray Tune alike: its
environment, a quick check that a cluster's address answers, and a session that shuts down what it started."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil

from infra.errors import ServiceError, SettingsError
from infra.process import HANDLED, interruptible
from infra.storage import is_uri

# Ray Train's switch of its preemption watcher (ray.train.v2._internal.constants), which it passes from the driver
# to its controller
PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
TRAIN_POLL_INTERVAL_S = 0.2  # how often Ray Train's controller polls its workers (Ray's default: 2 s)


def prepare_ray_env(address: str | None = None) -> None:
    """The environment of the Ray this process starts or joins; it must be set before `ray` is first imported.

    Token auth is off (RAY_AUTH_MODE=disabled) unless the environment says otherwise. A local Ray (no
    address, no $RAY_ADDRESS) runs in Ray's single-node mode, which binds every port to 127.0.0.1 (Ray
    otherwise resolves even 127.0.0.1 to the machine's address), without its Prometheus metrics
    export, which costs ~10% of a 2-core machine and which nothing here reads, and without Ray Train's
    preemption watcher: an actor of its own per run (a process to start, a few CPU-seconds on 2 cores) that
    watches for nodes a cloud or an autoscaler drains, where the only node is this machine.

    Ray Train's controller takes the workers' reports when it polls them, every 2 s by default, and a
    worker's report waits for that poll: on small data each epoch then waited about 1.4 s. It polls every
    TRAIN_POLL_INTERVAL_S here instead (a few remote calls a second); the controller reads it from the driver's
    environment, on a cluster too. $RAY_TRAIN_HEALTH_CHECK_INTERVAL_S set by the user wins."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(TRAIN_POLL_INTERVAL_S))
    if not (address or os.environ.get("RAY_ADDRESS")):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_enable_metrics_collection", "0")
        os.environ.setdefault(PREEMPTION_WATCHER, "0")


SERVICE_TIMEOUT_S = 3.0  # how long an address may take to answer before a command gives up on it


def check_ray_address(address: str | None, timeout_s: float = SERVICE_TIMEOUT_S) -> None:
    """ServiceError, within `timeout_s`, unless a Ray cluster's GCS answers at `address` (host:port; "auto" and None
    are Ray's own lookups): one gRPC call for its cluster id, the first thing ray.init asks. An unreachable address
    would otherwise keep ray.init retrying for minutes. SettingsError for a Ray Client address (ray://), which Ray
    Train and Tune no longer take: such a command goes to the cluster as a Ray Job."""
    import grpc  # Ray's own dependency

    if not address or address in ("auto", "local"):
        return
    if address.startswith("ray://"):
        raise SettingsError(f"--address {address}: Ray Client (ray://) does not run Ray Train or Tune; run the command "
                            "on a node of the cluster with --address HOST:6379 (or auto), or submit it from here as a "
                            "Ray Job: ray job submit --address http://HEAD:8265 --working-dir . -- pgt ...")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SettingsError(f"--address {address}: expected host:port (the head node's GCS port, 6379 by default) "
                            "or auto")
    hostport = address
    with grpc.insecure_channel(hostport) as channel:
        ask = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId",
                                  request_serializer=lambda request: request, response_deserializer=lambda reply: reply)
        try:
            ask(b"", timeout=timeout_s)
            problem = None
        except grpc.RpcError as exc:
            problem = exc.details() or exc.code().name
    if problem is not None:
        raise ServiceError(f"Ray cluster at {address} is not reachable ({problem.splitlines()[0]}); start its head "
                           "with `ray start --head --port PORT`, or leave --address (and RAY_ADDRESS) out to run on a "
                           "local Ray")
    if not _raylets_here():  # Ray would look for one for a minute, then fail with "No node info found"
        raise ServiceError(f"Ray cluster at {address}: no Ray node runs on this machine, and a command joins a cluster "
                           "from one of its nodes; submit it from here as a Ray Job instead: pgt submit --cluster "
                           "http://HEAD:8265 -- COMMAND ... (or ray job submit; docs/cluster.md)")


def _raylets_here() -> bool:
    """Whether a Ray node (its raylet process) runs on this machine, as ray.init looks for one to attach a driver."""
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == "raylet":
            return True
    return False


@contextlib.contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """The process's Python handlers of SIGTERM and SIGHUP, put back after the block: ray.init installs its core's
    own, which dumps a stack and aborts (exit 134) where the command would stop cleanly (preprocessing.process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in kept.items():
            if callable(handler):
                signal.signal(number, handler)


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """Join the Ray cluster at `address` (or $RAY_ADDRESS), or start a local Ray on 127.0.0.1 and shut it
    down on exit. The dashboard stays on (127.0.0.1): it serves the State API that Ray Train polls.

    A local Ray is always a new one (address="local"): a bare `ray.init()` would instead join whatever
    cluster a `ray start` on this machine last recorded in /tmp/ray, someone else's included, and then
    refuse `num_cpus`. To run on such a cluster, name it (`--address auto` or its host:port)."""
    prepare_ray_env(address)
    import ray

    if ray.is_initialized():
        with interruptible():
            yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    with kept_signal_handlers():
        if address:
            check_ray_address(address)
            try:
                ray.init(address=address, log_to_driver=True)
            except ConnectionError as exc:  # "auto" without a running cluster
                raise ServiceError(f"Ray cluster at {address}: {str(exc).splitlines()[0]}") from None
        else:
            with single_node_mode(), stop_signals_left_to_this_process():
                ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), log_to_driver=True)
    try:
        with interruptible():  # a cancelled Prefect flow run's SIGTERM stops the wait in Ray
            yield
    finally:
        shutdown_ray()


def shutdown_ray() -> None:
    """ray.shutdown() with no garbage collection while it runs.

    Ray ends the whole process, at once and without a traceback, when a thread touches its core worker while the
    core worker shuts down ("The core worker has already been shutdown ... The process will exit", Ray's
    core_worker_process.cc). Releasing a Ray handle (an ObjectRef, an actor handle) touches it, and the cyclic
    collector releases handles held in garbage cycles in whichever thread happens to allocate: MLflow's
    system-metrics sampler, which runs through the shutdown, or Prefect's log and event workers in a flow run.
    A sweep's or a run's results, written after the shutdown, would be lost with the process. So the cycles are
    collected here first, while Ray is up, and no collection runs until it is down."""
    import ray

    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        ray.shutdown()
    finally:
        if enabled:
            gc.enable()


def cluster_nodes(address: str | None, out: Path | str | None = None, data: Path | str | None = None) -> list[str]:
    """The addresses of the live nodes of the cluster at `address` (or $RAY_ADDRESS), a node of this machine as
    127.0.0.1 (Ray may name it by the machine's network address); [] where neither names a cluster (a local Ray is
    this machine alone). One connection, which also checks, before any work, that a local `out` or `data` is one
    folder for every node of a cluster of more than one (SettingsError in one line otherwise): ranks and trials on
    other nodes would write their checkpoints to, and read the data from, a disk of their own. A task on each node
    looks for a marker this process writes into `out` (created for it, removed after), and reads `data`'s
    manifest.json (never written to); a folder every node mounts at one path (NFS) passes, and URIs are every
    node's storage alike."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        return []
    import ray

    with ray_session(address):
        nodes = [node for node in ray.nodes() if node["Alive"]]
        if len(nodes) > 1:
            local = {flag: path for flag, path in (("--out", out), ("--data", data))
                     if path is not None and not is_uri(path)}
            _check_shared(nodes, local)
        here = ray.util.get_node_ip_address()
        return sorted("127.0.0.1" if node["NodeManagerAddress"] == here else node["NodeManagerAddress"]
                      for node in nodes)


def _check_shared(nodes: list[dict], local: dict[str, Path | str]) -> None:
    """cluster_nodes' check of the local folders `local` (flag -> path) on every node of `nodes`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    look = ray.remote(num_cpus=0, max_retries=0)(_file_digest)
    wanted, made = {}, []
    if "--out" in local:
        folder = Path(local["--out"]).resolve()
        made = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / f".pgt-shared-{uuid.uuid4().hex}"
        marker.write_text(marker.name)
        wanted["--out"] = (folder, marker, _file_digest(str(marker)))
    if "--data" in local:
        manifest = Path(local["--data"]).resolve() / "manifest.json"
        wanted["--data"] = (manifest.parent, manifest, _file_digest(str(manifest)))
    try:
        for flag, (folder, probe, digest) in wanted.items():
            seen = ray.get([look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                            .remote(str(probe)) for node in nodes], timeout=60)
            apart = [node["NodeManagerAddress"] for node, got in zip(nodes, seen) if got != digest]
            if apart:
                raise SettingsError(f"{flag} {folder} is a folder on this machine's disk, which the Ray cluster's "
                                    f"node(s) {', '.join(apart)} do not have: give object storage (s3://BUCKET/"
                                    "FOLDER) or a folder every node mounts at the same path (docs/cluster.md)")
    finally:
        if "--out" in wanted:
            wanted["--out"][1].unlink(missing_ok=True)
        for folder in made:  # what was created for the marker, where the run does not go on
            with contextlib.suppress(OSError):
                folder.rmdir()


def _file_digest(path: str) -> str | None:
    """The SHA-256 of a file on the node this runs on; None where it has none."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@contextlib.contextmanager
def stop_signals_left_to_this_process() -> Iterator[None]:
    """The processes of the local Ray this block starts (its head, and the workers its raylet starts later) do not
    take SIGTERM or SIGHUP (HANDLED): they stay blocked in them, as Ray itself blocks SIGINT there. A stop signal
    to the whole process group (systemd's stop, `kill -- -PGID`, a Prefect flow run's cancel, a closed terminal)
    then stops this process alone, which closes its run and releases its lock before it shuts Ray down. Were the
    head stopped by the same signal, Ray's core in this process would end it at once with exit status 1 on finding
    its raylet gone, often before the Python code that unwinds had run. A SIGKILL, which nothing blocks, still ends
    every process of the group it is sent to (Prefect's, 30 s after its SIGTERM). A signal mask is inherited by a
    child and kept across exec; this thread's is restored after (a signal that came meanwhile is taken then)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set(HANDLED))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextlib.contextmanager
def single_node_mode() -> Iterator[None]:
    """Ray's single-node mode for the local Ray this process starts, even where `ray` was imported before
    prepare_ray_env could set its switch (a flow or a notebook that imported Tune first): Ray reads the switch
    into a constant at import, and without it binds the local Ray to the machine's network address, reachable
    from other machines with token auth off. Ray's own processes read the switch from the environment that
    prepare_ray_env set; this process reads the constant, restored afterwards so that a later session of the
    same process can still join a cluster."""
    from ray._private import ray_constants

    kept = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = kept



"""Where preprocessing runs: partitions and DBSCAN tiles one after another in this process ("local"), or
as Ray tasks on a local Ray or a cluster ("ray"). The outputs are the same either way.

The Ray session helpers live here, below pgt and tune, which use them too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from preprocessing.errors import InputError
from preprocessing.settings import check_settings, setting

ENGINES = ("local", "ray")
AUTO_TILE_POINTS = 200_000  # auto: whole-data DBSCAN up to this many staypoints, whose neighbour lists it holds at once
AUTO_TILE_DEG = 0.05  # auto: beyond that, tiles of this size (about 5.5 km north-south)


@dataclass(frozen=True)
class EngineConfig:
    engine: str = setting("local", "local: partitions and tiles one after another in this process; ray: as Ray tasks "
                                   "on a local Ray or the cluster at address. Same outputs.", choices=ENGINES)
    partitions: int = setting(0, "Users hashed into this many partitions; memory follows the largest. 0 = one per "
                                 "~4M input rows.", low=0, high=1 << 20)
    tile_deg: float | None = setting(None, "DBSCAN by spatial tiles of this many degrees (0 = whole-data DBSCAN; None "
                                           f"= {AUTO_TILE_DEG} past {AUTO_TILE_POINTS:,} staypoints); the same labels "
                                           "either way.", low=0.0)
    address: str | None = setting(None, "Engine ray: the Ray cluster to run on (host:port or auto); None = "
                                        "$RAY_ADDRESS or a local Ray.")
    work_dir: Path | None = setting(None, "Where the input's partitions are written (None: a temporary folder); on a "
                                          "multi-machine Ray cluster, a path every node can read, like the input.")

    def __post_init__(self) -> None:
        check_settings(self)
        problems = []
        if self.address and self.engine != "ray":
            problems.append("address is for engine 'ray' only")
        if problems:
            raise ValueError("; ".join(problems))

    def tiles_for(self, staypoints: int) -> float:
        """The tile size for DBSCAN over this many staypoints (0: whole-data)."""
        if self.tile_deg is not None:
            return self.tile_deg
        return AUTO_TILE_DEG if staypoints > AUTO_TILE_POINTS else 0.0

    def to_dict(self) -> dict:
        return {"engine": self.engine, "partitions": self.partitions, "tile_deg": self.tile_deg,
                "address": self.address, "work_dir": str(self.work_dir) if self.work_dir else None}

    @classmethod
    def from_dict(cls, values: dict) -> EngineConfig:
        work_dir = values.get("work_dir")
        return cls(**{**values, "work_dir": Path(work_dir) if work_dir else None})


def serial_map(fn: Callable, items: list, *args, on_done: Callable[[], None] | None = None) -> list:
    """fn(item, *args) for each item, one after another in this process; on_done() after each."""
    out = []
    for item in items:
        out.append(fn(item, *args))
        if on_done:
            on_done()
    return out


def _on_node(fn: Callable, item, *args) -> tuple[str, object]:
    """fn(item, *args) in a Ray task, with the id of the node that ran it."""
    import ray

    return ray.get_runtime_context().get_node_id(), fn(item, *args)


class RayMap:
    """fn(item, *args) for each item as Ray tasks (1 CPU each, spread over the cluster's nodes), results in
    the items' order; arguments shared by all tasks go to the object store once. `nodes` counts the tasks
    each node ran."""

    def __init__(self) -> None:
        self.nodes: Counter[str] = Counter()

    def __call__(self, fn: Callable, items: list, *args, on_done: Callable[[], None] | None = None) -> list:
        import ray

        remote = ray.remote(num_cpus=1, max_retries=2, scheduling_strategy="SPREAD")(_on_node)
        shared = [ray.put(a) for a in args]
        refs = [remote.remote(fn, item, *shared) for item in items]
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            if on_done:
                on_done()
        try:
            ran = ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, InputError):  # the input's problem, in the one line the CLI prints
                raise exc.cause from None
            raise
        self.nodes.update(node for node, _ in ran)
        return [result for _, result in ran]


@contextlib.contextmanager
def mapper(engine: EngineConfig) -> Iterator[Callable]:
    """The map function of the engine: serial_map, or a RayMap inside a Ray session for "ray"."""
    if engine.engine == "local":
        yield serial_map
        return
    with ray_session(engine.address):
        yield RayMap()


def prepare_ray_env(address: str | None = None) -> None:
    """The environment of the Ray this process starts or joins; it must be set before `ray` is first imported.

    Token auth is off (RAY_AUTH_MODE=disabled) unless the environment says otherwise. A local Ray (no
    address, no $RAY_ADDRESS) runs in Ray's single-node mode, which binds every port to 127.0.0.1 (Ray
    otherwise resolves even 127.0.0.1 to the machine's address), and without its Prometheus metrics
    export, which costs ~10% of a 2-core machine and which nothing here reads."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not (address or os.environ.get("RAY_ADDRESS")):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_enable_metrics_collection", "0")


SERVICE_TIMEOUT_S = 3.0  # how long an address may take to answer before a command gives up on it


def check_ray_address(address: str | None, timeout_s: float = SERVICE_TIMEOUT_S) -> None:
    """ValueError, within `timeout_s`, unless a Ray cluster's GCS answers at `address` (host:port or
    ray://host:port; "auto" and None are Ray's own lookups): one gRPC call for its cluster id, the first thing
    ray.init asks. An unreachable address would otherwise keep ray.init retrying for minutes."""
    import grpc  # Ray's own dependency

    if not address or address in ("auto", "local"):
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address {address}: expected host:port (the head node's GCS port, 6379 by default), "
                         "ray://host:port, or auto")
    with grpc.insecure_channel(hostport) as channel:
        ask = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId",
                                  request_serializer=lambda request: request, response_deserializer=lambda reply: reply)
        try:
            ask(b"", timeout=timeout_s)
            return
        except grpc.RpcError as exc:
            problem = exc.details() or exc.code().name
    raise ValueError(f"Ray cluster at {address} is not reachable ({problem.splitlines()[0]}); start its head with "
                     "`ray start --head --port PORT`, or leave --address (and RAY_ADDRESS) out to run on a local Ray")


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
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    with kept_signal_handlers():
        if address:
            check_ray_address(address)
            try:
                ray.init(address=address, log_to_driver=True)
            except ConnectionError as exc:  # "auto" without a running cluster
                raise ValueError(f"Ray cluster at {address}: {str(exc).splitlines()[0]}") from None
        else:
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), log_to_driver=True)
    try:
        yield
    finally:
        ray.shutdown()



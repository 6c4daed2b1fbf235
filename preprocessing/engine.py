"""Where preprocessing runs: partitions and DBSCAN tiles one after another in this process ("local"), or
as Ray tasks on a local Ray or a cluster ("ray"). The outputs are the same either way."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from infra.errors import InputError, SettingsError
from infra.ray_session import ray_session
from infra.settings import check_settings, setting

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
                                        "$RAY_ADDRESS or a local Ray.", env="RAY_ADDRESS")
    work_dir: Path | None = setting(None, "Where the input's partitions are written on this machine (None: a "
                                          "temporary folder); on a cluster of several nodes their bytes go to the "
                                          "tasks through Ray's object store.")

    def __post_init__(self) -> None:
        check_settings(self)
        problems = []
        if self.address and self.engine != "ray":
            problems.append("address is for engine 'ray' only")
        if problems:
            raise SettingsError("; ".join(problems))

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
    each node ran; `ships_files` says whether the cluster has more than one node (whose disks it cannot assume
    shared)."""

    def __init__(self) -> None:
        import ray

        self.nodes: Counter[str] = Counter()
        # nodes that may not share this machine's disk: the partitions' tasks then get their files' bytes
        # (preprocessing.partitions.ship_partition) instead of paths; one node reads the paths
        self.ships_files = sum(node["Alive"] for node in ray.nodes()) > 1

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

"""Raw GPS points (or given staypoints) to staypoints: read, validate, find staypoints, the activity flag and the
tracked days, partition by partition, so that memory depends on the largest partition. The one way from an input
to its staypoints: a full run's many partitions, and new data's or a served request's one.

Users are hashed into partitions. A Parquet or CSV input is split once, streaming, into one Parquet part
per partition (its rows as stored, with their source_row); a GeoLife folder is split by user folder,
without copying. One partition is the input itself (a file, or a table in memory): nothing is split or copied.
Each partition is then read, validated and turned into staypoints on its own (`staypoints_of_partition`: a pure
function of its task, run in a loop or as a Ray task), and only its staypoints, tracked days and quarantined rows
come back. `combine_partitions` joins them: same rows, order and user ids whatever the partition count, so every
later stage and every output file is identical.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from infra.errors import InputError
from infra.output import clean_stale_temporaries, temporary_sibling
from preprocessing import geolife, readers
from preprocessing.config import FORMATS, PreprocessConfig
from preprocessing.engine import serial_map
from preprocessing.quality import tracking_days
from preprocessing.rows import TimeWindow, user_id_cast
from preprocessing.staypoints import flag_activity, generate_staypoints

PARTITION_ROWS = 4_000_000  # auto partitions: about this many input rows each (~0.5 GiB of parsed fixes)
PLT_BYTES_PER_ROW = 68  # a GeoLife .plt row, for the auto partition count of a folder
PARTITION_SEED = 0x5EED  # users' hash seed: the same partitions on every run of one polars version


@dataclass(frozen=True)
class PartitionTask:
    """One partition's work: everything a worker needs, and nothing of the other partitions."""

    input_format: str
    config: PreprocessConfig
    window: TimeWindow  # resolved once for all partitions
    source: readers.TableInput | None = None  # a Parquet/CSV input; its part files below
    parts: tuple[Path, ...] = ()  # this partition's rows of `source` (split_table); none: all of `source`
    folder: Path | None = None  # a GeoLife folder; its files below
    plt_files: tuple[Path, ...] = ()
    tracking: bool = True  # each user's tracked days (what the user filter needs; new data's application does not)


@dataclass
class InputStaypoints:
    """An input's staypoints and what came with them: the tables of the stages after it, by name."""

    staypoints: pl.DataFrame  # with is_activity; sorted by user_id, started_at
    tracking: pl.DataFrame | None  # user_id, tracked days (None when not asked for)
    quarantine: pl.DataFrame  # source_file, source_row, reason and the row's original values
    users: pl.Series  # the distinct user ids of valid rows
    counts: dict  # positionfixes_read, positionfixes_quarantined, staypoints, activity_staypoints
    details: dict  # quarantine_reasons, time_window, partitions (and a GeoLife folder's plt_files)


@dataclass
class PartitionResult:
    """What one partition hands back: staypoints (user ids as compared), tracked days, quarantined rows."""

    staypoints: pl.DataFrame
    tracking: pl.DataFrame
    quarantine: pl.DataFrame
    rows_read: int
    users: pl.Series  # the distinct user ids of valid rows, as compared
    notes: dict = field(default_factory=dict)


def auto_partitions(input_path: Path, input_format: str) -> int:
    """One partition per PARTITION_ROWS input rows (Parquet: its metadata; CSV and .plt: estimated from bytes)."""
    path = Path(input_path)
    if input_format == "geolife-plt":
        rows = sum(f.stat().st_size for f in geolife.find_plt_files(path)) / PLT_BYTES_PER_ROW
    else:
        rows = _table_rows_estimate(path)
    return max(1, math.ceil(rows / PARTITION_ROWS))


def _table_rows_estimate(path: Path) -> float:
    if not path.is_file():
        return 0
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic == b"PAR1":
        try:
            return pq.read_metadata(path).num_rows
        except Exception:  # noqa: BLE001 - the reader reports a broken file in one line
            return 0
    return path.stat().st_size / 40  # a CSV row of a fix: about 40 bytes


def resolved_window(config: PreprocessConfig) -> TimeWindow:
    """The config's plausible time window with its end fixed now (None means one day after the run)."""
    earliest, latest = TimeWindow(*config.time_window()).bounds()
    return TimeWindow(earliest, latest)


def plan_partitions(input_path: Path | pl.DataFrame, input_format: str, config: PreprocessConfig, partitions: int,
                    work_dir: Path | None, tracking: bool = True, name: str = "request") -> list[PartitionTask]:
    """The partitions' tasks; a table input is split into work_dir (streaming, one pass) where one is given (several
    partitions, or one whose files are shipped to a node), else one partition is the input itself. A table in
    memory (called `name` in messages) is one partition."""
    window = resolved_window(config)
    if input_format == "geolife-plt":
        files = geolife.find_plt_files(input_path)
        users = sorted({f.parent.parent.name for f in files})
        part_of = {u: i % partitions for i, u in enumerate(users)}  # round robin over sorted user folders
        groups = [tuple(f for f in files if part_of[f.parent.parent.name] == k) for k in range(partitions)]
        return [PartitionTask(input_format, config, window, folder=Path(input_path), plt_files=g, tracking=tracking)
                for g in groups if g]
    opener = readers.open_staypoints if input_format == "staypoints" else readers.open_positionfixes
    source = opener(input_path, name=name)
    if partitions == 1 and work_dir is None:
        return [PartitionTask(input_format, config, window, source=source, tracking=tracking)]  # the input, no copy
    return [PartitionTask(input_format, config, window, source=source, parts=tuple(p), tracking=tracking)
            for p in split_table(source, partitions, work_dir) if p]


def split_table(source: readers.TableInput, partitions: int, folder: Path) -> list[list[Path]]:
    """Stream the table once into folder/_part=k/*.parquet by its users' hash; the part files of each k."""
    key = (source.user_key().hash(seed=PARTITION_SEED) % partitions).alias("_part")
    try:
        source.scan().with_columns(key).sink_parquet(pl.PartitionBy(folder, key="_part", include_key=False), mkdir=True)
    except readers.UNREADABLE as exc:
        raise readers.unreadable_input(source.path, exc) from None
    return [sorted((folder / f"_part={k}").glob("*.parquet")) for k in range(partitions)]


def staypoints_of_partition(task: PartitionTask) -> PartitionResult:
    """Read, validate, find staypoints, tracked days and the activity flag of one partition."""
    config, window = task.config, task.window
    if task.input_format == "geolife-plt":
        read = geolife.read_geolife_plt(task.folder, window, files=list(task.plt_files))
        good, quarantine, rows_read, notes = read.table, read.quarantine, read.rows_read, read.notes
    else:
        parse = readers.parse_staypoints if task.input_format == "staypoints" else readers.parse_positionfixes
        rows = pl.scan_parquet(list(task.parts)) if task.parts else task.source.scan()
        try:  # the input is decoded here, lazily: a page that cannot be is the input's problem
            good, bad = parse(task.source, rows, window)
            bad = bad.sort("source_row")
            quarantine = readers.quarantine_of(task.source, bad, rows)
        except readers.UNREADABLE as exc:
            raise readers.unreadable_input(task.source.path, exc) from None
        rows_read, notes = good.height + bad.height, {}
    start, end = ("started_at", "finished_at") if task.input_format == "staypoints" else ("tracked_at", "tracked_at")
    tracking = tracking_days(good, start, end) if task.tracking else None
    if task.input_format == "staypoints":
        staypoints = good
    else:
        staypoints = generate_staypoints(good, config.staypoint_dist_threshold_m, config.staypoint_time_threshold_min,
                                         config.staypoint_gap_threshold_min)
    users = good["user_id"].unique()
    del good
    staypoints = flag_activity(staypoints, config.activity_time_threshold_min)
    return PartitionResult(staypoints, tracking, quarantine, rows_read, users, notes)


@dataclass(frozen=True)
class ShippedPartition:
    """A partition's task with its files' bytes: what a Ray task on a node that does not share the driver's disk
    receives (through Ray's object store), and writes into a folder of its own before reading."""

    task: PartitionTask
    files: tuple[tuple[str, bytes], ...]  # (the file's path relative to `root`, its bytes)
    root: str  # the folder the files lie under on the driver: the GeoLife folder, or the parts' scratch folder


def ship_partition(task: PartitionTask) -> ShippedPartition:
    """The task with its part files, or its GeoLife .plt files, read into it (a task without its own files reads
    nothing: staypoints_of_input ships only split tables and GeoLife folders)."""
    if task.plt_files:
        root = Path(task.folder)
        return ShippedPartition(task, tuple((str(f.relative_to(root)), f.read_bytes()) for f in task.plt_files), str(root))
    root = Path(task.parts[0]).parent.parent  # the scratch folder: _part=k/*.parquet
    return ShippedPartition(task, tuple((str(f.relative_to(root)), Path(f).read_bytes()) for f in task.parts), str(root))


def staypoints_of_shipped(shipped: ShippedPartition) -> PartitionResult:
    """staypoints_of_partition of a shipped task, its files written into a folder of this node's (removed after);
    the quarantine and notes name each file by its path on the driver, as they would without shipping."""
    local = Path(tempfile.mkdtemp(prefix="pgt-shipped-"))
    try:
        paths = []
        for relative, data in shipped.files:
            path = local / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            paths.append(path)
        task = shipped.task
        if task.plt_files:
            moved = PartitionTask(task.input_format, task.config, task.window, folder=local, plt_files=tuple(paths),
                                  tracking=task.tracking)
        else:
            moved = PartitionTask(task.input_format, task.config, task.window, source=task.source, parts=tuple(paths),
                                  tracking=task.tracking)
        result = staypoints_of_partition(moved)
        if not task.plt_files:  # a table's quarantine names its source, which did not move
            return result
        here, there = str(local), shipped.root
        quarantine = result.quarantine.with_columns(pl.col("source_file").str.replace(here, there, literal=True, n=1))
        notes = {**result.notes}
        if "plt_files_with_short_header" in notes:
            notes["plt_files_with_short_header"] = [name.replace(here, there, 1)
                                                    for name in notes["plt_files_with_short_header"]]
        return PartitionResult(result.staypoints, result.tracking, quarantine, result.rows_read, result.users, notes)
    finally:
        shutil.rmtree(local, ignore_errors=True)


def combine_partitions(tasks: list[PartitionTask], results: list[PartitionResult], input_path: Path | str,
                       input_format: str) -> InputStaypoints:
    """The whole input's staypoints, tracked days, quarantine, counts and details, from the partitions'."""
    source = tasks[0].source if tasks else None
    rows_read = sum(r.rows_read for r in results)
    one = len(results) == 1  # nothing to join: a served request's few rows skip the concatenations and sorts
    quarantine = results[0].quarantine if one else pl.concat([r.quarantine for r in results], how="vertical_relaxed")
    quarantine = quarantine.sort("source_file", "source_row")
    staypoints = results[0].staypoints if one else pl.concat([r.staypoints for r in results])
    staypoints = staypoints.sort("user_id", "started_at", maintain_order=True)
    tracking = None if results[0].tracking is None else pl.concat([r.tracking for r in results])
    users = results[0].users if one else pl.concat([r.users for r in results])
    cast = user_id_cast(users, source.schema["user_id"]) if source else None
    if cast is not None:
        staypoints = staypoints.with_columns(cast)
        tracking = tracking.with_columns(cast) if tracking is not None else None
        users = users.to_frame().with_columns(cast).to_series()
    tracking = tracking.sort("user_id") if tracking is not None else None
    reasons = dict(quarantine.group_by("reason").len().sort("reason").iter_rows())
    if rows_read == quarantine.height:
        top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        listed = "; ".join(f"{reason}: {n:,}" for reason, n in top)
        raise InputError(input_path, f"no valid rows: all {rows_read:,} rows were quarantined ({listed})")
    counts = {"positionfixes_read": rows_read, "positionfixes_quarantined": quarantine.height,
              "staypoints": staypoints.height, "activity_staypoints": int(staypoints["is_activity"].sum())}
    details = {"quarantine_reasons": reasons, "time_window": tasks[0].window.describe() if tasks else ""}
    if input_format == "geolife-plt":
        short = sorted(f for r in results for f in r.notes.get("plt_files_with_short_header", []))
        details["plt_files"] = sum(r.notes["plt_files"] for r in results)
        if short:
            details["plt_files_with_short_header"] = short
    return InputStaypoints(staypoints, tracking, quarantine, users.unique(maintain_order=True), counts, details)


def staypoints_of_input(input_path: Path | pl.DataFrame, input_format: str, config: PreprocessConfig,
                        partitions: int = 1, map_partitions: Callable = serial_map, work_dir: Path | None = None,
                        on_planned: Callable[[int], None] | None = None, on_done: Callable[[], None] | None = None,
                        tracking: bool = True, name: str = "request") -> InputStaypoints:
    """An input's staypoints over `partitions` partitions: a file or folder, or (positionfixes and staypoints, one
    partition) a table in memory, called `name` in messages. Only a table input of several partitions is split,
    into a scratch folder under work_dir (else the system's temporary folder), removed after. on_planned(n) once
    the input is planned as n non-empty partitions; on_done() after each. Without `tracking`, no tracked days."""
    if input_format not in FORMATS:
        raise InputError(name if isinstance(input_path, pl.DataFrame) else input_path,
                         f"unknown format {input_format!r}; expected one of {', '.join(FORMATS)}")
    where = name if isinstance(input_path, pl.DataFrame) else Path(input_path)  # what messages call the input
    if isinstance(input_path, pl.DataFrame):
        if input_format == "geolife-plt":
            raise InputError(name, "a table in memory holds positionfixes or staypoints, not a GeoLife folder")
        partitions = 1
    # on nodes that do not share this machine's disk (the map's ships_files), a partition goes with its files' bytes:
    # a table input is then always split (one part holds what a task reads), a GeoLife folder's files are read here
    ship = getattr(map_partitions, "ships_files", False) and not isinstance(input_path, pl.DataFrame)
    split = (partitions > 1 or ship) and input_format != "geolife-plt"
    tmp = None
    if split:
        base = Path(work_dir if work_dir is not None else tempfile.gettempdir()) / "pgt-partitions"
        base.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(base)  # the parts a killed run left behind
        tmp = temporary_sibling(base, "split")
        tmp.mkdir()
    try:
        tasks = plan_partitions(where if isinstance(where, Path) else input_path, input_format, config, partitions,
                                tmp, tracking, name)
        if on_planned:
            on_planned(len(tasks))
        if ship:
            results = map_partitions(staypoints_of_shipped, [ship_partition(task) for task in tasks], on_done=on_done)
        else:
            results = map_partitions(staypoints_of_partition, tasks, on_done=on_done)
        return combine_partitions(tasks, results, where, input_format)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

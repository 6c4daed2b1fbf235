"""Read, validate and find staypoints partition by partition, so that memory depends on the largest partition.

Users are hashed into partitions. A Parquet or CSV input is split once, streaming, into one Parquet part
per partition (its rows as stored, with their source_row); a GeoLife folder is split by user folder,
without copying. Each partition is then read, validated and turned into staypoints on its own
(`staypoints_of_partition`: a pure function of its task, run in a loop or as a Ray task), and only
its staypoints, tracked days and quarantined rows come back. `combine_partitions` joins them into
exactly the tables of the whole-input path (stage_read, then stage_staypoints): same rows, order and
user ids, so every later stage and every output file is identical whatever the partition count.
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

from preprocessing import readers
from preprocessing.config import PreprocessConfig
from preprocessing.engine import serial_map
from preprocessing.errors import InputError
from preprocessing.output import clean_stale_temporaries, temporary_sibling
from preprocessing.quality import tracking_days
from preprocessing.staypoints import flag_activity, generate_staypoints

PARTITION_ROWS = 4_000_000  # auto partitions: about this many input rows each (~0.5 GiB of parsed fixes)
PLT_BYTES_PER_ROW = 68  # a GeoLife .plt row, for the auto partition count of a folder
PARTITION_SEED = 0x5EED  # users' hash seed: the same partitions on every run of one polars version


@dataclass(frozen=True)
class PartitionTask:
    """One partition's work: everything a worker needs, and nothing of the other partitions."""

    input_format: str
    config: PreprocessConfig
    window: readers.TimeWindow  # resolved once for all partitions
    source: readers.TableInput | None = None  # a Parquet/CSV input; its part files below
    parts: tuple[Path, ...] = ()  # this partition's rows of `source` (split_table); none: all of `source`
    folder: Path | None = None  # a GeoLife folder; its files below
    plt_files: tuple[Path, ...] = ()


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
        rows = sum(f.stat().st_size for f in readers.find_plt_files(path)) / PLT_BYTES_PER_ROW
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


def resolved_window(config: PreprocessConfig) -> readers.TimeWindow:
    """The config's plausible time window with its end fixed now (None means one day after the run)."""
    earliest, latest = readers.TimeWindow(*config.time_window()).bounds()
    return readers.TimeWindow(earliest, latest)


def plan_partitions(input_path: Path, input_format: str, config: PreprocessConfig, partitions: int,
                    work_dir: Path) -> list[PartitionTask]:
    """The partitions' tasks; a table input is split into work_dir (streaming, one pass)."""
    window = resolved_window(config)
    if input_format == "geolife-plt":
        files = readers.find_plt_files(input_path)
        users = sorted({f.parent.parent.name for f in files})
        part_of = {u: i % partitions for i, u in enumerate(users)}  # round robin over sorted user folders
        groups = [tuple(f for f in files if part_of[f.parent.parent.name] == k) for k in range(partitions)]
        return [PartitionTask(input_format, config, window, folder=Path(input_path), plt_files=g) for g in groups if g]
    opener = readers.open_staypoints if input_format == "staypoints" else readers.open_positionfixes
    source = opener(input_path)
    if partitions == 1:
        return [PartitionTask(input_format, config, window, source=source)]  # the input itself, no copy
    return [PartitionTask(input_format, config, window, source=source, parts=tuple(p))
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
        read = readers.read_geolife_plt(task.folder, window, files=list(task.plt_files))
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
    if task.input_format == "staypoints":
        staypoints, tracking = good, tracking_days(good, "started_at", "finished_at")
    else:
        tracking = tracking_days(good, "tracked_at", "tracked_at")
        staypoints = generate_staypoints(good, config.staypoint_dist_threshold_m, config.staypoint_time_threshold_min,
                                         config.staypoint_gap_threshold_min)
    users = good["user_id"].unique()
    del good
    staypoints = flag_activity(staypoints, config.activity_time_threshold_min)
    return PartitionResult(staypoints, tracking, quarantine, rows_read, users, notes)


def combine_partitions(tasks: list[PartitionTask], results: list[PartitionResult], input_path: Path,
                       input_format: str) -> tuple[dict[str, pl.DataFrame], dict, dict]:
    """The whole-input stage tables (staypoints, tracking, quarantine), counts and details, from the partitions'."""
    source = tasks[0].source if tasks else None
    rows_read = sum(r.rows_read for r in results)
    quarantine = pl.concat([r.quarantine for r in results], how="vertical_relaxed").sort("source_file", "source_row")
    staypoints = pl.concat([r.staypoints for r in results]).sort("user_id", "started_at", maintain_order=True)
    tracking = pl.concat([r.tracking for r in results])
    cast = readers.user_id_cast(pl.concat([r.users for r in results]), source.schema["user_id"]) if source else None
    if cast is not None:
        staypoints, tracking = staypoints.with_columns(cast), tracking.with_columns(cast)
    tracking = tracking.sort("user_id")
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
    return {"staypoints": staypoints, "tracking": tracking, "quarantine": quarantine}, counts, details


def partitioned_staypoints(input_path: Path, input_format: str, config: PreprocessConfig, partitions: int,
                           map_partitions: Callable = serial_map, work_dir: Path | None = None,
                           on_planned: Callable[[int], None] | None = None, on_done: Callable[[], None] | None = None,
                           ) -> tuple[dict[str, pl.DataFrame], dict, dict]:
    """stage_read + stage_staypoints over `partitions` partitions (their tables, counts, details).
    on_planned(n) once the input is split into n non-empty partitions; on_done() after each."""
    base = Path(work_dir if work_dir is not None else tempfile.gettempdir()) / "pgt-partitions"
    base.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(base)  # the parts a killed run left behind
    tmp = temporary_sibling(base, "split")
    tmp.mkdir()
    try:
        tasks = plan_partitions(Path(input_path), input_format, config, partitions, tmp)
        if on_planned:
            on_planned(len(tasks))
        results = map_partitions(staypoints_of_partition, tasks, on_done=on_done)
        return combine_partitions(tasks, results, Path(input_path), input_format)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

"""preprocess(input, format, out): the reference protocol's stages in order, a manifest, an atomic write.

raw GPS points -> staypoints -> activity staypoints -> user filter -> locations -> merged staypoints
-> per-user day split -> samples -> train/validation/test Parquet.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import polars as pl

from preprocessing import readers
from preprocessing.config import FORMATS, SPLITS, PreprocessConfig  # noqa: F401 - FORMATS re-exported
from preprocessing.engine import EngineConfig, RayMap, mapper, serial_map
from preprocessing.errors import InputError
from preprocessing.fitted import (
    APPLIED_FILES,
    AppliedData,
    FittedPreprocessing,
    apply_fitted_stages,
    fitted_summary,
)
from preprocessing.locations import generate_locations, merge_staypoints
from preprocessing.output import (
    PRODUCER,
    check_output_folder,
    clean_stale_temporaries,
    is_own_manifest,
    output_lock,
    read_manifest,
    temporary_sibling,
    write_folder,
)
from preprocessing.partitions import auto_partitions, partitioned_staypoints
from preprocessing.quality import filter_users, tracking_days
from preprocessing.sequences import (
    UNSEEN,
    add_time_features,
    generate_samples,
    split_by_day,
)
from preprocessing.staypoints import flag_activity, generate_staypoints

OUTPUT_FILES = ("train.parquet", "validation.parquet", "test.parquet", "quarantine.parquet", "staypoints.parquet",
                "locations.parquet", "users.parquet", "places.parquet", "location_staypoints.parquet", "manifest.json")
OWN_FILES = (*OUTPUT_FILES, "evaluation.parquet", "latest.parquet")  # a full run's files and those of --fitted
STAGES = ("hash input", "read and validate", "staypoints", "activity", "user filter", "locations", "merge",
          "split and samples", "write")


def check_format(input_path: Path | str, input_format: str) -> None:
    """InputError naming the input unless input_format is one of FORMATS."""
    if input_format not in FORMATS:
        raise InputError(input_path, f"unknown format {input_format!r}; expected one of {', '.join(FORMATS)}")


def code_version() -> str:
    """Package version plus a digest of the preprocessing sources: a code change invalidates reuse."""
    try:
        version = metadata.version("pgt-pipeline")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + source.read_bytes())
    return f"{version}+{digest.hexdigest()[:12]}"


def input_sha256(path: Path, input_format: str) -> str:
    """sha256 of the input file, or of every .plt file (relative path and bytes) of a GeoLife folder."""
    digest = hashlib.sha256()
    if input_format == "geolife-plt":
        root = Path(path)
        for f in readers.find_plt_files(root):
            digest.update(str(f.relative_to(root)).encode() + b"\0")
            digest.update(f.read_bytes())
    else:
        path = Path(path)
        if not path.is_file():
            raise InputError(path, "no such file" if not path.exists() else "is a folder, expected a Parquet or CSV file")
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


@dataclass
class StageLog:
    """Wall time and peak resident memory of each stage, sampled by a background thread."""

    stages: list[dict] = field(default_factory=list)
    sample_memory: bool = True  # False: wall time only, no sampling thread (a served request of a few rows)
    _peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    @staticmethod
    def rss_bytes() -> int:
        try:
            with open("/proc/self/statm") as fh:
                return int(fh.read().split()[1]) * 4096
        except OSError:
            return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self._peak = max(self._peak, self.rss_bytes())

    @contextmanager
    def stage(self, name: str):
        if not self.sample_memory:
            start = time.perf_counter()
            try:
                yield
            finally:
                self.stages.append({"name": name, "seconds": round(time.perf_counter() - start, 3)})
            return
        self._peak = self.rss_bytes()
        self._stop.clear()
        sampler = threading.Thread(target=self._sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self._stop.set()
            sampler.join()
            self._peak = max(self._peak, self.rss_bytes())
            self.stages.append({"name": name, "seconds": round(seconds, 3), "peak_rss_mb": round(self._peak / 2**20, 1)})


@dataclass
class PreprocessResult:
    manifest: dict
    out_dir: Path
    reused: bool


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(SpinnerColumn(), TextColumn("[bold]preprocess[/] {task.description:<20}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled,
                    transient=False)


def reusable_manifest(out_dir: Path, sha: str, input_format: str, config: PreprocessConfig,
                      files: tuple[str, ...] = OUTPUT_FILES) -> dict | None:
    """The existing manifest if out_dir holds a complete output (`files`) of the same input, format, config and code."""
    if not all((Path(out_dir) / f).is_file() for f in files):
        return None
    try:
        manifest = read_manifest(out_dir)
    except InputError:
        return None
    if not is_own_manifest(manifest):
        return None
    same = (manifest.get("input_sha256") == sha and manifest.get("input_format") == input_format
            and manifest.get("config") == config.to_dict() and manifest.get("version") == code_version())
    return manifest if same else None


def preprocess(input_path: Path | str, input_format: str, out_dir: Path | str, config: PreprocessConfig | None = None,
               force: bool = False, progress: bool = True, engine: EngineConfig | None = None) -> PreprocessResult:
    """Run the protocol on one input and write out_dir atomically (a temporary folder, then a rename).

    `engine` says where the work runs (partitions and DBSCAN tiles, locally or on Ray); the outputs are the
    same for every engine, so it is no part of what a rerun compares.

    A rerun with the same input, format, config and code reuses out_dir unless `force`. Only a folder that
    `pgt preprocess` wrote, holding nothing else, is ever replaced; a second run into the same out_dir waits
    for the first.
    """
    config = config or PreprocessConfig()
    check_format(input_path, input_format)
    input_path, out_dir = Path(input_path), Path(out_dir)
    check_output_folder(out_dir, OWN_FILES)
    with output_lock(out_dir):
        check_output_folder(out_dir, OWN_FILES)  # what the run we waited for left there
        return _preprocess_locked(input_path, input_format, out_dir, config, force, progress, engine or EngineConfig())


def _hide_all(bar) -> None:
    """Hide every bar (stages and partitions) so that an error is the one line left on stderr."""
    for task in bar.task_ids:
        bar.update(task, visible=False)


def _preprocess_locked(input_path: Path, input_format: str, out_dir: Path, config: PreprocessConfig, force: bool,
                       progress: bool, engine: EngineConfig) -> PreprocessResult:
    with _progress(progress) as bar:
        task = bar.add_task(STAGES[0], total=len(STAGES))

        def advance(name: str | None = None) -> None:
            bar.advance(task)
            if name:
                bar.update(task, description=name)

        try:
            stage = stage_input(input_path, input_format)
            sha = stage.details["input_sha256"]
            if not force and (manifest := reusable_manifest(out_dir, sha, input_format, config)) is not None:
                bar.update(task, completed=len(STAGES), description="reused")
                return PreprocessResult(manifest, out_dir, reused=True)
            advance(STAGES[1])
            with mapper(engine) as map_fn:
                run = StageRun(input_path, input_format, config, engine, map_fn, advance, bar)
                for step in STEPS:
                    stage = run_step(step, run, stage)
            manifest = output_manifest(stage, run)
            _write_atomically(out_dir, manifest, stage.tables, StageLog(stages=list(stage.stages)))
            advance()
        except BaseException:
            _hide_all(bar)  # the error is the one line left on stderr
            raise
    return PreprocessResult(manifest, out_dir, reused=False)


@dataclass
class Stage:
    """What one stage hands the next: its tables, and the counts and details gathered so far."""

    tables: dict[str, pl.DataFrame]
    counts: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    stages: list[dict] = field(default_factory=list)  # the StageLog entries of the run so far (the manifest's "stages")

    def save(self, folder: Path) -> Path:
        """Write the tables as Parquet and the counts as stage.json, atomically (a temporary folder, then a rename)."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(folder)
        tmp = temporary_sibling(folder)
        tmp.mkdir()
        for name, table in self.tables.items():
            table.write_parquet(tmp / f"{name}.parquet", compression="zstd")
        (tmp / "stage.json").write_text(json.dumps({"counts": self.counts, "details": self.details,
                                                     "tables": sorted(self.tables), "stages": self.stages},
                                                    default=str) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return folder

    @classmethod
    def load(cls, folder: Path) -> Stage:
        meta = json.loads((Path(folder) / "stage.json").read_text())
        tables = {name: pl.read_parquet(Path(folder) / f"{name}.parquet") for name in meta["tables"]}
        return cls(tables, meta["counts"], meta["details"], meta.get("stages", []))


def _noop(name: str | None = None) -> None:
    return None


def stage_read(input_path: Path, input_format: str, log: StageLog | None = None, advance=_noop,
               config: PreprocessConfig | None = None) -> Stage:
    """Read and validate: the valid rows ("points") and the quarantined ones, with their counts."""
    log = log or StageLog()
    earliest, latest = (config or PreprocessConfig()).time_window()
    window = readers.TimeWindow(earliest, latest)
    with log.stage("read and validate"):
        if input_format == "geolife-plt":
            result = readers.read_geolife_plt(input_path, window)
        elif input_format == "positionfixes":
            result = readers.read_positionfixes(input_path, window)
        elif input_format == "staypoints":
            result = readers.read_staypoints(input_path, window)
        else:
            check_format(input_path, input_format)
        counts = {"positionfixes_read": result.rows_read, "positionfixes_quarantined": result.quarantine.height}
        reasons = dict(result.quarantine.group_by("reason").len().sort("reason").iter_rows())
        details = {"quarantine_reasons": reasons, "time_window": window.describe(), **result.notes}
        if result.table.height == 0:
            top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            listed = "; ".join(f"{reason}: {n:,}" for reason, n in top)
            raise InputError(input_path, f"no valid rows: all {result.rows_read:,} rows were quarantined ({listed})")
    advance("staypoints")
    return Stage({"points": result.table, "quarantine": result.quarantine}, counts, details)


def stage_staypoints(read: Stage, input_format: str, config: PreprocessConfig, log: StageLog | None = None,
                     advance=_noop) -> Stage:
    """Staypoints (sliding; given ones pass through), each user's tracked days, and the activity flag."""
    log = log or StageLog()
    points = read.tables["points"]
    counts, details = dict(read.counts), dict(read.details)
    with log.stage("staypoints"):
        if input_format == "staypoints":
            staypoints = points
            tracking = tracking_days(staypoints, "started_at", "finished_at")
        else:
            tracking = tracking_days(points, "tracked_at", "tracked_at")
            staypoints = generate_staypoints(points, config.staypoint_dist_threshold_m,
                                             config.staypoint_time_threshold_min, config.staypoint_gap_threshold_min)
        counts["staypoints"] = staypoints.height
    advance("activity")
    with log.stage("activity"):
        staypoints = flag_activity(staypoints, config.activity_time_threshold_min)
        counts["activity_staypoints"] = int(staypoints["is_activity"].sum())
    advance("user filter")
    return Stage({"staypoints": staypoints, "tracking": tracking, "quarantine": read.tables["quarantine"]}, counts, details)


def stage_partitions(input_path: Path, input_format: str, config: PreprocessConfig, engine: EngineConfig,
                     map_partitions=serial_map, log: StageLog | None = None, advance=_noop, bar=None) -> Stage:
    """stage_read and stage_staypoints partition by partition (preprocessing/partitions.py): the same tables,
    counts and details, with memory bounded by the largest partition. details["partitions"]: how many.
    `bar`: a rich Progress to which a bar over the partitions is added."""
    log = log or StageLog()
    partitions = engine.partitions or auto_partitions(input_path, input_format)
    task = bar.add_task("partitions", total=None) if bar is not None else None
    planned = (lambda n: bar.update(task, total=n)) if bar is not None else None
    done = (lambda: bar.advance(task)) if bar is not None else None
    try:
        with log.stage(f"read, validate, staypoints ({partitions} partition{'s' if partitions > 1 else ''})"):
            tables, counts, details = partitioned_staypoints(input_path, input_format, config, partitions,
                                                             map_partitions, engine.work_dir, planned, done)
    finally:
        if bar is not None:
            bar.remove_task(task)
    advance("staypoints")
    advance("activity")
    advance("user filter")
    return Stage(tables, counts, {**details, "partitions": partitions})


def stage_locations(found: Stage, config: PreprocessConfig, log: StageLog | None = None, advance=_noop,
                    engine: EngineConfig | None = None, map_tiles=serial_map) -> Stage:
    """The user filter, DBSCAN locations over the kept users' activities (by tiles as `engine` says), and
    the merge of repeated visits."""
    log = log or StageLog()
    staypoints, tracking = found.tables["staypoints"], found.tables["tracking"]
    counts, details = dict(found.counts), dict(found.details)
    with log.stage("user filter"):
        users = filter_users(tracking, staypoints, config.min_tracking_days, config.min_mean_window_quality,
                             config.quality_window_weeks)
        counts["users_kept"] = users.len()
        details["users_read"] = tracking.height
        activities = staypoints.filter(pl.col("is_activity") & pl.col("user_id").is_in(users.implode()))
        activities = activities.sort("user_id", "started_at", maintain_order=True)
        details["activity_staypoints_of_kept_users"] = activities.height
    advance("locations")
    with log.stage("locations"):
        tile_deg = (engine or EngineConfig()).tiles_for(activities.height)
        details["location_tile_deg"] = tile_deg
        labelled, locations = generate_locations(activities, config.location_epsilon_m, config.location_min_samples,
                                                 config.location_axis_order, tile_deg, map_tiles)
        counts["locations"] = locations.height
        located = labelled.filter(pl.col("location_id").is_not_null())
        details["staypoints_noise"] = labelled.height - located.height
        clustered = labelled.select("location_id", "latitude", "longitude", "is_core")
    advance("merge")
    with log.stage("merge"):
        merged = merge_staypoints(located, config.merge_max_gap_min)
        counts["staypoints_merged"] = merged.height
    advance("split and samples")
    return Stage({"merged": merged, "locations": locations, "clustered": clustered, "quarantine": found.tables["quarantine"]},
                 counts, details)


def stage_sequences(located: Stage, config: PreprocessConfig, log: StageLog | None = None, advance=_noop) -> Stage:
    """Time features, the per-user day split, samples and vocabularies: the output tables, the counts, and in
    details["vocab"] the manifest's table sizes."""
    log = log or StageLog()
    merged, locations = located.tables["merged"], located.tables["locations"]
    counts, details = dict(located.counts), dict(located.details)
    with log.stage("split and samples"):
        featured = add_time_features(merged, config.timezone, config.time_slot_min, config.duration_cap_min,
                                     config.duration_bucket_min)
        featured = split_by_day(featured, config.train_fraction, config.validation_fraction)
        samples, kept, vocab = generate_samples(featured, config.history_days, config.min_history_staypoints)
        counts["samples"] = {split: samples[split].height for split in SPLITS}
        details["users_with_samples_in_all_splits"] = vocab.users.height
        details["staypoints_of_users_with_samples"] = kept.height
        details["history_length_max"] = max(
            (int(s["locations"].list.len().max() or 0) for s in samples.values()), default=0)
    advance("write")
    located_vocab = vocab.locations.join(locations, left_on="source_location_id", right_on="location_id", how="left",
                                         maintain_order="left")
    places = locations.join(vocab.locations, left_on="location_id", right_on="source_location_id", how="left",
                            maintain_order="left").with_columns(pl.col("location").fill_null(UNSEEN))
    tables = {
        **{f"{split}.parquet": samples[split] for split in SPLITS},
        "quarantine.parquet": located.tables["quarantine"],
        "staypoints.parquet": kept.drop("history_start", "is_activity", strict=False),
        "locations.parquet": located_vocab,
        "users.parquet": vocab.users,
        "places.parquet": places,  # every DBSCAN location: its vocabulary id (1 when unseen in train), coordinates
        # the staypoints DBSCAN clustered (location_id null for noise): what new staypoints join (fitted.py)
        "location_staypoints.parquet": located.tables["clustered"],
    }
    details["vocab"] = feature_vocab(vocab.location_size, vocab.user_size, config, details["history_length_max"])
    return Stage(tables, counts, details)


def feature_vocab(locations: int, users: int, config: PreprocessConfig, max_history: int) -> dict:
    """The manifest's `vocab`: every table size the model needs, so that any valid config trains.
    locations and users count their embedding rows (with padding); the features count their values."""
    return {"locations": locations, "users": users, "time_slots": config.time_slots, "weekdays": 7,
            "recency": config.recency_days, "durations": config.duration_buckets, "max_history": max_history}


def finish_manifest(manifest: dict, input_path: Path, input_format: str, sha: str, config: PreprocessConfig,
                    engine: EngineConfig | None = None) -> dict:
    """What a run adds to its stages' manifest: its input, config and code version, and the engine it ran on
    (with the partitions and DBSCAN tiles used, which the stages left in the details)."""
    manifest.update({"producer": PRODUCER, "input": str(input_path), "input_format": input_format, "input_sha256": sha,
                     "config": config.to_dict(), "version": code_version()})
    details = manifest.get("details", {})
    used = {"partitions_used": details.pop("partitions", None), "tile_deg_used": details.pop("location_tile_deg", None)}
    if engine is not None:
        manifest["engine"] = {**engine.to_dict(), **used}
    return manifest


def stage_key(sha: str, input_format: str, config: PreprocessConfig) -> str:
    """What a cached stage depends on: the input's hash, its format, the config and the code version."""
    text = json.dumps([sha, input_format, config.to_dict(), code_version()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_stage(work_dir: Path, name: str, key: str, compute) -> Path:
    """The folder of stage `name` for `key` under work_dir: reused when complete, else `compute()` (a Stage)
    is saved there. A rerun after a failure continues from the last finished stage."""
    folder = Path(work_dir) / f"{name}-{key}"
    if not (folder / "stage.json").is_file():
        compute().save(folder)
    return folder


@dataclass
class StageRun:
    """What every stage of one run sees: the input, the config, where the work runs, and how it shows progress."""

    input_path: Path
    input_format: str
    config: PreprocessConfig
    engine: EngineConfig = field(default_factory=EngineConfig)
    map_fn: Callable = serial_map  # the engine's map (preprocessing.engine.mapper)
    advance: Callable = _noop  # moves the stage bar on
    bar: object | None = None  # a rich Progress for the bar over partitions


@dataclass(frozen=True)
class Step:
    """One row of the table of stages that `pgt preprocess` and the Prefect flow both run."""

    name: str  # the flow's task and its cache folder (work_dir/NAME-KEY)
    run: Callable[[StageRun, Stage, StageLog], Stage]  # the previous stage's output -> this stage's
    cached: bool  # the flow keeps the result in a folder, so that a rerun continues after it


STEPS = (
    Step("staypoints", lambda run, previous, log: stage_partitions(
        run.input_path, run.input_format, run.config, run.engine, run.map_fn, log, run.advance, run.bar), cached=True),
    Step("locations", lambda run, previous, log: stage_locations(
        previous, run.config, log, run.advance, run.engine, run.map_fn), cached=True),
    Step("sequences", lambda run, previous, log: stage_sequences(previous, run.config, log, run.advance), cached=False),
)


def stage_input(input_path: Path, input_format: str) -> Stage:
    """The first stage, "hash input": the input's sha256 (details["input_sha256"]), which every later stage's
    cache key and the reuse of a finished output depend on."""
    check_format(input_path, input_format)
    log = StageLog()
    with log.stage("hash input"):
        sha = input_sha256(Path(input_path), input_format)
    return Stage({}, {}, {"input_sha256": sha}, log.stages)


def run_step(step: Step, run: StageRun, previous: Stage) -> Stage:
    """One stage of the table, its log entries added to the previous stages', and under Ray the tasks it ran
    on each node added to details["ray_tasks_per_node"]."""
    log = StageLog(stages=list(previous.stages))
    nodes_before = dict(getattr(run.map_fn, "nodes", {}))
    stage = step.run(run, previous, log)
    stage.stages = log.stages
    if isinstance(run.map_fn, RayMap):
        ran = dict(previous.details.get("ray_tasks_per_node", {}))
        for node, count in run.map_fn.nodes.items():
            ran[node] = ran.get(node, 0) + count - nodes_before.get(node, 0)
        stage.details["ray_tasks_per_node"] = {node: n for node, n in ran.items() if n}
    stage.details.setdefault("input_sha256", previous.details.get("input_sha256"))
    return stage


def output_manifest(final: Stage, run: StageRun) -> dict:
    """The manifest of the output the last stage makes (its "stages" are added as it is written)."""
    details = dict(final.details)
    sha, vocab = details.pop("input_sha256"), details.pop("vocab")
    ray_nodes = details.pop("ray_tasks_per_node", None)
    manifest = {"counts": final.counts, "vocab": vocab, "details": details}
    finish_manifest(manifest, run.input_path, run.input_format, sha, run.config, run.engine)
    if ray_nodes is not None:
        manifest["engine"]["ray_tasks_per_node"] = ray_nodes
    return manifest


def write_stages(out_dir: Path, final: Stage, run: StageRun) -> dict:
    """The output folder from the last stage, written atomically (refused if out_dir holds anything `pgt
    preprocess` did not write); returns its manifest."""
    manifest = output_manifest(final, run)
    write_output(out_dir, manifest, final.tables, StageLog(stages=list(final.stages)))
    return manifest


def write_output(out_dir: Path, manifest: dict, tables: dict[str, pl.DataFrame], log: StageLog | None = None) -> None:
    """The final output folder, written atomically; refused if out_dir holds anything `pgt preprocess` did not write."""
    out_dir = Path(out_dir)
    check_output_folder(out_dir, OWN_FILES)
    with output_lock(out_dir):
        check_output_folder(out_dir, OWN_FILES)
        _write_atomically(out_dir, manifest, tables, log or StageLog())


def _write_atomically(out_dir: Path, manifest: dict, tables: dict[str, pl.DataFrame], log: StageLog) -> None:
    """Write everything into a temporary sibling folder, then swap it into place: a crash leaves no half output."""

    def write(tmp: Path) -> None:
        with log.stage("write"):
            for name, table in tables.items():
                table.write_parquet(tmp / name, compression="zstd")
        manifest["stages"] = log.stages
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")

    write_folder(out_dir, write)


def apply_fitted(input_path: Path | str, input_format: str, fitted: FittedPreprocessing,
                 log: StageLog | None = None, evaluation: bool = True) -> AppliedData:
    """New data through a fitted preprocessing, in memory (preprocessing/fitted.py): read and validate with
    the fitted run's rules, then staypoints, fitted places, samples (without `evaluation`: the latest only)."""
    log = log or StageLog()
    read = stage_read(Path(input_path), input_format, log, config=fitted.config)
    with log.stage("fitted places and samples"):
        return apply_fitted_stages(read.tables, read.counts, read.details, input_format, fitted, log, evaluation)


def preprocess_fitted(input_path: Path | str, input_format: str, fitted_dir: Path | str, out_dir: Path | str,
                      force: bool = False, progress: bool = True) -> PreprocessResult:
    """`pgt preprocess --fitted DIR`: apply the preprocessing fitted in DIR (a full run's output) to new data
    and write evaluation.parquet, latest.parquet, staypoints, places, users, quarantine and the manifest,
    with the locking, reuse and atomic write of `preprocess`."""
    fitted = FittedPreprocessing.from_folder(fitted_dir)
    input_path, out_dir = Path(input_path), Path(out_dir)
    check_format(input_path, input_format)
    check_output_folder(out_dir, OWN_FILES)
    with output_lock(out_dir):
        check_output_folder(out_dir, OWN_FILES)
        log = StageLog()
        with _progress(progress) as bar:
            task = bar.add_task("hash input", total=3)
            try:
                with log.stage("hash input"):
                    sha = input_sha256(input_path, input_format)
                previous = None if force else reusable_manifest(out_dir, sha, input_format, fitted.config,
                                                                APPLIED_FILES)
                if previous is not None and previous.get("fitted", {}).get("input_sha256") == fitted.input_sha256:
                    bar.update(task, completed=3, description="reused")
                    return PreprocessResult(previous, out_dir, reused=True)
                bar.update(task, advance=1, description="apply fitted")
                applied = apply_fitted(input_path, input_format, fitted, log)
                bar.update(task, advance=1, description="write")
                manifest = {"mode": "fitted", "counts": applied.counts, "vocab": fitted.vocab,
                            "fitted": fitted_summary(fitted), "details": applied.details}
                finish_manifest(manifest, input_path, input_format, sha, fitted.config)
                tables = {"evaluation.parquet": applied.evaluation, "latest.parquet": applied.latest,
                          "quarantine.parquet": applied.quarantine, "staypoints.parquet": applied.staypoints,
                          "places.parquet": applied.places, "users.parquet": applied.users}
                _write_atomically(out_dir, manifest, tables, log)
                bar.update(task, advance=1)
            except BaseException:
                _hide_all(bar)
                raise
    return PreprocessResult(manifest, out_dir, reused=False)

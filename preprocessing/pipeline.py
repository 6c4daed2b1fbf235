"""preprocess(input, format, out): the reference protocol's stages in order, a manifest, an atomic write.

raw GPS points -> staypoints -> activity staypoints -> user filter -> locations -> merged staypoints
-> per-user day split -> samples -> train/validation/test Parquet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from infra.errors import InputError
from infra.output import output_lock, write_folder, write_parquet
from preprocessing import geolife
from preprocessing.config import PreprocessConfig
from preprocessing.engine import EngineConfig, RayMap, mapper, serial_map
from preprocessing.fitted import APPLIED_FILES, FittedPreprocessing, apply_fitted, fitted_summary
from preprocessing.output import PRODUCER, check_output_folder, is_own_manifest, read_manifest
from preprocessing.stages import (
    STAGES,
    OutputTables,
    Stage,
    StageLog,
    check_format,
    stage_locations,
    stage_sequences,
    stage_staypoints,
)

OUTPUT_FILES = (*(f"{f.name}.parquet" for f in dataclasses.fields(OutputTables)), "manifest.json")
OWN_FILES = (*OUTPUT_FILES, "evaluation.parquet", "latest.parquet")  # a full run's files and those of --fitted


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
        for f in geolife.find_plt_files(root):
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
class PreprocessResult:
    manifest: dict
    out_dir: Path | str  # a URI where the output was published to object storage (preprocessing.stored)
    reused: bool


def progress_bars(enabled: bool):
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
    return manifest if same_output(manifest, sha, input_format, config) else None


def same_output(manifest: dict | None, sha: str, input_format: str, config: PreprocessConfig) -> bool:
    """Whether a manifest is `pgt preprocess`'s for this input, format, config and code."""
    return (is_own_manifest(manifest) and manifest.get("input_sha256") == sha
            and manifest.get("input_format") == input_format and manifest.get("config") == config.to_dict()
            and manifest.get("version") == code_version())


def preprocess(input_path: Path | str, input_format: str, out_dir: Path | str, config: PreprocessConfig | None = None,
               force: bool = False, progress: bool = True, engine: EngineConfig | None = None,
               source: str | None = None) -> PreprocessResult:
    """Run the protocol on one input and write out_dir atomically (a temporary folder, then a rename).

    `engine` says where the work runs (partitions and DBSCAN tiles, locally or on Ray); the outputs are the
    same for every engine, so it is no part of what a rerun compares.

    A rerun with the same input, format, config and code reuses out_dir unless `force`. Only a folder that
    `pgt preprocess` wrote, holding nothing else, is ever replaced; a second run into the same out_dir while
    the first writes it is refused, naming the first.

    `source` names where a local copy of the input came from (a URI, preprocessing.stored): the manifest and the
    quarantine name it in place of the copy.
    """
    config = config or PreprocessConfig()
    check_format(input_path, input_format)
    input_path, out_dir = Path(input_path), Path(out_dir)
    check_output_folder(out_dir, OWN_FILES)
    with output_lock(out_dir, command="pgt preprocess"):
        check_output_folder(out_dir, OWN_FILES)  # what a run that ended meanwhile left there
        return _preprocess_locked(input_path, input_format, out_dir, config, force, progress, engine or EngineConfig(),
                                  source)


def _hide_all(bar) -> None:
    """Hide every bar (stages and partitions) so that an error is the one line left on stderr."""
    for task in bar.task_ids:
        bar.update(task, visible=False)


class StageBar:
    """The runner's progress: a bar over the stages (STAGES), moved on as each step of the table ends, and while the
    staypoints step runs, one over its partitions. The stages themselves know nothing of it."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.stages = bar.add_task(STAGES[0], total=len(STAGES))
        self.partitions = None

    def started(self, step: Step) -> None:
        self.bar.update(self.stages, description=step.shows[0])

    def finished(self, step: Step) -> None:
        self.bar.advance(self.stages, len(step.shows))
        if self.partitions is not None:
            self.bar.remove_task(self.partitions)
            self.partitions = None

    def planned(self, partitions: int) -> None:
        self.partitions = self.bar.add_task("partitions", total=partitions)

    def done(self) -> None:
        self.bar.advance(self.partitions)

    def hashed(self) -> None:
        self.bar.advance(self.stages)

    def reused(self) -> None:
        self.bar.update(self.stages, completed=len(STAGES), description="reused")

    def writing(self) -> None:
        self.bar.update(self.stages, description="write")

    def written(self) -> None:
        self.bar.advance(self.stages)


def _preprocess_locked(input_path: Path, input_format: str, out_dir: Path, config: PreprocessConfig, force: bool,
                       progress: bool, engine: EngineConfig, source: str | None) -> PreprocessResult:
    with progress_bars(progress) as bar:
        shown = StageBar(bar)
        try:
            stage = stage_input(input_path, input_format)
            sha = stage.details["input_sha256"]
            if not force and (manifest := reusable_manifest(out_dir, sha, input_format, config)) is not None:
                shown.reused()
                return PreprocessResult(manifest, out_dir, reused=True)
            shown.hashed()
            with mapper(engine) as map_fn:
                run = StageRun(input_path, input_format, config, engine, map_fn, shown, source)
                for step in STEPS:
                    stage = run_step(step, run, stage)
            manifest = output_manifest(stage, run)
            shown.writing()
            _write_atomically(out_dir, manifest, output_tables(stage, run), StageLog(stages=list(stage.stages)))
            shown.written()
        except BaseException:
            _hide_all(bar)  # the error is the one line left on stderr
            raise
    return PreprocessResult(manifest, out_dir, reused=False)


def finish_manifest(manifest: dict, input_path: Path | str, input_format: str, sha: str, config: PreprocessConfig,
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


def named_sources(tables: dict[str, pl.DataFrame], copy: Path, source: str) -> dict[str, pl.DataFrame]:
    """The tables with every `source_file` (the quarantine's) under the local copy `copy` of the input renamed to
    the same place under `source`, the URI it was copied from."""
    prefix = str(copy)
    named = {}
    for name, table in tables.items():
        if "source_file" in table.columns:
            column = pl.col("source_file")
            table = table.with_columns(pl.when(column.str.starts_with(prefix))
                                       .then(pl.lit(source) + column.str.slice(len(prefix)))
                                       .otherwise(column).alias("source_file"))
        named[name] = table
    return named


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
    progress: StageBar | None = None  # the runner's bars; None: none shown (the flow's tasks)
    source: str | None = None  # the URI input_path is a local copy of, named in the manifest in its place


@dataclass(frozen=True)
class Step:
    """One row of the table of stages that `pgt preprocess` and the Prefect flow both run."""

    name: str  # the flow's task and its cache folder (work_dir/NAME-KEY)
    run: Callable[[StageRun, Stage, StageLog], Stage]  # the previous stage's output -> this stage's
    cached: bool  # the flow keeps the result in a folder, so that a rerun continues after it
    shows: tuple[str, ...]  # the STAGES it covers on the progress bar


def _partition_hooks(run: StageRun) -> dict:
    """The staypoints step's progress over partitions, when the runner shows progress."""
    return {} if run.progress is None else {"on_planned": run.progress.planned, "on_done": run.progress.done}


STEPS = (
    Step("staypoints", lambda run, previous, log: stage_staypoints(
        run.input_path, run.input_format, run.config, run.engine, run.map_fn, log, **_partition_hooks(run)),
        cached=True, shows=("read and validate", "staypoints", "activity")),
    Step("locations", lambda run, previous, log: stage_locations(previous, run.config, log, run.engine, run.map_fn),
         cached=True, shows=("user filter", "locations", "merge")),
    Step("sequences", lambda run, previous, log: stage_sequences(previous, run.config, log), cached=False,
         shows=("split and samples",)),
)


def stage_input(input_path: Path, input_format: str) -> Stage:
    """The first stage, "hash input": the input's sha256 (details["input_sha256"]), which every later stage's
    cache key and the reuse of a finished output depend on."""
    check_format(input_path, input_format)
    log = StageLog()
    with log.stage("hash input"):
        sha = input_sha256(Path(input_path), input_format)
    return Stage(None, {}, {"input_sha256": sha}, log.stages)


def run_step(step: Step, run: StageRun, previous: Stage) -> Stage:
    """One stage of the table, its log entries added to the previous stages', and under Ray the tasks it ran
    on each node added to details["ray_tasks_per_node"]."""
    log = StageLog(stages=list(previous.stages))
    nodes_before = dict(getattr(run.map_fn, "nodes", {}))
    if run.progress is not None:
        run.progress.started(step)
    stage = step.run(run, previous, log)
    if run.progress is not None:
        run.progress.finished(step)
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
    finish_manifest(manifest, run.source or run.input_path, run.input_format, sha, run.config, run.engine)
    if ray_nodes is not None:
        manifest["engine"]["ray_tasks_per_node"] = ray_nodes
    return manifest


def output_tables(final: Stage, run: StageRun) -> dict[str, pl.DataFrame]:
    """The output folder's tables by file name, the input named by run.source where it is a local copy."""
    tables = final.tables.files()
    return tables if run.source is None else named_sources(tables, run.input_path, run.source)


def write_stages(out_dir: Path, final: Stage, run: StageRun) -> dict:
    """The output folder from the last stage, written atomically (refused if out_dir holds anything `pgt
    preprocess` did not write); returns its manifest."""
    manifest = output_manifest(final, run)
    write_output(out_dir, manifest, output_tables(final, run), StageLog(stages=list(final.stages)))
    return manifest


def write_output(out_dir: Path, manifest: dict, tables: dict[str, pl.DataFrame], log: StageLog | None = None) -> None:
    """The final output folder, written atomically; refused if out_dir holds anything `pgt preprocess` did not write."""
    out_dir = Path(out_dir)
    check_output_folder(out_dir, OWN_FILES)
    with output_lock(out_dir, command="pgt preprocess"):
        check_output_folder(out_dir, OWN_FILES)
        _write_atomically(out_dir, manifest, tables, log or StageLog())


def _write_atomically(out_dir: Path, manifest: dict, tables: dict[str, pl.DataFrame], log: StageLog) -> None:
    """Write everything into a temporary sibling folder, then swap it into place: a crash leaves no half output."""

    def write(tmp: Path) -> None:
        with log.stage("write"):
            for name, table in tables.items():
                write_parquet(table, tmp / name)
        manifest["stages"] = log.stages
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")

    write_folder(out_dir, write)


def preprocess_fitted(input_path: Path | str, input_format: str, fitted_dir: Path | str, out_dir: Path | str,
                      force: bool = False, progress: bool = True) -> PreprocessResult:
    """`pgt preprocess --fitted DIR`: apply the preprocessing fitted in DIR (a full run's output) to new data
    and write evaluation.parquet, latest.parquet, staypoints, places, users, quarantine and the manifest,
    with the locking, reuse and atomic write of `preprocess`."""
    fitted = FittedPreprocessing.from_folder(fitted_dir)
    input_path, out_dir = Path(input_path), Path(out_dir)
    check_format(input_path, input_format)
    check_output_folder(out_dir, OWN_FILES)
    with output_lock(out_dir, command="pgt preprocess"):
        check_output_folder(out_dir, OWN_FILES)
        log = StageLog()
        with progress_bars(progress) as bar:
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
                applied = apply_fitted(input_path, input_format, fitted, log, memory=fitted.visits is not None)
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

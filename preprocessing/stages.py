"""The stages of the reference protocol, each a pure step from one Stage (tables, counts, details) to the next:

    stage_staypoints (read, validate, staypoints, partition by partition) -> stage_locations -> stage_sequences

The runner (preprocessing.pipeline) orders, caches and writes them; the fitted application (preprocessing.fitted)
takes new data to staypoints the same way (preprocessing.partitions.staypoints_of_input, one partition). StageLog
times each stage.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from infra.errors import InputError
from infra.output import clean_stale_temporaries, temporary_sibling, write_parquet
from preprocessing.config import FORMATS, SPLITS, PreprocessConfig
from preprocessing.engine import EngineConfig, serial_map
from preprocessing.locations import generate_locations, merge_staypoints
from preprocessing.memory import MEMORY_COLUMNS, TARGET_KINDS, MemoryRule
from preprocessing.partitions import auto_partitions, staypoints_of_input
from preprocessing.quality import filter_users
from preprocessing.sequences import UNSEEN, add_time_features, generate_samples, split_by_day

STAGES = ("hash input", "read and validate", "staypoints", "activity", "user filter", "locations", "merge",
          "split and samples", "write")



def check_format(input_path: Path | str, input_format: str) -> None:
    """InputError naming the input unless input_format is one of FORMATS."""
    if input_format not in FORMATS:
        raise InputError(input_path, f"unknown format {input_format!r}; expected one of {', '.join(FORMATS)}")



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
class FoundTables:
    """What the staypoints stage hands on."""

    staypoints: pl.DataFrame  # with is_activity, sorted by user_id, started_at
    tracking: pl.DataFrame  # each user's tracked days (the user filter's input)
    quarantine: pl.DataFrame  # the input's rows set aside, with their reasons


@dataclass
class LocatedTables:
    """What the locations stage hands on."""

    merged: pl.DataFrame  # the kept users' activity staypoints at places, repeated visits merged
    locations: pl.DataFrame  # every DBSCAN location: location_id, latitude, longitude
    clustered: pl.DataFrame  # the staypoints DBSCAN clustered (location_id null for noise): what new data joins
    quarantine: pl.DataFrame


@dataclass
class OutputTables:
    """The output folder's tables (the sequences stage's), each written as <field>.parquet."""

    train: pl.DataFrame
    validation: pl.DataFrame
    test: pl.DataFrame
    quarantine: pl.DataFrame
    staypoints: pl.DataFrame  # the visits of the users with samples (what a model's memory remembers)
    locations: pl.DataFrame  # the vocabulary's locations with their coordinates
    users: pl.DataFrame
    places: pl.DataFrame  # every DBSCAN location: its vocabulary id (1 when unseen in train), coordinates
    location_staypoints: pl.DataFrame  # the staypoints DBSCAN clustered: what new staypoints join (fitted.py)

    def files(self) -> dict[str, pl.DataFrame]:
        """File name -> table, as the output folder holds them."""
        return {f"{f.name}.parquet": getattr(self, f.name) for f in dataclasses.fields(self)}


TABLES = {kind.__name__: kind for kind in (FoundTables, LocatedTables, OutputTables)}  # what a saved stage may hold


@dataclass
class Stage:
    """What one stage hands the next: its tables (None for the input's hash), and the counts and details gathered
    so far."""

    tables: FoundTables | LocatedTables | OutputTables | None
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
        names = [f.name for f in dataclasses.fields(self.tables)] if self.tables is not None else []
        for name in names:
            write_parquet(getattr(self.tables, name), tmp / f"{name}.parquet")
        kind = type(self.tables).__name__ if self.tables is not None else None
        (tmp / "stage.json").write_text(json.dumps({"counts": self.counts, "details": self.details, "kind": kind,
                                                     "tables": names, "stages": self.stages}, default=str) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return folder

    @classmethod
    def load(cls, folder: Path) -> Stage:
        meta = json.loads((Path(folder) / "stage.json").read_text())
        kind = TABLES[meta["kind"]] if meta.get("kind") else None
        tables = kind(**{name: pl.read_parquet(Path(folder) / f"{name}.parquet") for name in meta["tables"]}) \
            if kind else None
        return cls(tables, meta["counts"], meta["details"], meta.get("stages", []))



def stage_staypoints(input_path: Path, input_format: str, config: PreprocessConfig, engine: EngineConfig,
                     map_partitions=serial_map, log: StageLog | None = None,
                     on_planned: Callable[[int], None] | None = None, on_done: Callable[[], None] | None = None
                     ) -> Stage:
    """Read, validate, staypoints, the activity flag and tracked days, partition by partition
    (preprocessing.partitions.staypoints_of_input): memory bounded by the largest partition. details["partitions"]:
    how many. on_planned(n) once the n partitions are planned, on_done() after each (the runner's progress)."""
    log = log or StageLog()
    partitions = engine.partitions or auto_partitions(input_path, input_format)
    with log.stage(f"read, validate, staypoints ({partitions} partition{'s' if partitions > 1 else ''})"):
        found = staypoints_of_input(input_path, input_format, config, partitions, map_partitions, engine.work_dir,
                                    on_planned, on_done)
    return Stage(FoundTables(found.staypoints, found.tracking, found.quarantine),
                 found.counts, {**found.details, "partitions": partitions})



def stage_locations(found: Stage, config: PreprocessConfig, log: StageLog | None = None,
                    engine: EngineConfig | None = None, map_tiles=serial_map) -> Stage:
    """The user filter, DBSCAN locations over the kept users' activities (by tiles as `engine` says), and
    the merge of repeated visits."""
    log = log or StageLog()
    staypoints, tracking = found.tables.staypoints, found.tables.tracking
    counts, details = dict(found.counts), dict(found.details)
    with log.stage("user filter"):
        users = filter_users(tracking, staypoints, config.min_tracking_days, config.min_mean_window_quality,
                             config.quality_window_weeks)
        counts["users_kept"] = users.len()
        details["users_read"] = tracking.height
        activities = staypoints.filter(pl.col("is_activity") & pl.col("user_id").is_in(users.implode()))
        activities = activities.sort("user_id", "started_at", maintain_order=True)
        details["activity_staypoints_of_kept_users"] = activities.height
    with log.stage("locations"):
        tile_deg = (engine or EngineConfig()).tiles_for(activities.height)
        details["location_tile_deg"] = tile_deg
        labelled, locations = generate_locations(activities, config.location_epsilon_m, config.location_min_samples,
                                                 config.location_axis_order, tile_deg, map_tiles)
        counts["locations"] = locations.height
        located = labelled.filter(pl.col("location_id").is_not_null())
        details["staypoints_noise"] = labelled.height - located.height
        clustered = labelled.select("location_id", "latitude", "longitude", "is_core")
    with log.stage("merge"):
        merged = merge_staypoints(located, config.merge_max_gap_min)
        counts["staypoints_merged"] = merged.height
    return Stage(LocatedTables(merged, locations, clustered, found.tables.quarantine),
                 counts, details)



def stage_sequences(located: Stage, config: PreprocessConfig, log: StageLog | None = None) -> Stage:
    """Time features, the per-user day split, samples and vocabularies: the output tables, the counts, and in
    details["vocab"] the manifest's table sizes."""
    log = log or StageLog()
    merged, locations = located.tables.merged, located.tables.locations
    counts, details = dict(located.counts), dict(located.details)
    with log.stage("split and samples"):
        featured = add_time_features(merged, config.timezone, config.time_slot_min, config.duration_cap_min,
                                     config.duration_bucket_min)
        featured = split_by_day(featured, config.train_fraction, config.validation_fraction)
        samples, kept, vocab = generate_samples(featured, config.history_days, config.min_history_staypoints,
                                                MemoryRule.of(config))
        counts["samples"] = {split: samples[split].height for split in SPLITS}
        details["users_with_samples_in_all_splits"] = vocab.users.height
        details["staypoints_of_users_with_samples"] = kept.height
        details["history_length_max"] = max(
            (int(s["locations"].list.len().max() or 0) for s in samples.values()), default=0)
        details["memory"] = memory_description(samples, config)
    located_vocab = vocab.locations.join(locations, left_on="source_location_id", right_on="location_id", how="left",
                                         maintain_order="left")
    places = locations.join(vocab.locations, left_on="location_id", right_on="source_location_id", how="left",
                            maintain_order="left").with_columns(pl.col("location").fill_null(UNSEEN))
    tables = OutputTables(**{split: samples[split] for split in SPLITS}, quarantine=located.tables.quarantine,
                          staypoints=kept.drop("history_start", "is_activity", strict=False), locations=located_vocab,
                          users=vocab.users, places=places, location_staypoints=located.tables.clustered)
    details["vocab"] = feature_vocab(vocab.location_size, vocab.user_size, config, details["history_length_max"])
    return Stage(tables, counts, details)



def memory_description(samples: dict[str, pl.DataFrame], config: PreprocessConfig) -> dict:
    """The manifest's `memory`: what the memory columns hold, and per split how many targets are places of the
    window, returns to an earlier place beyond it, or places never visited before (they reconcile with the samples)."""
    kinds = {split: {kind: int((table["target_kind"].cast(pl.String) == kind).sum()) for kind in TARGET_KINDS}
             for split, table in samples.items() if "target_kind" in table.columns}
    return {
        "places": config.memory_size,
        "columns": list(MEMORY_COLUMNS),
        "rule": "per sample, the user's earlier places outside the history window, from visits that started before "
                "the history's first and ended before its last visit ended; the most visited first (then the most "
                "recent), at most `places`; days count back from the sample's anchor day, time slots and weekdays "
                "are each place's peak hour and weekday (preprocessing.memory)",
        "target_kinds": kinds,
    }


def feature_vocab(locations: int, users: int, config: PreprocessConfig, max_history: int) -> dict:
    """The manifest's `vocab`: every table size the model needs, so that any valid config trains.
    locations and users count their embedding rows (with padding); the features count their values."""
    return {"locations": locations, "users": users, "time_slots": config.time_slots, "weekdays": 7,
            "recency": config.recency_days, "durations": config.duration_buckets, "max_history": max_history}

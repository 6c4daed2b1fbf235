"""Feature buckets, the per-user day split, vocabularies and samples with their 7-day history."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from infra.errors import SettingsError
from preprocessing.config import ANCHORS, SPLITS, PreprocessConfig
from preprocessing.memory import MemoryRule, generate_memory
from preprocessing.queries import collect_in_memory
from preprocessing.validation import require_columns

PADDING, UNSEEN = 0, 1  # location ids reserved by the vocabulary; known locations start at 2


def add_time_features(
    staypoints: pl.DataFrame,
    timezone: str = PreprocessConfig.timezone,
    time_slot_min: int = PreprocessConfig.time_slot_min,
    duration_cap_min: int = PreprocessConfig.duration_cap_min,
    duration_bucket_min: int = PreprocessConfig.duration_bucket_min,
) -> pl.DataFrame:
    """Add start_day (days since the user's first day), time_slot (start minute of day // time_slot_min),
    weekday (0 = Monday), duration_min (whole minutes) and duration_bucket (min(duration, cap) // bucket),
    with days, slots and weekdays taken in `timezone`."""
    require_columns(staypoints, "staypoints", {"user_id": None, "started_at": pl.Datetime, "finished_at": pl.Datetime})
    return collect_in_memory(time_features(staypoints.lazy(), timezone, time_slot_min, duration_cap_min,
                                           duration_bucket_min), staypoints.height)


def time_features(staypoints: pl.LazyFrame, timezone: str, time_slot_min: int, duration_cap_min: int,
                  duration_bucket_min: int) -> pl.LazyFrame:
    """add_time_features as a step of a lazy query, for a caller whose staypoints passed add_time_features's checks
    (merged ones: merge_staypoints checked them) and that goes on in the same query (a served request pays each
    query's fixed cost)."""
    local = pl.col("started_at").dt.convert_time_zone(timezone)
    minute_of_day = local.dt.hour().cast(pl.Int32) * 60 + local.dt.minute().cast(pl.Int32)
    duration_min = (pl.col("finished_at") - pl.col("started_at")).dt.total_seconds() // 60
    return staypoints.with_columns(
        local.dt.date().alias("_date"),
        (minute_of_day // time_slot_min).cast(pl.Int16).alias("time_slot"),
        (local.dt.weekday() - 1).cast(pl.Int8).alias("weekday"),
        duration_min.cast(pl.Int32).alias("duration_min"),
        (duration_min.clip(upper_bound=duration_cap_min) // duration_bucket_min).cast(pl.Int16).alias("duration_bucket"),
    ).with_columns(
        (pl.col("_date") - pl.col("_date").min().over("user_id")).dt.total_days().cast(pl.Int32).alias("start_day")
    ).drop("_date")


def split_by_day(staypoints: pl.DataFrame, train_fraction: float = PreprocessConfig.train_fraction,
                 validation_fraction: float = PreprocessConfig.validation_fraction) -> pl.DataFrame:
    """Add split: per user, staypoints starting before train_fraction of the user's last start_day go to
    train, before (train_fraction + validation_fraction) of it to validation, the rest to test."""
    require_columns(staypoints, "staypoints", {"user_id": None, "start_day": None})
    last_day = pl.col("start_day").max().over("user_id")
    validation_end = round(train_fraction + validation_fraction, 12)  # 0.6 + 0.2 is 0.8000000000000002 in floats
    split = (
        pl.when(pl.col("start_day") < last_day * train_fraction).then(pl.lit("train"))
        .when(pl.col("start_day") < last_day * validation_end).then(pl.lit("validation"))
        .otherwise(pl.lit("test"))
    )
    return staypoints.with_columns(split.cast(pl.Enum(SPLITS)).alias("split"))


def find_samples(staypoints: pl.DataFrame, history_days: int = PreprocessConfig.history_days,
                 min_history: int = PreprocessConfig.min_history_staypoints) -> pl.DataFrame:
    """Mark the staypoints that are sample targets, within each (user, split) separately.

    A staypoint is a target if its day, counted from the first day of its user's split, is at least
    `history_days`, and the earlier staypoints of that split starting at most `history_days` days before
    its day number at least `min_history`. Returns the input sorted by (user_id, split, started_at) with
    history_start (row index of the first history staypoint) and is_target.
    """
    require_columns(staypoints, "staypoints", {"user_id": None, "split": None, "started_at": pl.Datetime, "start_day": None})
    sp = collect_in_memory(staypoints.lazy().sort("user_id", "split", "started_at", maintain_order=True).with_columns(
        pl.struct("user_id", "split").rle_id().alias("_group"),
        pl.col("start_day").min().over("user_id", "split").alias("_first_day"),
    ), staypoints.height)  # one query; the helper columns leave in place (drop_in_place: no query)
    group = sp.drop_in_place("_group").to_numpy().astype(np.int64)
    first_day = sp.drop_in_place("_first_day").to_numpy()
    day = sp["start_day"].to_numpy().astype(np.int64)
    key = (group << 32) + day
    row = np.arange(sp.height, dtype=np.int64)
    history_start = np.searchsorted(key, key - history_days, side="left")
    is_target = (day - first_day >= history_days) & (row - history_start >= min_history)
    return sp.hstack([pl.Series("history_start", history_start), pl.Series("is_target", is_target)])


@dataclass(frozen=True)
class Vocabularies:
    locations: pl.DataFrame  # location (2..), source_location_id, fitted on the train split
    users: pl.DataFrame  # user (1..), source_user_id

    @property
    def location_size(self) -> int:
        """Embedding table size: ids 0 (padding), 1 (unseen in train) and 2.. (known)."""
        return self.locations.height + 2

    @property
    def user_size(self) -> int:
        """Embedding table size: id 0 (padding) and 1.. (users)."""
        return self.users.height + 1


def fit_vocabularies(staypoints: pl.DataFrame) -> Vocabularies:
    """Location ids fitted on the train split (sorted source ids -> 2..), users sorted -> 1.."""
    require_columns(staypoints, "staypoints", {"user_id": None, "split": None, "location_id": None})
    known = staypoints.filter(pl.col("split") == "train")["location_id"].unique().sort()
    users = staypoints["user_id"].unique().sort()
    return Vocabularies(
        locations=pl.DataFrame({"location": np.arange(2, len(known) + 2, dtype=np.int32), "source_location_id": known}),
        users=pl.DataFrame({"user": np.arange(1, len(users) + 1, dtype=np.int32), "source_user_id": users}),
    )


def encode(staypoints: pl.DataFrame, vocab: Vocabularies) -> pl.DataFrame:
    """Add location (vocabulary id, UNSEEN for locations absent from train) and user (1..)."""
    return (
        staypoints.join(vocab.locations, left_on="location_id", right_on="source_location_id", how="left",
                        maintain_order="left")
        .join(vocab.users, left_on="user_id", right_on="source_user_id", how="left", maintain_order="left")
        .with_columns(pl.col("location").fill_null(UNSEEN))
    )


def generate_samples(staypoints: pl.DataFrame, history_days: int = PreprocessConfig.history_days,
                     min_history: int = PreprocessConfig.min_history_staypoints, memory: MemoryRule | None = None
                     ) -> tuple[dict[str, pl.DataFrame], pl.DataFrame, Vocabularies]:
    """Samples per split from merged staypoints with time features and split.

    Keeps only users that have samples in all three splits, fits the vocabularies on what remains,
    and returns ({split: samples}, the kept staypoints encoded, vocabularies). A sample holds the
    user, the history as list columns (locations, time_slots, weekdays, durations, recency in days
    before the target's day, places) and the target location. `locations` are vocabulary ids (UNSEEN
    for every place first visited after train); `places` are the dataset-wide DBSCAN location ids of
    the same visits, which tell two unseen places apart (target_place likewise for the target). With `memory`,
    each sample also lists the user's earlier places outside its history (preprocessing.memory).
    """
    marked = find_samples(staypoints, history_days, min_history)
    per_split = marked.filter("is_target").group_by("user_id").agg(pl.col("split").n_unique().alias("n"))
    kept_users = per_split.filter(pl.col("n") == len(SPLITS))["user_id"]
    kept_mask = marked["user_id"].is_in(kept_users.implode())
    kept = marked.filter(kept_mask)
    # history_start indexes rows of `marked`; re-index into `kept` (whole users were removed)
    shift = np.cumsum(~kept_mask.to_numpy())
    shifted = pl.col("history_start") - pl.Series(shift[kept["history_start"].to_numpy()])
    kept = kept.with_columns(shifted.alias("history_start"))
    vocab = fit_vocabularies(kept)
    kept = encode(kept, vocab)
    samples = {split: sample_table(kept, split, memory=memory) for split in SPLITS}
    return samples, kept, vocab


def history_lists(kept: pl.DataFrame, starts: np.ndarray, ends: np.ndarray, target_days: np.ndarray) -> dict[str, pa.Array]:
    """The history list columns of samples whose histories are the rows starts[i] .. ends[i] - 1 of `kept`
    (encoded staypoints with time features), recency counted back from target_days[i]."""
    lengths = ends - starts
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    gather = (np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])).astype(np.int64)
    day = kept["start_day"].to_numpy()
    recency = (np.repeat(target_days, lengths) - day[gather]).astype(np.int8)

    def as_list(values: np.ndarray, dtype: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, dtype))

    return {
        "locations": as_list(kept["location"].to_numpy()[gather], pa.int32()),
        "time_slots": as_list(kept["time_slot"].to_numpy()[gather], pa.int16()),
        "weekdays": as_list(kept["weekday"].to_numpy()[gather], pa.int8()),
        "durations": as_list(kept["duration_bucket"].to_numpy()[gather], pa.int16()),
        "recency": as_list(recency, pa.int8()),
        "places": as_list(kept["location_id"].to_numpy()[gather].astype(np.int64), pa.int64()),
    }


def sample_table(kept: pl.DataFrame, split: str, anchor: str = "target_day", memory: MemoryRule | None = None,
                 visits: pl.DataFrame | None = None) -> pl.DataFrame:
    """The samples of one split: every target row of `kept` (find_samples) with the history before it, recency
    counted back from `anchor` (ANCHORS): the target's day, or the day of the history's last visit. With `memory`,
    also the memory columns (preprocessing.memory): the user's earlier places outside the history, known when the
    history's last visit ended, days counted back from the same anchor; `visits` are those the memory remembers (by
    default `kept`'s own)."""
    if anchor not in ANCHORS:
        raise SettingsError(f"anchor must be one of {', '.join(ANCHORS)}, got {anchor!r}")
    rows = np.flatnonzero((kept["is_target"] & (kept["split"] == split)).to_numpy())
    targets = kept[rows]
    day = kept["start_day"].to_numpy()
    anchor_rows = rows if anchor == "target_day" else rows - 1  # a target's history ends on the row before it
    starts = kept["history_start"].to_numpy()[rows]
    history = history_lists(kept, starts, rows, day[anchor_rows])
    remembered = {}
    if memory is not None:
        queries = pl.DataFrame({
            "user_id": targets["user_id"],
            "window_start": kept["started_at"].gather(starts),
            "moment": kept["finished_at"].gather(rows - 1),  # the end of the history's last visit
            "anchor_date": kept["started_at"].gather(anchor_rows).dt.convert_time_zone(memory.timezone).dt.date(),
            "window_places": pl.Series(history["places"]),
            "target_place": targets["location_id"].cast(pl.Int64),
        })
        remembered = generate_memory(kept if visits is None else visits, queries, memory.places, memory.timezone,
                                     memory.time_slot_min)
    return pl.DataFrame({
        "user": targets["user"],
        "source_user_id": targets["user_id"],
        **history,
        **remembered,
        "target": targets["location"],
        "target_place": targets["location_id"].cast(pl.Int64),
        "target_time_slot": targets["time_slot"],
        "target_weekday": targets["weekday"],
        "target_duration_min": targets["duration_min"],
        "target_started_at": targets["started_at"],
    })

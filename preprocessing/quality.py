"""The user tracking-quality filter of the reference protocol."""

from __future__ import annotations

import polars as pl

from preprocessing.config import PreprocessConfig
from preprocessing.validation import require_columns

MS_PER_DAY = 86_400_000


def tracking_days(records: pl.DataFrame, start: str, end: str) -> pl.DataFrame:
    """Per user, the whole days from the first tracked moment to the last: user_id, tracking_days.

    `start`/`end` name the columns holding each record's first and last moment (for positionfixes
    both are tracked_at; for staypoints started_at and finished_at).
    """
    require_columns(records, "records", {"user_id": None, start: pl.Datetime, end: pl.Datetime})
    span = pl.col(end).max() - pl.col(start).min()
    return records.group_by("user_id").agg(
        (span.dt.total_milliseconds() // MS_PER_DAY).cast(pl.Int64).alias("tracking_days")
    ).sort("user_id")


def window_quality(staypoints: pl.DataFrame, window_weeks: int) -> pl.DataFrame:
    """Per user and sliding window of `window_weeks` weeks (step one week, from the user's first day),
    the share of the window's time covered by staypoints lying wholly inside it: user_id, window, quality.
    Windows without any staypoint are left out, as in the reference."""
    require_columns(staypoints, "staypoints", {"user_id": None, "started_at": pl.Datetime, "finished_at": pl.Datetime})
    window_ms = window_weeks * 7 * MS_PER_DAY
    sp = staypoints.with_columns(
        pl.col("started_at").min().over("user_id").dt.truncate("1d").alias("_day0"),
        ((pl.col("finished_at").max() - pl.col("started_at").min()).over("user_id").dt.total_days() // 7).alias("_weeks"),
    )
    # candidate windows i with i*7 days <= started - day0 and finished < day0 + i*7 days + window
    sp = sp.with_columns(
        ((pl.col("started_at") - pl.col("_day0")).dt.total_milliseconds() // (7 * MS_PER_DAY)).alias("_last"),
        ((pl.col("finished_at") - pl.col("_day0")).dt.total_milliseconds() - window_ms).alias("_needs"),
    ).with_columns(
        (pl.col("_needs") // (7 * MS_PER_DAY) + 1).clip(lower_bound=0).alias("_first")
    ).filter(pl.col("_first") <= pl.col("_last"))
    sp = sp.with_columns(pl.int_ranges("_first", pl.col("_last") + 1).alias("window")).explode("window")
    sp = sp.filter(pl.col("window") <= pl.col("_weeks") - window_weeks)
    duration_ms = (pl.col("finished_at") - pl.col("started_at")).dt.total_milliseconds()
    return (
        sp.group_by("user_id", "window")
        .agg((duration_ms.sum() / window_ms).alias("quality"))
        .sort("user_id", "window")
    )


def filter_users(
    tracking: pl.DataFrame,
    staypoints: pl.DataFrame,
    min_tracking_days: int = PreprocessConfig.min_tracking_days,
    min_mean_window_quality: float | None = PreprocessConfig.min_mean_window_quality,
    quality_window_weeks: int = PreprocessConfig.quality_window_weeks,
) -> pl.Series:
    """Users to keep: tracking spans more than `min_tracking_days` whole days (from `tracking_days`),
    and, if `min_mean_window_quality` is set, the mean of `window_quality` exceeds it."""
    keep = tracking.filter(pl.col("tracking_days") > min_tracking_days)["user_id"]
    if min_mean_window_quality is not None:
        quality = window_quality(staypoints.filter(pl.col("user_id").is_in(keep.implode())), quality_window_weeks)
        mean = quality.group_by("user_id").agg(pl.col("quality").mean())
        keep = mean.filter(pl.col("quality") > min_mean_window_quality)["user_id"].sort()
    return keep

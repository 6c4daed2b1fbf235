"""Locations by DBSCAN over all users' staypoints, and merging of consecutive staypoints."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from preprocessing.config import PreprocessConfig
from preprocessing.engine import serial_map
from preprocessing.queries import collect_in_memory
from preprocessing.staypoints import EARTH_RADIUS_M
from preprocessing.tiles import dbscan_by_tiles
from preprocessing.validation import require_columns


def generate_locations(
    staypoints: pl.DataFrame, epsilon_m: float = PreprocessConfig.location_epsilon_m,
    min_samples: int = PreprocessConfig.location_min_samples,
    axis_order: str = PreprocessConfig.location_axis_order,
    tile_deg: float = 0.0, map_tiles: Callable = serial_map,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Cluster staypoints of all users together (shared location ids) with DBSCAN, haversine metric.

    Returns (staypoints with location_id, null for noise, and is_core, whether the staypoint is a
    core sample of its cluster; locations: location_id, latitude, longitude as the mean of its
    staypoints, n_staypoints, n_users). Input order decides the
    labels, so pass staypoints sorted by (user_id, started_at) for reproducible ids.

    axis_order "lat_lon" is the haversine distance as written. "lon_lat" reproduces trackintel 1.x,
    which hands scikit-learn (x, y) = (lon, lat) although its haversine reads (lat, lon): around
    Beijing that shrinks north-south distances by |cos(lon)| = 0.44 and stretches east-west ones
    from cos(lat) = 0.77 to 1. The published GeoLife dataset was built that way.
    """
    require_columns(staypoints, "staypoints", {"user_id": None, "latitude": pl.Float64, "longitude": pl.Float64})
    if staypoints.height == 0:
        empty = pl.DataFrame(schema={"location_id": pl.Int64, "latitude": pl.Float64, "longitude": pl.Float64,
                                     "n_staypoints": pl.UInt32, "n_users": pl.UInt32})
        return staypoints.with_columns(pl.lit(None, pl.Int64).alias("location_id"), pl.lit(False).alias("is_core")), empty
    axes = ("latitude", "longitude") if axis_order == "lat_lon" else ("longitude", "latitude")
    coords = np.radians(staypoints.select(*axes).to_numpy())
    eps_rad = epsilon_m / EARTH_RADIUS_M
    # scikit-learn's DBSCAN labels, in memory that grows with the staypoints however densely they sit (tiles.py;
    # tile_deg 0 is one tile)
    labels, is_core = dbscan_by_tiles(coords, eps_rad, min_samples, tile_deg, map_tiles)
    sp = staypoints.with_columns(pl.Series("location_id", labels, dtype=pl.Int64).replace(-1, None),
                                 pl.Series("is_core", is_core))
    return sp, summarise_locations(sp)


def summarise_locations(labelled: pl.DataFrame, where: pl.Expr | None = None) -> pl.DataFrame:
    """One row per location_id of labelled staypoints (nulls, i.e. noise, left out; with `where`, only the rows
    it selects): latitude and longitude as the mean of its staypoints, n_staypoints, n_users; sorted by
    location_id. One query."""
    keep = pl.col("location_id").is_not_null()
    if where is not None:
        keep = keep & where
    return collect_in_memory(
        labelled.lazy().filter(keep)
        .group_by("location_id")
        .agg(pl.col("latitude").mean(), pl.col("longitude").mean(), pl.len().alias("n_staypoints"),
             pl.col("user_id").n_unique().cast(pl.UInt32).alias("n_users"))
        .sort("location_id"), labelled.height)


def merge_staypoints(staypoints: pl.DataFrame, max_gap_min: float = PreprocessConfig.merge_max_gap_min) -> pl.DataFrame:
    """Merge consecutive staypoints of a user at the same location when the next one starts at most
    `max_gap_min` minutes after the previous one finished (chains merge into one).

    Input: user_id, started_at, finished_at, location_id (no nulls). Output keeps those columns,
    sorted by (user_id, started_at), with n_merged (how many staypoints each row stands for).
    """
    require_columns(staypoints, "staypoints", {"user_id": None, "started_at": pl.Datetime, "finished_at": pl.Datetime,
                                        "location_id": None})
    sp = staypoints.lazy().sort("user_id", "started_at", maintain_order=True)
    gap = pl.col("started_at") - pl.col("finished_at").shift(1)
    joins_previous = (
        (pl.col("user_id") == pl.col("user_id").shift(1))
        & (pl.col("location_id") == pl.col("location_id").shift(1))
        & (gap <= pl.duration(milliseconds=int(round(max_gap_min * 60_000))))
    ).fill_null(False)
    return collect_in_memory(  # one query (a served request's few rows pay each query's fixed cost)
        sp.with_columns((~joins_previous).cum_sum().alias("_group"))
        .group_by("_group", maintain_order=True)
        .agg(pl.col("user_id").first(), pl.col("started_at").first(), pl.col("finished_at").last(),
             pl.col("location_id").first(), pl.len().cast(pl.UInt32).alias("n_merged"))
        .drop("_group"), staypoints.height)

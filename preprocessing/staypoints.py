"""Staypoints by the sliding method (trackintel's generate_staypoints(method="sliding")) and the activity flag."""

from __future__ import annotations

from datetime import timedelta

import numba
import numpy as np
import polars as pl

from preprocessing.config import PreprocessConfig
from preprocessing.validation import require_columns

EARTH_RADIUS_M = 6_371_000.0  # as trackintel's haversine_dist
MS_PER_MIN = 60_000


def haversine_m(lat1, lon1, lat2, lon2):
    """Great-circle distance in metres between points in degrees (numpy arrays or scalars)."""
    lat1, lon1, lat2, lon2 = map(np.radians, (lat1, lon1, lat2, lon2))
    a = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.minimum(a, 1.0)))


@numba.njit(cache=True, nogil=True)
def _grow(first, end, finished, k):
    """Double the output arrays when staypoint k would not fit."""
    if k < first.shape[0]:
        return first, end, finished
    return np.resize(first, 2 * k), np.resize(end, 2 * k), np.resize(finished, 2 * k)


@numba.njit(cache=True, nogil=True)
def _slide(user_starts, t_ms, lat_deg, lon_deg, dist_m, time_ms, gap_ms):
    """Walk each user's fixes in time order. Returns, per staypoint, the index of its first fix, the
    index after its last fix (fixes [first, end) give its position) and its finished_at in ms.

    Distances are compared as haversine terms: d >= dist_m  <=>  a >= sin^2(dist_m / 2R)."""
    rad = np.pi / 180.0
    a_min = np.sin(min(dist_m / (2.0 * EARTH_RADIUS_M), np.pi / 2)) ** 2
    n_users = user_starts.shape[0] - 1
    first = np.empty(1024, np.int64)
    end = np.empty(1024, np.int64)
    finished = np.empty(1024, np.int64)
    k = 0
    for u in range(n_users):
        lo, hi = user_starts[u], user_starts[u + 1]
        if hi <= lo:
            continue
        anchor = lo
        a_lat, a_lon, a_cos = lat_deg[lo] * rad, lon_deg[lo] * rad, np.cos(lat_deg[lo] * rad)
        for cur in range(lo + 1, hi):
            if t_ms[cur] < t_ms[cur - 1]:
                raise ValueError("positionfixes must be sorted by (user_id, tracked_at); found fixes going back in time")
            c_lat, c_lon = lat_deg[cur] * rad, lon_deg[cur] * rad
            if t_ms[cur] - t_ms[cur - 1] > gap_ms:
                anchor = cur  # a long gap: start over, emit nothing
                a_lat, a_lon, a_cos = c_lat, c_lon, np.cos(c_lat)
                continue
            a = np.sin((c_lat - a_lat) * 0.5) ** 2 + a_cos * np.cos(c_lat) * np.sin((c_lon - a_lon) * 0.5) ** 2
            if a >= a_min:
                if t_ms[cur] - t_ms[anchor] >= time_ms:
                    first, end, finished = _grow(first, end, finished, k)
                    first[k], end[k], finished[k] = anchor, cur, t_ms[cur]
                    k += 1
                anchor = cur
                a_lat, a_lon, a_cos = c_lat, c_lon, np.cos(c_lat)
        if t_ms[hi - 1] - t_ms[anchor] >= time_ms:  # the last stay of the user, fixes up to the last one
            first, end, finished = _grow(first, end, finished, k)
            first[k], end[k], finished[k] = anchor, hi, t_ms[hi - 1]
            k += 1
    return first[:k], end[:k], finished[:k]


@numba.njit(cache=True, nogil=True)
def _distinct_means(first, end, lat, lon):
    """Mean latitude and longitude of the distinct (lat, lon) pairs among fixes [first[k], end[k])."""
    n = first.shape[0]
    out_lat = np.empty(n, np.float64)
    out_lon = np.empty(n, np.float64)
    for k in range(n):
        a, b = first[k], end[k]
        seg_lat = lat[a:b]
        seg_lon = lon[a:b]
        order = np.argsort(seg_lat, kind="mergesort")
        sum_lat = 0.0
        sum_lon = 0.0
        count = 0
        i = 0
        m = b - a
        while i < m:  # a run of equal latitudes: count its distinct longitudes
            j = i
            while j < m and seg_lat[order[j]] == seg_lat[order[i]]:
                j += 1
            lons = np.sort(seg_lon[order[i:j]])
            for q in range(lons.shape[0]):
                if q == 0 or lons[q] != lons[q - 1]:
                    sum_lat += seg_lat[order[i]]
                    sum_lon += lons[q]
                    count += 1
            i = j
        out_lat[k] = sum_lat / count
        out_lon[k] = sum_lon / count
    return out_lat, out_lon


def _user_starts(users: pl.Series) -> np.ndarray:
    """Row offsets where each user's run begins, plus the total, for rows sorted by user."""
    change = (users != users.shift(1)).fill_null(True)
    return np.append(np.flatnonzero(change.to_numpy()), len(users)).astype(np.int64)


def generate_staypoints(
    positionfixes: pl.DataFrame,
    dist_threshold_m: float = PreprocessConfig.staypoint_dist_threshold_m,
    time_threshold_min: float = PreprocessConfig.staypoint_time_threshold_min,
    gap_threshold_min: float = PreprocessConfig.staypoint_gap_threshold_min,
) -> pl.DataFrame:
    """Staypoints by the sliding method, per user over fixes sorted by (user_id, tracked_at).

    Keep an anchor fix and walk forward. After a gap over `gap_threshold_min` the current fix becomes
    the anchor. At the first fix at least `dist_threshold_m` from the anchor: if it comes at least
    `time_threshold_min` after the anchor, fixes [anchor, this) form a staypoint (started_at = the
    anchor's time, finished_at = this fix's time, position = mean of the distinct coordinates); either
    way this fix becomes the anchor. At the end, fixes [anchor, last] form one if they span the time.

    Returns user_id, started_at, finished_at, latitude, longitude, n_fixes.
    """
    require_columns(positionfixes, "positionfixes", {"user_id": None, "tracked_at": pl.Datetime, "latitude": pl.Float64,
                                              "longitude": pl.Float64})
    pfs = positionfixes
    t_ms = pfs["tracked_at"].dt.epoch("ms").to_numpy()
    users = pfs["user_id"]
    starts = _user_starts(users)
    lat = pfs["latitude"].to_numpy()
    lon = pfs["longitude"].to_numpy()
    first, end, finished = _slide(
        starts, t_ms, lat, lon, float(dist_threshold_m),
        int(round(time_threshold_min * MS_PER_MIN)), int(round(gap_threshold_min * MS_PER_MIN)),
    )
    sp_lat, sp_lon = _distinct_means(first, end, lat, lon)
    return pl.DataFrame({
        "user_id": users.gather(first),
        "started_at": pfs["tracked_at"].gather(first),
        "finished_at": pl.Series(finished).cast(pl.Datetime("ms")).dt.replace_time_zone("UTC"),
        "latitude": sp_lat,
        "longitude": sp_lon,
        "n_fixes": (end - first).astype(np.int32),
    })


def flag_activity(staypoints: pl.DataFrame,
                  time_threshold_min: float = PreprocessConfig.activity_time_threshold_min) -> pl.DataFrame:
    """Add is_activity: the staypoint lasted at least `time_threshold_min` minutes."""
    require_columns(staypoints, "staypoints", {"started_at": pl.Datetime, "finished_at": pl.Datetime})
    duration = staypoints["finished_at"] - staypoints["started_at"]  # Series arithmetic: no query
    long_enough = (duration >= timedelta(milliseconds=int(time_threshold_min * MS_PER_MIN))).alias("is_activity")
    if "is_activity" in staypoints.columns:  # replaced where it stands
        return staypoints.with_columns(long_enough)
    return staypoints.hstack([long_enough])

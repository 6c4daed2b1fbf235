"""Every threshold rule of the preprocessing, at its threshold and just past it, with the outcome the rule's text
states (preprocessing/config.py's comments and the functions' docstrings). Each pair tells `>=` from `>` (or `<=`
from `<`): swapping the comparison in the code fails one of the two."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest

from preprocessing.locations import merge_staypoints
from preprocessing.quality import filter_users, tracking_days, window_quality
from preprocessing.staypoints import EARTH_RADIUS_M, flag_activity, generate_staypoints

T0 = datetime(2008, 10, 23, tzinfo=timezone.utc)
MS = timedelta(milliseconds=1)
LON = 116.3  # every fix on one meridian: the haversine term is then sin^2(dlat / 2) exactly


def fixes(rows: list[tuple[timedelta, float]]) -> pl.DataFrame:
    """(time after T0, latitude in degrees) of one user, on the meridian LON."""
    return pl.DataFrame({"user_id": [1] * len(rows), "tracked_at": [T0 + t for t, _ in rows],
                         "latitude": [float(lat) for _, lat in rows], "longitude": [LON] * len(rows)}
                        ).with_columns(pl.col("tracked_at").dt.cast_time_unit("ms"))


def latitude_at_exactly(dist_m: float = 200.0) -> tuple[float, float]:
    """(latitude x, distance d near dist_m) such that the fix at (x, LON) lies exactly d from (0, LON) in the
    staypoint code's own arithmetic: (x * rad - 0) / 2 == d / (2R), bit for bit, so both sides of `>=` are the
    same float."""
    rad, x = np.pi / 180.0, dist_m / EARTH_RADIUS_M / (np.pi / 180.0)
    for _ in range(1000):
        half = (x * rad - 0.0 * rad) * 0.5
        d = half * (2.0 * EARTH_RADIUS_M)
        if d / (2.0 * EARTH_RADIUS_M) == half:
            return x, d
        x = np.nextafter(x, np.inf)
    raise AssertionError("no latitude whose distance round-trips exactly")


def test_a_fix_exactly_the_distance_threshold_away_ends_the_stay():
    """'A fix this far from the anchor ends the stay' (at least dist_threshold_m). At exactly d: the stay 0-31 min
    ends at the fix of minute 31. With a threshold a hair above d, nothing ends it: one stay 0-32 min."""
    x, d = latitude_at_exactly()
    rows = fixes([(timedelta(0), 0.0), (timedelta(minutes=31), x), (timedelta(minutes=32), 0.0)])
    at = generate_staypoints(rows, dist_threshold_m=d)
    assert at["finished_at"].to_list() == [T0 + timedelta(minutes=31)]
    past = generate_staypoints(rows, dist_threshold_m=float(np.nextafter(d, np.inf)) * (1 + 1e-12))
    assert past["finished_at"].to_list() == [T0 + timedelta(minutes=32)]


@pytest.mark.parametrize("last", [False, True], ids=["ended-by-a-far-fix", "the-user's-last-stay"])
def test_a_stay_of_exactly_the_time_threshold_is_a_staypoint(last):
    """'A stay must last at least staypoint_time_threshold_min' (30 min): exactly 30 min is one, 1 ms less is not,
    both for a stay ended by a far fix and for the user's last stay."""
    far = 0.01  # about 1.1 km north
    for duration, expected in ((timedelta(minutes=30), 1), (timedelta(minutes=30) - MS, 0)):
        rows = [(timedelta(0), 0.0), (duration, 0.0)] if last else [(timedelta(0), 0.0), (duration, far)]
        assert generate_staypoints(fixes(rows)).height == expected, duration


def test_a_gap_of_exactly_the_gap_threshold_does_not_reset_the_anchor():
    """'A gap longer than staypoint_gap_threshold_min between fixes resets the anchor' (1440 min): a gap of
    exactly 1440 min keeps the stay (one staypoint up to the far fix); 1 ms more resets it (none)."""
    gap = timedelta(minutes=1440)
    for length, expected in ((gap, 1), (gap + MS, 0)):
        rows = [(timedelta(0), 0.0), (length, 0.0), (length + timedelta(minutes=1), 0.01)]
        assert generate_staypoints(fixes(rows)).height == expected, length


def test_staypoints_exactly_the_merge_gap_apart_merge():
    """'Merge when the next starts at most merge_max_gap_min after the previous finished' (1 min): exactly 1 min
    apart they are one row; 1 ms more, two."""
    for gap, rows in ((timedelta(minutes=1), 1), (timedelta(minutes=1) + MS, 2)):
        end = T0 + timedelta(hours=1)
        sp = pl.DataFrame({"user_id": [1, 1], "started_at": [T0, end + gap], "finished_at": [end, end + gap + timedelta(hours=1)],
                           "location_id": [4, 4]})
        merged = merge_staypoints(sp, max_gap_min=1.0)
        assert merged.height == rows, gap
        assert merged["n_merged"].sum() == 2  # counts reconcile either way


def test_a_staypoint_of_exactly_the_activity_threshold_is_an_activity():
    """'Staypoints at least activity_time_threshold_min long are activities' (25 min)."""
    sp = pl.DataFrame({"started_at": [T0, T0], "finished_at": [T0 + timedelta(minutes=25), T0 + timedelta(minutes=25) - MS]})
    assert flag_activity(sp, time_threshold_min=25)["is_activity"].to_list() == [True, False]


def test_tracking_exactly_the_minimum_days_is_not_enough():
    """'Keep users whose tracking spans MORE than min_tracking_days whole days' (50): a span of exactly 51 days is
    kept; 51 days less 1 ms is 50 whole days, dropped."""
    pfs = pl.DataFrame({"user_id": [1, 1, 2, 2], "tracked_at": [T0, T0 + timedelta(days=51), T0, T0 + timedelta(days=51) - MS]})
    days = tracking_days(pfs, "tracked_at", "tracked_at")
    assert days.rows() == [(1, 51), (2, 50)]
    assert filter_users(days, pfs, min_tracking_days=50).to_list() == [1]


def test_the_quality_window_holds_stays_wholly_inside_and_its_mean_must_exceed_the_minimum():
    """A window covers the stays lying wholly inside it (finished before its end), and a user is kept when the
    mean coverage EXCEEDS min_mean_window_quality. One-week windows over a user tracked 3 weeks: an 84 h stay
    in week 0 covers half of it (0.5). A stay that finishes exactly at week 0's end is not wholly inside it."""
    sp = pl.DataFrame({"user_id": [1, 1, 1], "started_at": [T0, T0 + timedelta(days=8), T0 + timedelta(days=21)],
                       "finished_at": [T0 + timedelta(hours=84), T0 + timedelta(days=8, hours=84),
                                       T0 + timedelta(days=21, hours=1)]})
    quality = window_quality(sp, window_weeks=1)
    assert quality.select("window", "quality").rows() == [(0, 0.5), (1, 0.5)]  # mean exactly 0.5
    days = tracking_days(sp, "started_at", "finished_at")
    assert filter_users(days, sp, min_tracking_days=10, min_mean_window_quality=0.5, quality_window_weeks=1).to_list() == []
    kept = filter_users(days, sp, min_tracking_days=10, min_mean_window_quality=0.5 - 1e-9, quality_window_weeks=1)
    assert kept.to_list() == [1]
    # the window's end: a stay of day 6 up to exactly 7 days after day 0 lies outside window 0; 1 ms shorter, inside
    for finished, hours in ((T0 + timedelta(days=7), 1), (T0 + timedelta(days=7) - MS, 1 + 24 - 1 / 3_600_000)):
        edge = pl.DataFrame({"user_id": [1, 1, 1], "started_at": [T0, T0 + timedelta(days=6), T0 + timedelta(days=21)],
                             "finished_at": [T0 + timedelta(hours=1), finished, T0 + timedelta(days=21, hours=1)]})
        week0 = window_quality(edge, window_weeks=1).filter(pl.col("window") == 0)["quality"].to_list()
        assert week0 == [pytest.approx(hours / 168, rel=1e-12)], finished


def test_the_plausible_time_window_includes_its_ends():
    """Times outside [earliest, latest] are quarantined: both ends are inside, 1 ms beyond either is not."""
    from preprocessing.readers import read_positionfixes
    from preprocessing.rows import TimeWindow

    earliest, latest = datetime(2008, 1, 1, tzinfo=timezone.utc), datetime(2009, 1, 1, tzinfo=timezone.utc)
    times = [earliest - MS, earliest, latest, latest + MS]
    fixes = pl.DataFrame({"user_id": [1, 2, 3, 4], "tracked_at": times, "latitude": [39.9] * 4, "longitude": [LON] * 4})
    read = read_positionfixes(fixes, TimeWindow(earliest, latest))
    assert read.table["user_id"].to_list() == [2, 3]
    assert read.quarantine["source_row"].to_list() == [0, 3]
    assert set(read.quarantine["reason"]) == {"tracked_at outside the plausible window 2008-01-01 00:00 to 2009-01-01 00:00 UTC"}

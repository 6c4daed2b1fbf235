"""Sliding staypoints on hand-built fixes, and against a plain-Python transcription of the reference protocol."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest

from preprocessing.staypoints import flag_activity, generate_staypoints, haversine_m

T0 = datetime(2008, 10, 23, tzinfo=timezone.utc)
HOME = (39.9800, 116.3000)
NORTH_250M = (39.9800 + 250 / 111_195, 116.3000)  # 250 m north (haversine, R = 6371 km)


def fixes(rows: list[tuple[int, float, tuple[float, float]]]) -> pl.DataFrame:
    """(user, minutes after T0, (lat, lon)) -> positionfixes."""
    return pl.DataFrame({
        "user_id": [r[0] for r in rows],
        "tracked_at": [T0 + timedelta(minutes=r[1]) for r in rows],
        "latitude": [r[2][0] for r in rows],
        "longitude": [r[2][1] for r in rows],
    }).with_columns(pl.col("tracked_at").dt.cast_time_unit("ms"))


def test_a_stay_ends_at_the_first_far_fix():
    # 40 minutes at home (two distinct coordinates), then 250 m away: one staypoint 00:00 -> 00:45
    near = (HOME[0] + 0.00001, HOME[1])
    sp = generate_staypoints(fixes([(1, 0, HOME), (1, 10, HOME), (1, 20, near), (1, 40, HOME), (1, 45, NORTH_250M)]))
    assert sp.height == 1
    row = sp.row(0, named=True)
    assert row["started_at"] == T0 and row["finished_at"] == T0 + timedelta(minutes=45)
    assert row["latitude"] == pytest.approx((HOME[0] + near[0]) / 2)  # mean of the DISTINCT coordinates
    assert row["n_fixes"] == 4


def test_short_stays_and_gaps_emit_nothing():
    # 20 minutes is too short; a 25 h gap resets the anchor, so the stay around it is not joined
    rows = [(1, 0, HOME), (1, 20, NORTH_250M), (1, 21, NORTH_250M), (1, 21 + 25 * 60, NORTH_250M),
            (1, 21 + 25 * 60 + 10, HOME)]
    assert generate_staypoints(fixes(rows)).height == 0


def test_the_last_stay_is_kept_if_long_enough_and_users_are_separate():
    rows = [(1, 0, HOME), (1, 30, HOME),  # user 1: a 30 min stay at the end -> kept
            (2, 0, HOME), (2, 29, HOME)]  # user 2: 29 min -> not
    sp = generate_staypoints(fixes(rows))
    assert sp["user_id"].to_list() == [1]
    assert sp["finished_at"].to_list() == [T0 + timedelta(minutes=30)]


def test_unsorted_input_is_refused():
    with pytest.raises(ValueError, match="sorted by"):
        generate_staypoints(fixes([(1, 10, HOME), (1, 0, HOME)]))


def test_activity_flag():
    sp = pl.DataFrame({"started_at": [T0, T0],
                       "finished_at": [T0 + timedelta(minutes=24, seconds=59), T0 + timedelta(minutes=25)]})
    assert flag_activity(sp)["is_activity"].to_list() == [False, True]


def _reference_sliding(t, lat, lon, dist_m=200.0, time_min=30.0, gap_min=1440.0):
    """The reference protocol, transcribed literally in plain Python for one user."""
    out, anchor = [], 0
    for cur in range(1, len(t)):
        if t[cur] - t[cur - 1] > gap_min * 60_000:
            anchor = cur
            continue
        if haversine_m(lat[anchor], lon[anchor], lat[cur], lon[cur]) >= dist_m:
            if t[cur] - t[anchor] >= time_min * 60_000:
                pts = sorted(set(zip(lat[anchor:cur], lon[anchor:cur])))
                out.append((t[anchor], t[cur], np.mean([p[0] for p in pts]), np.mean([p[1] for p in pts])))
            anchor = cur
    if len(t) and t[-1] - t[anchor] >= time_min * 60_000:
        pts = sorted(set(zip(lat[anchor:], lon[anchor:])))
        out.append((t[anchor], t[-1], np.mean([p[0] for p in pts]), np.mean([p[1] for p in pts])))
    return out


def test_matches_a_literal_transcription_on_random_walks():
    rng = np.random.default_rng(7)
    frames, expected = [], []
    for user in range(4):
        n = 3000
        t = np.cumsum(rng.choice([5_000, 60_000, 600_000, 30 * 3_600_000], size=n, p=[0.5, 0.3, 0.19, 0.01]))
        moving = rng.uniform(size=n) < 0.08
        step = np.where(moving[:, None], rng.normal(0, 0.003, (n, 2)), rng.normal(0, 0.00002, (n, 2)))
        pos = np.round(np.array([39.9, 116.3]) + np.cumsum(step, axis=0), 5)  # rounding makes repeated coordinates
        frames.append(pl.DataFrame({"user_id": user, "tracked_at": t, "latitude": pos[:, 0], "longitude": pos[:, 1]}))
        expected += [(user, *row) for row in _reference_sliding(t, pos[:, 0], pos[:, 1])]
    pfs = pl.concat(frames).with_columns(pl.col("tracked_at").cast(pl.Datetime("ms")).dt.replace_time_zone("UTC"))
    sp = generate_staypoints(pfs)
    assert sp.height == len(expected) > 50
    got = sp.select("user_id", pl.col("started_at").dt.epoch("ms"), pl.col("finished_at").dt.epoch("ms"), "latitude", "longitude")
    for g, e in zip(got.iter_rows(), expected):
        assert g[:3] == e[:3]
        assert g[3] == pytest.approx(e[3], abs=1e-9) and g[4] == pytest.approx(e[4], abs=1e-9)

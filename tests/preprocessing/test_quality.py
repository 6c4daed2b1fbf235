from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from preprocessing.quality import filter_users, tracking_days, window_quality

T0 = datetime(2008, 1, 1, tzinfo=timezone.utc)


def test_tracking_days_are_whole_days_and_the_filter_is_strict():
    pfs = pl.DataFrame({
        "user_id": [1, 1, 2, 2, 3, 3],
        "tracked_at": [T0, T0 + timedelta(days=50, hours=23), T0, T0 + timedelta(days=51), T0, T0 + timedelta(days=80)],
    })
    days = tracking_days(pfs, "tracked_at", "tracked_at")
    assert days.rows() == [(1, 50), (2, 51), (3, 80)]
    assert filter_users(days, pfs, min_tracking_days=50).to_list() == [2, 3]


def test_window_quality_share_of_covered_time():
    # user 1 tracked 3 weeks; windows of 1 week: week 0 holds a 7 h stay + a 14 h stay -> 21 h / 168 h
    sp = pl.DataFrame({
        "user_id": [1, 1, 1, 1],
        "started_at": [T0, T0 + timedelta(days=2), T0 + timedelta(days=8), T0 + timedelta(days=21)],
        "finished_at": [T0 + timedelta(hours=7), T0 + timedelta(days=2, hours=14), T0 + timedelta(days=8, hours=84),
                        T0 + timedelta(days=21, hours=1)],
    })
    q = window_quality(sp, window_weeks=1)
    # weeks = 22 days // 7 = 3 -> windows 0..2; week 1 holds the 84 h stay; week 2 none (left out)
    assert q.select("window", "quality").rows() == [(0, pytest.approx(21 / 168)), (1, pytest.approx(84 / 168))]
    days = tracking_days(sp, "started_at", "finished_at")
    assert filter_users(days, sp, min_tracking_days=10, min_mean_window_quality=0.3, quality_window_weeks=1).to_list() == [1]
    assert filter_users(days, sp, min_tracking_days=10, min_mean_window_quality=0.35, quality_window_weeks=1).to_list() == []

"""Features, the day split and samples on a hand-built staypoint history with the expected output stated."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from preprocessing.sequences import (
    Vocabularies,
    add_time_features,
    encode,
    find_samples,
    generate_samples,
    sample_table,
    split_by_day,
)

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)  # a Monday


def staypoints(rows):
    """(user, day, start 'HH:MM', minutes, location)"""
    out = []
    for user, day, hhmm, minutes, loc in rows:
        h, m = map(int, hhmm.split(":"))
        start = T0 + timedelta(days=day, hours=h, minutes=m)
        out.append((user, start, start + timedelta(minutes=minutes), loc))
    return pl.DataFrame(out, schema=["user_id", "started_at", "finished_at", "location_id"], orient="row").with_columns(
        pl.col("started_at", "finished_at").dt.cast_time_unit("ms"))


def test_time_features():
    sp = staypoints([(1, 0, "08:07", 95, 10), (1, 2, "23:30", 3000, 10), (1, 3, "00:00", 29, 10)])
    f = add_time_features(sp)
    assert f.select("start_day", "time_slot", "weekday", "duration_min", "duration_bucket").rows() == [
        (0, 32, 0, 95, 3),      # 08:07 -> slot 32; Monday; 95 min -> bucket 3
        (2, 94, 2, 3000, 95),   # 23:30 -> slot 94; 3,000 min capped at 2,879 -> bucket 95
        (3, 0, 3, 29, 0),
    ]
    shanghai = add_time_features(sp, timezone="Asia/Shanghai")  # UTC+8: 23:30 is 07:30 the next day
    assert shanghai.select("start_day", "time_slot", "weekday").rows() == [(0, 64, 0), (3, 30, 3), (3, 32, 3)]


def test_split_by_day():
    sp = add_time_features(staypoints([(1, d, "08:00", 60, 1) for d in range(30)]))
    split = split_by_day(sp)["split"].to_list()
    # last day 29: train day < 17.4, validation < 23.2
    assert split == ["train"] * 18 + ["validation"] * 6 + ["test"] * 6
    sp = add_time_features(staypoints([(1, d, "08:00", 60, 1) for d in range(6)]))
    # last day 5: 5 * 0.8 = 4.0 exactly, so day 4 is test (0.6 + 0.2 must not be 0.8000000000000002)
    assert split_by_day(sp)["split"].to_list() == ["train"] * 3 + ["validation"] + ["test"] * 2


def test_samples_history_vocabulary_and_user_filter():
    rows = []
    for d in range(30):  # user 7: one visit a day, location 10 on even days and 20 on odd days
        rows.append((7, d, "08:00", 60, 10 if d % 2 == 0 else 20))
    rows[29] = (7, 29, "08:00", 60, 30)  # the last test visit goes somewhere never seen in train
    rows.append((7, 26, "12:00", 60, 20))  # a second visit on day 26
    rows += [(9, d, "09:00", 60, 10) for d in range(0, 30, 3)]  # user 9: too sparse for samples in all splits
    f = split_by_day(add_time_features(staypoints(rows)))
    samples, kept, vocab = generate_samples(f, history_days=2, min_history=2)
    # train days 0..17 -> targets on days 2..17 (history: the two previous days); validation 18..23 -> 20..23;
    # test 24..29 -> 26..29 plus the second visit of day 26
    assert {k: v.height for k, v in samples.items()} == {"train": 16, "validation": 4, "test": 5}
    assert kept["user_id"].unique().to_list() == [7]  # user 9 has no validation samples: dropped
    assert vocab.locations.rows() == [(2, 10), (3, 20)] and vocab.location_size == 4
    assert vocab.users.rows() == [(1, 7)] and vocab.user_size == 2
    test = samples["test"].sort("target_started_at")
    first = test.row(0, named=True)  # 08:00 on day 26: history = days 24 (loc 10) and 25 (loc 20)
    assert (first["locations"], first["recency"], first["target"], first["user"]) == ([2, 3], [2, 1], 2, 1)
    second = test.row(1, named=True)  # 12:00 on day 26: its history includes that morning's visit
    assert (second["locations"], second["recency"], second["target"]) == ([2, 3, 2], [2, 1, 0], 3)
    last = test.row(4, named=True)  # day 29, location 30 unseen in train -> 1; history days 27 (20) and 28 (10)
    assert (last["locations"], last["recency"], last["target"]) == ([3, 2], [2, 1], 1)
    assert last["time_slots"] == [32, 32] and last["weekdays"] == [6, 0] and last["durations"] == [2, 2]


def test_samples_anchored_at_the_last_visit_count_recency_from_its_day():
    """One rule for every sample: recency counts back from the anchor's day. At the target's day (the protocol) a
    history of days 24 and 25 before a day-27 target reads [3, 2]; at the last visit's day it reads [1, 0]. Nothing
    else changes."""
    rows = [(7, d, "08:00", 60, 10 if d % 2 == 0 else 20) for d in (22, 24, 25, 27)]
    f = split_by_day(add_time_features(staypoints(rows))).with_columns(pl.lit("test").alias("split"))
    marked = find_samples(f, history_days=3, min_history=2)
    vocab_rows = pl.DataFrame({"location": [2, 3], "source_location_id": [10, 20]}, schema_overrides={"location": pl.Int32})
    users = pl.DataFrame({"user": [1], "source_user_id": [7]}, schema_overrides={"user": pl.Int32})
    kept = encode(marked, Vocabularies(vocab_rows, users))
    protocol, live = sample_table(kept, "test"), sample_table(kept, "test", anchor="last_visit")
    # targets: day 25 (history days 22 and 24) and day 27 (history days 24 and 25)
    assert protocol["recency"].to_list() == [[3, 1], [3, 2]]  # days before the target
    assert live["recency"].to_list() == [[2, 0], [1, 0]]  # days before the last history visit
    assert protocol.drop("recency").equals(live.drop("recency"))
    with pytest.raises(ValueError, match="anchor must be one of target_day, last_visit, got 'tomorrow'"):
        sample_table(kept, "test", anchor="tomorrow")

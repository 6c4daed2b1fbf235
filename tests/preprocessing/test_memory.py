"""The long-term memory on hand-built histories whose remembered places are stated, its moment-of-prediction rule at
the boundary, and the same memory for a split's sample and a live prediction of the same person and moment."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from preprocessing.config import PreprocessConfig, SynthConfig
from preprocessing.fitted import FittedPreprocessing, generate_applied_samples, remembered_visits
from preprocessing.memory import MEMORY_COLUMNS, generate_memory
from preprocessing.pipeline import preprocess
from preprocessing.sequences import add_time_features, generate_samples, split_by_day
from preprocessing.synthetic import write_positionfixes

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)  # a Monday


def visits(rows) -> pl.DataFrame:
    """(user, day, start 'HH:MM', minutes, place) -> visits with the columns generate_memory reads (UTC slots of
    15 minutes; the vocabulary id is the place id + 100)."""
    out = []
    for user, day, hhmm, minutes, place in rows:
        h, m = map(int, hhmm.split(":"))
        start = T0 + timedelta(days=day, hours=h, minutes=m)
        out.append((user, start, start + timedelta(minutes=minutes), place, place + 100, (h * 60 + m) // 15,
                    start.weekday()))
    return pl.DataFrame(out, schema=["user_id", "started_at", "finished_at", "location_id", "location", "time_slot",
                                     "weekday"], orient="row")


def query(user, window_start: datetime, moment: datetime, anchor: date, window_places, target=None) -> dict:
    row = {"user_id": user, "window_start": window_start, "moment": moment, "anchor_date": anchor,
           "window_places": window_places}
    return row | ({"target_place": target} if target is not None else {})


def memory_of(visit_rows, queries, places=8) -> pl.DataFrame:
    return pl.DataFrame(generate_memory(visits(visit_rows), pl.DataFrame(queries), places, "UTC", 15))


def test_a_hand_built_history_remembers_its_earlier_places_with_stated_features():
    history = [
        (1, 0, "09:00", 480, 7),   # Mon: work, three times, mostly at 09:00 on weekdays
        (1, 1, "09:30", 480, 7),
        (1, 2, "14:00", 120, 7),
        (1, 5, "18:00", 60, 8),    # Sat 18:00: a restaurant, twice, the last on day 12
        (1, 12, "18:15", 60, 8),
        (1, 3, "20:00", 60, 9),    # Thu: once
        (1, 20, "08:00", 60, 7),   # day 20 onwards: the window
        (1, 21, "08:00", 60, 5),
        (2, 1, "10:00", 60, 7),    # another person's visits are never remembered
    ]
    window_start = T0 + timedelta(days=20, hours=8)
    moment = T0 + timedelta(days=21, hours=9)
    got = memory_of(history, [query(1, window_start, moment, date(2024, 1, 23), [7, 5])])
    # place 7 is in the window: not remembered; 8 (2 visits) before 9 (1 visit); days from 23 Jan back to the last
    assert got.row(0, named=True) == {
        "memory_locations": [108, 109], "memory_places": [8, 9], "memory_visits": [2, 1],
        "memory_days": [22 - 12, 22 - 3],  # anchor 2024-01-23 is day 22
        "memory_time_slots": [18 * 4, 20 * 4],  # the peak hour's first slot
        "memory_weekdays": [5, 3],  # Saturday (both visits), Thursday
        "memory_after_current": [0, 0],  # the person is at 5 now, which no remembered visit followed
    }
    at_work = memory_of(history, [query(1, window_start, moment, date(2024, 1, 23), [5, 7])]).row(0, named=True)
    # at 7 now: the Thursday visit to 9 came right after work (day 2), the restaurant's after 9 and after itself
    assert at_work["memory_places"] == [8, 9] and at_work["memory_after_current"] == [0, 1]
    without_window = memory_of(history, [query(1, window_start, moment, date(2024, 1, 23), [5])]).row(0, named=True)
    assert without_window["memory_places"] == [7, 8, 9]  # work: 3 visits, peak hour 09:00 (two of three), Monday
    assert without_window["memory_visits"][0] == 3 and without_window["memory_time_slots"][0] == 36
    assert without_window["memory_weekdays"][0] == 0  # Mon, Tue, Wed once each: the first peak


def test_the_cap_keeps_the_most_visited_then_the_most_recent_place():
    history = [(1, d, "08:00", 30, p) for d, p in [(0, 1), (1, 2), (2, 2), (3, 3), (4, 4), (5, 3)]]
    late = T0 + timedelta(days=30)
    got = memory_of(history, [query(1, late, late, date(2024, 2, 1), [])], places=3).row(0, named=True)
    assert got["memory_places"] == [3, 2, 4]  # 3 and 2 twice (3 more recently), then 4 (day 4) before 1 (day 0)


def test_a_visit_ending_exactly_at_the_moment_is_not_remembered():
    history = [(1, 0, "08:00", 60, 1), (1, 1, "08:00", 60, 2)]
    ends = T0 + timedelta(days=1, hours=9)  # place 2's visit ends here
    window_start = T0 + timedelta(days=10)
    at_the_end = memory_of(history, [query(1, window_start, ends, date(2024, 1, 11), [])]).row(0, named=True)
    assert at_the_end["memory_places"] == [1]
    a_moment_later = memory_of(history, [query(1, window_start, ends + timedelta(microseconds=1), date(2024, 1, 11),
                                               [])]).row(0, named=True)
    assert a_moment_later["memory_places"] == [1, 2] or a_moment_later["memory_places"] == [2, 1]
    # nor is a visit that starts at the window's start (it belongs to the window's time)
    started = memory_of(history, [query(1, T0 + timedelta(days=1, hours=8), window_start, date(2024, 1, 11), [])])
    assert started.row(0, named=True)["memory_places"] == [1]


def test_queries_in_any_order_get_the_memory_each_would_get_alone():
    history = [(1, d, "08:00", 60, d % 4) for d in range(20)]
    rows = [query(1, T0 + timedelta(days=d), T0 + timedelta(days=d), date(2024, 1, 1) + timedelta(days=d), [],
                  target=d % 4) for d in (15, 3, 9)]
    together = memory_of(history, rows)
    alone = pl.concat([memory_of(history, [row]) for row in rows])
    assert together.drop("target_kind").rows() == alone.drop("target_kind").rows()
    assert together["memory_visits"].to_list()[1] == [1, 1, 1]  # before day 3: days 0, 1, 2
    assert together["target_kind"].cast(pl.String).to_list() == ["return", "new", "return"]


def test_a_person_without_earlier_visits_remembers_nothing():
    got = memory_of([(1, 0, "08:00", 60, 1)], [query(9, T0 + timedelta(days=5), T0 + timedelta(days=5),
                                                    date(2024, 1, 6), [])])
    assert got.row(0, named=True)["memory_places"] == []


def test_split_samples_remember_nothing_from_the_moment_on(tmp_path: Path):
    """Every remembered place of every sample was visited, and that visit ended, before the sample's history began;
    none is a place of the history."""
    rows = []
    for d in range(60):  # one person: home every day, a café on Sundays, a gym on Wednesdays before day 30
        rows.append((1, d, "07:00", 60, 1))
        rows.append((1, d, "12:00", 60, 2 if d % 7 == 6 else 3 if d % 7 == 2 and d < 30 else 4))
    sp = [(u, T0 + timedelta(days=d, hours=int(t[:2])), T0 + timedelta(days=d, hours=int(t[:2]), minutes=m), p)
          for u, d, t, m, p in rows]
    frame = pl.DataFrame(sp, schema=["user_id", "started_at", "finished_at", "location_id"], orient="row")
    featured = split_by_day(add_time_features(frame))
    from preprocessing.memory import MemoryRule

    samples, kept, _ = generate_samples(featured, 7, 3, MemoryRule(8))
    staypoints = kept.select("started_at", "finished_at", "location_id")
    for split, table in samples.items():
        assert set(MEMORY_COLUMNS) <= set(table.columns)
        for sample in table.iter_rows(named=True):
            window_start = sample["target_started_at"] - timedelta(days=8)
            for place in sample["memory_places"]:
                assert place not in sample["places"]
                ends = staypoints.filter(pl.col("location_id") == place)["finished_at"]
                assert ends.min() < window_start
    test = samples["test"]  # the gym (place 3) was last visited on day 23: a test sample on day 55 remembers it
    late = test.filter(pl.col("target_started_at") >= T0 + timedelta(days=55)).row(0, named=True)
    assert 3 in late["memory_places"]
    gym = late["memory_places"].index(3)
    assert late["memory_visits"][gym] == 4 and late["memory_weekdays"][gym] == 2  # days 2, 9, 16, 23: Wednesdays


@pytest.fixture(scope="module")
def synthetic_output(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("memory")
    points = folder / "points.parquet"
    write_positionfixes(SynthConfig(users=6, days=70, seed=3), points, progress=False)
    preprocess(points, "positionfixes", folder / "out", PreprocessConfig(min_tracking_days=20), progress=False)
    return folder / "out"


def test_a_live_prediction_remembers_what_the_split_remembers_for_the_same_person_and_moment(synthetic_output: Path):
    fitted = FittedPreprocessing.from_folder(synthetic_output)
    assert fitted.visits is not None
    test = pl.read_parquet(synthetic_output / "test.parquet")
    staypoints = pl.read_parquet(synthetic_output / "staypoints.parquet")
    checked = 0
    for sample in test.filter(pl.col("memory_places").list.len() > 0).head(5).iter_rows(named=True):
        person = staypoints.filter(pl.col("user_id") == sample["source_user_id"]).sort("started_at")
        target = sample["target_started_at"]
        # the request: the person's visits of the sample's history, and the prediction made when the target began
        window = person.filter((pl.col("started_at") < target)).tail(len(sample["places"]))
        assert window["location_id"].to_list() == sample["places"]
        request = window.drop("split", "is_target", strict=False)
        _, latest = generate_applied_samples(request, fitted.config, evaluation=False, at=target,
                                             memory_visits=remembered_visits(request, fitted.visits))
        live = latest.row(0, named=True)
        assert live["places"] == sample["places"]
        for column in MEMORY_COLUMNS:
            assert live[column] == sample[column], column
        checked += 1
    assert checked == 5


def test_a_person_the_fitted_data_never_saw_remembers_only_the_request(synthetic_output: Path):
    fitted = FittedPreprocessing.from_folder(synthetic_output)
    person = pl.read_parquet(synthetic_output / "staypoints.parquet").sort("started_at")
    first = person["user_id"][0]
    request = person.filter(pl.col("user_id") == first).drop("split", "is_target", strict=False).with_columns(
        pl.lit(0, pl.Int32).alias("user"), pl.lit(999, person.schema["user_id"]).alias("user_id"))  # a stranger
    remembered = remembered_visits(request, fitted.visits)
    assert remembered.height == request.height
    known = person.filter(pl.col("user_id") == first).drop("split", "is_target", strict=False)
    tail = known.filter(pl.col("started_at") >= known["started_at"][known.height // 2])
    assert remembered_visits(tail, fitted.visits).height == known.height  # the fitted visits before it, then its own

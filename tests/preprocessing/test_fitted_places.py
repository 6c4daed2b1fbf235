"""New staypoints joined to a fitted run's places (preprocessing.fitted_places): DBSCAN's rules on hand-placed
points, the join by cells equal to the join by pairs, a request's short path equal to the long one, memory."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from preprocessing.config import PreprocessConfig
from preprocessing.fitted import FittedPreprocessing
from preprocessing.fitted_places import join_fitted_places

M_PER_DEG = 111_195.0  # metres per degree of latitude (haversine, mean earth radius)
A, C = (39.9, 116.3), (39.95, 116.3)


def north(point: tuple[float, float], metres: float) -> tuple[float, float]:
    return point[0] + metres / M_PER_DEG, point[1]


def hand_fitted() -> FittedPreprocessing:
    """Place 0 (vocabulary id 2) with core staypoints at A and 5 m north of it; a noise staypoint at C."""
    clustered = pl.DataFrame({"location_id": [0, 0, None], "latitude": [A[0], north(A, 5)[0], C[0]],
                              "longitude": [A[1], A[1], C[1]], "is_core": [True, True, False]},
                             schema_overrides={"location_id": pl.Int64})
    places = pl.DataFrame({"location_id": [0], "latitude": [A[0]], "longitude": [A[1]], "location": [2]})
    users = pl.DataFrame({"user": [1], "source_user_id": ["u1"]})
    manifest = {"config": PreprocessConfig().to_dict(), "vocab": {"locations": 3, "users": 2}}
    return FittedPreprocessing.from_tables(manifest, places, clustered, users, "hand-built")


def test_new_staypoints_join_fitted_places_by_dbscan_rules():
    """p0 is 10 m from A's cores: place 0. p1 is 23 m from the nearest core but 18 m from p0: chained to place 0.
    p2 and p3 are 5 m apart, 500 m away: a new place, numbered first after the fitted ids (1). p4 is 10 m from the
    fitted noise staypoint C: together a place the fitted run did not have (2). p5 is alone: noise."""
    points = [north(A, 10), north(A, 28), north(A, 500), north(A, 505), north(C, 10), north(A, 3000)]
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    activities = pl.DataFrame({"user_id": ["u1"] * 6, "started_at": [t0 + timedelta(hours=h) for h in range(6)],
                               "latitude": [p[0] for p in points], "longitude": [p[1] for p in points]})
    labelled, new_places = join_fitted_places(activities, hand_fitted())
    assert labelled["location_id"].to_list() == [0, 0, 1, 1, 2, None]
    assert labelled["is_new_place"].to_list() == [False, False, True, True, True, True]
    assert new_places["location_id"].to_list() == [1, 2] and new_places["location"].to_list() == [1, 1]
    assert new_places["n_staypoints"].to_list() == [2, 1]  # the fitted staypoint C is not a new staypoint


def random_fitted(seed: int, min_samples: int) -> tuple[FittedPreprocessing, pl.DataFrame]:
    """A fitted run's places by DBSCAN over 1,500 old staypoints around 20 spots, and 1,500 new staypoints around
    the same spots and 20 others, some dense, some sparse."""
    import numpy as np

    from preprocessing.locations import generate_locations

    rng = np.random.default_rng(seed)
    spots = np.array(A) + rng.normal(0, 0.01, size=(40, 2))

    def around(which, n, spread_m):
        pick = rng.choice(which, n)
        return spots[pick] + rng.normal(0, spread_m / M_PER_DEG, size=(n, 2))

    config = PreprocessConfig(location_min_samples=min_samples)
    old = around(np.arange(20), 1500, 25)
    staypoints = pl.DataFrame({"user_id": ["u1"] * len(old), "latitude": old[:, 0], "longitude": old[:, 1]})
    clustered, _ = generate_locations(staypoints, config.location_epsilon_m, min_samples)
    places = (clustered.filter(pl.col("location_id").is_not_null()).group_by("location_id")
              .agg(pl.col("latitude").mean(), pl.col("longitude").mean()).sort("location_id")
              .with_columns((pl.col("location_id") + 2).cast(pl.Int32).alias("location")))
    manifest = {"config": config.to_dict(), "vocab": {"locations": places.height + 2, "users": 2}}
    fitted = FittedPreprocessing.from_tables(manifest, places, clustered, pl.DataFrame({"user": [1], "source_user_id": ["u1"]}),
                                             "random")
    new = np.concatenate([around(np.arange(40), 1200, 30), around(np.arange(5), 300, 3)])
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    activities = pl.DataFrame({"user_id": ["u1"] * len(new), "started_at": [t0 + timedelta(hours=h) for h in range(len(new))],
                               "latitude": new[:, 0], "longitude": new[:, 1]})
    return fitted, activities


@pytest.mark.parametrize("min_samples", [2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_join_by_cells_equals_the_join_by_pairs(seed, min_samples):
    """Past its pair budget the join builds its graph from cells instead of listed pairs: the same places."""
    fitted, activities = random_fitted(seed, min_samples)
    by_pairs, new_by_pairs = join_fitted_places(activities, fitted, pair_budget=10**12)
    by_cells, new_by_cells = join_fitted_places(activities, fitted, pair_budget=0)
    assert by_pairs["is_new_place"].sum() > 50 and by_pairs["location_id"].is_null().sum() > 0
    assert by_pairs["location_id"].n_unique() > 30
    assert by_cells["location_id"].to_list() == by_pairs["location_id"].to_list()
    assert by_cells["is_new_place"].to_list() == by_pairs["is_new_place"].to_list()
    assert new_by_cells.equals(new_by_pairs)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_request_of_few_staypoints_joins_as_a_large_input_does(seed, monkeypatch):
    """A served request's few staypoints take the short path (their fitted pairs listed once, the components by
    label propagation in numpy): the same places, new places and summaries as the path of large inputs."""
    import preprocessing.neighbours as neighbours

    fitted, activities = random_fitted(seed, 2)
    requests = [activities[start:start + 40] for start in range(0, activities.height, 173)][:6]
    short = [join_fitted_places(request, fitted) for request in requests]
    monkeypatch.setattr(neighbours, "SMALL_TREE", 0)  # KD-trees and counts for every query
    monkeypatch.setattr(neighbours, "SMALL_GRAPH", 0)  # scipy's components
    for request, (labelled, new_places) in zip(requests, short):
        long_labelled, long_new = join_fitted_places(request, fitted)
        assert labelled["location_id"].to_list() == long_labelled["location_id"].to_list()
        assert labelled["is_new_place"].to_list() == long_labelled["is_new_place"].to_list()
        assert new_places.equals(long_new)
    assert sum(labelled["location_id"].is_not_null().sum() for labelled, _ in short) > 100  # they do join places
    assert sum(new.height for _, new in short) > 0  # and found new ones


def test_a_dense_request_joins_in_memory_that_grows_with_it():
    """20,000 new staypoints within 3 m of a fitted place (400 million pairs, over 10 GB as lists): all join
    place 0, in a few MB, whichever way the join chooses."""
    import tracemalloc

    import numpy as np

    rng = np.random.default_rng(0)
    spots = np.array(north(A, 2)) + rng.normal(0, 3 / M_PER_DEG, size=(20_000, 2))
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    activities = pl.DataFrame({"user_id": ["u1"] * len(spots), "started_at": [t0] * len(spots),
                               "latitude": spots[:, 0], "longitude": spots[:, 1]})
    tracemalloc.start()
    try:
        labelled, new_places = join_fitted_places(activities, hand_fitted())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert labelled["location_id"].unique().to_list() == [0] and new_places.height == 0
    assert peak < 80 * 2**20, f"peak {peak / 2**20:.0f} MiB"

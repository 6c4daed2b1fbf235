"""Neighbourhoods on the sphere in bounded memory: the same answers as scikit-learn's haversine BallTree and DBSCAN,
whatever the density, the axis order or the antimeridian."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from sklearn.cluster import DBSCAN
from sklearn.neighbors import BallTree

from preprocessing.neighbours import SphereTree, cell_groups, core_components, haversine

R = 6_371_000.0  # metres per radian (preprocessing.staypoints.EARTH_RADIUS_M)
EPS = 20 / R


def clustered(n: int, centre_deg: tuple[float, float], spread_m: float, places: int, seed: int = 0) -> np.ndarray:
    """n points (radians) around `places` centres within ~300 m of centre_deg, each spread_m around its centre,
    with b wrapped into [-pi, pi)."""
    rng = np.random.default_rng(seed)
    centres = np.radians(centre_deg) + rng.normal(0, 300 / R, size=(places, 2))
    points = centres[rng.integers(0, places, n)] + rng.normal(0, spread_m / R, size=(n, 2))
    points[:, 1] = (points[:, 1] + np.pi) % (2 * np.pi) - np.pi
    return points


# Beijing as (lat, lon) and as the protocol's (lon, lat); the antimeridian; near a pole; duplicates
PLACES = [(39.9, 116.3), (116.3, 39.9), (0.0, 179.99995), (89.95, 10.0), (-60.0, -179.99999)]


@pytest.mark.parametrize("centre", PLACES)
def test_counts_and_pairs_equal_a_haversine_ball_tree(centre):
    points = clustered(1500, centre, 15, 25)
    points[:200] = points[200:400]  # exact duplicates count too
    tree = BallTree(points, metric="haversine")
    sphere = SphereTree(points)
    expected = tree.query_radius(points, EPS, count_only=True)
    assert (sphere.counts(points, EPS) == expected).all()
    query, found, distance = sphere.pairs(points, EPS)
    assert len(query) == expected.sum()
    lists = tree.query_radius(points, EPS)
    assert set(zip(query.tolist(), found.tolist())) == {(i, int(j)) for i, js in enumerate(lists) for j in js}
    assert np.allclose(distance, haversine(points[query], points[found]))


def test_a_pair_exactly_at_the_radius_is_inside_and_just_past_it_outside():
    """d <= eps is a neighbour (scikit-learn's rule): at the radius itself by its own arithmetic, 1e-9 past it not."""
    a = np.radians([[39.9, 116.3]])
    inside = a + [[EPS, 0.0]]
    outside = a + [[EPS * (1 + 1e-9), 0.0]]
    points = np.concatenate([a, inside, outside])
    expected = BallTree(points, metric="haversine").query_radius(a, EPS, count_only=True)
    assert SphereTree(points).counts(a, EPS).tolist() == expected.tolist() == [2]
    nearest, _ = SphereTree(points[2:]).nearest(a, EPS)
    assert nearest.tolist() == [-1]


@pytest.mark.parametrize("centre", PLACES)
def test_points_of_one_cell_are_within_the_radius(centre):
    points = clustered(3000, centre, 10, 5)
    group = cell_groups(points, EPS)
    i, j = np.triu_indices(len(points), 1)
    same = group[i] == group[j]
    assert same.sum() > 1000  # dense: many pairs share a cell
    assert (haversine(points[i[same]], points[j[same]]) <= EPS).all()


@pytest.mark.parametrize("centre", PLACES)
@pytest.mark.parametrize("spread_m", [2, 12, 40])
def test_core_components_are_dbscan_clusters(centre, spread_m):
    points = clustered(2500, centre, spread_m, 30, seed=spread_m)
    fit = DBSCAN(eps=EPS, min_samples=3, metric="haversine", algorithm="ball_tree").fit(points)
    core = np.zeros(len(points), bool)
    core[fit.core_sample_indices_] = True
    ours = core_components(points[core], EPS)
    theirs = fit.labels_[core]
    # the same partition: each of our components is one of theirs, and the other way round
    pairs = set(zip(ours.tolist(), theirs.tolist()))
    assert len(pairs) == len(set(ours.tolist())) == len(set(theirs.tolist())) > 1


def test_memory_grows_with_the_points_not_with_their_pairs():
    """30,000 points within a few metres: 900 million pairs (over 20 GB as lists), one cluster in a few MB."""
    points = clustered(30_000, (39.9, 116.3), 3, 1)
    tracemalloc.start()
    try:
        component = core_components(points, EPS)
        counts = SphereTree(points).counts(points[:1000], EPS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert set(component.tolist()) == {0}
    assert counts.min() > 20_000
    assert peak < 60 * 2**20, f"peak {peak / 2**20:.0f} MiB"

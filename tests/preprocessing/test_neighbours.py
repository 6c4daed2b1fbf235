"""Neighbourhoods on the sphere in bounded memory: the same answers as scikit-learn's haversine BallTree and DBSCAN,
whatever the density, the axis order or the antimeridian."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from sklearn.cluster import DBSCAN
from sklearn.neighbors import BallTree

from preprocessing.neighbours import SphereTree, cell_groups, components, core_components, haversine

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


@pytest.mark.parametrize("centre", PLACES)
def test_a_small_tree_compares_every_pair_and_answers_as_the_kd_tree(centre, monkeypatch):
    """A tree of at most SMALL_TREE points (a served request's staypoints) skips the KD-tree: counts, pairs, the
    nearest within a radius and the k nearest are those of the KD-tree path and of a haversine BallTree."""
    import preprocessing.neighbours as neighbours

    points = clustered(400, centre, 15, 8, seed=2)
    points[:5] = points[5:10]  # duplicates
    small = SphereTree(points[:40])
    assert small.small and small.tree is None
    monkeypatch.setattr(neighbours, "SMALL_TREE", 0)
    big = SphereTree(points[:40])
    assert not big.small
    expected = BallTree(points[:40], metric="haversine").query_radius(points, EPS, count_only=True)
    assert (small.counts(points, EPS) == expected).all() and (big.counts(points, EPS) == expected).all()
    lists = BallTree(points[:40], metric="haversine").query_radius(points, EPS)
    within = {(i, int(j)) for i, js in enumerate(lists) for j in js}
    for query, found, distance in (small.pairs(points, EPS), big.pairs(points, EPS)):
        assert len(query) == expected.sum() and set(zip(query.tolist(), found.tolist())) == within
        assert np.allclose(distance, haversine(points[query], points[:40][found]))
    for a, b in zip(small.nearest(points, EPS), big.nearest(points, EPS)):
        assert np.array_equal(a, b)
    nearest_k = small.k_nearest(points, 3)
    d_small = haversine(np.repeat(points, 3, axis=0), points[:40][nearest_k.reshape(-1)]).reshape(-1, 3)
    d_big = haversine(np.repeat(points, 3, axis=0), points[:40][big.k_nearest(points, 3).reshape(-1)]).reshape(-1, 3)
    assert np.allclose(d_small, d_big, rtol=0, atol=1e-15) and (np.diff(d_small, axis=1) >= 0).all()
    assert SphereTree(points[:0]).counts(points, EPS).tolist() == [0] * len(points)


@pytest.mark.parametrize("small_tree", [64, 0], ids=["pairwise", "kd-tree"])
def test_a_pair_exactly_at_the_radius_is_inside_and_just_past_it_outside(small_tree, monkeypatch):
    """d <= eps is a neighbour (scikit-learn's rule): at the radius itself by its own arithmetic, 1e-9 past it not;
    for a small tree compared pair by pair as for a KD-tree."""
    import preprocessing.neighbours as neighbours

    monkeypatch.setattr(neighbours, "SMALL_TREE", small_tree)
    a = np.array([[0.0, np.radians(116.3)]])  # from the equator the step of EPS is exact: rdist is within(EPS) itself
    inside = a + [[EPS, 0.0]]
    outside = a + [[EPS * (1 + 1e-9), 0.0]]
    points = np.concatenate([a, inside, outside])
    expected = BallTree(points, metric="haversine").query_radius(a, EPS, count_only=True)
    assert SphereTree(points).counts(a, EPS).tolist() == expected.tolist() == [2]
    nearest, _ = SphereTree(points[2:]).nearest(a, EPS)
    assert nearest.tolist() == [-1]
    nearest, _ = SphereTree(points[1:]).nearest(a, EPS)  # the point exactly at the radius is the nearest within it
    assert nearest.tolist() == [0]


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


def test_small_graph_components_equal_scipys_numbering():
    """Components of a small graph (label propagation in numpy) are scipy's: same components, numbered by their
    lowest node; a long chain past the propagation rounds falls back to scipy with the same answer."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(0)
    graphs = [(int(n), rng.integers(0, n, m), rng.integers(0, n, m))
              for n, m in zip(rng.integers(1, 500, 300), rng.integers(0, 500, 300))]
    chain = rng.permutation(400)
    graphs += [(400, chain[:-1], chain[1:]), (5, np.array([4, 2]), np.array([2, 4])), (3, np.zeros(0, np.int64),
                                                                                       np.zeros(0, np.int64))]
    for n, src, dst in graphs:
        expected = connected_components(coo_matrix((np.ones(len(src), np.int8), (src, dst)), shape=(n, n)),
                                        directed=False)[1]
        assert components(n, src, dst).tolist() == expected.tolist()
    assert components(400, chain[:-1], chain[1:]).tolist() == [0] * 400
    assert components(5, np.array([4, 2]), np.array([2, 4])).tolist() == [0, 1, 2, 3, 2]

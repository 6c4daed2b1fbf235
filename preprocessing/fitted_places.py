"""New staypoints joined to a fitted run's places, as if they had been part of its DBSCAN.

DBSCAN runs over the new staypoints and the fitted staypoints within `location_epsilon_m` of them, the fitted
core staypoints weighted to stay core. A new staypoint whose cluster holds fitted core staypoints takes the place
of the nearest of them (it is within epsilon of a core, or chained to one through other new staypoints, as in a
whole-data run); clusters without one are new places, numbered after the fitted ones. Staypoints left as noise are
dropped, as in the fitted run. With the protocol's min_samples = 2 this is whole-data DBSCAN restricted to the new
staypoints; with more, the fitted non-core staypoints count once although their fitted neighbours may lie outside
the neighbourhood. Neighbour pairs are listed up to a budget, beyond which the join goes by cells, in memory that
grows with the staypoints (preprocessing.neighbours).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import polars as pl
import pyarrow as pa

from preprocessing.config import PreprocessConfig
from preprocessing.locations import summarise_locations
from preprocessing.neighbours import SphereTree, cell_groups, components, haversine, linked_groups
from preprocessing.sequences import UNSEEN
from preprocessing.staypoints import EARTH_RADIUS_M


class FittedPlaces(Protocol):
    """What the join reads of a fitted run (preprocessing.fitted.FittedPreprocessing)."""

    config: PreprocessConfig
    clustered: pl.DataFrame  # location_id (null: noise), latitude, longitude, is_core: the staypoints DBSCAN saw

    @property
    def tree(self) -> SphereTree: ...  # radius queries over `clustered`

    @property
    def clustered_arrays(self) -> tuple[np.ndarray, np.ndarray]: ...  # (place, is_core) of `clustered`

    @property
    def first_new_place(self) -> int: ...  # the location_id a new place's numbering starts at

    def _coordinates(self, frame: pl.DataFrame) -> np.ndarray: ...  # radians, in the DBSCAN axis order

PAIR_BUDGET = 500_000  # the fitted join lists neighbour pairs up to this many (plus PAIRS_PER_STAYPOINT per staypoint)
PAIRS_PER_STAYPOINT = 16  # beyond that, it joins by cells, in memory that grows with the staypoints (neighbours.py)


def join_fitted_places(activities: pl.DataFrame, fitted: FittedPlaces,
                       pair_budget: int | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """location_id for each new activity staypoint by the fitted run's DBSCAN (module docstring): a fitted place,
    a new place (ids from fitted.first_new_place) or null (noise).

    DBSCAN's clusters are the connected components of core staypoints joined when within epsilon; a
    non-core staypoint joins the cluster of its nearest core neighbour. Here the graph holds the new
    staypoints and the fitted ones within epsilon of them; a fitted core stays core and is joined to its
    place. A new staypoint is core when it, its new neighbours and its fitted neighbours number at least
    min_samples. Its place is that of the nearest fitted core of its cluster, else a new place.

    Memory grows with the staypoints, however densely they sit: while the neighbour pairs are few (at most
    `pair_budget`, by default PAIR_BUDGET + PAIRS_PER_STAYPOINT per staypoint) they are listed; beyond, the
    graph is built from cells of staypoints all within epsilon of each other (same result).

    Input sorted by (user_id, started_at) gives reproducible new ids. Returns (staypoints with location_id
    and is_new_place, new places: location_id, latitude, longitude, n_staypoints, n_users, location = 1)."""
    n = activities.height
    labels = np.full(n, -1, np.int64)
    is_new = np.ones(n, bool)
    if n:
        coords = fitted._coordinates(activities)
        radius = fitted.config.location_epsilon_m / EARTH_RADIUS_M
        new_tree = SphereTree(coords)
        new_degree = new_tree.counts(coords, radius) - 1  # themselves left out
        fitted_pairs = None
        if new_tree.small:  # a request's few staypoints: their fitted pairs are listed once (at most n per fitted row)
            fitted_pairs = fitted.tree.pairs(coords, radius)
            fitted_degree = np.bincount(fitted_pairs[0], minlength=n)
        else:
            fitted_degree = fitted.tree.counts(coords, radius)
        budget = PAIR_BUDGET + PAIRS_PER_STAYPOINT * n if pair_budget is None else pair_budget
        degree = new_degree + fitted_degree
        if degree.sum() <= budget:
            rows, new_cluster, fitted_cluster = _join_by_pairs(coords, new_tree, degree, fitted, radius, fitted_pairs)
        else:
            rows, new_cluster, fitted_cluster = _join_by_cells(coords, new_tree, degree, fitted, radius)
        all_places, all_cores = fitted.clustered_arrays
        place = all_places[rows]
        # the place of each new staypoint: that of the nearest fitted core in its cluster
        place_cores = np.flatnonzero(all_cores[rows] & (place >= 0))
        core_cluster = fitted_cluster[place_cores]
        anchored = np.isin(new_cluster, core_cluster) & (new_cluster >= 0)
        joins = np.flatnonzero(anchored)
        if len(joins):
            labels[joins] = _nearest_core_place(coords[joins], new_cluster[joins],
                                                fitted.tree.coords[rows[place_cores]], core_cluster, place[place_cores])
            is_new[joins] = False
        fresh = np.flatnonzero(is_new & (new_cluster >= 0))
        _, first_seen, inverse = np.unique(new_cluster[fresh], return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first_seen))  # new places numbered in input order
        labels[fresh] = rank[inverse] + fitted.first_new_place
    labelled = activities.hstack([pl.Series("location_id", pa.array(labels, pa.int64(), mask=labels < 0)),
                                  pl.Series("is_new_place", is_new)])
    new_places = summarise_locations(labelled, where=pl.col("is_new_place"))
    new_places = new_places.hstack([pl.Series("location", [UNSEEN] * new_places.height, pl.Int32)])
    return labelled, new_places


def _join_by_pairs(coords: np.ndarray, new_tree: SphereTree, degree: np.ndarray, fitted: FittedPlaces,
                   radius: float, fitted_pairs: tuple | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows of fitted.clustered within epsilon of a new staypoint, the cluster of each new staypoint (-1: noise),
    the cluster of each of those fitted rows (-1: none)), from the listed neighbour pairs (`fitted_pairs`:
    fitted.tree.pairs(coords, radius) where the caller has them already)."""
    min_samples = fitted.config.location_min_samples
    n = len(coords)
    new_i, new_j, new_d = new_tree.pairs(coords, radius)
    keep = new_i != new_j
    new_i, new_j, new_d = new_i[keep], new_j[keep], new_d[keep]
    fit_i, fit_row, fit_d = fitted.tree.pairs(coords, radius) if fitted_pairs is None else fitted_pairs
    rows, fit_j = np.unique(fit_row, return_inverse=True)  # fitted node k = n + fit_j
    m = len(rows)
    all_places, all_cores = fitted.clustered_arrays
    place, fitted_core = all_places[rows], all_cores[rows]
    fitted_new_degree = np.bincount(fit_j, minlength=m)
    core = np.concatenate([1 + degree >= min_samples, fitted_core | (1 + fitted_new_degree >= min_samples)])
    # edges between cores: new-new, new-fitted, and the fitted cores of each place
    src = np.concatenate([new_i, fit_i])
    dst = np.concatenate([new_j, n + fit_j])
    place_cores = fitted_core & (place >= 0)  # each joined to the first core of its place
    links_src, links_dst = same_place_links(n + np.flatnonzero(place_cores), place[place_cores])
    both = core[src] & core[dst]
    component = components(n + m, np.concatenate([src[both], links_src]), np.concatenate([dst[both], links_dst]))
    # a non-core new staypoint joins the component of its nearest core neighbour, if any
    cluster = np.where(core, component, -1)
    distance = np.concatenate([new_d, fit_d])
    border = ~core[src] & core[dst]
    order = np.argsort(distance[border], kind="stable")
    b_src, b_dst = src[border][order], dst[border][order]
    _, nearest = np.unique(b_src, return_index=True)
    cluster[b_src[nearest]] = component[b_dst[nearest]]
    return rows, cluster[:n], cluster[n:]


def _join_by_cells(coords: np.ndarray, new_tree: SphereTree, degree: np.ndarray, fitted: FittedPlaces,
                   radius: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_join_by_pairs's result without listing pairs: core staypoints in cells (each within epsilon across), new
    cells joined to new and fitted cells by their closest pair, fitted cells only through their place."""
    min_samples = fitted.config.location_min_samples
    n = len(coords)
    fitted_new_degree = new_tree.counts(fitted.tree.coords, radius)  # (all fitted staypoints,)
    rows = np.flatnonzero(fitted_new_degree > 0)
    all_places, all_cores = fitted.clustered_arrays
    place, fitted_core = all_places[rows], all_cores[rows]
    core = np.concatenate([1 + degree >= min_samples, fitted_core | (1 + fitted_new_degree[rows] >= min_samples)])
    points = np.concatenate([coords, fitted.tree.coords[rows]])
    # what may share a cell: new staypoints; fitted cores of one place; each other fitted staypoint alone
    kind = np.concatenate([np.zeros(n, np.int64),
                           np.where(fitted_core & (place >= 0), place + 1, -1 - np.arange(len(rows)))])
    core_index = np.flatnonzero(core)
    cells = cell_groups(points[core_index], radius, within=kind[core_index])
    count = int(cells.max()) + 1 if len(cells) else 0
    cell_kind = np.zeros(count, np.int64)
    cell_kind[cells] = kind[core_index]
    # fitted cells are joined through their place only, never by distance (as _join_by_pairs)
    joined = same_place_links(np.flatnonzero(cell_kind > 0), cell_kind[cell_kind > 0])
    g, h = linked_groups(points[core_index], cells, radius, lambda a, b: (cell_kind[a] == 0) | (cell_kind[b] == 0),
                         joined)
    component = components(count, np.concatenate([g, joined[0]]), np.concatenate([h, joined[1]]))[cells]
    cluster = np.full(len(points), -1, np.int64)
    cluster[core_index] = component
    border = np.flatnonzero(~core[:n])  # joins the component of its nearest core neighbour, if any
    nearest, _ = SphereTree(points[core_index]).nearest(coords[border], radius)
    cluster[border[nearest >= 0]] = component[nearest[nearest >= 0]]
    return rows, cluster[:n], cluster[n:]


def same_place_links(nodes: np.ndarray, place: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (node, the first node of its place) that join the nodes of each place: a fitted place is one cluster."""
    _, first, which = np.unique(place, return_index=True, return_inverse=True)
    return nodes, nodes[first][which]


def _nearest_core_place(points: np.ndarray, point_cluster: np.ndarray, cores: np.ndarray, core_cluster: np.ndarray,
                        core_place: np.ndarray) -> np.ndarray:
    """The place of each point's nearest fitted core staypoint in the same cluster (radians, haversine)."""
    tree = SphereTree(cores)
    k = min(16, len(cores))
    index = tree.k_nearest(points, k)  # (J, k) nearest first
    same = core_cluster[index] == point_cluster[:, None]  # (J, k)
    result = core_place[index[np.arange(len(points)), same.argmax(axis=1)]]
    for j in np.flatnonzero(~same.any(axis=1)):  # rare: the k nearest cores lie in other clusters
        members = np.flatnonzero(core_cluster == point_cluster[j])
        result[j] = core_place[members[haversine(np.repeat(points[j:j + 1], len(members), axis=0),
                                                 cores[members]).argmin()]]
    return result

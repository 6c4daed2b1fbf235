"""DBSCAN by spatial tiles: the same labels as scikit-learn's whole-data DBSCAN, tile by tile.

The plane of DBSCAN's coordinates (a, b) in radians (a = latitude for "lat_lon", longitude for trackintel's
"lon_lat") is cut into strips of `tile_deg` in a, and each strip into tiles of `tile_deg` in b. A tile
holds the points it owns and a halo: every point that can lie within epsilon of an owned one. So
each owned point sees all its neighbours, and

1. `count_neighbours(tile)` gives the owned points' neighbour counts: core points are those with at least
   `min_samples`, themselves included, exactly as scikit-learn counts;
2. `link_cores(tile, is_core)` gives the tile's connected components of core points (joined when within
   epsilon, without listing the pairs: preprocessing.neighbours) and each owned non-core point's core neighbours;
3. `assemble_labels` joins components that share a point across tiles and numbers the clusters as
   scikit-learn does: in the order of each cluster's first core point; a border point takes the lowest
   label among its core neighbours; points with no core neighbour are noise (-1).

The halo bound. The haversine term is h = hav(da) + cos(a1) cos(a2) hav(db). When cos(a1) cos(a2) >= 0,
h <= hav(eps) implies |da| <= eps, and with c = min |cos a| over the strip and its halo, hav(db) <=
hav(eps) / c^2. Latitudes always give cos >= 0. Longitudes as `a` ("lon_lat") on both sides of +-90
degrees do not; then the whole set is one tile (plain DBSCAN). Both axes wrap at +-180 degrees.

Each step runs per tile and takes only that tile's coordinates, so it can run anywhere: `map_tiles`
maps a function over tiles, here in a loop, under Ray as tasks (preprocessing.engine).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from preprocessing.engine import serial_map
from preprocessing.neighbours import SphereTree, core_components

HALO_SLACK = 1e-6  # relative widening of every halo, so that rounding never leaves a neighbour out


@dataclass
class Tile:
    """One tile: its members (owned and halo points, as indices into the whole set, ascending) and
    which of them it owns."""

    members: np.ndarray  # (m,) int64 global indices
    owned: np.ndarray  # (m,) bool
    coords: np.ndarray  # (m, 2) radians, the members' (a, b)


def _hav(x: np.ndarray | float) -> np.ndarray | float:
    return np.sin(np.asarray(x) / 2) ** 2


def _cell(x: np.ndarray, n: int) -> np.ndarray:
    """Cell index of angles x (radians) on a circle cut into n equal cells starting at -pi."""
    return np.floor((x + np.pi) / (2 * np.pi / n)).astype(np.int64) % n


def plan_tiles(coords: np.ndarray, eps_rad: float, tile_deg: float) -> list[Tile]:
    """Tiles of about `tile_deg` degrees over coords (n, 2) in radians; one tile when the bound does not hold."""
    n = coords.shape[0]
    everything = [Tile(np.arange(n), np.ones(n, bool), coords)]
    cos_a = np.cos(coords[:, 0])
    if n == 0 or (cos_a.min() < 0 < cos_a.max()) or tile_deg <= 0:
        return everything
    cells = max(1, int(round(360 / tile_deg)))
    width = 2 * np.pi / cells
    halo_a = eps_rad * (1 + HALO_SLACK) + 1e-12
    if halo_a >= width / 2:
        return everything
    # per strip: the b halo, from the smallest |cos a| over the strip widened by the a halo
    lo = -np.pi + width * np.arange(cells) - halo_a
    hi = lo + width + 2 * halo_a
    crosses_zero = (np.floor((lo - np.pi / 2) / np.pi) != np.floor((hi - np.pi / 2) / np.pi))  # holds a cos-zero
    c = np.where(crosses_zero, 0.0, np.minimum(np.abs(np.cos(lo)), np.abs(np.cos(hi))))
    ratio = np.sqrt(_hav(eps_rad)) / np.maximum(c, 1e-300)
    halo_b = np.where(ratio < 1, 2 * np.arcsin(np.minimum(ratio, 1.0)), np.inf) * (1 + HALO_SLACK) + 1e-12
    split = halo_b < width / 2  # strips near a cos-zero stay whole in b
    a, b = coords[:, 0], coords[:, 1]
    home_strip = _cell(a, cells)
    home_tile = home_strip * cells + np.where(split[home_strip], _cell(b, cells), 0)
    pairs = []
    for da in (-halo_a, 0.0, halo_a):
        strip = _cell(a + da, cells)
        for sign in (-1.0, 0.0, 1.0):
            hb = np.where(split[strip], halo_b[strip], 0.0)
            pairs.append(strip * cells + np.where(split[strip], _cell(b + sign * hb, cells), 0))
    keys = np.unique(np.concatenate([tile * n + np.arange(n) for tile in pairs]))  # by tile, then point
    point, tile = keys % n, keys // n
    bounds = np.flatnonzero(np.diff(tile)) + 1
    planned = [Tile(p, home_tile[p] == t[0], coords[p]) for p, t in zip(np.split(point, bounds), np.split(tile, bounds))]
    return [t for t in planned if t.owned.any()]  # a halo alone owns nothing


def count_neighbours(tile: Tile, eps_rad: float) -> tuple[np.ndarray, np.ndarray]:
    """(owned global indices, their neighbour counts within eps_rad, themselves included)."""
    owned = tile.owned
    return tile.members[owned], SphereTree(tile.coords).counts(tile.coords[owned], eps_rad)


def link_cores(tile: Tile, is_core: np.ndarray, eps_rad: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tile's core components and its border candidates.

    Returns (core points, as global indices; their component within this tile; owned non-core points;
    one core neighbour each, as global indices: a border point with k core neighbours appears k times).
    Core points are joined in memory that grows with the tile, whatever its density (neighbours.core_components);
    halo core points join too, which is right: core status is global. A non-core point has fewer than
    min_samples neighbours, so its list of core neighbours is short."""
    core = is_core[tile.members]
    core_members = tile.members[core]
    empty = np.empty(0, np.int64)
    if not core.any():
        return empty, empty, empty, empty
    component = core_components(tile.coords[core], eps_rad)
    owned_border = tile.owned & ~core
    query, near, _ = SphereTree(tile.coords[core]).pairs(tile.coords[owned_border], eps_rad)
    return core_members, component, tile.members[owned_border][query], core_members[near]


def assemble_labels(n: int, is_core: np.ndarray, linked: Iterable[tuple[np.ndarray, ...]]) -> np.ndarray:
    """Cluster labels of all n points, numbered as scikit-learn numbers them (see the module's docstring)."""
    linked = list(linked)
    nodes, comps, borders, border_cores = [], [], [], []
    offset = n
    for core_points, component, border, border_core in linked:
        nodes.append(core_points)
        comps.append(component + offset)
        offset += int(component.max()) + 1 if component.size else 0
        borders.append(border)
        border_cores.append(border_core)
    src = np.concatenate(nodes) if nodes else np.empty(0, np.int64)
    dst = np.concatenate(comps) if comps else np.empty(0, np.int64)
    graph = coo_matrix((np.ones(src.shape[0], np.int8), (src, dst)), shape=(offset, offset))
    _, group = connected_components(graph, directed=False)
    core_idx = np.flatnonzero(is_core)
    # clusters in the order of their first core point
    first = np.full(offset, n, np.int64)
    np.minimum.at(first, group[core_idx], core_idx)
    used = np.unique(group[core_idx])
    rank = np.full(offset, -1, np.int64)
    rank[used[np.argsort(first[used], kind="stable")]] = np.arange(used.shape[0])
    labels = np.full(n, -1, np.int64)
    labels[core_idx] = rank[group[core_idx]]
    border = np.concatenate(borders) if borders else np.empty(0, np.int64)
    if border.size:
        cand = labels[np.concatenate(border_cores)]
        best = np.full(n, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(best, border, cand)
        has = best < np.iinfo(np.int64).max
        labels[has] = best[has]
    return labels


def dbscan_by_tiles(coords: np.ndarray, eps_rad: float, min_samples: int, tile_deg: float,
                    map_tiles: Callable = serial_map) -> tuple[np.ndarray, np.ndarray]:
    """(labels, is_core) of DBSCAN(eps_rad, min_samples, metric="haversine") over coords (n, 2) in radians,
    computed tile by tile; `map_tiles(fn, tiles, *args)` runs fn over the tiles (serially by default)."""
    n = coords.shape[0]
    tiles = plan_tiles(coords, eps_rad, tile_deg)
    is_core = np.zeros(n, bool)
    for owned, counts in map_tiles(count_neighbours, tiles, eps_rad):
        is_core[owned] = counts >= min_samples
    labels = assemble_labels(n, is_core, map_tiles(link_cores, tiles, is_core, eps_rad))
    return labels, is_core

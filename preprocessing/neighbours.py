"""Which points lie within a radius of each other on the sphere (haversine), in memory that grows with the input.

DBSCAN, and the fitted join that extends it to new data, needs two things: how many points lie within the
radius of each point, and which core points are chained together by such pairs. Listing the pairs costs
memory in proportion to their number, and that grows with the square of the input where many staypoints sit
at one place: a home visited every day of a year is a million pairs, a dense request a billion. Here:

- `SphereTree` answers radius and nearest-neighbour queries with a KD-tree over unit vectors (the chord
  2 sin(d / 2) orders pairs as the great-circle distance d does, and is far faster than a haversine
  BallTree), then decides every pair near the radius by scikit-learn's own haversine arithmetic, so the
  answers are exactly those of `BallTree(metric="haversine")`; `counts` needs one integer per point,
  whatever the density;
- `cell_groups` puts points into grid cells small enough that any two points of a cell lie within the
  radius of each other, so the core points of a cell are connected without looking at their pairs;
- `linked_groups` connects two groups when their closest pair lies within the radius: all pairs for small
  groups, a nearest-neighbour query against the larger one otherwise (a bichromatic closest pair).

Coordinates are (a, b) in radians as the haversine reads them: a is the "latitude" (the protocol's
"lon_lat" axis order feeds longitude there, so |a| can exceed pi / 2), b the "longitude". The chord
identity |u - v|^2 = 4 hav(d) holds for any a.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.neighbors import KDTree

CELL_SLACK = 1e-7  # cells shrink by this fraction, so that rounding never puts two points too far apart in one
CHORD_SLACK = 1e-9  # chords within this fraction of the radius's are decided by the haversine itself
SMALL_PAIRS = 4096  # group pairs with at most this many point pairs are compared pair by pair
PAIR_CHUNK = 500_000  # point pairs compared at once (about 60 MB of temporaries)
LINK_BATCH = 20_000  # uncertain group pairs compared between two updates of the components
QUERY_CHUNK = 20_000  # points per radius query, so that the neighbour lists held at once stay bounded
SMALL_TREE = 64  # a SphereTree of at most this many points compares every pair (a served request's staypoints)


def rdist(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """hav(d) of rows of p and q, (..., 2) radians each and broadcast together (`rdist(p[:, None], q[None])` is every
    pair), in scikit-learn's order of operations (its haversine's `rdist`), so that comparisons with
    `within(radius)` decide as `BallTree(metric="haversine")` does."""
    s0, s1 = np.sin(0.5 * (p[..., 0] - q[..., 0])), np.sin(0.5 * (p[..., 1] - q[..., 1]))
    return s0 * s0 + np.cos(p[..., 0]) * np.cos(q[..., 0]) * s1 * s1


def within(radius: float) -> float:
    """The rdist bound of a radius in radians: d <= radius exactly when rdist <= within(radius)."""
    return float(np.sin(0.5 * radius) ** 2)


def distance_of(r: np.ndarray) -> np.ndarray:
    """The great-circle distances (radians) of rdist values."""
    return 2 * np.arcsin(np.sqrt(np.clip(r, 0.0, 1.0)))


def haversine(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Great-circle distances (radians) between rows of p and q, (n, 2) each."""
    return distance_of(rdist(p, q))


def unit_vectors(coords: np.ndarray) -> np.ndarray:
    """(n, 3) points on the unit sphere of (a, b) radians."""
    a, b = coords[:, 0], coords[:, 1]
    return np.column_stack([np.cos(a) * np.cos(b), np.cos(a) * np.sin(b), np.sin(a)])


class SphereTree:
    """Radius and nearest-neighbour queries over points (n, 2) in radians, exactly as a haversine BallTree
    answers them (module docstring), much faster. A tree of at most SMALL_TREE points (a served request's
    staypoints) compares every pair by the same exact arithmetic instead: the same answers, without building a
    KD-tree or paying scikit-learn's per-call checks."""

    def __init__(self, coords: np.ndarray):
        self.coords = np.ascontiguousarray(coords, dtype=np.float64).reshape(-1, 2)
        self.small = len(self.coords) <= SMALL_TREE
        self.tree = KDTree(unit_vectors(self.coords)) if len(self.coords) and not self.small else None

    def _chords(self, radius: float) -> tuple[float, float]:
        chord = 2 * np.sin(0.5 * radius)
        return chord * (1 - CHORD_SLACK), chord * (1 + CHORD_SLACK)

    def _chunks(self, points: np.ndarray):
        """(start, rdist of points[start:...] against every tree point) in chunks of bounded memory (small trees)."""
        step = max(1, QUERY_CHUNK * 4 // max(len(self.coords), 1))
        for start in range(0, len(points), step):
            yield start, rdist(points[start:start + step, None], self.coords[None])

    def counts(self, points: np.ndarray, radius: float) -> np.ndarray:
        """(m,) how many tree points lie within `radius` of each point (a tree point counts itself)."""
        out = np.zeros(len(points), np.int64)
        if len(self.coords) == 0 or len(points) == 0:
            return out
        if self.small:
            for start, r in self._chunks(points):
                out[start:start + len(r)] = (r <= within(radius)).sum(axis=1)
            return out
        inner, outer = self._chords(radius)
        for start in range(0, len(points), QUERY_CHUNK):
            chunk = points[start:start + QUERY_CHUNK]
            u = unit_vectors(chunk)
            low = self.tree.query_radius(u, inner, count_only=True)
            high = self.tree.query_radius(u, outer, count_only=True)
            out[start:start + len(chunk)] = low
            for i in np.flatnonzero(high > low):  # a tree point near the radius: decide each such pair exactly
                index = self.tree.query_radius(u[i:i + 1], outer)[0]
                exact = rdist(np.repeat(chunk[i:i + 1], len(index), axis=0), self.coords[index]) <= within(radius)
                out[start + i] = int(exact.sum())
        return out

    def pairs(self, points: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query, tree index, distance in radians) for every tree point within `radius` of a query point, by query
        then tree index. Memory follows the pairs: call it where `counts` says they are few."""
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        if len(self.coords) == 0 or len(points) == 0:
            return empty
        if self.small:
            parts = [(start + i, j, r[i, j]) for start, r in self._chunks(points)
                     for i, j in [np.nonzero(r <= within(radius))]]
            return (np.concatenate([q for q, _, _ in parts]).astype(np.int64),
                    np.concatenate([j for _, j, _ in parts]).astype(np.int64),
                    distance_of(np.concatenate([d for _, _, d in parts])))
        index = self.tree.query_radius(unit_vectors(points), self._chords(radius)[1])
        sizes = np.fromiter((len(a) for a in index), np.int64, len(index))
        if sizes.sum() == 0:
            return empty
        query, found = np.repeat(np.arange(len(index)), sizes), np.concatenate(index).astype(np.int64)
        r = rdist(points[query], self.coords[found])
        keep = r <= within(radius)
        return query[keep], found[keep], distance_of(r[keep])

    def k_nearest(self, points: np.ndarray, k: int) -> np.ndarray:
        """(m, k) indices of each point's k nearest tree points, nearest first (k at most the tree's size)."""
        if self.small:
            return np.concatenate([np.argsort(r, axis=1, kind="stable")[:, :k] for _, r in self._chunks(points)]
                                  or [np.zeros((0, k), np.int64)]).astype(np.int64)
        return self.tree.query(unit_vectors(points), k=k)[1].astype(np.int64)

    def nearest(self, points: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
        """(tree index, distance) of each point's nearest tree point within `radius`; (-1, inf) where there is
        none. Memory grows with the points, whatever the density."""
        index = np.full(len(points), -1, np.int64)
        distance = np.full(len(points), np.inf)
        if len(self.coords) == 0 or len(points) == 0:
            return index, distance
        if self.small:
            for start, r in self._chunks(points):
                best = np.argmin(r, axis=1)
                closest = r[np.arange(len(r)), best]
                hit = closest <= within(radius)
                rows = start + np.flatnonzero(hit)
                index[rows], distance[rows] = best[hit], distance_of(closest[hit])
            return index, distance
        chord, found = self.tree.query(unit_vectors(points), k=1)
        found = found[:, 0]
        r = rdist(points, self.coords[found])
        hit = r <= within(radius)
        index[hit], distance[hit] = found[hit], distance_of(r[hit])
        for i in np.flatnonzero(~hit & (chord[:, 0] <= self._chords(radius)[1])):  # the nearest chord just past the radius
            query, near, d = self.pairs(points[i:i + 1], radius)
            if len(near):
                index[i], distance[i] = near[np.argmin(d)], d.min()
        return index, distance


def cell_groups(coords: np.ndarray, radius: float, within: np.ndarray | None = None) -> np.ndarray:
    """(n,) a group id per point (0.., dense): points of one group lie within `radius` of each other (and share
    their value of `within`, an optional (n,) integer key that splits cells further).

    Cells are `side` wide in a, where 2 hav(side) = hav(radius). In b a strip's cells are wide enough that
    cos(a1) cos(a2) hav(db) <= hav(side) for any two of its points (c = the largest |cos a| over the strip),
    so the haversine term of two points of a cell is at most 2 hav(side) = hav(radius)."""
    n = coords.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    side = 2 * np.arcsin(np.sin(radius / 2) / np.sqrt(2)) * (1 - CELL_SLACK)
    strip = np.floor(coords[:, 0] / side).astype(np.int64)
    lo, hi = strip * side, (strip + 1) * side
    holds_peak = np.ceil(lo / np.pi) * np.pi <= hi  # |cos| reaches 1 inside the strip
    c = np.where(holds_peak, 1.0, np.maximum(np.abs(np.cos(lo)), np.abs(np.cos(hi))))
    width = 2 * np.arcsin(np.minimum(1.0, np.sin(side / 2) / c)) * (1 - CELL_SLACK)
    column = np.floor((coords[:, 1] + np.pi) / width).astype(np.int64)
    keys = (column, strip) if within is None else (column, strip, within)
    order = np.lexsort(keys)
    new = np.ones(n, bool)
    new[1:] = np.any([np.diff(key[order]) != 0 for key in keys], axis=0)
    group = np.empty(n, np.int64)
    group[order] = np.cumsum(new) - 1
    return group


def linked_groups(coords: np.ndarray, group: np.ndarray, radius: float,
                  allowed: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                  joined: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Edges (g, h) between groups, each with a point of g within `radius` of a point of h, enough to give the
    connected components of all such pairs (together with the `joined` edges, groups known to be connected).

    coords (n, 2) radians; group (n,) ids 0..G-1, each group within `radius` across (cell_groups).
    `allowed(g, h)`, given candidate pairs, masks those that may be joined by distance. Memory grows with n and
    the groups near each group, never with the point pairs. Pairs whose anchors (first points) are close enough
    that every point pair is within the radius are linked unseen; of the others, only those that would join
    two components are compared."""
    n = coords.shape[0]
    empty = np.zeros(0, np.int64)
    if n == 0:
        return empty, empty
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    starts = np.flatnonzero(np.r_[True, np.diff(sorted_group) != 0])
    ids = sorted_group[starts]
    sizes = np.diff(np.r_[starts, n])
    points = coords[order]  # grouped
    anchors = points[starts]
    spread = np.maximum.reduceat(haversine(np.repeat(anchors, sizes, axis=0), points), starts)  # anchor to farthest
    tree = SphereTree(anchors)
    reach = radius + 2 * float(spread.max())
    sure_g, sure_h, maybe_g, maybe_h = [], [], [], []
    for chunk in range(0, len(anchors), QUERY_CHUNK):
        g, h, between = tree.pairs(anchors[chunk:chunk + QUERY_CHUNK], reach)
        g = g + chunk
        g, h, between = g[g < h], h[g < h], between[g < h]
        possible = between <= radius + spread[g] + spread[h]
        g, h, between = g[possible], h[possible], between[possible]
        if allowed is not None:
            keep = allowed(ids[g], ids[h])
            g, h, between = g[keep], h[keep], between[keep]
        sure = between + spread[g] + spread[h] <= radius * (1 - CELL_SLACK)
        sure_g.append(g[sure])
        sure_h.append(h[sure])
        maybe_g.append(g[~sure])
        maybe_h.append(h[~sure])
    src, dst = [np.concatenate(sure_g)], [np.concatenate(sure_h)]  # the edges found, as positions in ids
    known_src, known_dst = empty, empty  # the `joined` edges: they count for the components, they are not returned
    if joined is not None:
        position = np.full(int(ids.max()) + 1, -1, np.int64)
        position[ids] = np.arange(len(ids))
        known_src, known_dst = position[joined[0]], position[joined[1]]
    maybe_g, maybe_h = np.concatenate(maybe_g), np.concatenate(maybe_h)
    closest_first = np.argsort(haversine(anchors[maybe_g], anchors[maybe_h]), kind="stable")
    maybe_g, maybe_h = maybe_g[closest_first], maybe_h[closest_first]
    for begin in range(0, len(maybe_g), LINK_BATCH):  # pairs already connected through others are not compared
        component = components(len(ids), np.concatenate([known_src, *src]), np.concatenate([known_dst, *dst]))
        bg, bh = maybe_g[begin:begin + LINK_BATCH], maybe_h[begin:begin + LINK_BATCH]
        apart = component[bg] != component[bh]
        bg, bh = bg[apart], bh[apart]
        linked = _closest_within(points, starts, sizes, bg, bh, radius)
        src.append(bg[linked])
        dst.append(bh[linked])
    return ids[np.concatenate(src)], ids[np.concatenate(dst)]


def _closest_within(points: np.ndarray, starts: np.ndarray, sizes: np.ndarray, g: np.ndarray, h: np.ndarray,
                    radius: float) -> np.ndarray:
    """(len(g),) whether groups g[k] and h[k] have a pair within radius (points grouped, group k at starts[k])."""
    result = np.zeros(len(g), bool)
    work = sizes[g] * sizes[h]
    small = np.flatnonzero(work <= SMALL_PAIRS)
    begin = 0
    while begin < len(small):  # pair by pair, in chunks of about PAIR_CHUNK point pairs
        end = begin + max(1, int(np.searchsorted(np.cumsum(work[small[begin:]]), PAIR_CHUNK, side="right")))
        pick = small[begin:end]
        per = work[pick]
        pair = np.repeat(np.arange(len(pick)), per)
        offset = np.arange(per.sum()) - np.repeat(np.cumsum(per) - per, per)
        width = sizes[h[pick]][pair]
        i = starts[g[pick]][pair] + offset // width
        j = starts[h[pick]][pair] + offset % width
        hit = rdist(points[i], points[j]) <= within(radius)
        result[pick] = np.bincount(pair, weights=hit, minlength=len(pick)) > 0
        begin = end
    trees: dict[int, SphereTree] = {}
    for k in np.flatnonzero(work > SMALL_PAIRS):  # large groups: the smaller one's points against the larger's tree
        big, other = (g[k], h[k]) if sizes[g[k]] >= sizes[h[k]] else (h[k], g[k])
        if big not in trees:
            trees[big] = SphereTree(points[starts[big]:starts[big] + sizes[big]])
        nearest, _ = trees[big].nearest(points[starts[other]:starts[other] + sizes[other]], radius)
        result[k] = bool((nearest >= 0).any())
    return result


SMALL_GRAPH = 512  # components of a graph of at most this many nodes and edges: by label propagation in numpy
PROPAGATION_ROUNDS = 8  # ... unless it has not settled after this many rounds


def components(count: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(count,) the connected component (0..) of each of `count` nodes under the undirected edges (src, dst),
    numbered in the order of each component's lowest node (as scipy's connected_components numbers them).

    A small graph (a served request's staypoints and their fitted neighbours) takes each node's lowest reachable
    node by propagation with pointer jumping, in numpy: the same answer without building a sparse matrix."""
    if count <= SMALL_GRAPH and len(src) <= SMALL_GRAPH:
        label = np.arange(count)
        for _ in range(PROPAGATION_ROUNDS):  # beyond, a long chain: scipy's search is faster
            low = np.minimum(label[src], label[dst])  # each edge pulls both ends to its lower label
            new = label.copy()
            np.minimum.at(new, src, low)
            np.minimum.at(new, dst, low)
            new = new[new]  # a label is a node of the same component, with a label no higher: jump to it
            if np.array_equal(new, label):
                return np.unique(label, return_inverse=True)[1].astype(np.int64)
            label = new
    graph = coo_matrix((np.ones(len(src), np.int8), (src, dst)), shape=(count, count))
    return connected_components(graph, directed=False)[1].astype(np.int64)


def core_components(coords: np.ndarray, radius: float) -> np.ndarray:
    """(n,) DBSCAN's clusters of core points (every point given is one): the connected components (0..) of the
    points joined when within `radius`, in memory that grows with n whatever the density."""
    if coords.shape[0] == 0:
        return np.zeros(0, np.int64)
    cells = cell_groups(coords, radius)
    g, h = linked_groups(coords, cells, radius)
    return components(int(cells.max()) + 1, g, h)[cells]

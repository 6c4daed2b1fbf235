"""DBSCAN by tiles gives scikit-learn's labels exactly: on GeoLife, and on points placed where tiles are
hardest (tile borders, the antimeridian, the poles, both sides of 90 degrees east in trackintel's axis order)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import DBSCAN

from preprocessing.staypoints import EARTH_RADIUS_M
from preprocessing.tiles import dbscan_by_tiles, plan_tiles


def sklearn_dbscan(coords: np.ndarray, eps_rad: float, min_samples: int) -> tuple[np.ndarray, np.ndarray]:
    fitted = DBSCAN(eps=eps_rad, min_samples=min_samples, metric="haversine", algorithm="ball_tree").fit(coords)
    core = np.zeros(coords.shape[0], bool)
    core[fitted.core_sample_indices_] = True
    return fitted.labels_, core


def assert_same_as_sklearn(coords_deg: np.ndarray, eps_m: float, min_samples: int, tile_deg: float) -> int:
    """Labels and core flags equal, not only up to renumbering; returns the number of tiles used."""
    coords = np.radians(coords_deg)
    eps = eps_m / EARTH_RADIUS_M
    expected_labels, expected_core = sklearn_dbscan(coords, eps, min_samples)
    labels, core = dbscan_by_tiles(coords, eps, min_samples, tile_deg)
    np.testing.assert_array_equal(core, expected_core)
    np.testing.assert_array_equal(labels, expected_labels)
    return len(plan_tiles(coords, eps, tile_deg))


def clustered_points(rng, centres_deg: np.ndarray, per_centre: int, spread_m: float) -> np.ndarray:
    """Points scattered around each (lat, lon) centre, in degrees; longitudes wrapped into [-180, 180)."""
    lat = np.repeat(centres_deg[:, 0], per_centre) + rng.normal(0, spread_m / 111_000, len(centres_deg) * per_centre)
    lon = np.repeat(centres_deg[:, 1], per_centre) + rng.normal(0, spread_m / 111_000, len(centres_deg) * per_centre)
    lat = np.clip(lat, -90, 90)
    lon = (lon + 180) % 360 - 180
    return np.stack([lat, lon], axis=1)


@pytest.mark.parametrize("min_samples", [2, 4])
@pytest.mark.parametrize("tile_deg", [0.001, 0.05, 2.0])
def test_clusters_across_tile_borders_match_sklearn(min_samples, tile_deg):
    rng = np.random.default_rng(7)
    # centres on multiples of the tile size: clusters straddle tile corners
    grid = np.array([[lat, lon] for lat in np.arange(39.9, 40.0, 0.01) for lon in np.arange(116.3, 116.4, 0.01)])
    points = clustered_points(rng, grid, 40, spread_m=30)
    assert assert_same_as_sklearn(points, 20.0, min_samples, tile_deg) > 1


def test_antimeridian_and_poles_match_sklearn():
    """Clusters across 180 degrees of longitude and at the poles, where longitude halos are whole strips."""
    rng = np.random.default_rng(3)
    centres = np.array([[0.0, 180.0], [-16.5, 179.9999], [89.99, 0.0], [-89.995, 100.0], [60.0, -179.9995]])
    points = clustered_points(rng, centres, 60, spread_m=25)
    assert assert_same_as_sklearn(points, 20.0, 2, 0.01) > 1


def test_trackintel_axis_order_on_both_sides_of_90_east_is_one_tile():
    """With longitude as the first axis, points on both sides of 90 degrees east break the halo bound (cos of
    the first axis changes sign): the tiles fall back to one, and labels still match."""
    rng = np.random.default_rng(5)
    lat_lon = clustered_points(rng, np.array([[23.7, 89.999], [23.7, 90.001], [40.0, 116.4]]), 50, spread_m=25)
    lon_lat = lat_lon[:, ::-1].copy()
    assert assert_same_as_sklearn(lon_lat, 20.0, 2, 0.01) == 1
    # one side only (Beijing): tiles again
    assert assert_same_as_sklearn(lon_lat[lon_lat[:, 0] > 100], 20.0, 2, 0.01) > 1


@pytest.mark.real_data
def test_geolife_locations_by_tiles_equal_whole_data_dbscan(geolife_parquet):
    """All 182 users' staypoints, clustered with the protocol's 20 m: identical labels and core flags."""
    from preprocessing.config import PreprocessConfig
    from preprocessing.partitions import staypoints_of_input

    config = PreprocessConfig()
    found = staypoints_of_input(geolife_parquet, "positionfixes", config)
    sp = found.staypoints.filter("is_activity").sort("user_id", "started_at")
    assert sp.height > 20_000
    tiles = assert_same_as_sklearn(sp.select("latitude", "longitude").to_numpy(), 20.0, 2, 0.05)
    assert tiles > 100

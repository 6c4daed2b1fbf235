from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl

from preprocessing.locations import generate_locations, merge_staypoints

T0 = datetime(2008, 10, 23, tzinfo=timezone.utc)
M = 1 / 111_195  # one metre of latitude in degrees


def test_dbscan_shares_locations_across_users_and_drops_noise():
    sp = pl.DataFrame({
        "user_id": [1, 1, 2, 2, 3],
        "latitude": [39.9, 39.9 + 10 * M, 39.9 + 5 * M, 40.0, 40.0 + 30 * M],
        "longitude": [116.3] * 5,
    })
    labelled, locations = generate_locations(sp, epsilon_m=20, min_samples=2)
    ids = labelled["location_id"].to_list()
    # three staypoints within 20 m of each other (users 1 and 2) share location 0; 40.0 and 40.0+30 m are
    # 30 m apart: each is alone within 20 m, so both are noise
    assert ids == [0, 0, 0, None, None]
    assert locations.row(0, named=True)["n_staypoints"] == 3 and locations.row(0, named=True)["n_users"] == 2
    assert locations.height == 1


def test_merge_consecutive_staypoints_at_one_location():
    def at(minutes):
        return T0 + timedelta(minutes=minutes)

    sp = pl.DataFrame({
        "user_id": [1, 1, 1, 1, 1, 2],
        "started_at": [at(0), at(60.5), at(120.5), at(180), at(300), at(121)],
        "finished_at": [at(60), at(120), at(170), at(240), at(320), at(130)],
        "location_id": [5, 5, 5, 5, 6, 5],
    })
    merged = merge_staypoints(sp, max_gap_min=1)
    # 0-60, 60.5-120, 120.5-170 chain (gaps of 30 s); 180 starts 10 min after 170: separate; user 2 apart
    assert merged.select("user_id", "started_at", "finished_at", "location_id", "n_merged").rows() == [
        (1, at(0), at(170), 5, 3), (1, at(180), at(240), 5, 1), (1, at(300), at(320), 6, 1), (2, at(121), at(130), 5, 1)]


def test_trackintel_axis_order():
    # two staypoints 25 m apart north-south near Beijing: apart under the true haversine (eps 20 m);
    # with trackintel's (lon, lat) order the north-south offset counts |cos(116.3 deg)| = 0.44 -> 11 m: together
    sp = pl.DataFrame({"user_id": [1, 1], "latitude": [39.9, 39.9 + 25 * M], "longitude": [116.3, 116.3]})
    assert generate_locations(sp, 20, 2)[0]["location_id"].to_list() == [None, None]
    assert generate_locations(sp, 20, 2, axis_order="lon_lat")[0]["location_id"].to_list() == [0, 0]
    # and 18 m east-west: together as written (18 * 1), apart as trackintel reads it (18 / cos(39.9) = 23 m)
    ew = pl.DataFrame({"user_id": [1, 1], "latitude": [39.9, 39.9], "longitude": [116.3, 116.3 + 18 * M / 0.7672]})
    assert generate_locations(ew, 20, 2)[0]["location_id"].to_list() == [0, 0]
    assert generate_locations(ew, 20, 2, axis_order="lon_lat")[0]["location_id"].to_list() == [None, None]

from __future__ import annotations

import polars as pl
import pytest

from preprocessing.config import SynthConfig
from preprocessing.pipeline import preprocess
from preprocessing.synthetic import generate_positionfixes


def test_deterministic_and_realistic():
    cfg = SynthConfig(users=6, days=60, seed=3)
    a, b = generate_positionfixes(cfg), generate_positionfixes(cfg)
    assert a.equals(b)
    assert not a.equals(generate_positionfixes(SynthConfig(users=6, days=60, seed=4)))
    assert a.schema == {"user_id": pl.Int32, "tracked_at": pl.Datetime("ms", "UTC"), "latitude": pl.Float64,
                        "longitude": pl.Float64}
    assert a["user_id"].unique().sort().to_list() == list(range(6))
    # repeated timestamps exist (they exercise the quarantine) but are rare
    repeats = a.height - a.select(pl.struct("user_id", "tracked_at").n_unique()).item()
    assert 0 < repeats < a.height * 0.01
    # phone-off days: some user-days have no fix at all, and there are gaps over 24 h
    local_day = a.select(((pl.col("tracked_at") - pl.col("tracked_at").min()).dt.total_days()).alias("d"), "user_id")
    user_days = local_day.n_unique()
    assert user_days < 6 * 61
    gaps = a.sort("user_id", "tracked_at").select(pl.col("tracked_at").diff().over("user_id").dt.total_hours().max()).item()
    assert gaps >= 24
    # everything lies in the city, around Beijing
    assert a["latitude"].is_between(39.6, 40.2).all() and a["longitude"].is_between(116.0, 116.8).all()


def test_weekday_commutes_and_weekend_outings():
    fixes = generate_positionfixes(SynthConfig(users=3, days=28, seed=1))
    local = fixes.with_columns(pl.col("tracked_at").dt.convert_time_zone("Asia/Shanghai").alias("local"))
    # moving fixes (more than 100 m from the previous one) happen more on weekday mornings 07-09 than at 03-05
    moved = local.sort("user_id", "tracked_at").with_columns(
        (((pl.col("latitude").diff().over("user_id") * 111_000) ** 2
          + (pl.col("longitude").diff().over("user_id") * 85_000) ** 2).sqrt() > 100).alias("moving"))
    hour = pl.col("local").dt.hour()
    weekday = pl.col("local").dt.weekday() <= 5
    morning = moved.filter(weekday & hour.is_between(7, 9))["moving"].sum()
    night = moved.filter(hour.is_between(3, 5))["moving"].sum()
    assert morning > 10 * max(night, 1)


@pytest.mark.slow
def test_the_default_yields_thousands_of_samples_per_split(tmp_path):
    path = tmp_path / "synth.parquet"
    generate_positionfixes(SynthConfig(users=50, days=120)).write_parquet(path)
    m = preprocess(path, "positionfixes", tmp_path / "out", progress=False).manifest
    assert min(m["counts"]["samples"].values()) >= 2000
    assert m["counts"]["positionfixes_quarantined"] > 0 and m["details"]["staypoints_noise"] > 0
    assert m["vocab"]["users"] == 51 and m["vocab"]["locations"] > 200

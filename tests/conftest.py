"""Shared fixtures: the real data in ../shared/data (skipped with a reason where absent, required under CI=true)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
GEOLIFE_PARQUET = SHARED_DATA / "geolife" / "geolife_positionfixes.parquet"
PLT_SAMPLE = SHARED_DATA / "geolife-plt-sample"
TRACKINTEL_STAYPOINTS = PLT_SAMPLE / "trackintel_staypoints.csv"


def _require(path: Path) -> Path:
    if path.exists():
        return path
    if os.environ.get("CI") == "true":
        pytest.fail(f"{path} is missing, but CI=true requires the shared real data")
    pytest.skip(f"real data not available: {path} is missing (it lives in ../shared/data beside the project)")


@pytest.fixture(scope="session")
def geolife_parquet() -> Path:
    return _require(GEOLIFE_PARQUET)


@pytest.fixture(scope="session")
def plt_sample() -> Path:
    return _require(PLT_SAMPLE)


@pytest.fixture(scope="session")
def trackintel_staypoints() -> Path:
    return _require(TRACKINTEL_STAYPOINTS)


@pytest.fixture(scope="session")
def geolife_few_users(geolife_parquet: Path, tmp_path_factory) -> Path:
    """Five real GeoLife users (ids 11, 12, 28, 71, 74) with months of tracking, as a Parquet file in the shared schema."""
    import polars as pl

    out = tmp_path_factory.mktemp("geolife") / "few_users.parquet"
    pl.scan_parquet(geolife_parquet).filter(pl.col("user_id").is_in([11, 12, 28, 71, 74])).collect().write_parquet(out)
    return out

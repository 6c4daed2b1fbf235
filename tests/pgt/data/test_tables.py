"""pgt/data/tables.py: each person's latest samples (recent_repeat) and the places' coordinates (place_distance)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest
import torch

from infra.errors import InputError
from pgt.data.tables import latest_samples, place_coordinates


def write_split(folder, name: str, users: list[int], days: list[int]) -> None:
    start = datetime(2009, 1, 1, tzinfo=timezone.utc)
    pl.DataFrame({"user": users, "target_started_at": [start + timedelta(days=d) for d in days]}).write_parquet(
        folder / f"{name}.parquet")


def test_latest_samples_are_each_persons_latest_fraction_across_the_splits_learned_from(tmp_path):
    """Rows index the splits one after another; each person keeps the ceiling of the fraction of their samples, at
    least one, the latest by target time whatever the row order."""
    write_split(tmp_path, "train", [1, 1, 1, 1, 2, 2, 1], [3, 1, 2, 4, 7, 5, 0])
    write_split(tmp_path, "validation", [2, 1], [9, 8])
    assert latest_samples(tmp_path, ("train",), 0.4).tolist() == [0, 3, 4]  # person 1: 2 of 5 (days 3, 4); 2: 1 of 2
    # with validation: person 1 keeps 2 of 6 (day 8 in validation, day 4), person 2 one of 3 (day 9, in validation)
    assert latest_samples(tmp_path, ("train", "validation"), 0.25).tolist() == [3, 7, 8]
    assert latest_samples(tmp_path, ("train",), 1.0).tolist() == list(range(7))
    assert latest_samples(tmp_path, ("train",), 0.01).tolist() == [3, 4]  # at least one each


def test_place_coordinates_fill_the_vocabulary_and_name_a_bad_table(tmp_path):
    pl.DataFrame({"location": [2, 4], "latitude": [39.9, 40.0], "longitude": [116.3, 116.4]}).write_parquet(
        tmp_path / "locations.parquet")
    coords = place_coordinates(tmp_path, 5)
    assert coords.shape == (5, 2) and torch.isnan(coords[[0, 1, 3]]).all()
    assert coords[4].tolist() == pytest.approx([40.0, 116.4])
    with pytest.raises(InputError, match="column location holds 2..4; the vocabulary has ids 2..3"):
        place_coordinates(tmp_path, 4)
    (tmp_path / "locations.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="locations.parquet.*place_distance needs the places' coordinates"):
        place_coordinates(tmp_path, 5)

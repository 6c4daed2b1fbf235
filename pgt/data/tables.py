"""What training reads from a `pgt preprocess` folder beside the splits' sequences: the places' coordinates
(place_distance) and each person's latest samples (recent_repeat)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from infra.errors import InputError


def place_coordinates(data_dir, num_locations: int) -> torch.Tensor:
    """(num_locations, 2) latitude and longitude (degrees) of each location id, from the data's locations.parquet;
    NaN for ids 0 and 1 and any id the table lacks. InputError naming the file where it cannot be read."""
    path = Path(data_dir) / "locations.parquet"
    try:
        table = pq.read_table(path, columns=["location", "latitude", "longitude"])
    except (OSError, pa.ArrowException) as exc:
        raise InputError(path, f"place_distance needs the places' coordinates: {str(exc).strip().splitlines()[0]}") from None
    ids = table["location"].to_numpy()
    if len(ids) and (ids.min() < 2 or ids.max() >= num_locations):
        raise InputError(path, f"column location holds {ids.min()}..{ids.max()}; the vocabulary has ids 2.."
                               f"{num_locations - 1}")
    coords = torch.full((num_locations, 2), float("nan"), dtype=torch.float32)
    coords[torch.from_numpy(ids.astype(np.int64))] = torch.from_numpy(
        np.stack([table["latitude"].to_numpy(), table["longitude"].to_numpy()], axis=1).astype(np.float32))
    return coords


def latest_samples(data_dir, splits: tuple[str, ...], fraction: float) -> np.ndarray:
    """Row indices, into the splits' rows one after another (as a refit concatenates them), of each person's latest
    `fraction` of samples by target time (at least one per person with any)."""
    frames = [pq.read_table(Path(data_dir) / f"{split}.parquet", columns=["user", "target_started_at"]) for split in splits]
    users = np.concatenate([f["user"].to_numpy() for f in frames])
    times = np.concatenate([f["target_started_at"].cast(pa.int64()).to_numpy() for f in frames])
    order = np.lexsort((-times, users))  # by person, latest first
    first = np.r_[0, np.flatnonzero(np.diff(users[order])) + 1]  # where each person's rows start in `order`
    counts = np.diff(np.r_[first, len(order)])
    rank = np.arange(len(order)) - np.repeat(first, counts)  # 0 for each person's latest sample
    keep = rank < np.maximum(1, np.ceil(fraction * np.repeat(counts, counts)))
    return np.sort(order[keep])

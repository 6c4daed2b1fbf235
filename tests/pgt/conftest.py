from __future__ import annotations

import pytest
import torch

from pgt.config import ModelConfig
from pgt.training.data import Batch


@pytest.fixture
def tiny_batch() -> Batch:
    """Three right-padded histories over 10 locations; sample 0 repeats location 5."""
    locations = torch.tensor([[5, 3, 5, 7], [2, 4, 0, 0], [9, 0, 0, 0]])
    valid = (locations != 0).long()
    return Batch(locations=locations, users=torch.tensor([1, 2, 1]), times=valid * 10, weekdays=valid * 2,
                 recency=valid * 3, durations=valid * 4, targets=torch.tensor([5, 6, 9]),
                 slots=torch.zeros_like(locations), target_slots=torch.zeros(3, dtype=torch.long))


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(num_locations=10, num_users=3, d_model=16, nhead=2, num_layers=1, dim_feedforward=32,
                       dropout=0.0, max_len=8)


@pytest.fixture(scope="session")
def synthetic_sequences(tmp_path_factory):
    """A `pgt preprocess` folder from the synthetic generator: 8 people over 70 days."""
    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes

    root = tmp_path_factory.mktemp("synthetic")
    generate_positionfixes(SynthConfig(users=8, days=70, seed=11)).write_parquet(root / "fixes.parquet")
    preprocess(root / "fixes.parquet", "positionfixes", root / "seq", progress=False)
    return root / "seq"

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pgt.config import ModelConfig
from pgt.data.dataset import Batch
from tests.conftest import made_once, split_days


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


@dataclass(frozen=True)
class RegisteredModel:
    """The test run's one small trained, logged and registered model, shared by the tracking, serving and
    prediction tests: `pgt train --register` (3 epochs, unseen slots, simulated unseen places) on each synthetic
    person's first 80% of days, against the run's MLflow server. Tests that change a registry use names of their
    own: version 1 of `name` is the champion for the whole run."""

    root: Path  # early.parquet and late.parquet (raw GPS points), early/ (the training sequences), late/ (`--fitted`)
    server: str  # the run's MLflow server
    metrics: dict  # the run's metrics.json
    stdout: str  # what `pgt train` printed
    name: str = "shared"  # its registered name

    @property
    def uri(self) -> str:
        return f"models:/{self.name}@champion"

    @property
    def data(self) -> Path:
        return self.root / "early"


@pytest.fixture(scope="session")
def registered_model(mlflow_server, tmp_path_factory) -> RegisteredModel:
    made = made_once("registered_model", tmp_path_factory, lambda root: train_shared_model(root, mlflow_server))
    return RegisteredModel(Path(made["root"]), mlflow_server, made["metrics"], made["stdout"])


def train_shared_model(root: Path, server: str) -> dict:
    """The installed `pgt train` in a process of its own, as a user runs it (a fresh interpreter, its exit code)."""
    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess, preprocess_fitted
    from preprocessing.synthetic import generate_positionfixes

    early, late = split_days(generate_positionfixes(SynthConfig(users=10, days=90, seed=5)))
    early.write_parquet(root / "early.parquet")
    late.write_parquet(root / "late.parquet")
    preprocess(root / "early.parquet", "positionfixes", root / "early", progress=False)
    preprocess_fitted(root / "late.parquet", "positionfixes", root / "early", root / "late", progress=False)
    r = subprocess.run([sys.executable, "-m", "pgt.cli", "train", "--data", str(root / "early"), "--out",
                        str(root / "run"), "--epochs", "3", "--unseen-slots", "--simulate-unseen", "--tracking-uri",
                        server, "--experiment", "shared", "--register", "shared"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return {"root": str(root), "metrics": json.loads((root / "run" / "metrics.json").read_text()), "stdout": r.stdout}

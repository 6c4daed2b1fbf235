"""What the benchmark harnesses' dry runs train on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_sequences(tmp_path_factory) -> Path:
    """The synthetic generator's 6 people over 60 days, preprocessed: a few hundred samples."""
    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes

    root = tmp_path_factory.mktemp("tiny")
    generate_positionfixes(SynthConfig(users=6, days=60, seed=3)).write_parquet(root / "fixes.parquet")
    preprocess(root / "fixes.parquet", "positionfixes", root / "seq", progress=False)
    return root / "seq"

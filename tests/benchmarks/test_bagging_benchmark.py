"""benchmarks/bagging.py's bootstrap copy of a data folder."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.benchmarks.conftest import load_benchmark


def test_a_bootstrap_folder_draws_train_with_replacement_and_leaves_the_rest_and_its_input_as_they_are(tmp_path):
    bagging = load_benchmark("bagging")
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"sample": list(range(10))}), data / "train.parquet")
    pq.write_table(pa.table({"sample": [100, 101]}), data / "validation.parquet")
    (data / "manifest.json").write_text("{}")
    counts = bagging.bootstrap_folder(data, tmp_path / "bagged", seed=3)
    drawn = pq.read_table(tmp_path / "bagged" / "train.parquet")["sample"].to_pylist()
    expected = np.random.default_rng(3).integers(0, 10, 10).tolist()  # the seed's draws, in order
    assert drawn == expected and counts == {"seed": 3, "samples": 10, "distinct": len(set(expected))}
    assert counts["distinct"] < 10  # with replacement: some samples twice, some not at all
    assert pq.read_table(tmp_path / "bagged" / "validation.parquet")["sample"].to_pylist() == [100, 101]
    assert (tmp_path / "bagged" / "manifest.json").read_text() == "{}"
    assert pq.read_table(data / "train.parquet")["sample"].to_pylist() == list(range(10))  # its input untouched
    # an existing copy is kept, not drawn over
    pq.write_table(pa.table({"sample": [7]}), tmp_path / "bagged" / "train.parquet")
    bagging.bootstrap_folder(data, tmp_path / "bagged", seed=3)
    assert pq.read_table(tmp_path / "bagged" / "train.parquet")["sample"].to_pylist() == [7]
    assert not (tmp_path / "bagged.partial").exists()

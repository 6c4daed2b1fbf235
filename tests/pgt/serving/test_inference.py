"""pgt.serving.inference's checks of what a model is asked to score: sequences from another preprocessing run are refused
in one line naming the column, before the model would index past a table."""

from __future__ import annotations

import pytest

from pgt.config import ModelConfig
from pgt.data.dataset import SequenceDataset
from pgt.serving.inference import check_top_k, check_vocabulary, prediction_time
from tests.pgt.training.test_data import write_split


def model_knowing(locations: int, users: int) -> ModelConfig:
    """What check_vocabulary reads: a model's config (the vocabulary sizes of the data it was trained on)."""
    return ModelConfig(num_locations=locations, num_users=users, d_model=16, nhead=2, dim_feedforward=32)


@pytest.mark.parametrize("histories, message", [
    ([(1, [5, 12, 7], 5)], "column locations holds 12, but the model knows 0..9"),
    ([(4, [5, 6, 7], 5)], "column user holds 4, but the model knows 0..2"),
])
def test_sequences_beyond_the_model_s_tables_are_refused_naming_the_column(tmp_path, histories, message):
    path = tmp_path / "other-run.parquet"
    write_split(path, histories)
    dataset = SequenceDataset.from_parquet(path)
    with pytest.raises(ValueError, match=rf"^{path}: {message}; score sequences from the preprocessing run the model"):
        check_vocabulary(model_knowing(10, 3), dataset, path)
    check_vocabulary(model_knowing(13, 5), dataset, path)  # a model with larger tables takes them


def test_feature_values_name_the_split_s_own_value(tmp_path):
    """Features are stored + 1 (0 pads): the message gives the value as the split holds it."""
    path = tmp_path / "s.parquet"
    write_split(path, [(1, [5, 6, 7], 5)])  # recency 3, 2, 1 days
    dataset = SequenceDataset.from_parquet(path)
    cfg = model_knowing(10, 3)
    cfg.recency_days = 3  # recency values 0..2 (a 2-day history): the split's 3 lies beyond its table
    with pytest.raises(ValueError, match=r"column recency holds 3, but the model knows 0..2"):
        check_vocabulary(cfg, dataset, path)


def test_top_k_and_the_moment_of_a_prediction_are_checked():
    assert check_top_k("3") == 3 and check_top_k(1000) == 1000
    for bad in (0, 1001, True, 2.5, "three"):
        with pytest.raises(ValueError, match=r"^top_k must be an integer from 1 to 1000, got"):
            check_top_k(bad)
    assert prediction_time(None) is None and prediction_time("") is None
    assert prediction_time("2024-05-01T08:00:00+08:00").isoformat() == "2024-05-01T00:00:00+00:00"
    with pytest.raises(ValueError, match=r"^params.at must be an ISO 8601 time such as .*, got 'tomorrow'$"):
        prediction_time("tomorrow", "params.at")

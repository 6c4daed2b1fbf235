"""pgt.serving.inference's checks of what a model is asked to score: sequences from another preprocessing run are refused
in one line naming the column, before the model would index past a table."""

from __future__ import annotations

import pytest

from pgt.config import ModelConfig
from pgt.data.dataset import SequenceDataset
from pgt.serving.inference import check_top_k, check_vocabulary, predict_applied, prediction_time, top_k_predictions
from tests.pgt.training.test_data import write_split
from tests.preprocessing.test_fitted import synthetic_80_20  # noqa: F401 - a fixture this module's test uses too


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


def test_live_rows_are_mixed_over_the_next_visits_day_and_rows_for_a_given_moment_are_not(synthetic_80_20):  # noqa: F811 - the fixture
    """predict_applied (pgt predict on raw data, and the served tables): the evaluation rows and the latest rows
    without a prediction time count recency from the last visit's day, so a day_gaps model mixes them
    (PackedModel.live); latest rows for a given moment count from that moment's day and are scored as they are."""
    from datetime import timedelta

    import torch

    from pgt.config import TrainConfig
    from pgt.data.dataset import SequenceDataset, Vocab
    from pgt.network.daygap import END_HOURS
    from pgt.network.model import build_model, set_day_gap_prior
    from pgt.network.packed import PackedModel
    from preprocessing.fitted import FittedPreprocessing, apply_fitted

    root, _ = synthetic_80_20
    vocab = Vocab.from_manifest(root / "early")
    cfg = TrainConfig.from_dict({"data_dir": "d", "out_dir": "o", "d_model": 16, "nhead": 2, "dim_feedforward": 32,
                                 "day_gaps": 2}).model_config(vocab)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    set_day_gap_prior(model, torch.tensor([[0.01, 0.99]]).repeat(END_HOURS, 1))  # nearly always the day after
    packed = PackedModel(model)
    fitted = FittedPreprocessing.from_folder(root / "early")
    default = apply_fitted(root / "late.parquet", "positionfixes", fitted)
    later = apply_fitted(root / "late.parquet", "positionfixes", fitted,
                         at=default.latest["history_end"].max() + timedelta(days=1))

    def probabilities(samples, live: bool) -> list[float]:
        dataset = SequenceDataset.from_arrow(samples.to_arrow(), cfg.max_len)
        return top_k_predictions(packed, dataset, 3, live=live).probabilities.ravel().tolist()

    for applied in (default, later):
        frame = predict_applied(packed, applied, 3)
        for kind, samples, live in (("latest", applied.latest, applied is default),
                                    ("evaluation", applied.evaluation, True)):
            got = frame.filter(sample=kind).sort("sample_index", "rank")["probability"].to_list()
            assert got == pytest.approx(probabilities(samples, live), abs=1e-6), kind
            assert got != pytest.approx(probabilities(samples, not live), abs=1e-6), kind  # the reading matters


def test_the_new_place_probability_is_served_at_the_odds_the_loss_weight_took(tmp_path):
    """top_k_predictions ranks by the network's own scores and gives the probability of a new place with the odds of
    the new_place_weight it was trained with restored (ModelConfig.new_place_log_odds)."""
    import math

    import torch

    from pgt.network.model import build_model
    from pgt.network.packed import PackedModel

    path = tmp_path / "s.parquet"
    write_split(path, [(1, [5, 6, 7], 5), (2, [3, 4, 6], 4)])
    dataset = SequenceDataset.from_parquet(path)
    own = model_knowing(10, 3)
    own.unseen_slots = True
    torch.manual_seed(0)
    model = build_model(own).eval()
    plain = top_k_predictions(PackedModel(model), dataset, 3)
    model.cfg.new_place_log_odds = math.log(20)  # the same weights, trained at new_place_weight 0.05
    restored = top_k_predictions(PackedModel(model), dataset, 3)
    assert (restored.locations == plain.locations).all() and (restored.probabilities == plain.probabilities).all()
    odds = plain.new_place / (1 - plain.new_place)
    assert restored.new_place == pytest.approx(20 * odds / (1 + 20 * odds), rel=1e-5)

"""pgt/network/daygap.py: the prior of the next visit's day, and live predictions mixed over it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from infra.errors import SettingsError
from pgt.config import ModelConfig, TrainConfig
from pgt.network.daygap import END_HOURS, PRIOR_COUNT, day_gap_prior, fit_day_gap_prior, last_visit_end_hours, live_log_probs
from pgt.network.model import build_model, set_day_gap_prior
from pgt.network.packed import PackedModel
from pgt.network.stacked import for_inference

# three histories (stored + 1 values); the last visits: slot 39 (9:45) for 1 bucket (30-59 min), slot 87 (21:45) for
# 20 buckets (10 h), slot 0 for 0 buckets
LOCATIONS = torch.tensor([[5, 3, 7], [2, 4, 0], [9, 0, 0]])
TIMES = torch.tensor([[10, 20, 40], [30, 88, 0], [1, 0, 0]])
DURATIONS = torch.tensor([[3, 3, 2], [4, 21, 0], [1, 0, 0]])
# the protocol's recency: the last visits are 0, 1 and 2 days before their targets
RECENCY = torch.tensor([[3, 2, 1], [4, 2, 0], [3, 0, 0]])


def test_the_hour_a_last_visit_ends_is_read_from_its_slot_and_duration_bucket():
    # 9:52:30 + 45 min = 10:37:30; 21:52:30 + 10 h 15 min = 32:07:30 (8 the next morning); 0:07:30 + 15 min
    assert last_visit_end_hours(LOCATIONS, TIMES, DURATIONS, 96, 96).tolist() == [10, 32, 0]
    # a visit ending beyond the second day counts as the last hour
    long = last_visit_end_hours(LOCATIONS[2:], torch.tensor([[96, 0, 0]]), torch.tensor([[96, 0, 0]]), 96, 96)
    assert long.tolist() == [END_HOURS - 1]


def test_the_prior_counts_each_hours_next_visit_days_plus_the_smoothing():
    prior = fit_day_gap_prior(LOCATIONS, TIMES, DURATIONS, RECENCY, 2, 96, 96)
    assert prior.shape == (END_HOURS, 2)
    assert torch.allclose(prior.sum(dim=1), torch.ones(END_HOURS))
    # hour 10: one sample, same day; hour 32: one sample, the day after; hour 0: its gap of 2 is beyond 2 days, left out
    one = 1 + PRIOR_COUNT
    assert prior[10].tolist() == pytest.approx([one / (one + PRIOR_COUNT), PRIOR_COUNT / (one + PRIOR_COUNT)])
    assert prior[32].tolist() == pytest.approx([PRIOR_COUNT / (one + PRIOR_COUNT), one / (one + PRIOR_COUNT)])
    assert prior[0].tolist() == pytest.approx([0.5, 0.5])


def mixed_model(cfg: ModelConfig, prior: torch.Tensor) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    set_day_gap_prior(model, prior)
    return model


@pytest.mark.parametrize("members", [1, 2])
def test_a_live_prediction_is_the_prior_weighted_mixture_of_the_shifted_inputs(tiny_config, members):
    """P(place) = sum_k P(k | end hour) P(place | recency + k), recency capped at the window's last day; the stacked
    form and the packed one give the same; a model of day_gaps 1 gives its plain prediction."""
    cfg = dataclasses.replace(tiny_config, day_gaps=3, unseen_slots=True, visit_relations=True, members=members)
    prior = torch.rand(END_HOURS, 3) + 0.1
    prior = prior / prior.sum(dim=1, keepdim=True)
    model = mixed_model(cfg, prior)
    users, weekdays, slots = torch.tensor([1, 2, 1]), (LOCATIONS != 0) * 3, torch.zeros_like(LOCATIONS)
    live = (LOCATIONS != 0).long() * torch.tensor([[7, 3, 1]])  # the last visit at 1: its day is the anchor
    with torch.no_grad():
        mixed = live_log_probs(model, LOCATIONS, users, TIMES, weekdays, live, DURATIONS, slots)
        hours = last_visit_end_hours(LOCATIONS, TIMES, DURATIONS, cfg.time_slots, cfg.duration_buckets)
        expected = sum(prior[hours, k].unsqueeze(1)
                       * model(LOCATIONS, users, TIMES, weekdays, torch.where(live > 0, (live + k).clamp(max=8), 0),
                               DURATIONS, slots).log_probs.exp() for k in range(3))
        assert torch.allclose(mixed.exp(), expected, atol=1e-6)
        assert torch.allclose(mixed.exp().sum(dim=1), torch.ones(3), atol=1e-5)
        stacked = for_inference(model)
        assert torch.allclose(live_log_probs(stacked, LOCATIONS, users, TIMES, weekdays, live, DURATIONS, slots),
                              mixed, atol=1e-5)
        packed = torch.stack([LOCATIONS, users.unsqueeze(1).expand_as(LOCATIONS), TIMES, weekdays, live, DURATIONS,
                              slots], dim=1)
        assert torch.allclose(PackedModel(stacked).live(packed), mixed, atol=1e-5)
        assert not torch.allclose(PackedModel(stacked)(packed), mixed, atol=1e-3)  # the protocol's reading differs
        plain = build_model(dataclasses.replace(cfg, day_gaps=1)).eval()
        assert day_gap_prior(plain) is None
        assert torch.equal(live_log_probs(plain, LOCATIONS, users, TIMES, weekdays, live, DURATIONS, slots),
                           plain(LOCATIONS, users, TIMES, weekdays, live, DURATIONS, slots).log_probs.float())


def test_with_a_memory_only_the_windows_recency_is_shifted(tiny_config):
    """A remembered place (in front of the history, recency past the window's values: its age bucket) keeps its
    value on every day of the mixture."""
    cfg = dataclasses.replace(tiny_config, day_gaps=2, memory_size=2)
    prior = torch.tensor([[0.3, 0.7]]).repeat(END_HOURS, 1)
    model = mixed_model(cfg, prior)
    locations = torch.tensor([[6, 8, 5, 3, 7]])
    live = torch.tensor([[cfg.recency_days + 2, cfg.recency_days + 5, 3, 2, 1]])  # two remembered, three visits
    times, durations, weekdays = torch.tensor([[1, 1, 10, 20, 40]]), torch.tensor([[2, 2, 3, 3, 2]]), torch.ones(1, 5).long()
    users = torch.tensor([1])
    with torch.no_grad():
        mixed = live_log_probs(model, locations, users, times, weekdays, live, durations)
        day_after = live.clone()
        day_after[0, 2:] += 1
        expected = (0.3 * model(locations, users, times, weekdays, live, durations).log_probs.exp()
                    + 0.7 * model(locations, users, times, weekdays, day_after, durations).log_probs.exp())
    assert torch.allclose(mixed.exp(), expected, atol=1e-6)


def test_the_prior_travels_with_the_weights_and_a_wrong_shape_is_refused(tiny_config):
    cfg = dataclasses.replace(tiny_config, day_gaps=2)
    prior = torch.tensor([[0.9, 0.1]]).repeat(END_HOURS, 1)
    model = mixed_model(cfg, prior)
    again = build_model(cfg)
    again.load_state_dict(model.state_dict())
    assert torch.equal(day_gap_prior(again), prior) and torch.equal(day_gap_prior(PackedModel(again)), prior)
    with pytest.raises(ValueError, match=r"takes a \(48, 2\) prior, got \(48, 3\)"):
        set_day_gap_prior(model, torch.full((END_HOURS, 3), 1 / 3))


def test_day_gaps_is_refused_with_the_lstm_and_live_trained_models(tiny_config):
    with pytest.raises(SettingsError, match="lstm-pg"):
        dataclasses.replace(tiny_config, day_gaps=2, variant="lstm-pg")
    with pytest.raises(SettingsError, match="anchor last_visit learns from those inputs"):
        TrainConfig.from_dict({"data_dir": "d", "out_dir": "o", "day_gaps": 2, "anchor": "last_visit"})
    with pytest.raises(SettingsError, match="day_gaps"):
        TrainConfig.from_dict({"data_dir": "d", "out_dir": "o", "day_gaps": 0})

"""The day of the next visit, which a live prediction does not know. The protocol's inputs count recency from the
target's day; a live prediction can only count it from the last visit's day. A network trained on the protocol's
inputs (`day_gaps` K > 1) predicts from the live inputs by mixing its predictions over the K days the next visit may
fall on (the last visit's day, the day after, ...): each day's inputs are the live ones shifted by that many days,
and each day is weighted by how often it followed a last visit that ended at that hour in the data the network
learned from (`fit_day_gap_prior`, kept with the weights as the network's `day_gap_prior`).

    P(place | live inputs) = sum_k P(k | the hour the last visit ends) * P(place | inputs counted from day last + k)

Without it, a protocol-trained network reads every live input as if the next visit were on the last visit's day.
"""

from __future__ import annotations

import torch
import torch.nn as nn

END_HOURS = 48  # the hour the last visit ends, from the midnight before it starts: 0..47 (later ones count as 47)
PRIOR_COUNT = 0.5  # added to every (hour, day) count of the prior: an hour never seen weighs the days evenly


def at_last_visit(locations: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(B,) each right-padded history's value of `values` (B, T) at its last visit."""
    last = ((locations != 0).sum(dim=1) - 1).clamp(min=0).unsqueeze(1)  # (B, 1)
    return values.gather(1, last).squeeze(1)


def days_after_last_visit(locations: torch.Tensor, recency: torch.Tensor) -> torch.Tensor:
    """(B,) the days from each history's last visit to its target, which the protocol's recency (stored + 1) tells."""
    return at_last_visit(locations, recency) - 1


def last_visit_end_hours(locations: torch.Tensor, times: torch.Tensor, durations: torch.Tensor, time_slots: int,
                         duration_buckets: int) -> torch.Tensor:
    """(B,) the hour each history's last visit ends (0..END_HOURS - 1), as its time slot and duration bucket tell:
    their middles, the slots spanning a day and the buckets the two days the durations are capped at."""
    slot = (at_last_visit(locations, times) - 1).clamp(min=0).float()  # stored + 1
    bucket = (at_last_visit(locations, durations) - 1).clamp(min=0).float()
    minutes = (slot + 0.5) * (1440 / time_slots) + (bucket + 0.5) * (2880 / duration_buckets)
    return (minutes // 60).long().clamp(max=END_HOURS - 1)


def fit_day_gap_prior(locations: torch.Tensor, times: torch.Tensor, durations: torch.Tensor, recency: torch.Tensor,
                      day_gaps: int, time_slots: int, duration_buckets: int) -> torch.Tensor:
    """(END_HOURS, day_gaps) P(the next visit is k days after the last visit's day | the hour it ends), counted over
    samples with the protocol's inputs (the last visit's recency is the gap; gaps beyond day_gaps - 1 are left out),
    each count plus PRIOR_COUNT."""
    hours = last_visit_end_hours(locations, times, durations, time_slots, duration_buckets)
    gaps = days_after_last_visit(locations, recency)  # (N,)
    kept = (gaps >= 0) & (gaps < day_gaps)
    counts = torch.zeros(END_HOURS * day_gaps, dtype=torch.float64)
    counts.index_add_(0, (hours * day_gaps + gaps)[kept], torch.ones(int(kept.sum()), dtype=torch.float64))
    counts = counts.view(END_HOURS, day_gaps) + PRIOR_COUNT
    return (counts / counts.sum(dim=1, keepdim=True)).float()


def day_gap_prior(model: nn.Module) -> torch.Tensor | None:
    """The (END_HOURS, K) prior a model mixes live predictions with (its first network's: every member holds the
    same), or None for a model that reads live inputs as they are (day_gaps 1, or a model without the buffer)."""
    return next((buffer for name, buffer in model.named_buffers() if name.rpartition(".")[2] == "day_gap_prior"),
                None)  # a network's own, an Ensemble member's, a PackedModel's network's or a stacked model's


def live_log_probs(model: nn.Module, locations, users, times, weekdays, recency, durations, slots=None) -> torch.Tensor:
    """(B, V + S) log-probabilities of inputs whose recency counts from the last visit's day (stored + 1, the last
    visit at 1): the model's own where it has no day_gap_prior, else the mixture over the days the next visit may
    fall on (the module docstring). One pass over the K shifted copies of the batch."""
    prior = day_gap_prior(model)
    if prior is None:
        return model(locations, users, times, weekdays, recency, durations, slots).log_probs.float()
    cfg = model.cfg
    K, B = prior.shape[1], locations.shape[0]
    shift = torch.arange(K, device=recency.device).view(K, 1, 1)  # (K, 1, 1)
    # (K, B, T): day k's recency; a visit more than the window's days before it takes the window's last value. A
    # remembered place's age bucket (recency past the window's values) stays: a day or two moves few across its edges
    window = (locations != 0) & (recency <= cfg.recency_days)
    shifted = torch.where(window, (recency.unsqueeze(0) + shift).clamp(max=cfg.recency_days), recency)

    def repeat(t: torch.Tensor | None) -> torch.Tensor | None:  # (B, ...) -> (K * B, ...)
        return None if t is None else t.repeat(K, *([1] * (t.dim() - 1)))

    log_probs = model(repeat(locations), repeat(users), repeat(times), repeat(weekdays), shifted.reshape(K * B, -1),
                      repeat(durations), repeat(slots)).log_probs.float().view(K, B, -1)  # (K, B, V + S)
    hours = last_visit_end_hours(locations, times, durations, cfg.time_slots, cfg.duration_buckets)  # (B,)
    log_weights = prior.to(log_probs.device)[hours].log().T.unsqueeze(2)  # (K, B, 1)
    return torch.logsumexp(log_probs + log_weights, dim=0)  # (B, V + S)

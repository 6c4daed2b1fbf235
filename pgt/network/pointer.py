"""The pointer's pieces, as functions of tensors: each visit's relation to the last one (the learned biases'
indices), the window's and the memory's pointers as one, the pointer's distribution over places and its mix with the
generator's. pgt.network.model's transformer and its LSTM variant call them; pgt.network.stacked runs them on
stacked members."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pgt.config import MEMORY_VISIT_EDGES, ModelConfig
from pgt.network.vocabulary import extended_ids, visit_ids

RELATIONS = 8  # visit_relations: 4 * (followed the last two places in order) + 2 * (followed the current place) + (is it)
CLOCK_BUCKETS = 48  # visit_relations: whole hours from now to the visit's start time of day (24) * same weekday (2)


def visit_relations(locations, slots, times, weekdays, recency, durations, lengths,
                    cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Each visit's relation to the last one, as indices of the pointer's learned biases (all (B, T)).

    relation: 2 * [the visit before it was at the current place] + [it is at the current place], and with
    cfg.relation_order 2 also 4 * [the two visits before it were at the last two places, in order]; the current
    place is the last visit's (unseen places told apart by their slots, visit_ids, with cfg.unseen_slots). These
    are the history's own transitions out of where the user is now. clock: 2 * (whole hours from now to the visit's
    start, in time of day, 0..23)
    + [the visit's weekday is the target's]; now is the last visit's end (its start slot plus its duration
    bucket; a slot is 1440 / cfg.time_slots minutes, a bucket 2880 / cfg.duration_buckets, as the protocol's 15 and
    30), and the target's weekday is the last visit's plus its recency (days before the target's day)."""
    B, T = locations.shape
    ids = visit_ids(locations, slots if cfg.unseen_slots else None, cfg.num_locations)  # (B, T)
    last = (lengths - 1).clamp_min(0).unsqueeze(1)  # (B, 1)
    current = ids.gather(1, last)  # (B, 1)
    here = ids == current  # (B, T)
    after = F.pad(here[:, :-1], (1, 0))  # (B, T) the visit before was at the current place
    memory = remembered_places(recency, cfg)  # (B, T) or None
    if memory is not None:  # a remembered place "followed the current place" when one of its visits came right after it
        # its duration value (stored + 1) is duration_buckets + 1 + visit bucket (+ len(MEMORY_VISIT_EDGES) if so)
        after = torch.where(memory, durations > cfg.duration_buckets + len(MEMORY_VISIT_EDGES), after)
    relation = 2 * after.long() + here.long()
    if cfg.relation_order == 2:  # the visits before it were at the second-to-last place, then at the current one
        before = ids.gather(1, (last - 1).clamp_min(0))  # (B, 1)
        followed = F.pad((ids == before)[:, :-2], (2, 0)) & after & (last > 0)  # (B, T)
        if memory is not None:
            followed = followed & ~memory
        relation = relation + 4 * followed.long()
    slot_min, bucket_min = 1440 / cfg.time_slots, 2880 / cfg.duration_buckets
    start = (times - 1).clamp_min(0) * slot_min  # (B, T) minute of day
    now = start.gather(1, last) + (durations.gather(1, last) - 1).clamp_min(0) * bucket_min  # (B, 1) the last visit's end
    hours = (((start - now) % 1440) // 60).long().clamp(0, 23)  # (B, T)
    target_weekday = (weekdays.gather(1, last) - 1 + recency.gather(1, last) - 1) % cfg.weekdays  # (B, 1)
    same_day = (weekdays - 1) % cfg.weekdays == target_weekday  # (B, T)
    return relation, 2 * hours + same_day.long()


def remembered_places(recency: torch.Tensor, cfg: ModelConfig) -> torch.Tensor | None:
    """(B, T) True on the remembered places in front of the history, told by their recency (an age bucket after the
    window's values, pgt.data.dataset.MemoryLayout); None for a model that reads no memory."""
    return recency > cfg.recency_days if cfg.memory_size else None


def memory_pointer(logits: torch.Tensor, scores: torch.Tensor, pad: torch.Tensor,
                   memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two pointers of a model with a memory, as one: (gate (B,), attention (B, T)) from the gate's (B, 3) logits
    (window, memory, generator) and the pointer's (B, T) scores. Each pointer is a softmax over its own columns (the
    history's visits; the remembered places), the gate a softmax over the three sources, the memory's logit
    masked where a row remembers nothing. The returned gate is the pointers' share (window + memory) and the
    attention their mixture over both, so that P = gate * P_ptr + (1 - gate) * P_gen as without a memory."""
    has_memory = memory.any(dim=1, keepdim=True)  # (B, 1)
    window = torch.softmax(scores.masked_fill(pad | memory, float("-inf")), dim=-1)  # (B, T)
    remembered = torch.softmax(scores.masked_fill(~memory, float("-inf")).masked_fill(~has_memory, 0.0), dim=-1)
    remembered = remembered * memory  # (B, T), all 0 where a row remembers nothing
    weights = torch.softmax(logits.masked_fill(F.pad(~has_memory, (1, 1)), float("-inf")), dim=-1)  # (B, 3)
    pointers = weights[:, 0] + weights[:, 1]  # (B,)
    attention = (weights[:, :1] * window + weights[:, 1:2] * remembered) / pointers.unsqueeze(1)  # (B, T)
    return pointers, attention


def pointer_distribution(attention: torch.Tensor, locations: torch.Tensor, slots: torch.Tensor | None,
                         cfg: ModelConfig, pad_slots: bool = False) -> torch.Tensor:
    """(B, T) attention -> (B, V + S) pointer distribution: each visit's weight goes to its location id, or
    with cfg.unseen_slots to its slot's column (extended_ids; S = T with pad_slots)."""
    ids, width = extended_ids(locations, slots if cfg.unseen_slots else None, cfg.num_locations, pad_slots)  # (B, T)
    p_ptr = torch.zeros(locations.shape[0], width, device=attention.device, dtype=attention.dtype)
    return p_ptr.scatter_add(1, ids, attention)  # (B, V + S)


def mix(gate: torch.Tensor, p_ptr: torch.Tensor, p_gen: torch.Tensor) -> torch.Tensor:
    """g * P_ptr + (1 - g) * P_gen, the generator's (B, V) padded with zeros to the pointer's (B, V + S)."""
    p_gen = F.pad(p_gen, (0, p_ptr.shape[1] - p_gen.shape[1]))
    g = gate.unsqueeze(1).to(p_gen.dtype)
    return g * p_ptr.to(p_gen.dtype) + (1 - g) * p_gen

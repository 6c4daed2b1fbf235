"""The extended vocabulary (`unseen_slots`, See et al. 2017's "P(w) over V + max_oov"), in one place.

The protocol maps every place first visited after the train split to id UNSEEN (1). With slots, the distinct
unseen places of each history get per-sample slots 1, 2, ... after the V known ids: column V + k - 1 is the
row's k-th unseen place, so the pointer can name it, and id 1 then means "a new place" (neither known nor in
the history). The protocol's scores are recovered by merging every slot back into id 1 (merge_slots).

Shapes: B batch, T history length, V known ids (with padding 0 and id 1), S the batch's most slots.
"""

from __future__ import annotations

import torch

from preprocessing.sequences import UNSEEN  # the id of every place first visited after the train split


def unseen_slots(locations: torch.Tensor, places: torch.Tensor, targets: torch.Tensor,
                 target_places: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots of the extended vocabulary (See et al. 2017, "P(w) over V + max_oov").

    In each row, the distinct places of the visits whose location id is UNSEEN get slots 1, 2, ... in
    the order of their first visit; known locations and padding get 0. The target gets its place's slot
    when it is unseen and its place is one of the row's slots, else 0. `places` (B, T) and
    `target_places` (B,) are dataset-wide place ids. Returns (slots (B, T), target_slots (B,))."""
    T = locations.shape[1]
    unseen = locations == UNSEEN  # (B, T)
    same = (places.unsqueeze(2) == places.unsqueeze(1)) & unseen.unsqueeze(1) & unseen.unsqueeze(2)  # (B, T, T)
    first_visit = same.to(torch.uint8).argmax(dim=2)  # (B, T) first visit to the same unseen place
    is_first = unseen & (first_visit == torch.arange(T, device=locations.device))  # (B, T)
    numbered = torch.cumsum(is_first, dim=1) * is_first  # (B, T) slot number at each first visit
    slots = numbered.gather(1, first_visit) * unseen  # (B, T)
    hit = unseen & (places == target_places.unsqueeze(1)) & (targets == UNSEEN).unsqueeze(1)  # (B, T)
    return slots, (slots * hit).amax(dim=1) if T else torch.zeros_like(targets)


def visit_ids(locations: torch.Tensor, slots: torch.Tensor | None, num_locations: int) -> torch.Tensor:
    """(B, T) each visit's column in the extended vocabulary: a slot k is column V + k - 1, every other visit
    keeps its location id (all of them without slots)."""
    if slots is None or not slots.numel():
        return locations
    return torch.where(slots > 0, num_locations - 1 + slots, locations)


def extended_ids(locations: torch.Tensor, slots: torch.Tensor | None, num_locations: int,
                 pad_slots: bool = False) -> tuple[torch.Tensor, int]:
    """((B, T) each visit's column in the extended vocabulary (visit_ids), its width V + S): S is the batch's most
    slots (0 without slots), or with pad_slots T, the most a history of T visits can have: a width known from the
    shapes alone (no host sync; one shape per T for CUDA graphs and torch.compile), its extra columns never used."""
    if slots is None or not slots.numel():
        return locations, num_locations
    most = slots.shape[1] if pad_slots else int(slots.max())
    return visit_ids(locations, slots, num_locations), num_locations + most


def restore_new_place_odds(log_probs: torch.Tensor, new_place_log_odds: float) -> torch.Tensor:
    """(B, C) log-probabilities with a new place's (id 1) raised by `new_place_log_odds` (ModelConfig's) and each row
    renormalised: the odds of a new place that a loss weighing every target alike would have trained. A loss that
    weighs new-place targets by w moves a new place's optimal logit by log w and no other's (Menon et al. 2021,
    logit adjustment), so log(1 / w) restores it."""
    if not new_place_log_odds:
        return log_probs
    raised = torch.cat([log_probs[:, :UNSEEN], log_probs[:, UNSEEN:UNSEEN + 1] + new_place_log_odds,
                        log_probs[:, UNSEEN + 1:]], dim=1)  # (B, C)
    return raised - torch.logsumexp(raised, dim=1, keepdim=True)


def merge_slots(log_probs: torch.Tensor, num_locations: int) -> torch.Tensor:
    """(B, V + S) extended log-probabilities -> (B, V) the protocol's: id 1 ("unseen in train") takes the
    probability of a new place plus that of every slot, which are all places unseen in train."""
    if log_probs.shape[1] == num_locations:
        return log_probs
    unseen = torch.logsumexp(torch.cat([log_probs[:, 1:2], log_probs[:, num_locations:]], dim=1), dim=1)  # (B,)
    return torch.cat([log_probs[:, :1], unseen.unsqueeze(1), log_probs[:, 2:num_locations]], dim=1)

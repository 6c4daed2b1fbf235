"""The non-neural baselines on hand-built histories, under both readings."""

from __future__ import annotations

import torch

from pgt.baselines import MostFrequent
from pgt.data import Batch, unseen_slots
from pgt.metrics import target_ranks


def history_batch() -> Batch:
    """One history: unseen place A, unseen place B, A again, known 5, known 5; the target is place A.
    V = 8: place A is slot 1, column 8."""
    locations = torch.tensor([[1, 1, 1, 5, 5]])
    places = torch.tensor([[100, 200, 100, 50, 50]])
    slots, target_slots = unseen_slots(locations, places, torch.tensor([1]), torch.tensor([100]))
    ones = torch.ones_like(locations)
    return Batch(locations, torch.tensor([1]), ones, ones, ones, ones, torch.tensor([1]), slots, target_slots)


def test_most_frequent_counts_unseen_places_apart_with_slots():
    batch = history_batch()
    assert batch.slots.tolist() == [[1, 2, 1, 0, 0]] and batch.target_slots.tolist() == [1]
    protocol = MostFrequent().scores(batch, 8)
    extended = MostFrequent().scores(batch, 8, use_slots=True)
    assert protocol.shape == (1, 8) and extended.shape == (1, 10)
    # the protocol's id 1 has three visits and ranks first: a protocol hit, though it names no place
    assert protocol.argmax(dim=1).tolist() == [1] and target_ranks(protocol, batch.targets).tolist() == [1]
    # with slots: location 5 (2 visits, the latest) ranks first, A (2 visits) second, B third; never id 1
    assert extended[0].argsort(descending=True)[:3].tolist() == [5, 8, 9]
    assert target_ranks(extended, batch.strict_targets(8)).tolist() == [2]

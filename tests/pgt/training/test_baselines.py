"""The non-neural baselines on hand-built histories, under both readings."""

from __future__ import annotations

import torch

from pgt.data.dataset import Batch
from pgt.data.metrics import target_ranks
from pgt.network.vocabulary import unseen_slots
from pgt.training.baselines import MostFrequent


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


def test_the_markov_chain_ranks_by_the_users_transitions_then_the_global_ones_then_frequency():
    """Train: user 1 visits 2,3,2,4,2,3 (from 2: to 3 twice, to 4 once); user 2 visits 2,5,2,5,2,5,2,6 (from 2: to 5
    three times, to 6 once). A validation split's transitions (2 -> 7) are never counted. From 2, user 1's own
    transitions come first (3, 4), then the global ones (5, 6), then user 1's visit counts (2: three visits);
    user 3, unknown to train, gets the global chain alone (5, 3, then 4 and 6 tied). Plain visit counts, or the
    global chain alone, would order them otherwise."""
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    import polars as pl

    from pgt.training.baselines import MarkovChain

    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    visits = [(1, loc, "train") for loc in (2, 3, 2, 4, 2, 3)] + [(2, loc, "train") for loc in (2, 5, 2, 5, 2, 5, 2, 6)] \
        + [(1, loc, "validation") for loc in (2, 7) * 5]
    staypoints = pl.DataFrame({"user": [v[0] for v in visits], "location": [v[1] for v in visits],
                               "started_at": [t0 + timedelta(hours=i) for i in range(len(visits))],
                               "split": [v[2] for v in visits]})
    vocab = SimpleNamespace(locations=8, users=4)
    chain = MarkovChain(vocab).fit(staypoints)
    locations = torch.tensor([[4, 2], [3, 2]])
    ones = torch.ones_like(locations)
    batch = Batch(locations, torch.tensor([1, 3]), ones, ones, ones, ones, torch.tensor([3, 5]),
                  torch.zeros_like(locations), torch.zeros(2, dtype=torch.long))
    scores = chain.scores(batch)
    user1 = scores[0].argsort(descending=True, stable=True).tolist()
    assert user1[:5] == [3, 4, 5, 6, 2] and scores[0, 7] == 0  # the validation transitions count for nothing
    user3 = scores[1].argsort(descending=True, stable=True).tolist()
    assert user3[:2] == [5, 3] and set(user3[2:4]) == {4, 6} and scores[1, 4] == scores[1, 6]

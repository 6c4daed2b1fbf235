from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pgt.data.metrics import Scored, compute_all, compute_metrics, target_ranks, top1, weighted_f1
from pgt.network.vocabulary import merge_slots


def test_ranks_with_ties_broken_by_id():
    scores = torch.tensor([[0.1, 0.5, 0.3, 0.5], [1.0, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2]])
    targets = torch.tensor([3, 0, 2])
    # row 0: ids 1 and 3 tie at 0.5; id 1 goes first -> target 3 ranks 2
    assert target_ranks(scores, targets).tolist() == [2, 1, 3]
    assert top1(scores).tolist() == [1, 0, 0]


def test_hand_computed_metrics():
    ranks = np.array([1, 2, 6, 11])
    m = compute_metrics(ranks, predictions=np.array([7, 1, 1, 1]), targets=np.array([7, 8, 9, 9]))
    assert m["acc@1"] == 25.0 and m["acc@5"] == 50.0 and m["acc@10"] == 75.0 and m["n"] == 4
    assert m["mrr"] == pytest.approx(100 * (1 + 1 / 2 + 1 / 6 + 1 / 11) / 4)
    assert m["ndcg@10"] == pytest.approx(100 * (1 + 1 / math.log2(3) + 1 / math.log2(7) + 0) / 4)
    # weighted F1 of the top-1: class 7 has F1 1 (weight 1/4); 8 and 9 have 0 -> 25
    assert m["f1"] == pytest.approx(25.0)


@pytest.mark.parametrize("places, n, seed", [(3, 10, 0), (50, 400, 1), (400, 300, 2), (1, 5, 3)])
def test_weighted_f1_is_scikit_learns(places, n, seed):
    """The same figure as sklearn's f1_score(average="weighted", zero_division=0), which the scoring no longer
    imports: places predicted but never the target, targets never predicted, and one place only."""
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(seed)
    targets = rng.integers(0, places, n)
    predictions = np.where(rng.random(n) < 0.5, targets, rng.integers(0, places + 5, n))
    assert weighted_f1(targets, predictions) == pytest.approx(
        f1_score(targets, predictions, average="weighted", zero_division=0), abs=1e-12)
    assert weighted_f1(targets, targets) == 1.0 and weighted_f1(targets, targets + places + 5) == 0.0


def scored(**fields) -> Scored:
    n = len(fields["ranks"])
    defaults = {"top1": np.zeros(n, int), "targets": np.zeros(n, int), "in_history": np.ones(n, bool),
                "strict_ranks": fields["ranks"], "strict_top1": np.zeros(n, int), "place_in_history": np.ones(n, bool),
                "new_place": np.zeros(n, bool)}
    return Scored(**{k: np.asarray(v) for k, v in {**defaults, **fields}.items()})


def test_split_by_history():
    m = compute_all(scored(ranks=[1, 3, 1], top1=[4, 5, 6], targets=[4, 6, 6], in_history=[True, True, False]))
    assert m["n"] == 3 and m["in_history"]["n"] == 2 and m["outside_history"]["n"] == 1
    assert m["in_history"]["acc@1"] == 50.0 and m["outside_history"]["acc@1"] == 100.0
    assert compute_metrics(np.array([]), np.array([]), np.array([]))["n"] == 0


def test_strict_metrics_count_only_the_exact_place():
    """Four samples, V = 10 known ids:
    0: known target 5, ranked 1st under both readings;
    1: an unseen place of the history (slot column 10); the protocol's id 1 ranks 1st, the slot itself 3rd;
    2: a new place: the protocol's id 1 ranks 1st (a protocol hit), strictly no column names it (rank 0);
    3: known target 7, ranked 2nd behind "new place" (id 1) under both readings."""
    m = compute_all(scored(ranks=[1, 1, 1, 2], top1=[5, 1, 1, 1], targets=[5, 1, 1, 7],
                           strict_ranks=[1, 3, 0, 2], strict_top1=[5, 4, 1, 1],
                           in_history=[True, True, True, False], place_in_history=[True, True, False, False],
                           new_place=[False, False, True, False]))
    assert m["acc@1"] == 75.0 and m["mrr"] == pytest.approx(100 * (1 + 1 + 1 + 1 / 2) / 4)
    strict = m["strict"]
    assert strict["acc@1"] == 25.0 and strict["acc@5"] == 75.0 and strict["acc@10"] == 75.0
    assert strict["mrr"] == pytest.approx(100 * (1 + 1 / 3 + 0 + 1 / 2) / 4)
    assert strict["ndcg@10"] == pytest.approx(100 * (1 + 1 / math.log2(4) + 0 + 1 / math.log2(3)) / 4)
    assert strict["in_history"]["n"] == 2 and strict["in_history"]["acc@1"] == 50.0
    assert strict["outside_history"]["acc@5"] == 50.0 and "f1" not in strict
    # "new place" said at top-1 in samples 2 and 3; right in sample 2, the only new place
    assert m["new_place"] == {"rate": 25.0, "predicted": 50.0, "precision": 50.0, "recall": 100.0}


def test_a_new_place_prediction_is_never_a_strict_hit():
    scores = torch.tensor([[0.0, 0.9, 0.1, 0.0], [0.0, 0.9, 0.1, 0.0]])  # "new place" (id 1) first
    strict_targets = torch.tensor([-1, 2])  # a new place has no column; a known target 2 ranks behind id 1
    assert target_ranks(scores, strict_targets).tolist() == [0, 2]
    assert target_ranks(scores, torch.tensor([4, 1])).tolist() == [0, 1]  # a column beyond the scores: never ranked
    assert compute_metrics(np.array([0, 2]))["acc@1"] == 0.0


def test_merged_slots_are_the_protocols_unseen_id():
    log_probs = torch.log(torch.tensor([[0.0, 0.1, 0.2, 0.15, 0.25, 0.3]]) + 1e-10)  # V = 4, two slots
    merged = merge_slots(log_probs, 4)
    assert merged.shape == (1, 4)
    assert torch.allclose(merged.exp(), torch.tensor([[0.0, 0.65, 0.2, 0.15]]), atol=1e-6)

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pgt.metrics import compute_all, compute_metrics, target_ranks, top1


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


def test_split_by_history():
    m = compute_all(np.array([1, 3, 1]), np.array([4, 5, 6]), np.array([4, 6, 6]), np.array([True, True, False]))
    assert m["n"] == 3 and m["in_history"]["n"] == 2 and m["outside_history"]["n"] == 1
    assert m["in_history"]["acc@1"] == 50.0 and m["outside_history"]["acc@1"] == 100.0
    assert compute_metrics(np.array([]), np.array([]), np.array([]))["n"] == 0

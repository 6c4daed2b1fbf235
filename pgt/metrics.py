"""Acc@1/5/10, MRR, NDCG@10 (in %), weighted F1 of the top-1 prediction and n (SPEC §4),
overall and split by whether the target appears in the history.

Ranks are 1-based. Ties are broken by location id (a lower id ranks first), as a stable sort by
descending score would; a target never ranks ahead of an equal-scoring lower id.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import f1_score

METRIC_NAMES = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1", "n")


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, V) scores and (B,) targets -> (B,) 1-based rank of each target."""
    target_score = scores.gather(1, targets.unsqueeze(1))  # (B, 1)
    ids = torch.arange(scores.shape[1], device=scores.device).unsqueeze(0)  # (1, V)
    ahead = (scores > target_score) | ((scores == target_score) & (ids < targets.unsqueeze(1)))
    return ahead.sum(dim=1) + 1


def top1(scores: torch.Tensor) -> torch.Tensor:
    """The first-ranked location (lowest id among equal best scores)."""
    return scores.argmax(dim=1)  # torch.argmax returns the first maximal index


def compute_metrics(ranks: np.ndarray, predictions: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    """Metrics in % (f1 too), and n, from 1-based ranks and top-1 predictions."""
    ranks = np.asarray(ranks, dtype=np.float64)
    n = len(ranks)
    if n == 0:
        return {**{name: 0.0 for name in METRIC_NAMES[:-1]}, "n": 0}
    ndcg = np.where(ranks <= 10, 1.0 / np.log2(ranks + 1.0), 0.0)
    return {
        "acc@1": 100.0 * float(np.mean(ranks <= 1)),
        "acc@5": 100.0 * float(np.mean(ranks <= 5)),
        "acc@10": 100.0 * float(np.mean(ranks <= 10)),
        "mrr": 100.0 * float(np.mean(1.0 / ranks)),
        "ndcg@10": 100.0 * float(np.mean(ndcg)),
        "f1": 100.0 * float(f1_score(targets, predictions, average="weighted", zero_division=0)),
        "n": int(n),
    }


def compute_all(ranks: np.ndarray, predictions: np.ndarray, targets: np.ndarray, in_history: np.ndarray) -> dict:
    """Overall metrics plus the same for targets inside and outside the history."""
    ranks, predictions, targets, in_history = map(np.asarray, (ranks, predictions, targets, in_history))
    inside = in_history.astype(bool)
    return {
        **compute_metrics(ranks, predictions, targets),
        "in_history": compute_metrics(ranks[inside], predictions[inside], targets[inside]),
        "outside_history": compute_metrics(ranks[~inside], predictions[~inside], targets[~inside]),
    }

"""Acc@1/5/10, MRR, NDCG@10 (in %), weighted F1 of the top-1 prediction and n, overall and
split by whether the target appears in the history, under two readings:

- protocol: the published one. Every place unseen in train is id 1, so a prediction of id 1 for a
  target of id 1 is a hit, although the two real places may differ. Kept unchanged for comparison.
- strict: a target counts as found only where its exact place was ranked: a known id, or the slot of
  an unseen place of the history (the extended vocabulary). A "new place" (id 1) is never a hit, and a
  target that is a new place is a miss at every k.

Plus the new-place detection: how often the target is a new place (unseen in train and absent from
the history), and the precision and recall of a top-1 prediction of "new place".

Ranks are 1-based; 0 means the target was not among the ranked candidates (strict misses). Ties are
broken by column (a lower one ranks first), as a stable sort by descending score would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from preprocessing.memory import TARGET_KINDS
from preprocessing.sequences import UNSEEN

METRIC_NAMES = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1", "n")
STRICT_NAMES = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "n")
NEW_PLACE = UNSEEN  # "a place unseen in train" (protocol) or "a new place" (extended vocabulary)


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, C) scores and (B,) target columns -> (B,) 1-based rank of each target; 0 for a target outside 0..C-1."""
    valid = (targets >= 0) & (targets < scores.shape[1])  # (B,)
    safe = torch.where(valid, targets, 0)
    target_score = scores.gather(1, safe.unsqueeze(1))  # (B, 1)
    ids = torch.arange(scores.shape[1], device=scores.device).unsqueeze(0)  # (1, C)
    ahead = (scores > target_score) | ((scores == target_score) & (ids < safe.unsqueeze(1)))
    return torch.where(valid, ahead.sum(dim=1) + 1, 0)


def top1(scores: torch.Tensor) -> torch.Tensor:
    """The first-ranked column (lowest among equal best scores)."""
    return scores.argmax(dim=1)  # torch.argmax returns the first maximal index


@dataclass
class Scored:
    """A split's predictions, as `pgt.data.scoring.score_dataset` gathers them; every array has one entry per sample."""

    ranks: np.ndarray  # protocol: 1-based rank of the target id among the V ids
    top1: np.ndarray  # protocol: the top-1 id (1 = unseen in train)
    targets: np.ndarray  # protocol: the target id
    in_history: np.ndarray  # protocol: the target id is among the history's ids
    strict_ranks: np.ndarray  # strict: 1-based rank of the target's exact place, 0 where no column names it
    strict_top1: np.ndarray  # strict: the top-1 column (a known id, 1 = "new place", or V + slot - 1)
    place_in_history: np.ndarray  # strict: the target's exact place is in the history
    new_place: np.ndarray  # the target is a new place: unseen in train and absent from the history
    # what the target is to the person (preprocessing.memory.TARGET_KINDS: 0 window, 1 return, 2 never visited);
    # -1 where the data does not say (splits written before the memory)
    target_kind: np.ndarray | None = None

    def subset(self, mask: np.ndarray) -> Scored:
        return Scored(*(None if getattr(self, f) is None else getattr(self, f)[mask] for f in self.__dataclass_fields__))


def compute_metrics(ranks: np.ndarray, predictions: np.ndarray | None = None, targets: np.ndarray | None = None
                    ) -> dict[str, float]:
    """Metrics in %, and n, from 1-based ranks (0 = never ranked, a miss at every k); weighted F1 of the
    top-1 predictions when they and the targets are given."""
    ranks = np.asarray(ranks, dtype=np.float64)
    ranks = np.where(ranks >= 1, ranks, np.inf)
    n = len(ranks)
    names = METRIC_NAMES if predictions is not None else STRICT_NAMES
    if n == 0:
        return {**{name: 0.0 for name in names[:-1]}, "n": 0}
    ndcg = np.where(ranks <= 10, 1.0 / np.log2(np.minimum(ranks, 10) + 1.0), 0.0)
    metrics = {
        "acc@1": 100.0 * float(np.mean(ranks <= 1)),
        "acc@5": 100.0 * float(np.mean(ranks <= 5)),
        "acc@10": 100.0 * float(np.mean(ranks <= 10)),
        "mrr": 100.0 * float(np.mean(1.0 / ranks)),
        "ndcg@10": 100.0 * float(np.mean(ndcg)),
    }
    if predictions is not None:
        metrics["f1"] = 100.0 * weighted_f1(np.asarray(targets), np.asarray(predictions))
    return {**metrics, "n": int(n)}


def weighted_f1(targets: np.ndarray, predictions: np.ndarray) -> float:
    """F1 of each place, weighted by how often it is the target (scikit-learn's f1_score(average="weighted",
    zero_division=0)), in [0, 1]. Here rather than sklearn's: importing sklearn.metrics costs 2 s of every
    process that scores a model (each `pgt` command, Ray worker and Tune trial)."""
    labels, index = np.unique(np.concatenate([targets, predictions]), return_inverse=True)
    target_index, predicted_index = index[:len(targets)], index[len(targets):]
    support = np.bincount(target_index, minlength=len(labels))
    predicted = np.bincount(predicted_index, minlength=len(labels))
    hits = np.bincount(target_index[target_index == predicted_index], minlength=len(labels))
    # F1 = 2 tp / (2 tp + fp + fn) = 2 tp / (predicted + support); a place never predicted nor a target is not listed
    f1 = 2.0 * hits / (predicted + support)
    return float(np.sum(f1 * support) / support.sum()) if support.sum() else 0.0


def new_place_detection(scored: Scored) -> dict[str, float]:
    """In %: `rate`, how often the target is a new place; `precision` and `recall` of a top-1 "new place";
    `predicted`, how often the top-1 is "new place"."""
    said = scored.strict_top1 == NEW_PLACE
    new = scored.new_place.astype(bool)
    hits = int(np.sum(said & new))
    return {
        "rate": 100.0 * float(np.mean(new)) if len(new) else 0.0,
        "predicted": 100.0 * float(np.mean(said)) if len(said) else 0.0,
        "precision": 100.0 * hits / int(said.sum()) if said.any() else 0.0,
        "recall": 100.0 * hits / int(new.sum()) if new.any() else 0.0,
    }


def compute_all(scored: Scored) -> dict:
    """Protocol metrics (top level, unchanged), `strict` metrics and `new_place` detection, each overall and
    split by whether the target is in the history (protocol: its id; strict: its exact place)."""
    inside = scored.in_history.astype(bool)
    place_inside = scored.place_in_history.astype(bool)

    def protocol(mask: np.ndarray) -> dict:
        return compute_metrics(scored.ranks[mask], scored.top1[mask], scored.targets[mask])

    everything = np.ones(len(scored.ranks), bool)
    return {
        **protocol(everything),
        "in_history": protocol(inside),
        "outside_history": protocol(~inside),
        "strict": {
            **compute_metrics(scored.strict_ranks),
            "in_history": compute_metrics(scored.strict_ranks[place_inside]),
            "outside_history": compute_metrics(scored.strict_ranks[~place_inside]),
        },
        "new_place": new_place_detection(scored),
        **by_target_kind(scored),
    }


def by_target_kind(scored: Scored) -> dict:
    """{"by_target_kind": {kind: {"strict": metrics, "protocol": metrics}}} where the split says what each target
    is to the person (a place of the window, a return beyond it, a place never visited); {} where it does not."""
    if scored.target_kind is None or not len(scored.target_kind) or (scored.target_kind < 0).any():
        return {}
    kinds = {}
    for code, kind in enumerate(TARGET_KINDS):
        mask = scored.target_kind == code
        kinds[kind] = {"strict": compute_metrics(scored.strict_ranks[mask]),
                       "protocol": compute_metrics(scored.ranks[mask])}
    return {"by_target_kind": kinds}

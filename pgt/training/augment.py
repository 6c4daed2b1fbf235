"""Histories with visits left out while training (visit_dropout): each epoch shows every sample's history with
some of its earlier visits missing, as a person's tracking misses places, so that the model cannot lean on any
one of them. The last visit, the current place, is always kept."""

from __future__ import annotations

import copy

import torch
from torch.utils.data import Dataset

from pgt.data.dataset import Batch, SequenceDataset
from pgt.network.vocabulary import unseen_slots
from pgt.training.unseen import UnseenSimulation

VISIT_FIELDS = ("locations", "times", "weekdays", "recency", "durations")  # the (B, T) columns of a visit


def drop_visits(batch: Batch, places: torch.Tensor, target_places: torch.Tensor, rate: float) -> Batch:
    """`batch` with each history visit but the last left out at `rate` (draws from torch's global RNG, which
    checkpoints save), the kept visits moved to the front in their order and the rest padding, so that the batch
    reads as histories that never had them. Slots are numbered again over the kept visits (`places` (B, T) and
    `target_places` (B,), dataset-wide place ids): an unseen target whose every visit was left out becomes a new place."""
    valid = batch.locations != 0  # (B, T)
    lengths = valid.sum(dim=1, keepdim=True)  # (B, 1)
    positions = torch.arange(valid.shape[1], device=valid.device)  # (T,)
    keep = valid & ((positions == lengths - 1) | (torch.rand(valid.shape, device=valid.device) >= rate))  # (B, T)
    order = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)  # (B, T) kept visits first, in order
    kept = positions < keep.sum(dim=1, keepdim=True)  # (B, T) the new history's visits
    moved = {name: getattr(batch, name).gather(1, order) * kept for name in VISIT_FIELDS}
    places = places.gather(1, order) * kept
    slots, target_slots = unseen_slots(moved["locations"], places, batch.targets, target_places)
    return batch._replace(**moved, slots=slots, target_slots=target_slots)


class VisitDropout(Dataset):
    """A train split (or its unseen simulation) whose batches leave out history visits at `rate` (drop_visits)."""

    def __init__(self, inner: SequenceDataset | UnseenSimulation, rate: float):
        self.inner, self.rate = inner, rate
        self.lengths, self.targets = inner.lengths, inner.targets

    @property
    def base(self) -> SequenceDataset:
        return self.inner.dataset if isinstance(self.inner, UnseenSimulation) else self.inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Batch:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> Batch:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.gather(idx, int(self.lengths[idx].max()))

    def to(self, device: torch.device | str) -> VisitDropout:
        """A copy whose split lives on `device`."""
        moved = copy.copy(self)
        moved.inner = self.inner.to(device)
        moved.lengths, moved.targets = moved.inner.lengths, moved.inner.targets
        return moved

    def gather(self, idx: torch.Tensor, width: int) -> Batch:
        batch = self.inner.gather(idx, width)
        base = self.base
        return drop_visits(batch, base.places[idx, :width], base.target_places[idx], self.rate)

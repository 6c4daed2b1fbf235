"""Train batches changed after they are gathered: places unseen in train shown as later splits show them
(pgt.training.unseen.UnseenSimulation) and history visits left out (VisitDropout). Each is a TransformedSplit over
the train split or over another, and the slots of the unseen places are numbered once, over the visits the last
change leaves.

Visits left out: each epoch shows every sample's history with some of its earlier visits missing, as a person's
tracking misses places, so that the model cannot lean on any one of them. The last visit, the current place, is
always kept."""

from __future__ import annotations

import copy

import torch
from torch.utils.data import Dataset

from pgt.data.dataset import Batch, SequenceDataset
from pgt.network.vocabulary import unseen_slots

VISIT_FIELDS = ("locations", "times", "weekdays", "recency", "durations")  # the (B, T) columns of a visit


class TransformedSplit(Dataset):
    """A train split whose batches are changed after they are gathered. A subclass gives `transform`; over another
    TransformedSplit, that one's changes come first. The slots of the unseen places (vocabulary.unseen_slots) are
    numbered once, over the visits and targets the last change leaves."""

    def __init__(self, inner: SequenceDataset | TransformedSplit):
        self.inner = inner
        self.lengths, self.targets = inner.lengths, inner.targets

    @property
    def dataset(self) -> SequenceDataset:
        """The split underneath every change."""
        return self.inner.dataset if isinstance(self.inner, TransformedSplit) else self.inner

    def transform(self, batch: Batch, places: torch.Tensor, idx: torch.Tensor) -> tuple[Batch, torch.Tensor]:
        """(the changed batch, its visits' (B, T) dataset-wide places) of the samples `idx`; slots are numbered
        afterwards."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Batch:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> Batch:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.gather(idx, int(self.lengths[idx].max()))

    def to(self, device: torch.device | str) -> TransformedSplit:
        """A copy whose split lives on `device` (a subclass moves its own tensors too)."""
        moved = copy.copy(self)
        moved.inner = self.inner.to(device)
        moved.lengths, moved.targets = moved.inner.lengths, moved.inner.targets
        return moved

    def gather(self, idx: torch.Tensor, width: int) -> Batch:
        """The samples `idx` (on the split's device) `width` visits wide, every change made, the slots numbered."""
        batch, places = self.changed(idx, width)
        slots, target_slots = unseen_slots(batch.locations, places, batch.targets, self.dataset.target_places[idx])
        return batch._replace(slots=slots, target_slots=target_slots)

    def changed(self, idx: torch.Tensor, width: int) -> tuple[Batch, torch.Tensor]:
        """(the batch after this change and every one under it, its visits' places); slots not yet numbered."""
        if isinstance(self.inner, TransformedSplit):
            batch, places = self.inner.changed(idx, width)
        else:
            batch, places = self.inner.gather(idx, width), self.dataset.places[idx, :width]
        return self.transform(batch, places, idx)


def leave_out_visits(batch: Batch, places: torch.Tensor, rate: float) -> tuple[Batch, torch.Tensor]:
    """(`batch` with each history visit but the last left out at `rate`, the (B, T) dataset-wide places of its
    visits): draws come from torch's global RNG, which checkpoints save; the kept visits move to the front in their
    order and the rest are padding, so that the batch reads as histories that never had them. Slots are not
    renumbered here (TransformedSplit.gather numbers them): an unseen target whose every visit was left out is then a
    new place."""
    valid = batch.locations != 0  # (B, T)
    lengths = valid.sum(dim=1, keepdim=True)  # (B, 1)
    positions = torch.arange(valid.shape[1], device=valid.device)  # (T,)
    keep = valid & ((positions == lengths - 1) | (torch.rand(valid.shape, device=valid.device) >= rate))  # (B, T)
    order = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)  # (B, T) kept visits first, in order
    kept = positions < keep.sum(dim=1, keepdim=True)  # (B, T) the new history's visits
    moved = {name: getattr(batch, name).gather(1, order) * kept for name in VISIT_FIELDS}
    return batch._replace(**moved), places.gather(1, order) * kept


class VisitDropout(TransformedSplit):
    """A train split (or its unseen simulation) whose batches leave out history visits at `rate` (leave_out_visits)."""

    def __init__(self, inner: SequenceDataset | TransformedSplit, rate: float):
        super().__init__(inner)
        self.rate = rate

    def transform(self, batch: Batch, places: torch.Tensor, idx: torch.Tensor) -> tuple[Batch, torch.Tensor]:
        return leave_out_visits(batch, places, self.rate)

"""How a split becomes batches: length buckets, batches held on the device (resident_data), and a Ray Data
shard streamed into batches (--data-engine ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from pgt.data.dataset import Batch, MemoryLayout, SequenceDataset, Vocab
from pgt.training.augment import TransformedSplit


def keep_batch(batch: Batch) -> Batch:
    """DataLoader collate_fn: the dataset already returns whole batches."""
    return batch


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar history length: takes `bucket_batches` batches' worth of indices from the
    inner sampler (which may be a DistributedSampler), sorts them by length, cuts batches and
    shuffles their order. Less padding, same samples per epoch."""

    def __init__(self, sampler: Sampler[int], lengths: torch.Tensor, batch_size: int, bucket_batches: int = 50,
                 seed: int = 0):
        self.sampler, self.lengths, self.batch_size = sampler, lengths, batch_size
        self.bucket_batches, self.seed, self.epoch = bucket_batches, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng((self.seed, self.epoch))
        indices = np.fromiter(iter(self.sampler), dtype=np.int64)
        chunk = self.batch_size * self.bucket_batches
        for start in range(0, len(indices), chunk):
            part = indices[start:start + chunk]
            part = part[np.argsort(self.lengths[part].numpy(), kind="stable")]
            batches = [part[i:i + self.batch_size] for i in range(0, len(part), self.batch_size)]
            for b in rng.permutation(len(batches)):
                yield batches[b].tolist()

    def __len__(self) -> int:
        n = len(self.sampler)
        chunk = self.batch_size * self.bucket_batches
        return (n // chunk) * self.bucket_batches + -(-(n % chunk) // self.batch_size)


class ResidentBatches:
    """The train split held on the training device and batched there: `batch_sampler` (the DataLoader path's
    BucketBatchSampler) draws each epoch's index lists on the host once, they go to the device in one copy, and
    every batch is a gather on the device: no per-batch transfer, no per-batch sync. Without static_width these
    are exactly the DataLoader path's batches.

    With static_width, each batch's history width is rounded up to a multiple of it (padding is masked: the
    model's outputs do not change) and a short batch is filled to full size with the epoch's first samples
    (as DistributedSampler pads its shards), so that batches take at most max_len / static_width shapes."""

    def __init__(self, dataset: SequenceDataset | TransformedSplit, batch_sampler: BucketBatchSampler,
                 device: torch.device | str, static_width: int = 0):
        self.lengths = dataset.lengths.cpu().numpy()  # (N,) host copy: widths are planned on the host
        self.max_width = int(self.lengths.max(initial=1))  # the split's padded width (its longest kept history)
        self.dataset, self.batch_sampler = dataset.to(device), batch_sampler
        self.device, self.static_width = torch.device(device), static_width

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def plan(self) -> tuple[list[np.ndarray], list[int]]:
        """This epoch's batches (index arrays) and their widths, on the host."""
        batches = [np.asarray(b, dtype=np.int64) for b in self.batch_sampler]
        if self.static_width and batches:
            size = self.batch_sampler.batch_size
            order = np.concatenate(batches)
            batches = [np.concatenate([b, np.resize(order, size - len(b))]) if len(b) < size else b for b in batches]
        widths = [int(self.lengths[b].max()) for b in batches]
        if self.static_width:
            step = self.static_width
            widths = [min(-(-w // step) * step, self.max_width) for w in widths]
        return batches, widths

    def __iter__(self) -> Iterator[Batch]:
        for idx, width in self.indices():
            yield self.dataset.gather(idx, width)

    def indices(self) -> Iterator[tuple[torch.Tensor, int]]:
        """This epoch's batches as (B,) indices on the device and widths, to gather there (the whole step does)."""
        torch.empty((), dtype=torch.int64).random_()  # the draw a DataLoader makes per epoch (its workers' base
        # seed): the global generator, and so dropout and the unseen simulation, then run as on the DataLoader path
        batches, widths = self.plan()
        if not batches:
            return
        flat = torch.as_tensor(np.concatenate(batches)).to(self.device, non_blocking=True)  # one copy an epoch
        start = 0
        for batch, width in zip(batches, widths):
            yield flat[start:start + len(batch)], width
            start += len(batch)


class StreamedBatches:
    """Train batches streamed from a Ray Data shard (`ray.train.get_dataset_shard("train")`) instead of a split
    held in memory: each Arrow batch is padded as SequenceDataset pads a split (so a batch holds what the
    in-memory path would give those samples), after a local shuffle buffer reseeded every epoch. Memory
    follows the buffer, not the split."""

    def __init__(self, shard, batch_size: int, max_len: int, seed: int, shuffle_rows: int = 20_000,
                 vocab: Vocab | None = None, path: Path | str = "train.parquet", at_last_visit: bool = False,
                 memory: MemoryLayout | None = None):
        self.shard, self.batch_size, self.max_len, self.seed = shard, batch_size, max_len, seed
        self.memory = memory  # the remembered places in front of each history (MemoryLayout)
        self.shuffle_rows, self.vocab, self.path, self.epoch = shuffle_rows, vocab, path, 0
        self.at_last_visit = at_last_visit  # recency from the last visit's day (TrainConfig.anchor)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        for table in self.shard.iter_batches(batch_size=self.batch_size, batch_format="pyarrow", drop_last=False,
                                             local_shuffle_buffer_size=self.shuffle_rows,
                                             local_shuffle_seed=self.seed + self.epoch):
            dataset = SequenceDataset.from_arrow(table, self.max_len, self.path, self.memory)
            if self.vocab is not None:
                self.vocab.check_features(dataset, self.path)
            if self.at_last_visit:
                dataset = dataset.anchored_at_last_visit()
            yield dataset.__getitems__(list(range(len(dataset))))

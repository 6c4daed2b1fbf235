from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from pgt.data import BucketBatchSampler, SequenceDataset, Vocab, keep_batch


def write_split(path, histories, max_visits=None):
    rows = []
    for user, locs, target in histories:
        n = len(locs)
        rows.append({"user": user, "locations": locs, "time_slots": list(range(n)), "weekdays": [6] * n,
                     "recency": list(range(n, 0, -1)), "durations": [95] * n, "target": target})
    pl.DataFrame(rows, schema={"user": pl.Int32, "locations": pl.List(pl.Int32), "time_slots": pl.List(pl.Int16),
                               "weekdays": pl.List(pl.Int8), "recency": pl.List(pl.Int8),
                               "durations": pl.List(pl.Int16), "target": pl.Int32}).write_parquet(path)


def test_padded_tensors_shifted_features_and_truncation(tmp_path):
    path = tmp_path / "test.parquet"
    write_split(path, [(1, [5, 6, 7], 5), (2, [8, 9, 10, 11, 12], 9), (1, [4], 4)])
    ds = SequenceDataset.from_parquet(path, max_len=4)
    assert ds.locations.tolist() == [[5, 6, 7, 0], [9, 10, 11, 12], [4, 0, 0, 0]]  # the most recent 4 kept
    assert ds.times.tolist()[0] == [1, 2, 3, 0]  # slot + 1, 0 = padding
    assert ds.times.tolist()[1] == [2, 3, 4, 5]  # slots 1..4 of the truncated history
    assert ds.weekdays.tolist()[2] == [7, 0, 0, 0] and ds.durations.tolist()[2] == [96, 0, 0, 0]
    assert ds.recency.tolist()[0] == [4, 3, 2, 0]
    assert ds.users.tolist() == [1, 2, 1] and ds.targets.tolist() == [5, 9, 4]
    assert ds.lengths.tolist() == [3, 4, 1]
    assert ds.in_history().tolist() == [True, True, True]
    batch = ds.__getitems__([0, 2])
    assert batch.locations.shape == (2, 3)  # trimmed to the longest history in the batch
    assert ds[2].locations.tolist() == [[4]]


def test_bucketed_distributed_batches_cover_every_sample_once(tmp_path):
    path = tmp_path / "train.parquet"
    rng = np.random.default_rng(0)
    write_split(path, [(1, rng.integers(2, 50, rng.integers(1, 30)).tolist(), 3) for _ in range(1000)])
    ds = SequenceDataset.from_parquet(path)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=1)
        batches = BucketBatchSampler(sampler, ds.lengths, batch_size=32, bucket_batches=8, seed=1)
        batches.set_epoch(3)
        loader = DataLoader(ds, batch_sampler=batches, collate_fn=keep_batch)
        got = [b for b in batches]
        assert len(got) == len(batches) == len(loader)
        seen += [i for b in got for i in b]
        widths = [int(ds.lengths[b].max() - ds.lengths[b].min()) for b in got]
        assert np.mean(widths) < 6  # similar lengths together (random batches would spread ~25)
    assert sorted(seen) == list(range(1000))


def test_vocab_from_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"vocab": {"locations": 12, "users": 4}}))
    assert Vocab.from_manifest(tmp_path) == Vocab(12, 4)
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        Vocab.from_manifest(tmp_path / "nope")

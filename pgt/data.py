"""The Parquet splits of `pgt preprocess` as padded tensors, a Dataset that samplers can shard,
and optional length bucketing. Built with pyarrow and numpy: no Python loop per row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset, Sampler

SPLITS = ("train", "validation", "test")
LIST_COLUMNS = ("locations", "time_slots", "weekdays", "recency", "durations")
SHIFTED = ("time_slots", "weekdays", "recency", "durations")  # stored +1 so that 0 means padding


class Batch(NamedTuple):
    locations: torch.Tensor  # (B, T) location ids, 0 = padding, right-padded
    users: torch.Tensor  # (B,)
    times: torch.Tensor  # (B, T) time slot + 1
    weekdays: torch.Tensor  # (B, T) weekday + 1
    recency: torch.Tensor  # (B, T) days before the target + 1
    durations: torch.Tensor  # (B, T) duration bucket + 1
    targets: torch.Tensor  # (B,)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """The model's positional arguments."""
        return self.locations, self.users, self.times, self.weekdays, self.recency, self.durations

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(*(t.to(device, non_blocking=non_blocking) for t in self))

    def packed(self) -> torch.Tensor:
        """The inputs as one (B, 6, T) int64 tensor (the user repeated along T): the interface of
        `pgt.model.PackedModel`, which MLflow logs and serves."""
        users = self.users.unsqueeze(1).expand_as(self.locations)
        return torch.stack([self.locations, users, self.times, self.weekdays, self.recency, self.durations], dim=1)


@dataclass
class Vocab:
    locations: int  # location table size (0 padding, 1 unseen)
    users: int  # user table size (0 padding)

    @classmethod
    def from_manifest(cls, data_dir: Path | str) -> Vocab:
        path = Path(data_dir) / "manifest.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no manifest.json; expected a `pgt preprocess` output folder")
        vocab = json.loads(path.read_text())["vocab"]
        return cls(locations=int(vocab["locations"]), users=int(vocab["users"]))


class SequenceDataset(Dataset):
    """One split as padded int64 tensors. `dataset[i]` is a one-sample Batch; `__getitems__` (which
    DataLoader uses when given a batch of indices) gathers a whole batch trimmed to its longest history."""

    def __init__(self, locations: np.ndarray, users: np.ndarray, features: dict[str, np.ndarray], targets: np.ndarray):
        self.locations = torch.from_numpy(locations)
        self.users = torch.from_numpy(users)
        self.times = torch.from_numpy(features["time_slots"])
        self.weekdays = torch.from_numpy(features["weekdays"])
        self.recency = torch.from_numpy(features["recency"])
        self.durations = torch.from_numpy(features["durations"])
        self.targets = torch.from_numpy(targets)
        self.lengths = (self.locations != 0).sum(dim=1)

    @classmethod
    def from_parquet(cls, path: Path | str, max_len: int = 64, require_target: bool = True) -> SequenceDataset:
        """Read a split; histories longer than max_len keep their most recent max_len visits. Without
        `require_target` a file may lack the target column (new sequences to score): targets are then 0."""
        path = Path(path)
        with_target = "target" in cls.check_columns(path, require_target)
        table = pq.read_table(path, columns=["user", *LIST_COLUMNS] + (["target"] if with_target else []))
        offsets = table.column("locations").combine_chunks().offsets.to_numpy()
        lengths = np.diff(offsets)
        if len(lengths) and lengths.min() < 1:
            raise ValueError(f"{path}: a sample has an empty history")
        n = len(lengths)
        kept = np.minimum(lengths, max_len)
        width = int(kept.max()) if n else 1
        # flat index of every kept value and its (row, column) in the right-padded matrix
        row = np.repeat(np.arange(n), kept)
        col = np.arange(kept.sum()) - np.repeat(np.cumsum(kept) - kept, kept)
        flat = np.repeat(offsets[:-1] + lengths - kept, kept) + col
        padded = {}
        for name in LIST_COLUMNS:
            values = table.column(name).combine_chunks().values.to_numpy().astype(np.int64)
            matrix = np.zeros((n, width), dtype=np.int64)
            matrix[row, col] = values[flat] + (1 if name in SHIFTED else 0)
            padded[name] = matrix
        users = table.column("user").to_numpy().astype(np.int64)
        targets = table.column("target").to_numpy().astype(np.int64) if with_target else np.zeros(n, np.int64)
        return cls(padded.pop("locations"), users, padded, targets)

    @staticmethod
    def check_columns(path: Path | str, require_target: bool = True) -> set[str]:
        """The file's column names, after checking it has those of a split (FileNotFoundError, ValueError)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file; run `pgt preprocess` first")
        present = set(pq.read_schema(path).names)
        needed = ["user", *LIST_COLUMNS] + (["target"] if require_target else [])
        missing = [c for c in needed if c not in present]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected the columns of a "
                             f"`pgt preprocess` split: {', '.join(needed)}")
        return present

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Batch:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> Batch:
        idx = torch.as_tensor(indices, dtype=torch.long)
        width = int(self.lengths[idx].max())
        return Batch(self.locations[idx, :width], self.users[idx], self.times[idx, :width],
                     self.weekdays[idx, :width], self.recency[idx, :width], self.durations[idx, :width],
                     self.targets[idx])

    def in_history(self) -> np.ndarray:
        """Whether each sample's target appears among its history's locations."""
        return (self.locations == self.targets.unsqueeze(1)).any(dim=1).numpy()


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


def load_splits(data_dir: Path | str, max_len: int = 64) -> dict[str, SequenceDataset]:
    return {split: SequenceDataset.from_parquet(Path(data_dir) / f"{split}.parquet", max_len) for split in SPLITS}


@dataclass
class FirstVisits:
    """When each user first visited each location in the train split, and the day of every train
    sample's target; days count from the user's first tracked day (staypoints.parquet's start_day)."""

    first_day: torch.Tensor  # (U, V) float32; +inf where the user never visited the location in train
    sample_day: torch.Tensor  # (N,) float32, the day of each train sample's target, in train.parquet's row order

    @classmethod
    def from_data_dir(cls, data_dir: Path | str, vocab: Vocab) -> FirstVisits:
        import polars as pl

        data_dir = Path(data_dir)
        path = data_dir / "staypoints.parquet"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file; simulating unseen locations needs the staypoints "
                                    "that `pgt preprocess` writes next to the splits")
        staypoints = pl.read_parquet(path, columns=["user", "location", "started_at", "start_day", "split"])
        train = staypoints.filter(pl.col("split") == "train")
        first = train.group_by("user", "location").agg(pl.col("start_day").min())
        first_day = np.full((vocab.users, vocab.locations), np.inf, np.float32)
        first_day[first["user"].to_numpy(), first["location"].to_numpy()] = first["start_day"].to_numpy()
        samples = pl.read_parquet(data_dir / "train.parquet", columns=["user", "target_started_at"])
        days = samples.join(staypoints.select("user", "started_at", "start_day"), how="left", maintain_order="left",
                            left_on=["user", "target_started_at"], right_on=["user", "started_at"])["start_day"]
        if len(days) != len(samples) or days.null_count():
            raise ValueError(f"{data_dir / 'train.parquet'}: {days.null_count()} of {len(samples)} targets have no "
                             f"staypoint in {path} (expected every target_started_at among the user's staypoints)")
        return cls(torch.from_numpy(first_day), torch.from_numpy(days.to_numpy().astype(np.float32)))


class UnseenSimulation(Dataset):
    """The train split as later splits look to the model: there, locations first visited after the
    train period are all id 1 ("unseen in train", a quarter of GeoLife's test histories and targets),
    an id the train split never shows. For each sample this draws a known fraction f uniformly in
    [known_min, known_max] and turns every location the user first visited at least a day after the
    cutoff (f times the days from the user's first day to the sample) into id 1, in the history and the
    target alike. Draws come from torch's global RNG, which checkpoints save, so resumed runs draw the
    same."""

    def __init__(self, dataset: SequenceDataset, visits: FirstVisits, known_min: float, known_max: float):
        if len(visits.sample_day) != len(dataset):
            raise ValueError(f"first visits cover {len(visits.sample_day)} samples, the dataset has {len(dataset)}")
        self.dataset, self.visits = dataset, visits
        self.known_min, self.known_max = known_min, known_max
        self.lengths, self.targets = dataset.lengths, dataset.targets

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Batch:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> Batch:
        batch = self.dataset.__getitems__(indices)
        idx = torch.as_tensor(indices, dtype=torch.long)
        known = self.known_min + (self.known_max - self.known_min) * torch.rand(len(idx))  # (B,)
        cutoff = known * self.visits.sample_day[idx] + 1  # (B,) locations first visited on this day or later are new
        first_history = self.visits.first_day[batch.users.unsqueeze(1), batch.locations]  # (B, T)
        first_target = self.visits.first_day[batch.users, batch.targets]  # (B,)
        new_history = (first_history >= cutoff.unsqueeze(1)) & (batch.locations > 1)  # padding stays 0
        new_target = (first_target >= cutoff) & (batch.targets > 1)
        return batch._replace(locations=torch.where(new_history, 1, batch.locations),
                              targets=torch.where(new_target, 1, batch.targets))

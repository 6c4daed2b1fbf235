"""Unseen places shown in training as later splits show them (simulate_unseen): each sample's first visits, and
a train split whose samples forget some of the places their person knew."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from infra.errors import InputError
from pgt.data.dataset import Batch, SequenceDataset, Vocab
from pgt.training.augment import TransformedSplit
from preprocessing.sequences import UNSEEN


@dataclass
class FirstVisits:
    """When each user first visited each location in the training splits (train, or train and validation), and
    the day of every training sample's target; days count from the user's first tracked day (staypoints.parquet's
    start_day)."""

    first_day: torch.Tensor  # (U, V) float32; +inf where the user never visited the location in those splits
    sample_day: torch.Tensor  # (N,) float32, the day of each sample's target, in the splits' row order, one after another

    @classmethod
    def from_data_dir(cls, data_dir: Path | str, vocab: Vocab, splits: tuple[str, ...] = ("train",)) -> FirstVisits:
        data_dir = Path(data_dir)
        path = data_dir / "staypoints.parquet"
        if not path.is_file():
            raise InputError(path, "no such file; simulating unseen locations needs the staypoints "
                                   "that `pgt preprocess` writes next to the splits")
        staypoints = pl.read_parquet(path, columns=["user", "location", "started_at", "start_day", "split"])
        seen = staypoints.filter(pl.col("split").cast(pl.String).is_in(list(splits)))
        first = seen.group_by("user", "location").agg(pl.col("start_day").min())
        first_day = np.full((vocab.users, vocab.locations), np.inf, np.float32)
        first_day[first["user"].to_numpy(), first["location"].to_numpy()] = first["start_day"].to_numpy()
        samples = pl.concat([pl.read_parquet(data_dir / f"{split}.parquet", columns=["user", "target_started_at"])
                             for split in splits])
        days = samples.join(staypoints.select("user", "started_at", "start_day"), how="left", maintain_order="left",
                            left_on=["user", "target_started_at"], right_on=["user", "started_at"])["start_day"]
        if len(days) != len(samples) or days.null_count():
            files = " + ".join(str(data_dir / f"{split}.parquet") for split in splits)
            raise InputError(files, f"{days.null_count()} of {len(samples)} targets have no "
                                    f"staypoint in {path} (expected every target_started_at among the user's staypoints)")
        return cls(torch.from_numpy(first_day), torch.from_numpy(days.to_numpy().astype(np.float32)))

    def extended(self, again: np.ndarray) -> FirstVisits:
        """The same first visits for the samples followed by the samples at `again` once more (recent_repeat)."""
        return FirstVisits(self.first_day, torch.cat([self.sample_day, self.sample_day[torch.as_tensor(again)]]))


class UnseenSimulation(TransformedSplit):
    """The train split as later splits look to the model: there, locations first visited after the
    train period are all id 1 ("unseen in train", a quarter of GeoLife's test histories and targets),
    an id the train split never shows. For each sample this draws a known fraction f uniformly in
    [known_min, known_max] and turns every location the user first visited at least a day after the
    cutoff (f times the days from the user's first day to the sample) into id 1, in the history and the
    target alike; the simulated unseen places get slots as real ones do (a train place is its own location id).
    Draws come from torch's global RNG, which checkpoints save, so resumed runs draw the same."""

    def __init__(self, dataset: SequenceDataset, visits: FirstVisits, known_min: float, known_max: float):
        if len(visits.sample_day) != len(dataset):
            raise ValueError(f"first visits cover {len(visits.sample_day)} samples, the dataset has {len(dataset)}")
        super().__init__(dataset)
        self.visits, self.known_min, self.known_max = visits, known_min, known_max

    def to(self, device: torch.device | str) -> UnseenSimulation:
        """A copy whose split and first visits live on `device`."""
        moved = super().to(device)
        moved.visits = FirstVisits(self.visits.first_day.to(device), self.visits.sample_day.to(device))
        return moved

    def transform(self, batch: Batch, places: torch.Tensor, idx: torch.Tensor) -> tuple[Batch, torch.Tensor]:
        known = self.known_min + (self.known_max - self.known_min) * torch.rand(len(idx), device=idx.device)  # (B,)
        cutoff = known * self.visits.sample_day[idx] + 1  # (B,) locations first visited on this day or later are new
        first_history = self.visits.first_day[batch.users.unsqueeze(1), batch.locations]  # (B, T)
        first_target = self.visits.first_day[batch.users, batch.targets]  # (B,)
        new_history = (first_history >= cutoff.unsqueeze(1)) & (batch.locations > UNSEEN)  # padding stays 0
        new_target = (first_target >= cutoff) & (batch.targets > UNSEEN)
        locations = torch.where(new_history, UNSEEN, batch.locations)
        targets = torch.where(new_target, UNSEEN, batch.targets)
        return batch._replace(locations=locations, targets=targets), places

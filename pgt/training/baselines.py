"""Non-neural baselines: a per-user first-order Markov chain and the history's most frequent location.

Both score every location of the vocabulary for a Batch, so they share the metric code with the
neural models; `evaluate_baseline` fits one and writes metrics.json in the neural models' shape."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from infra.output import write_json_atomically
from pgt.config import TrainConfig
from pgt.data.dataset import Batch, SequenceDataset, Vocab, load_splits
from pgt.data.fetch import local_data
from pgt.data.scoring import Scores, evaluate
from pgt.network.vocabulary import extended_ids


class MarkovChain:
    """First-order transitions between consecutive train staypoints of each user. A location is scored
    by the user's transitions from the last visited location, then (to break ties or where the user
    has none) the global chain's, then the user's visit frequency."""

    def __init__(self, vocab: Vocab):
        self.V, self.U = vocab.locations, vocab.users
        self.user_transitions = sp.csr_matrix((self.U * self.V, self.V))
        self.global_transitions = sp.csr_matrix((self.V, self.V))
        self.user_frequency = np.zeros((self.U, self.V))

    def fit(self, staypoints: pl.DataFrame) -> MarkovChain:
        """staypoints: user, location, started_at, split (as `pgt preprocess` writes staypoints.parquet)."""
        train = staypoints.filter(pl.col("split") == "train").sort("user", "started_at")
        user = train["user"].to_numpy().astype(np.int64)
        loc = train["location"].to_numpy().astype(np.int64)
        same_user = user[1:] == user[:-1]
        src, dst, u = loc[:-1][same_user], loc[1:][same_user], user[1:][same_user]
        ones = np.ones(len(src))
        self.user_transitions = sp.csr_matrix((ones, (u * self.V + src, dst)), shape=(self.U * self.V, self.V))
        self.global_transitions = sp.csr_matrix((ones, (src, dst)), shape=(self.V, self.V))
        np.add.at(self.user_frequency, (user, loc), 1.0)
        return self

    @classmethod
    def from_data_dir(cls, data_dir: Path | str) -> MarkovChain:
        return cls(Vocab.from_manifest(data_dir)).fit(pl.read_parquet(Path(data_dir) / "staypoints.parquet"))

    def scores(self, batch: Batch) -> torch.Tensor:
        lengths = (batch.locations != 0).sum(dim=1)
        last = batch.locations[torch.arange(len(lengths)), lengths - 1].numpy()
        users = batch.users.numpy()
        user_t = self.user_transitions[users * self.V + last].toarray()  # (B, V)
        global_t = self.global_transitions[last].toarray()
        freq = self.user_frequency[users]
        g_max, f_max = self.global_transitions.max() + 1, self.user_frequency.max() + 1  # lexicographic order
        return torch.from_numpy(user_t * g_max * f_max + global_t * f_max + freq)


class MostFrequent:
    """The history's most frequent location first; ties go to the most recently visited one. With
    `use_slots` the unseen places of the history are counted apart, each in its slot's column V + slot - 1
    (the extended vocabulary); without, they all count as id 1, as the protocol has them."""

    def scores(self, batch: Batch, num_locations: int, use_slots: bool = False) -> torch.Tensor:
        B, T = batch.locations.shape
        ids, width = extended_ids(batch.locations, batch.slots if use_slots else None, num_locations)  # (B, T)
        valid = (batch.locations != 0).double()
        position = torch.arange(1, T + 1, dtype=torch.float64).expand(B, T)
        counts = torch.zeros(B, width, dtype=torch.float64).scatter_add(1, ids, valid)
        latest = torch.zeros(B, width, dtype=torch.float64).scatter_reduce(1, ids, position * valid, reduce="amax")
        return counts * (T + 1) + latest  # (B, width)


def evaluate_baseline(config: dict) -> dict:
    """Fit a non-neural baseline on train and write metrics.json in the same shape as the neural models."""
    cfg = TrainConfig.from_dict(config)
    data_dir = local_data(cfg.data_dir)
    vocab = Vocab.from_manifest(data_dir)
    splits = load_splits(data_dir, cfg.network.max_len, vocab)
    began = time.perf_counter()
    markov = MarkovChain.from_data_dir(data_dir) if cfg.model == "markov" else None
    fit_seconds = time.perf_counter() - began

    most_frequent = MostFrequent()

    def score(batch: Batch) -> Scores:
        if markov:  # the chain knows no place unseen in train: the slots rank last
            protocol = markov.scores(batch)
            width = extended_ids(batch.locations, batch.slots, vocab.locations)[1]
            return Scores(F.pad(protocol, (0, width - vocab.locations), value=-math.inf), protocol)
        return Scores(most_frequent.scores(batch, vocab.locations, use_slots=True),
                      most_frequent.scores(batch, vocab.locations))

    def run(dataset: SequenceDataset) -> dict:
        return evaluate(score, dataset, cfg.eval_batch_size, torch.device("cpu"))

    result = {"model": cfg.model, "test": run(splits["test"]), "validation": run(splits["validation"]),
              "deployment": {split: run(splits[split].anchored_at_last_visit()) for split in ("validation", "test")},
              "best_epoch": 0, "epochs_run": 0, "early_stopped": False, "workers": 1,
              "train_seconds": round(fit_seconds, 3), "samples_per_second": 0.0, "parameters": 0,
              "history": [], "config": cfg.to_dict()}
    write_json_atomically(Path(cfg.out_dir) / "metrics.json", result, indent=2, default=float)
    return result

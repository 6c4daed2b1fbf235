"""Scoring a split: a model's scores of every sample, the ranks of the targets, and the protocol's metrics
(pgt.data.metrics), for training's validation as for `pgt evaluate`. Under DDP each rank scores its share."""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol

import numpy as np
import torch
import torch.distributed as dist

from pgt.config import ModelConfig
from pgt.network.daygap import live_log_probs
from pgt.network.vocabulary import merge_slots, restore_new_place_odds
from pgt.data.dataset import Batch, SequenceDataset
from pgt.data.metrics import Scored, compute_all, target_ranks, top1


class Worker(Protocol):
    """Where a scoring pass runs among several (pgt.training.worker.Worker is one): this rank of world_size, on
    device."""

    rank: int
    world_size: int
    device: torch.device


class Scores(NamedTuple):
    extended: torch.Tensor  # (B, V + S) scores over the known ids and the batch's slots (S = 0 without slots)
    protocol: torch.Tensor  # (B, V) scores over the known ids, every unseen place in id 1

    @classmethod
    def from_log_probs(cls, extended: torch.Tensor, cfg: ModelConfig) -> Scores:
        """A model's (B, V + S) log-probabilities and the protocol's view of them: a new place at the odds an
        unweighted loss would have given it (vocabulary.restore_new_place_odds), every slot merged into id 1
        (vocabulary.merge_slots). The strict ranks read the model's own."""
        return cls(extended, merge_slots(restore_new_place_odds(extended, cfg.new_place_log_odds), cfg.num_locations))



def model_scores(model: torch.nn.Module, live: bool = False) -> Callable[[Batch], Scores]:
    """A scorer for `score_dataset`: the model's log-probabilities in eval mode; the protocol's id 1 takes the
    probability of a new place and of every slot (Scores.from_log_probs). `live`: the inputs count recency from the
    last visit's day, as a live prediction's do (daygap.live_log_probs)."""
    model.eval()
    if live:
        return lambda batch: Scores.from_log_probs(live_log_probs(model, *batch.inputs()), model.cfg)
    return lambda batch: Scores.from_log_probs(model(*batch.inputs()).log_probs.float(), model.cfg)



@torch.no_grad()
def score_dataset(score: Callable[[Batch], Scores], dataset: SequenceDataset, batch_size: int, device: torch.device,
            indices: np.ndarray | None = None, loss: Callable[[Batch, torch.Tensor], torch.Tensor] | None = None,
            worker: Worker | None = None) -> tuple[Scored, float | None]:
    """(the scores of the given samples, all by default, as metrics.Scored; the mean loss or None).

    `score(batch)` gives Scores, higher first. `loss(batch, extended scores)`, when given, is summed and
    averaged. With a worker of a larger world, each rank scores every world_size-th sample and the
    results are summed across ranks (each sample is scored by one rank), so every rank returns the
    whole split's predictions."""
    indices = np.arange(len(dataset)) if indices is None else indices
    order = indices[np.argsort(dataset.lengths[indices].numpy(), kind="stable")]  # little padding
    if worker is not None and worker.world_size > 1:
        order = order[worker.rank::worker.world_size]
    # rows: protocol rank, protocol top-1, strict rank, strict top-1; every sample is written by one rank. They and
    # the loss stay on the device until the pass ends: no batch waits for the one before it to reach the host
    found = torch.zeros(4, len(dataset), dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for start in range(0, len(order), batch_size):
        chunk = torch.from_numpy(order[start:start + batch_size])
        batch = dataset.__getitems__(chunk.tolist()).to(device, non_blocking=True)
        scores = score(batch)
        if loss is not None:
            loss_sum += loss(batch, scores.extended).detach().double()
        found[:, chunk.to(device, non_blocking=True)] = ranks_and_top1(scores, batch)
    if worker is not None and worker.world_size > 1:
        totals = torch.cat([found.flatten().double(), loss_sum.reshape(1)]).to(worker.device)
        dist.all_reduce(totals)  # float64 holds every rank and id exactly
        found, loss_sum = totals[:-1].round().long().view(4, -1), totals[-1]
    found, loss_sum = found.cpu(), loss_sum.cpu()
    mean_loss = float(loss_sum) / max(len(indices), 1) if loss is not None else None
    return scored_samples(found, dataset, indices), mean_loss


def ranks_and_top1(scores: Scores, batch: Batch) -> torch.Tensor:
    """(4, B): each sample's protocol rank of its target, protocol top-1, strict rank, strict top-1."""
    strict_targets = batch.strict_targets(scores.protocol.shape[1])
    return torch.stack([target_ranks(scores.protocol, batch.targets), top1(scores.protocol),
                        target_ranks(scores.extended, strict_targets), top1(scores.extended)])


def scored_samples(found: torch.Tensor, dataset: SequenceDataset, indices: np.ndarray) -> Scored:
    """metrics.Scored of the given samples from the (4, N) rows of ranks_and_top1 over the whole split."""
    pick = torch.from_numpy(indices)
    ranks, best, strict_ranks, strict_best = (row[pick].numpy() for row in found)
    return Scored(ranks=ranks, top1=best, targets=dataset.targets[pick].numpy(),
                  in_history=dataset.in_history()[indices], strict_ranks=strict_ranks, strict_top1=strict_best,
                  place_in_history=dataset.place_in_history()[indices], new_place=dataset.new_place()[indices],
                  target_kind=dataset.target_kinds[indices] if dataset.target_kinds is not None else None)



def evaluate(score: Callable[[Batch], Scores], dataset: SequenceDataset, batch_size: int, device: torch.device,
             loss: Callable[[Batch, torch.Tensor], torch.Tensor] | None = None, worker: Worker | None = None) -> dict:
    """Metrics over the whole split (metrics.compute_all), plus `loss` (the training criterion's mean) when given.
    Under DDP every rank scores its share and gets the whole split's metrics."""
    scored, mean_loss = score_dataset(score, dataset, batch_size, device, loss=loss, worker=worker)
    metrics = compute_all(scored)
    return metrics if mean_loss is None else {**metrics, "loss": mean_loss}


def packed_scores(model, live: bool = False) -> Callable[[Batch], Scores]:
    """A `score_dataset` scorer for a logged PackedModel: its extended log-probabilities and the protocol's merge;
    `live` as for model_scores (PackedModel.live)."""
    forward = model.live if live else model
    return lambda batch: Scores.from_log_probs(forward(batch.packed()), model.cfg)

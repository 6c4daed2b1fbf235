"""The training loss: cross-entropy with label smoothing over the model's log-probabilities, new-place targets
at their own weight, an ensemble's members each with its own loss."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from pgt.config import HOURS, STAY_EDGES_MIN, ModelConfig, TrainConfig
from pgt.data.dataset import Batch
from pgt.network.daygap import days_after_last_visit
from pgt.network.model import Output
from preprocessing.sequences import UNSEEN


def training_targets(batch: Batch, model_cfg: ModelConfig) -> torch.Tensor:
    """What the loss asks for: with slots, the extended target (a slot, or 1 for a new place); else the protocol's."""
    return batch.extended_targets(model_cfg.num_locations) if model_cfg.unseen_slots else batch.targets


def criterion(log_probs: torch.Tensor, batch: Batch, model_cfg: ModelConfig, cfg: TrainConfig,
              reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy with label smoothing on the (B, V + S) log-probabilities; with slots, samples whose target
    is a new place weigh cfg.new_place_weight. "mean" divides by the batch size, "sum" does not."""
    targets = training_targets(batch, model_cfg)
    if cfg.static_width and model_cfg.unseen_slots and cfg.label_smoothing:  # the output may have padded slot columns
        columns = model_cfg.num_locations + batch.slots.amax()  # () the batch's real width, on the device: no sync
        losses = smoothed_cross_entropy(log_probs, targets, cfg.label_smoothing, columns)
    else:
        losses = F.cross_entropy(log_probs, targets, label_smoothing=cfg.label_smoothing, reduction="none")  # (B,)
    if model_cfg.unseen_slots and cfg.new_place_weight != 1.0:
        losses = torch.where(targets == UNSEEN, cfg.new_place_weight * losses, losses)
    return losses.sum() if reduction == "sum" else losses.mean()


def smoothed_cross_entropy(log_probs: torch.Tensor, targets: torch.Tensor, smoothing: float,
                           columns: torch.Tensor) -> torch.Tensor:
    """(B,) F.cross_entropy's label smoothing over the first `columns` of (B, C) log-probabilities only: what it
    gives on those columns alone, so that the slot columns a static shape pads (`pad_slots`) change nothing:
    (1 - smoothing) * -log p[target] + smoothing * mean over the columns of -log p."""
    nll = -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)  # (B,)
    kept = torch.arange(log_probs.shape[1], device=log_probs.device) < columns  # (C,)
    spread = -(log_probs * kept).sum(dim=1) / kept.sum()  # (B,)
    return (1 - smoothing) * nll + smoothing * spread


def training_loss(out: Output, batch: Batch, model_cfg: ModelConfig, cfg: TrainConfig) -> torch.Tensor:
    """What a batch backpropagates: the criterion of the model's log-probabilities, or for an ensemble the sum of
    its members' criteria, so that each member gets the gradient it would get trained alone; with distance_head and
    arrival_head, each network's auxiliary losses at their weights beside its criterion."""
    one = out.members is None
    loss = criterion(out.log_probs.float(), batch, model_cfg, cfg) if one else \
        sum(criterion(log_probs.float(), batch, model_cfg, cfg) for log_probs in out.members)
    if out.distance is not None:
        each = [out.distance] if one else out.distance  # (B, bands) per network
        loss = loss + model_cfg.distance_head * sum(distance_loss(logits, out.bands, batch) for logits in each)
    if out.arrival is not None:
        each = [out.arrival] if one else out.arrival  # (B, arrival_classes * arrival_days) per network
        loss = loss + model_cfg.arrival_head * sum(arrival_loss(logits, batch, model_cfg.time_slots,
                                                                model_cfg.arrival_classes) for logits in each)
    if out.stay is not None:
        each = [out.stay] if one else out.stay  # (B, stay bands) per network
        loss = loss + model_cfg.stay_head * sum(stay_loss(logits, batch) for logits in each)
    return loss


def distance_loss(distance: torch.Tensor, bands: torch.Tensor, batch: Batch) -> torch.Tensor:
    """() The auxiliary task's cross-entropy: (B, bands) logits against the band of each row's target place from
    its current place, read off the (B, V) bands of every location id; averaged over the rows whose target has a
    band (a place unseen in train has no coordinates: band 0, which counts for nothing). No host synchronisation."""
    target = bands.gather(1, batch.targets.unsqueeze(1)).squeeze(1)  # (B,)
    losses = F.cross_entropy(distance.float(), target, reduction="none")  # (B,)
    kept = target > 0
    return (losses * kept).sum() / kept.sum().clamp_min(1)


def arrival_loss(arrival: torch.Tensor, batch: Batch, time_slots: int, classes: int = HOURS) -> torch.Tensor:
    """() The auxiliary task's cross-entropy: (B, classes * days) logits against the class of the day (by default
    its hour) each row's target visit starts in (its time slot of `time_slots` a day, times classes // time_slots),
    averaged over the rows that have one (target_times -1: none). Over one day, the class of the day; over more,
    counted from the midnight before the last visit's day, the days after it read off the protocol's recency
    (daygap.days_after_last_visit; later days count as the last). No host synchronisation."""
    if batch.target_times is None:
        raise ValueError("arrival_loss needs the batch's target_times (SequenceDataset.gather gives them)")
    known = batch.target_times >= 0  # (B,)
    target = (batch.target_times.clamp_min(0) * classes) // time_slots  # (B,) the class of the day
    days = arrival.shape[1] // classes
    if days > 1:
        target = target + classes * days_after_last_visit(batch.locations, batch.recency).clamp(0, days - 1)  # (B,)
    losses = F.cross_entropy(arrival.float(), target, reduction="none")  # (B,)
    return (losses * known).sum() / known.sum().clamp_min(1)


def stay_loss(stay: torch.Tensor, batch: Batch) -> torch.Tensor:
    """() The auxiliary task's cross-entropy: (B, bands) logits against the band of how long each row's target visit
    lasts (STAY_EDGES_MIN), averaged over the rows that know it (target_minutes -1: none). No host synchronisation."""
    if batch.target_minutes is None:
        raise ValueError("stay_loss needs the batch's target_minutes (SequenceDataset.gather gives them)")
    known = batch.target_minutes >= 0  # (B,)
    # (B,) 0 .. len(edges): the edges reached, from Python numbers (no tensor made here, so a captured step can hold it)
    target = sum((batch.target_minutes >= edge).long() for edge in STAY_EDGES_MIN)
    losses = F.cross_entropy(stay.float(), target, reduction="none")  # (B,)
    return (losses * known).sum() / known.sum().clamp_min(1)


def cross_entropy_sum(model_cfg: ModelConfig, cfg: TrainConfig) -> Callable[[Batch, torch.Tensor], torch.Tensor]:
    """The training criterion summed over a batch, for `score_dataset`'s validation loss."""
    return lambda batch, log_probs: criterion(log_probs, batch, model_cfg, cfg, reduction="sum")



def training_pass(model: torch.nn.Module, batch: Batch, cfg: TrainConfig, amp_dtype: torch.dtype | None = None):
    """The model's output on a train batch: under autocast to amp_dtype when given; with static_width, T slot columns
    (pad_slots)."""
    with torch.autocast(batch.locations.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        return model(*batch.inputs(), pad_slots=bool(cfg.static_width))


def batch_loss(model: torch.nn.Module, batch: Batch, model_cfg: ModelConfig, cfg: TrainConfig,
               amp_dtype: torch.dtype | None = None) -> torch.Tensor:
    """A train batch's loss: the model's pass (training_pass), then training_loss in float32."""
    return training_loss(training_pass(model, batch, cfg, amp_dtype), batch, model_cfg, cfg)

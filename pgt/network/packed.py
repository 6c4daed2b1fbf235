"""A trained model behind one input tensor, as MLflow logs and serves it (`PackedModel`), and the bounds of each of
that tensor's rows (`input_tables`, `check_packed`): a request's values outside the model's tables are named, not
looked up."""

from __future__ import annotations

import torch
import torch.nn as nn

from infra.errors import InputError
from pgt.config import ModelConfig
from pgt.network.daygap import live_log_probs


class PackedModel(nn.Module):
    """A trained model behind one input tensor, as MLflow logs and serves it: x (B, 7, T) int64 stacks
    locations, users (repeated along T), time slots, weekdays, recency, durations and slots, each as the
    data loader gives them (`Batch.packed()`; a (B, 6, T) input has no slots); the output is the
    (B, V + S) log-probabilities, S = 0 for a model without `unseen_slots`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.cfg = model.cfg

    @staticmethod
    def unpacked(x: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """The model's positional arguments from x: (B, T) rows, the user once per sample, slots None without them."""
        locations, users, times, weekdays, recency, durations, *slots = x.unbind(1)  # (B, T) each
        return locations, users[:, 0], times, weekdays, recency, durations, slots[0] if slots else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(*self.unpacked(x)).log_probs.float()

    def live(self, x: torch.Tensor) -> torch.Tensor:
        """forward's output for an input whose recency counts from the last visit's day (a live prediction without
        a prediction time): mixed over the days the next visit may fall on where the model has a day_gap_prior."""
        return live_log_probs(self.model, *self.unpacked(x))


def input_tables(cfg: ModelConfig) -> dict[str, int]:
    """The largest value each input may hold as the data loader gives it (the features stored + 1, 0 pads), by the
    split column it comes from, in PackedModel's row order: the model's embedding tables end there."""
    return {"locations": cfg.num_locations - 1, "user": cfg.num_users - 1, "time_slots": cfg.time_slots,
            "weekdays": cfg.weekdays, "recency": cfg.recency_rows, "durations": cfg.duration_rows}


def check_packed(x: torch.Tensor, cfg: ModelConfig) -> None:
    """InputError naming the row of a (B, 7, T) input (PackedModel's) that lies outside the model's tables."""
    tables = [*input_tables(cfg).items(), ("slots", x.shape[2])]
    for row, (name, top) in enumerate(tables[:x.shape[1]]):
        values = x[:, row]
        if int(values.min()) < 0 or int(values.max()) > top:
            raise InputError("the (B, 7, T) input", f"row {row} ({name}) holds {int(values.min())}.."
                                                    f"{int(values.max())}, but the model's table takes 0..{top}")
    if not bool((x[:, 0, 0] != 0).all()):
        raise InputError("the (B, 7, T) input", "every history starts at column 0: row 0 (locations) is 0 there, "
                                                "which pads")

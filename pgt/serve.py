"""Use a model logged in MLflow: metrics on a split (`pgt evaluate`), top-k scoring of new sequences (`pgt predict`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pgt.data import UNSEEN, Batch, SequenceDataset
from pgt.metrics import compute_all
from pgt.tracking import load_model
from pgt.train import Scores, predict


def packed_scores(model) -> Callable[[Batch], Scores]:
    """A `predict` scorer for a logged PackedModel: its extended log-probabilities and the protocol's merge."""
    return lambda batch: Scores.from_log_probs(model(batch.packed()), model.cfg.num_locations)


def evaluate_model(model_uri: str, data_dir: Path, split: str = "test", tracking_uri: str | None = None) -> dict:
    """The metrics of SPEC §4, protocol and strict, for a logged PackedModel on one split of a `pgt preprocess` folder."""
    SequenceDataset.check_columns(Path(data_dir) / f"{split}.parquet")
    model = load_model(model_uri, tracking_uri)
    dataset = SequenceDataset.from_parquet(Path(data_dir) / f"{split}.parquet", model.cfg.max_len)
    _check_vocab(model, dataset, Path(data_dir) / f"{split}.parquet")
    scored, _ = predict(packed_scores(model), dataset, 1024, torch.device("cpu"))
    return compute_all(scored)


@torch.no_grad()
def predict_file(model_uri: str, input_path: Path, out_path: Path, top_k: int = 5, tracking_uri: str | None = None) -> int:
    """Write, for every sequence of `input_path`, its top-k predictions and their probabilities (highest first).

    Output columns: row (the input's row number), user, top_locations (location ids; 1 is a place unseen in
    train), top_places (the dataset-wide place id where a prediction is an unseen place of the history, i.e. a
    slot of the extended vocabulary, else null), top_probabilities, new_place_probability (the probability of
    id 1: a new place, none of the known or visited ones, for a model with slots; any place unseen in train
    without), and target and target_place when the input has them. Returns the number of rows."""
    SequenceDataset.check_columns(input_path, require_target=False)  # before the model's download
    model = load_model(model_uri, tracking_uri)
    dataset = SequenceDataset.from_parquet(input_path, model.cfg.max_len, require_target=False)
    _check_vocab(model, dataset, input_path)
    V = model.cfg.num_locations
    k = min(top_k, V - 1)
    locations = np.zeros((len(dataset), k), np.int64)
    places = np.full((len(dataset), k), -1, np.int64)
    probabilities = np.zeros((len(dataset), k), np.float32)
    new_place = np.zeros(len(dataset), np.float32)
    for start in range(0, len(dataset), 1024):
        idx = list(range(start, min(start + 1024, len(dataset))))
        batch = dataset.__getitems__(idx)
        log_probs = model(batch.packed())  # (B, V + S)
        new_place[idx] = log_probs[:, UNSEEN].exp().numpy()
        log_probs[:, 0] = -torch.inf  # id 0 pads histories; it is never a place
        top = torch.topk(log_probs, k, dim=1)
        slot = (top.indices - V + 1).clamp_min(0)  # (B, k) the slot of each prediction, 0 for known ids and 1
        # the place of a slot: that of its first visit in the history
        first = (batch.slots.unsqueeze(1) == slot.unsqueeze(2)) & (slot.unsqueeze(2) > 0)  # (B, k, T)
        slot_place = dataset.places[idx, :batch.slots.shape[1]].gather(1, first.to(torch.uint8).argmax(dim=2))
        places[idx] = torch.where(slot > 0, slot_place, -1).numpy()
        locations[idx] = torch.where(slot > 0, UNSEEN, top.indices).numpy()
        probabilities[idx] = top.values.exp().numpy()
    columns = {
        "row": pa.array(np.arange(len(dataset))),
        "user": pa.array(dataset.users.numpy()),
        "top_locations": pa.array(list(locations), type=pa.list_(pa.int64())),
        "top_places": pa.array([[None if p < 0 else int(p) for p in row] for row in places], type=pa.list_(pa.int64())),
        "top_probabilities": pa.array(list(probabilities), type=pa.list_(pa.float32())),
        "new_place_probability": pa.array(new_place),
    }
    if "target" in pq.read_schema(input_path).names:
        columns["target"] = pa.array(dataset.targets.numpy())
        columns["target_place"] = pa.array(dataset.target_places.numpy())
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    pq.write_table(pa.table(columns), tmp)
    tmp.replace(out_path)
    return len(dataset)


def _check_vocab(model, dataset: SequenceDataset, path: Path) -> None:
    """Ids beyond the model's tables mean the sequences come from another preprocessing run."""
    checks = [("locations", dataset.locations, model.cfg.num_locations), ("user", dataset.users, model.cfg.num_users)]
    for column, values, size in checks:
        if len(values) and int(values.max()) >= size:
            raise ValueError(f"{path}: column {column} holds id {int(values.max())}, but the model knows ids "
                             f"0..{size - 1}; score sequences from the preprocessing run the model was trained on")

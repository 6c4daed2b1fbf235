"""Use a model logged in MLflow: metrics on a split (`pgt evaluate`), top-k scoring of new sequences (`pgt predict`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pgt.data import SequenceDataset
from pgt.metrics import compute_all
from pgt.tracking import load_model
from pgt.train import predict


def evaluate_model(model_uri: str, data_dir: Path, split: str = "test", tracking_uri: str | None = None) -> dict:
    """The metrics of SPEC §4 for a logged PackedModel on one split of a `pgt preprocess` folder."""
    SequenceDataset.check_columns(Path(data_dir) / f"{split}.parquet")
    model = load_model(model_uri, tracking_uri)
    dataset = SequenceDataset.from_parquet(Path(data_dir) / f"{split}.parquet", model.cfg.max_len)
    _check_vocab(model, dataset, Path(data_dir) / f"{split}.parquet")
    ranks, best, _ = predict(lambda batch: model(batch.packed()), dataset, 1024, torch.device("cpu"))
    return compute_all(ranks, best, dataset.targets.numpy(), dataset.in_history())


@torch.no_grad()
def predict_file(model_uri: str, input_path: Path, out_path: Path, top_k: int = 5, tracking_uri: str | None = None) -> int:
    """Write, for every sequence of `input_path`, its top-k locations and their probabilities (highest first).
    Output columns: row (the input's row number), user, top_locations, top_probabilities, and target when
    the input has one. Returns the number of rows."""
    SequenceDataset.check_columns(input_path, require_target=False)  # before the model's download
    model = load_model(model_uri, tracking_uri)
    dataset = SequenceDataset.from_parquet(input_path, model.cfg.max_len, require_target=False)
    _check_vocab(model, dataset, input_path)
    k = min(top_k, model.cfg.num_locations)
    locations = np.zeros((len(dataset), k), np.int64)
    probabilities = np.zeros((len(dataset), k), np.float32)
    for start in range(0, len(dataset), 1024):
        idx = list(range(start, min(start + 1024, len(dataset))))
        log_probs = model(dataset.__getitems__(idx).packed())  # (B, V)
        log_probs[:, 0] = -torch.inf  # id 0 pads histories; it is never a place
        top = torch.topk(log_probs, k, dim=1)
        locations[idx], probabilities[idx] = top.indices.numpy(), top.values.exp().numpy()
    columns = {
        "row": pa.array(np.arange(len(dataset))),
        "user": pa.array(dataset.users.numpy()),
        "top_locations": pa.array(list(locations), type=pa.list_(pa.int64())),
        "top_probabilities": pa.array(list(probabilities), type=pa.list_(pa.float32())),
    }
    if "target" in pq.read_schema(input_path).names:
        columns["target"] = pa.array(dataset.targets.numpy())
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

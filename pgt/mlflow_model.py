"""The MLflow model of a trained PGT, logged as models-from-code: nothing is pickled.

MLflow logs this file as the model's code, `weights.pt` (a state_dict, read with
`torch.load(weights_only=True)`) and `model_config.json` as its artifacts, and the pgt package as its
code path. Loading builds `PackedModel` from the config and loads the weights, so models load with
`MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false`, in `pgt evaluate`/`predict` and in `mlflow models serve`.

Input: (B, 7, T) int64 as `Batch.packed()` gives it; output: (B, V + S) float32 log-probabilities.

The model is self-contained: with the weights it carries the training data's location table (id,
source id, latitude, longitude), its user table and its `manifest.json` (the preprocessing config and
every feature table size), loaded as `.locations`, `.users` (pyarrow tables) and `.manifest` (a dict).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import torch
from mlflow.pyfunc import PythonModel

WEIGHTS, CONFIG = "weights", "model_config"  # artifact keys: the model itself
LOCATIONS, USERS, MANIFEST = "locations", "users", "manifest"  # the data it was trained on: tables and preprocessing


class PGTModel(PythonModel):
    """A pyfunc around `pgt.model.PackedModel`; `.packed` is the torch module itself."""

    packed: torch.nn.Module | None = None
    locations = users = None  # pyarrow tables of the training data's vocabularies
    manifest: dict | None = None  # the training data's manifest: config, vocab, counts

    def load_context(self, context) -> None:
        from pgt.model import ModelConfig, PackedModel, build_model

        cfg = ModelConfig(**json.loads(Path(context.artifacts[CONFIG]).read_text()))
        model = build_model(cfg)
        model.load_state_dict(torch.load(context.artifacts[WEIGHTS], map_location="cpu", weights_only=True))
        self.packed = PackedModel(model).eval()
        import pyarrow.parquet as pq

        artifacts = context.artifacts
        self.locations = pq.read_table(artifacts[LOCATIONS]) if LOCATIONS in artifacts else None
        self.users = pq.read_table(artifacts[USERS]) if USERS in artifacts else None
        self.manifest = json.loads(Path(artifacts[MANIFEST]).read_text()) if MANIFEST in artifacts else None

    def predict(self, context, model_input, params=None) -> np.ndarray:
        x = torch.as_tensor(np.asarray(model_input), dtype=torch.int64)
        if x.dim() != 3 or x.shape[1] not in (6, 7):
            raise ValueError(f"expected int64 input of shape (B, 7, T) as Batch.packed() gives it, got {tuple(x.shape)}")
        with torch.no_grad():
            return self.packed(x).numpy()


mlflow.models.set_model(PGTModel())

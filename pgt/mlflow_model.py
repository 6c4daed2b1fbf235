"""The MLflow model of a trained PGT, logged as models-from-code: nothing is pickled.

MLflow logs this file as the model's code, `weights.pt` (a state_dict, read with
`torch.load(weights_only=True)`) and `model_config.json` as its artifacts, and the pgt package as its
code path. Loading builds `PackedModel` from the config and loads the weights, so models load with
`MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false`, in `pgt evaluate`/`predict` and in `mlflow models serve`.

Input: (B, 7, T) int64 as `Batch.packed()` gives it; output: (B, V + S) float32 log-probabilities.

The model is self-contained: with the weights it carries the training data's location table (id,
source id, latitude, longitude), its user table and its `manifest.json` (the preprocessing config and
every feature table size), loaded as `.locations`, `.users` (pyarrow tables) and `.manifest` (a dict),
and every place with the staypoints DBSCAN clustered, from which `.fitted()` rebuilds the fitted
preprocessing (preprocessing/fitted.py) that turns raw GPS into the model's ids.

`predict` (and `mlflow models serve`) takes
- a (B, 7, T) int64 array as `Batch.packed()` gives it: returns (B, V + S) float32 log-probabilities;
- a table of GPS points (user_id, tracked_at, latitude, longitude) or staypoints (user_id, started_at,
  finished_at, latitude, longitude): returns, per user, the top-k next places (rank, place_id, latitude,
  longitude, probability, new_place_probability; pgt.serve.place_predictions), times as ISO 8601 text;
- a table of sequences in the columns of a `pgt preprocess` split: the same, one block per row.
params {"top_k": K} sets k (default TOP_K).
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
PLACES, CLUSTERED = "places", "location_staypoints"  # every place and the staypoints DBSCAN clustered: new data joins them
DATA_FILES = {LOCATIONS: "locations.parquet", USERS: "users.parquet", MANIFEST: "manifest.json",
              PLACES: "places.parquet", CLUSTERED: "location_staypoints.parquet"}  # artifact key -> file of the data folder
TOP_K = 5  # places per served prediction unless the request's params say `top_k`


class PGTModel(PythonModel):
    """A pyfunc around `pgt.model.PackedModel`; `.packed` is the torch module itself."""

    # predict takes several input kinds (the module docstring) and checks them itself: MLflow's type-hint
    # validation (and its warning that predict has no type hints) does not apply
    _skip_type_hint_validation = True

    packed: torch.nn.Module | None = None
    data_files: dict = {}  # artifact key -> local file of the training data's tables
    _fitted = None
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
        self.data_files = {key: Path(artifacts[key]) for key in DATA_FILES if key in artifacts}
        self._fitted = None

    def fitted(self, source: str = "the model"):
        """The fitted preprocessing of the training data (built once): raw GPS -> the model's ids."""
        if self._fitted is None:
            import polars as pl

            from preprocessing.fitted import FittedPreprocessing

            missing = [DATA_FILES[k] for k in (MANIFEST, PLACES, CLUSTERED, USERS) if k not in self.data_files]
            if missing:
                raise ValueError(f"{source}: carries no {', '.join(missing)} (logged before models carried their "
                                 "preprocessing); train it again to score raw GPS")
            self._fitted = FittedPreprocessing.from_tables(
                self.manifest, pl.read_parquet(self.data_files[PLACES]), pl.read_parquet(self.data_files[CLUSTERED]),
                pl.from_arrow(self.users), source)
        return self._fitted

    def predict(self, context, model_input, params=None):
        import pandas as pd

        if isinstance(model_input, pd.DataFrame):
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

            from preprocessing.errors import InputError

            top_k = int((params or {}).get("top_k", TOP_K))
            try:
                if top_k < 1:
                    raise ValueError(f"top_k must be at least 1, got {top_k}")
                return self._predict_table(model_input, top_k)
            except (InputError, ValueError, KeyError) as exc:  # a bad request: HTTP 400 with the reason
                raise MlflowException(f"bad request: {exc}", error_code=INVALID_PARAMETER_VALUE) from None
        x = torch.as_tensor(np.asarray(model_input), dtype=torch.int64)
        if x.dim() != 3 or x.shape[1] not in (6, 7):
            raise ValueError(f"expected int64 input of shape (B, 7, T) as Batch.packed() gives it, got {tuple(x.shape)}")
        with torch.no_grad():
            return self.packed(x).numpy()

    def _predict_table(self, frame, top_k: int):
        """Top-k places with coordinates for GPS points, staypoints or sequences (the module docstring)."""
        import tempfile

        import pandas as pd
        import polars as pl

        from pgt.serve import place_predictions, predict_applied, top_k_predictions
        from preprocessing.pipeline import StageLog, apply_fitted

        columns = set(frame.columns)
        if "locations" in columns:  # sequences, as a split holds them
            from pgt.data import SequenceDataset

            samples = pl.from_pandas(frame)
            dataset = SequenceDataset.from_arrow(samples.to_arrow(), self.packed.cfg.max_len, "request")
            if "source_user_id" not in columns:
                samples = samples.with_columns(source_user_id=pl.col("user"))
            if "history_end" not in columns and "target_started_at" not in columns:
                samples = samples.with_columns(history_end=pl.lit(None, pl.Datetime("us", "UTC")))
            places = self.fitted().places
            result = place_predictions(top_k_predictions(self.packed, dataset, top_k), samples, places, "request")
        else:
            input_format = "positionfixes" if "tracked_at" in columns else "staypoints"
            shm = Path("/dev/shm")  # a memory-backed folder where there is one: the request never touches disk
            with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
                path = Path(tmp) / "request.parquet"
                pl.from_pandas(frame).write_parquet(path)
                applied = apply_fitted(path, input_format, self.fitted(), StageLog(sample_memory=False), evaluation=False)
            result = predict_applied(self.packed, applied, top_k, evaluation=False)
        records = result.with_columns(pl.col("time").cast(pl.String)).to_dicts()
        return pd.DataFrame(records, columns=result.columns, dtype=object)  # ints stay ints, JSON null (not NaN) for none


mlflow.models.set_model(PGTModel())

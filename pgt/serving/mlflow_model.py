"""The MLflow model of a trained PGT, logged as models-from-code: nothing is pickled.

MLflow logs this file as the model's code, `weights.pt` (a state_dict, read with
`torch.load(weights_only=True)`) and `model_config.json` as its artifacts, and the pgt package as its
code path. Loading builds `PackedModel` from the config and loads the weights (a transformer, or an ensemble of
them, stacked into one batched pass, pgt/network/stacked.py), so models load with
`MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false`, in `pgt evaluate`/`predict` and in `mlflow models serve`.

The model is self-contained: with the weights it carries the training data's location table (id,
source id, latitude, longitude), its user table and its `manifest.json` (the preprocessing config and
every feature table size), loaded as `.locations`, `.users` (pyarrow tables) and `.manifest` (a dict),
and every place with the staypoints DBSCAN clustered, from which `.fitted()` rebuilds the fitted
preprocessing (preprocessing/fitted.py) that turns raw GPS into the model's ids.

`predict` takes
- a (B, 7, T) int64 array as `Batch.packed()` gives it: returns (B, V + S) float32 log-probabilities (through the
  python model itself, `unwrap_python_model()`, or `pgt serve`: MLflow's pyfunc checks a request against the
  signature, whose column schema describes the tables only);
- a table of GPS points (user_id, tracked_at, latitude, longitude) or staypoints (user_id, started_at,
  finished_at, latitude, longitude): returns, per user, the top-k next places (rank, place_id, latitude,
  longitude, probability, new_place_probability; pgt.serving.inference.place_predictions), times as ISO 8601 text;
- a table of sequences in the columns of a `pgt preprocess` split: the same, one block per row.
params {"top_k": K} sets k (default TOP_K); {"at": "ISO 8601 time"} the moment GPS points or staypoints are
predicted for (default: the end of each user's last visit; recency counts from its day).

The logged signature (input_schema) names every column of the three table forms, all optional, and the two params;
the input example is a known person's staypoints (example_requests). So the MLflow UI shows what the model takes,
and MLflow's own tools (pyfunc predict, `mlflow models serve`) check a request before predict sees it.

`answer` (what `pgt serve` sends) gives a table request's predictions together with the rows it set aside and the
people it could not score, each with the reason: nothing a request holds is dropped unsaid.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import mlflow
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel
from mlflow.types import DataType
from mlflow.types.schema import AnyType, Array, ColSpec, Schema

from infra.errors import InputError
from infra.settings import stored_settings
from pgt.config import ModelConfig
from pgt.data.dataset import MemoryLayout, SequenceDataset
from pgt.network.model import build_model
from pgt.network.packed import PackedModel, check_packed
from pgt.network.stacked import for_inference
from pgt.serving.inference import (
    SAMPLE_TIME_COLUMNS,
    check_vocabulary,
    place_predictions,
    predict_applied,
    prediction_time,
    top_k_of,
    top_k_predictions,
)
from preprocessing.readers import GEOMETRY_COLUMNS, POSITIONFIX_COLUMNS, STAYPOINT_TIME_COLUMNS

WEIGHTS, CONFIG = "weights", "model_config"  # artifact keys: the model itself
LOCATIONS, USERS, MANIFEST = "locations", "users", "manifest"  # the data it was trained on: tables and preprocessing
PLACES, CLUSTERED = "places", "location_staypoints"  # every place and the staypoints DBSCAN clustered: new data joins them
VISITS = "visits"  # the training data's visits, which a model that remembers (memory_size) recalls for known people
DATA_FILES = {LOCATIONS: "locations.parquet", USERS: "users.parquet", MANIFEST: "manifest.json",
              PLACES: "places.parquet", CLUSTERED: "location_staypoints.parquet",
              VISITS: "staypoints.parquet"}  # artifact key -> file of the data folder


class Answer(NamedTuple):
    """A table request's answer: the predictions, and what of the request they do not cover."""

    predictions: pl.DataFrame  # the top-k rows (pgt.serving.inference.place_predictions), times as ISO 8601 text
    quarantined: pl.DataFrame  # row (0-based, in the request's order), reason: the rows set aside
    not_scored: pl.DataFrame  # source_user_id (as the request gives it), reason: its people without a prediction


class PGTModel(PythonModel):
    """A pyfunc around `pgt.network.packed.PackedModel`; `.packed` is the torch module itself."""

    # predict takes several input kinds (the module docstring) and checks them itself: MLflow's type-hint
    # validation (and its warning that predict has no type hints) does not apply
    _skip_type_hint_validation = True

    packed: torch.nn.Module | None = None
    data_files: dict = {}  # artifact key -> local file of the training data's tables
    _fitted = None
    locations = users = None  # pyarrow tables of the training data's vocabularies
    manifest: dict | None = None  # the training data's manifest: config, vocab, counts

    def load_context(self, context) -> None:
        try:
            cfg = ModelConfig(**stored_settings(_read_json(context.artifacts[CONFIG], "model_config.json")))
        except TypeError as exc:
            raise InputError("the model's model_config.json", f"does not describe a model ({exc}); log the model again") from None
        model = build_model(cfg)
        try:
            model.load_state_dict(torch.load(context.artifacts[WEIGHTS], map_location="cpu", weights_only=True))
        except Exception as exc:  # a truncated or foreign file: one line, never an unpickling attempt
            raise InputError("the model's weights.pt", f"cannot be loaded ({' '.join(str(exc).split())[:200]}); "
                                                       "log the model again") from None
        self.packed = PackedModel(for_inference(model)).eval()  # stacked: one batched pass, the embedding folded
        artifacts = context.artifacts
        self.data_files = {key: Path(artifacts[key]) for key in DATA_FILES if key in artifacts}
        for key, path in self.data_files.items():  # a folder with a table deleted: which, not a bare path, at load
            if not path.is_file():
                raise InputError(f"the model's {DATA_FILES[key]}", f"missing (expected at {path}); download or "
                                                                   "log the model again")
        self.locations = _read_table(artifacts[LOCATIONS], DATA_FILES[LOCATIONS]) if LOCATIONS in artifacts else None
        self.users = _read_table(artifacts[USERS], DATA_FILES[USERS]) if USERS in artifacts else None
        self.manifest = _read_json(artifacts[MANIFEST], "manifest.json") if MANIFEST in artifacts else None
        self._fitted = None

    def fitted(self, source: str = "the model"):
        """The fitted preprocessing of the training data (built once): raw GPS -> the model's ids."""
        if self._fitted is None:
            # here, not at the top: logging a model imports this module, and the fitted preprocessing's place
            # search (scikit-learn, SciPy) is a second of every training run's start that only raw GPS needs
            from preprocessing.fitted import VISIT_COLUMNS, FittedPreprocessing

            missing = [DATA_FILES[k] for k in (MANIFEST, PLACES, CLUSTERED, USERS) if k not in self.data_files]
            if missing:
                raise InputError(source, f"carries no {', '.join(missing)} (logged before models carried their "
                                         "preprocessing); train it again to score raw GPS")
            visits = (pl.read_parquet(self.data_files[VISITS], columns=list(VISIT_COLUMNS))
                      if VISITS in self.data_files else None)
            if self.packed.cfg.memory_size and visits is None:
                raise InputError(source, "remembers earlier places but carries no staypoints.parquet (the training "
                                         "data's visits); log the model again")
            self._fitted = FittedPreprocessing.from_tables(
                self.manifest, pl.read_parquet(self.data_files[PLACES]), pl.read_parquet(self.data_files[CLUSTERED]),
                pl.from_arrow(self.users), source, visits)
        return self._fitted

    def warm_up_requests(self) -> list[list[dict]]:
        """The JSON records of small requests a server sends itself before it answers, so that its first client's
        request finds the fitted tables, the neighbour trees and every code path ready (example_requests)."""
        fitted = self.fitted()
        return example_requests(fitted.places, fitted.users)

    def predict(self, context, model_input, params=None):
        """The module docstring's inputs. A client's error (a column, a shape, an id beyond the model's tables, a
        parameter) raises MlflowException(INVALID_PARAMETER_VALUE) with one line naming it: HTTP 400."""
        with _client_errors():
            if isinstance(model_input, pd.DataFrame):
                answer = self._predict_table(_polars(model_input), params).predictions
                return pd.DataFrame(answer.to_dicts(), columns=answer.columns, dtype=object)  # ints stay ints; null, not NaN
            return self._predict_packed(model_input)

    def answer(self, frame: pl.DataFrame | pd.DataFrame, params: dict | None = None) -> dict:
        """What `pgt serve` answers a table request (GPS points, staypoints or sequences; a polars frame, or pandas as
        predict takes it), as JSON-ready records: {"predictions": predict's rows, "quarantined": [{row, reason}],
        "not_scored": [{source_user_id, reason}]}. The same errors as predict."""
        with _client_errors():
            result = self._predict_table(frame if isinstance(frame, pl.DataFrame) else _polars(frame), params)
        return {name: table.to_dicts() for name, table in result._asdict().items()}

    def _predict_packed(self, model_input) -> np.ndarray:
        """(B, V + S) log-probabilities of a (B, 7, T) (or (B, 6, T)) integer array, checked against the tables."""
        try:
            array = np.asarray(model_input)
        except ValueError:
            raise InputError("request", f"{PACKED}; the rows are ragged") from None
        if array.dtype == object or not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
            raise InputError("request", f"{PACKED}, got {array.dtype} values")
        if array.ndim != 3 or array.shape[1] not in (6, 7) or array.shape[0] < 1 or array.shape[2] < 1:
            raise InputError("request", f"{PACKED}, got shape {array.shape}")
        if np.issubdtype(array.dtype, np.floating) and not (np.isfinite(array).all() and (array == np.round(array)).all()):
            raise InputError("request", "expected integers; the array holds fractions, NaN or infinities")
        x = torch.as_tensor(array.astype(np.int64))
        check_packed(x, self.packed.cfg)
        with torch.no_grad():
            return self.packed(x).numpy()

    def _predict_table(self, frame: pl.DataFrame, params: dict | None) -> Answer:
        """Top-k places with coordinates for GPS points, staypoints or sequences (the module docstring), and for the
        first two the rows set aside and the people not scored."""
        top_k, at = top_k_of(params), prediction_time((params or {}).get("at"), "params.at")
        columns = set(frame.columns)
        if frame.height == 0:
            raise InputError("request", "no rows")
        if "locations" in columns:  # sequences, as a split holds them
            samples = frame
            SequenceDataset.check_schema(samples.to_arrow().schema, "request", require_target=False)
            dataset = SequenceDataset.from_arrow(samples.to_arrow(), self.packed.cfg.max_len, "request",
                                                 MemoryLayout.of(self.packed.cfg))
            check_vocabulary(self.packed.cfg, dataset, "request")
            if "source_user_id" not in columns:
                samples = samples.with_columns(source_user_id=pl.col("user"))
            if "history_end" not in columns and "target_started_at" not in columns:
                samples = samples.with_columns(history_end=pl.lit(None, pl.Datetime("us", "UTC")))
            places = self.fitted().places
            result = place_predictions(top_k_predictions(self.packed, dataset, top_k), samples, places, "request")
            quarantined, not_scored = QUARANTINED, NOT_SCORED  # a sequence is scored or refused
        else:
            from preprocessing.fitted import apply_fitted  # see fitted()
            from preprocessing.stages import StageLog

            input_format = "positionfixes" if "tracked_at" in columns else "staypoints"
            applied = apply_fitted(frame, input_format, self.fitted(), StageLog(sample_memory=False),
                                   evaluation=False, at=at, name="request", users_table=False,
                                   memory=bool(self.packed.cfg.memory_size))
            result = predict_applied(self.packed, applied, top_k, evaluation=False)
            quarantine = applied.quarantine
            quarantined = pl.DataFrame({"row": quarantine["source_row"].cast(pl.Int64), "reason": quarantine["reason"]})
            not_scored = _as_request_ids(applied.unscored, frame.schema.get("user_id"))
        times = result["time"].cast(pl.String)
        return Answer(result.replace_column(result.get_column_index("time"), times), quarantined, not_scored)  # no query


def example_requests(places: pl.DataFrame, users: pl.DataFrame) -> list[list[dict]]:
    """Small requests as JSON records, built from a model's own places (location_id, latitude, longitude, location)
    and people (source_user_id): staypoints and GPS points, each for one of its people and for a stranger (so both
    integer and text user ids), at three of its places and at a spot none of them covers (a new place). The first,
    a known person's staypoints, is the logged model's input example. An empty list for a model without a place."""
    places = places.filter(pl.col("location") >= 2).head(3)
    if places.height == 0:
        return []
    known = users["source_user_id"][0] if users.height else None
    people = [known, -1 if isinstance(known, str) else "warm-up"] if known is not None else ["warm-up", -1]
    spots = [(row["latitude"], row["longitude"]) for row in places.iter_rows(named=True)]
    spots = [spots[i % len(spots)] for i in range(6)] + [(spots[0][0] + 0.01, spots[0][1])] * 2  # ~1 km away
    start, requests = pd.Timestamp("2024-01-01T08:00:00Z"), []
    for person in people:
        stays, fixes = [], []
        for i, (latitude, longitude) in enumerate(spots):
            begin = start + pd.Timedelta(hours=5 * i)
            stays.append({"user_id": person, "started_at": begin.isoformat(),
                          "finished_at": (begin + pd.Timedelta(hours=2)).isoformat(),
                          "latitude": latitude, "longitude": longitude})
            fixes += [{"user_id": person, "tracked_at": (begin + pd.Timedelta(minutes=m)).isoformat(),
                       "latitude": latitude, "longitude": longitude} for m in range(0, 40, 2)]
        requests += [stays, fixes]
    return requests


def input_schema(split: pa.Schema) -> Schema:
    """The MLflow input schema of the table forms predict takes, every column optional (a request holds one form's):
    GPS points and staypoints as preprocessing's readers take them (user ids and times of any type: integers or text,
    ISO 8601 text or datetimes; coordinates as floats; or a WKT/WKB `geom`), and sequences in the columns of `split`
    (a training split's schema) and the sample times predictions report. MLflow's own check (pyfunc predict, `mlflow
    models serve`) keeps only the columns named here: a column predict reads and this schema lacks would be dropped
    before it, which the tests rule out by comparing both paths on every form."""
    coordinates = {"latitude": DataType.double, "longitude": DataType.double}
    types = {name: AnyType() for name in (*POSITIONFIX_COLUMNS, *STAYPOINT_TIME_COLUMNS, *GEOMETRY_COLUMNS,
                                          "source_user_id", *SAMPLE_TIME_COLUMNS) if name not in coordinates}
    types |= coordinates
    for field in split:
        if field.name in types:
            continue
        listed = pa.types.is_list(field.type) or pa.types.is_large_list(field.type)
        types[field.name] = (Array(DataType.long) if listed else DataType.long if pa.types.is_integer(field.type)
                             else AnyType())
    return Schema([ColSpec(kind, name, required=False) for name, kind in types.items()])


@contextmanager
def _client_errors():
    """A request's own fault (ValueError, InputError and SettingsError among them; KeyError, TypeError,
    OverflowError) as MlflowException(INVALID_PARAMETER_VALUE) with one line: HTTP 400."""
    try:
        yield
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise MlflowException(f"bad request: {message}", error_code=INVALID_PARAMETER_VALUE) from None


PACKED = "expected a (B, 7, T) array of integers as Batch.packed() gives it"
QUARANTINED = pl.DataFrame(schema={"row": pl.Int64, "reason": pl.String})
NOT_SCORED = pl.DataFrame(schema={"source_user_id": pl.String, "reason": pl.String})


def _as_request_ids(unscored: pl.DataFrame, dtype) -> pl.DataFrame:
    """The people not scored (source_user_id as text) with their ids in the request's own type where they all
    convert back (3, not "3", for integer ids)."""
    ids = unscored["source_user_id"]
    typed = ids.cast(dtype, strict=False) if dtype is not None and unscored.height else ids
    if typed.null_count() != ids.null_count():
        return unscored
    return unscored.replace_column(unscored.get_column_index("source_user_id"), typed)


def _polars(frame) -> pl.DataFrame:
    """The request's pandas frame as polars (pl.from_pandas's columns), or InputError naming the column polars could
    not take. Text, integer, float and boolean columns, what a JSON request holds, are taken in numpy and Python: a
    request's few rows then wake no thread pool of Arrow's or polars' (on a 2-core VM that wake-up is slower than the
    conversion)."""
    if not (frame.columns.is_unique and all(isinstance(c, str) for c in frame.columns)):
        try:
            return pl.from_pandas(frame)
        except (pl.exceptions.PolarsError, ValueError, TypeError) as exc:
            raise InputError("request", f"unusable columns ({' '.join(str(exc).split())[:200]})") from None
    series = []
    for name in frame.columns:
        try:
            series.append(_series(name, frame[name]))
        except (pl.exceptions.PolarsError, ValueError, TypeError) as exc:
            raise InputError("request", _unusable(name, frame[name], exc)) from None
    return pl.DataFrame(series)


JSON_KINDS = {str: "text", int: "numbers", float: "numbers", bool: "booleans", list: "lists", dict: "objects"}


def _unusable(name: str, column: pd.Series, exc: Exception) -> str:
    """One line on a column polars cannot take: the first row whose kind of value differs from the column's first."""
    def kind(value) -> str:
        return JSON_KINDS.get(type(value), type(value).__name__)

    values = [(i, v) for i, v in enumerate(column.tolist()) if v is not None and v == v]  # nulls and NaN aside
    first = kind(values[0][1]) if values else None
    odd = next(((i, v) for i, v in values if kind(v) != first), None)
    if odd is not None:
        return (f"column {name} mixes {first} and {kind(odd[1])} (row {odd[0]}: {repr(odd[1])[:40]}); "
                f"expected one kind of value per column")
    return f"column {name} is unusable ({' '.join(str(exc).split())[:200]})"


def _series(name: str, column: pd.Series) -> pl.Series:
    """One column as pl.from_pandas gives it: NaN as null in float and text columns."""
    if isinstance(column.dtype, pd.StringDtype):
        return pl.Series(name, [None if v is None or v is pd.NA or v != v else v for v in column.tolist()], pl.String)
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iubf":  # plain numpy: no nullable extension
        return pl.Series(name, column.to_numpy(), nan_to_null=column.dtype.kind == "f")
    return pl.from_pandas(column)


def _read_table(path: str, name: str):
    """A table the model carries (pyarrow), or InputError naming it (a truncated or hand-edited file)."""
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"the model's {name}", f"unreadable ({' '.join(str(exc).split())[:120]}); download "
                                                "or log the model again") from None


def _read_json(path: str, name: str) -> dict:
    """A JSON object the model carries, or InputError naming it (a corrupt or hand-edited model)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"the model's {name}", f"unreadable ({' '.join(str(exc).split())[:120]}); download "
                                                "or log the model again") from None
    if not isinstance(data, dict):
        raise InputError(f"the model's {name}", f"holds a {type(data).__name__}, expected a JSON object; download "
                                                "or log the model again")
    return data


mlflow.models.set_model(PGTModel())

"""A model's top-k next places for sequences: the ranked location ids with their probabilities, turned into
places with coordinates for data applied through a fitted preprocessing (preprocessing.fitted). What
`pgt predict`, the MLflow pyfunc and `pgt serve` all answer with. No MLflow here: it takes a loaded model."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import torch

from infra.errors import InputError, SettingsError
from infra.settings import stored_settings
from pgt.config import EVAL_BATCH_SIZE, MAX_TOP_K, TOP_K, ModelConfig
from pgt.data.dataset import MemoryLayout, SequenceDataset
from pgt.network.packed import input_tables
from pgt.network.vocabulary import restore_new_place_odds
from preprocessing.config import parse_time
from preprocessing.output import read_manifest
from preprocessing.sequences import UNSEEN

# the columns of place_predictions, one row per (sample, rank)
PREDICTION_COLUMNS = ["sample", "sample_index", "source_user_id", "user", "time", "rank", "place_id", "location",
                      "latitude", "longitude", "probability", "new_place_probability", "target_place"]





def check_top_k(value, what: str = "top_k") -> int:
    """value as the number of places to list: an integer 1..MAX_TOP_K (digits as text count), else SettingsError
    naming `what`."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_TOP_K:
        raise SettingsError(f"{what} must be an integer from 1 to {MAX_TOP_K}, got {value!r}")
    return int(value)


def prediction_time(value, what: str = "--at") -> datetime | None:
    """The moment a prediction is for, from ISO 8601 text (UTC when it names no offset); None for none given
    (each user's last visit's end). ValueError naming `what` otherwise."""
    if value is None or value == "":
        return None
    try:
        return parse_time(str(value))
    except (TypeError, ValueError):
        raise SettingsError(f"{what} must be an ISO 8601 time such as 2024-05-01T08:00:00+08:00, got {value!r}") from None


def top_k_of(params: dict | None) -> int:
    """A request's `top_k` (TOP_K when its params have none), checked (check_top_k)."""
    return TOP_K if not params or "top_k" not in params else check_top_k(params["top_k"], "params.top_k")


class TopK(NamedTuple):
    locations: np.ndarray  # (N, k) location ids, UNSEEN (1) for a new place and for a slot
    places: np.ndarray  # (N, k) the dataset-wide place of a slot prediction (an unseen place of the history), else -1
    probabilities: np.ndarray  # (N, k) highest first
    # (N,) the probability of id 1, a new place (with slots) or any place unseen in train, at the odds a loss that
    # weighs every target alike would give it (vocabulary.restore_new_place_odds): a forecast, where the network's own
    # (the ranking's) understates it by the new_place_weight it was trained with
    new_place: np.ndarray



@torch.inference_mode()  # no autograd bookkeeping at all: faster than no_grad for a request of one sample
def top_k_predictions(model, dataset: SequenceDataset, top_k: int, batch_size: int = EVAL_BATCH_SIZE,
                      live: bool = False) -> TopK:
    """The k most probable next locations of every sample of `dataset` under a PackedModel; `live`: the samples'
    recency counts from their last visit's day (PackedModel.live)."""
    V = model.cfg.num_locations
    k = min(top_k, V - 1)
    locations = np.zeros((len(dataset), k), np.int64)
    places = np.full((len(dataset), k), -1, np.int64)
    probabilities = np.zeros((len(dataset), k), np.float32)
    new_place = np.zeros(len(dataset), np.float32)
    for start in range(0, len(dataset), batch_size):
        idx = list(range(start, min(start + batch_size, len(dataset))))
        batch = dataset.__getitems__(idx)
        log_probs = model.live(batch.packed()) if live else model(batch.packed())  # (B, V + S)
        new_place[idx] = restore_new_place_odds(log_probs, model.cfg.new_place_log_odds)[:, UNSEEN].exp().numpy()
        log_probs[:, 0] = -torch.inf  # id 0 pads histories; it is never a place
        top = torch.topk(log_probs, k, dim=1)
        slot = (top.indices - V + 1).clamp_min(0)  # (B, k) the slot of each prediction, 0 for known ids and 1
        # the place of a slot: that of its first visit in the history
        first = (batch.slots.unsqueeze(1) == slot.unsqueeze(2)) & (slot.unsqueeze(2) > 0)  # (B, k, T)
        slot_place = dataset.places[idx, :batch.slots.shape[1]].gather(1, first.to(torch.uint8).argmax(dim=2))
        places[idx] = torch.where(slot > 0, slot_place, -1).numpy()
        locations[idx] = torch.where(slot > 0, UNSEEN, top.indices).numpy()
        probabilities[idx] = top.values.exp().numpy()
    return TopK(locations, places, probabilities, new_place)



# a sample's moment, the first of these its table has: when the target started (an evaluation sample), when the
# prediction is made, when the history ended
SAMPLE_TIME_COLUMNS = ("target_started_at", "prediction_time", "history_end")


def place_predictions(top: TopK, samples: pl.DataFrame, places: pl.DataFrame, kind: str) -> pl.DataFrame:
    """Long format, one row per (sample, rank): sample (`kind`), sample_index, source_user_id, user, time (when
    the target started for evaluation samples, the moment of the prediction for latest ones), rank (1 = most
    probable), place_id (null for a new place), location (the model's id: >= 2 known, 1 unseen in train),
    latitude, longitude, probability, new_place_probability and, for evaluation samples, target_place.

    `places` (location_id, latitude, longitude, location) names the fitted and new places; a known id is the
    place the fitted vocabulary gave it, a slot is the history's place it points at."""
    n, k = top.locations.shape
    rows = np.repeat(np.arange(n), k)
    location = top.locations.reshape(-1)
    # a known id's place (the fitted vocabulary maps ids 2.. to places one to one), a slot's place as pointed at
    ids, vocabulary = places["location_id"].to_numpy(), places["location"].to_numpy()
    known = vocabulary >= 2
    place_of_id = np.full(max(int(vocabulary.max(initial=0)), int(location.max(initial=0))) + 1, -1, np.int64)
    place_of_id[vocabulary[known]] = ids[known]
    place = np.where(top.places.reshape(-1) >= 0, top.places.reshape(-1), place_of_id[location])
    # coordinates by place id (ids are small non-negative integers); NaN for a new place or an unknown id
    coordinates = np.full((max(int(ids.max(initial=-1)), int(place.max(initial=-1))) + 1, 2), np.nan)
    coordinates[ids] = np.column_stack([places["latitude"].to_numpy(), places["longitude"].to_numpy()])
    latitude, longitude = np.where((place >= 0)[:, None], coordinates[place], np.nan).T
    time = next(name for name in SAMPLE_TIME_COLUMNS if name in samples.columns)
    index = pl.Series(rows, dtype=pl.get_index_type())
    repeated = samples.select(pl.col("source_user_id").gather(index), pl.col(time).gather(index).alias("time"),
                              *([pl.col("target_place").cast(pl.Int64).gather(index)] if "target_place" in samples.columns
                                else []))  # one query for every column repeated per rank
    target = (repeated["target_place"] if "target_place" in samples.columns
              else pl.Series("target_place", [None] * (n * k), dtype=pl.Int64))
    return pl.DataFrame({
        "sample": pl.Series([kind] * (n * k), dtype=pl.String),
        "sample_index": rows,
        "source_user_id": repeated["source_user_id"],
        "user": np.repeat(samples["user"].to_numpy().astype(np.int64), k),
        "time": repeated["time"],
        "rank": np.tile(np.arange(1, k + 1), n),
        "place_id": pl.Series("place_id", pa.array(place, pa.int64(), mask=place < 0)),  # null: a new place
        "location": location,
        "latitude": pl.Series("latitude", latitude, nan_to_null=True),
        "longitude": pl.Series("longitude", longitude, nan_to_null=True),
        "probability": top.probabilities.reshape(-1),
        "new_place_probability": np.repeat(top.new_place, k),
        "target_place": target,
    })



def predict_applied(model, applied, top_k: int, evaluation: bool = True) -> pl.DataFrame:
    """place_predictions for the latest samples (and the evaluation samples) of fitted.AppliedData."""
    frames = []
    for kind, samples in (("latest", applied.latest), ("evaluation", applied.evaluation if evaluation else None)):
        if samples is None:
            continue
        dataset = SequenceDataset.from_arrow(samples.to_arrow(), model.cfg.max_len, f"{kind} samples",
                                             MemoryLayout.of(model.cfg))
        check_vocabulary(model.cfg, dataset, f"{kind} samples")
        live = kind == "evaluation" or applied.latest_at_last_visit  # else counted from the prediction time's day
        frames.append(place_predictions(top_k_predictions(model, dataset, top_k, live=live), samples, applied.places,
                                        kind))
    return pl.concat(frames, how="vertical_relaxed")



def check_lineage(trained_on: dict | None, data_dir: Path, model_uri: str) -> None:
    """InputError unless the `pgt preprocess` folder data_dir comes from the preprocessing the model was trained on:
    its input (sha256) and settings, or, for an output of `--fitted`, the fitted run's. Its ids would otherwise
    mean other places and other people. A folder without a manifest, or a model logged before models carried
    theirs, leaves only the vocabulary check (check_vocabulary)."""

    data = read_manifest(data_dir)
    if not trained_on or data is None:
        return

    def settings(manifest: dict) -> dict:
        return {k: v for k, v in stored_settings(manifest.get("config") or {}).items() if k != "latest_valid_time"}

    fitted = data.get("mode") == "fitted"
    source = (data.get("fitted") or {}).get("input_sha256") if fitted else data.get("input_sha256")
    expected = trained_on.get("input_sha256")
    if source != expected or settings(data) != settings(trained_on):
        what = "was applied with the fitted preprocessing of another run" if fitted else "comes from another preprocessing run"
        problem = (f"input sha256 {str(source)[:12]}, the model's {str(expected)[:12]}" if source != expected
                   else "same input, other settings")
        raise InputError(data_dir, f"{what} than the one {model_uri} was trained on ({problem}); its ids mean other "
                                   "places and people: score that run's own data, or new data through `pgt preprocess --fitted` "
                                   "of the model's training folder (or `pgt predict --format`)")



def live_folder(data_dir: Path) -> bool:
    """Whether the sequences of a `pgt preprocess` folder have a live prediction's inputs: an output of `--fitted`,
    whose samples count recency from their last visit's day (the target's day unknown), where a full run's count it
    from the target's day."""
    manifest = read_manifest(data_dir)
    return manifest is not None and manifest.get("mode") == "fitted"


def check_vocabulary(model_cfg: ModelConfig, dataset: SequenceDataset, path: Path) -> None:
    """Ids and features beyond the model's tables mean the sequences come from another preprocessing run (or are
    not a split's): one line naming the column, before the model would index past a table."""
    stored = (dataset.locations, dataset.users, dataset.times, dataset.weekdays, dataset.recency, dataset.durations)
    for (column, top), values in zip(input_tables(model_cfg).items(), stored):
        shift = 0 if column in ("locations", "user") else 1  # features are stored + 1; the message shows the split's
        if len(values) and int(values.max()) > top:
            raise InputError(path, f"column {column} holds {int(values.max()) - shift}, but the model knows "
                                   f"0..{top - shift}; score sequences from the preprocessing run the model was trained on")

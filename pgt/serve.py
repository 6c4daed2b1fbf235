"""Use a model logged in MLflow: metrics on a split (`pgt evaluate`), top-k scoring of new sequences (`pgt predict`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pgt.data import UNSEEN, Batch, SequenceDataset
from pgt.metrics import compute_all
from pgt.model import input_tables
from pgt.tracking import load_model_and_manifest, load_pgt_model
from pgt.train import Scores, predict
from preprocessing.output import check_apart, check_output_file, output_lock, write_file_atomically, write_parquet_marked

PREDICTOR = "pgt predict"  # the producer mark of predict's output files (preprocessing.output.written_by)
# the columns of place_predictions, one row per (sample, rank)
PREDICTION_COLUMNS = ["sample", "sample_index", "source_user_id", "user", "time", "rank", "place_id", "location",
                      "latitude", "longitude", "probability", "new_place_probability", "target_place"]


def packed_scores(model) -> Callable[[Batch], Scores]:
    """A `predict` scorer for a logged PackedModel: its extended log-probabilities and the protocol's merge."""
    return lambda batch: Scores.from_log_probs(model(batch.packed()), model.cfg.num_locations)


def evaluate_model(model_uri: str, data_dir: Path, split: str = "test", tracking_uri: str | None = None) -> dict:
    """The metrics of SPEC §4, protocol and strict, for a logged PackedModel on one split of a `pgt preprocess` folder."""
    SequenceDataset.check_columns(Path(data_dir) / f"{split}.parquet")
    model, trained_on = load_model_and_manifest(model_uri, tracking_uri)
    check_lineage(trained_on, Path(data_dir), model_uri)
    dataset = SequenceDataset.from_parquet(Path(data_dir) / f"{split}.parquet", model.cfg.max_len)
    _check_vocab(model, dataset, Path(data_dir) / f"{split}.parquet")
    scored, _ = predict(packed_scores(model), dataset, 1024, torch.device("cpu"))
    return compute_all(scored)


class TopK(NamedTuple):
    locations: np.ndarray  # (N, k) location ids, UNSEEN (1) for a new place and for a slot
    places: np.ndarray  # (N, k) the dataset-wide place of a slot prediction (an unseen place of the history), else -1
    probabilities: np.ndarray  # (N, k) highest first
    new_place: np.ndarray  # (N,) the probability of id 1: a new place (with slots) or any place unseen in train


@torch.no_grad()
def top_k_predictions(model, dataset: SequenceDataset, top_k: int, batch_size: int = 1024) -> TopK:
    """The k most probable next locations of every sample of `dataset` under a PackedModel."""
    V = model.cfg.num_locations
    k = min(top_k, V - 1)
    locations = np.zeros((len(dataset), k), np.int64)
    places = np.full((len(dataset), k), -1, np.int64)
    probabilities = np.zeros((len(dataset), k), np.float32)
    new_place = np.zeros(len(dataset), np.float32)
    for start in range(0, len(dataset), batch_size):
        idx = list(range(start, min(start + batch_size, len(dataset))))
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
    return TopK(locations, places, probabilities, new_place)


def place_predictions(top: TopK, samples: pl.DataFrame, places: pl.DataFrame, kind: str) -> pl.DataFrame:
    """Long format, one row per (sample, rank): sample (`kind`), sample_index, source_user_id, user, time (when
    the target started for evaluation samples, when the history ended for latest ones), rank (1 = most
    probable), place_id (null for a new place), location (the model's id: >= 2 known, 1 unseen in train),
    latitude, longitude, probability, new_place_probability and, for evaluation samples, target_place.

    `places` (location_id, latitude, longitude, location) names the fitted and new places; a known id is the
    place the fitted vocabulary gave it, a slot is the history's place it points at."""
    n, k = top.locations.shape
    rows = np.repeat(np.arange(n), k)
    location = top.locations.reshape(-1)
    # a known id's place (the fitted vocabulary maps ids 2.. to places one to one), a slot's place as pointed at
    known = places.filter(pl.col("location") >= 2)
    place_of_id = np.full(max(int(known["location"].max() or 0), int(location.max(initial=0))) + 1, -1, np.int64)
    place_of_id[known["location"].to_numpy()] = known["location_id"].to_numpy()
    place = np.where(top.places.reshape(-1) >= 0, top.places.reshape(-1), place_of_id[location])
    # coordinates by place id (ids are small non-negative integers); NaN for a new place or an unknown id
    ids = places["location_id"].to_numpy()
    coordinates = np.full((max(int(ids.max(initial=-1)), int(place.max(initial=-1))) + 1, 2), np.nan)
    coordinates[ids] = places.select("latitude", "longitude").to_numpy()
    latitude, longitude = np.where((place >= 0)[:, None], coordinates[place], np.nan).T
    time = samples["target_started_at"] if "target_started_at" in samples.columns else samples["history_end"]
    target = (samples["target_place"].cast(pl.Int64).gather(rows) if "target_place" in samples.columns
              else pl.Series("target_place", [None] * (n * k), dtype=pl.Int64))
    return pl.DataFrame({
        "sample": pl.Series([kind] * (n * k), dtype=pl.String),
        "sample_index": rows,
        "source_user_id": samples["source_user_id"].gather(rows),
        "user": np.repeat(samples["user"].to_numpy().astype(np.int64), k),
        "time": time.gather(rows),
        "rank": np.tile(np.arange(1, k + 1), n),
        "place_id": pl.Series(place).set(pl.Series(place < 0), None) if n else pl.Series([], dtype=pl.Int64),
        "location": location,
        "latitude": pl.Series(latitude).fill_nan(None),
        "longitude": pl.Series(longitude).fill_nan(None),
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
        dataset = SequenceDataset.from_arrow(samples.to_arrow(), model.cfg.max_len, f"{kind} samples")
        _check_vocab(model, dataset, f"{kind} samples")
        frames.append(place_predictions(top_k_predictions(model, dataset, top_k), samples, applied.places, kind))
    return pl.concat(frames, how="vertical_relaxed")


class RawPrediction(NamedTuple):
    """What `pgt predict --format` wrote and what it could not score."""

    frame: pl.DataFrame  # place_predictions of the latest and the evaluation samples (written to `out`)
    counts: dict  # the applied data's counts: rows read and quarantined, staypoints, users, samples
    unscored: pl.DataFrame  # source_user_id, reason: people of the input without a prediction
    files: dict[str, Path]  # what was written: "predictions", and "quarantine" / "unscored" where there were any


def side_files(out_path: Path) -> dict[str, Path]:
    """The files predict writes beside its output: the quarantined rows and the people it could not score."""
    out_path = Path(out_path)
    return {"quarantine": out_path.with_name(f"{out_path.stem}.quarantine.parquet"),
            "unscored": out_path.with_name(f"{out_path.stem}.unscored.parquet")}


def predict_raw(model_uri: str, input_path: Path, input_format: str, out_path: Path, top_k: int = 5,
                tracking_uri: str | None = None) -> RawPrediction:
    """`pgt predict --format F`: raw GPS points or staypoints through the model's own fitted preprocessing, then
    the top-k next places of every user (the latest sample) and of every evaluation sample, written to
    out_path (.parquet or .csv; place_predictions gives the columns). Rows the readers quarantined go to
    `<out>.quarantine.parquet` and the people without a prediction, with the reason, to `<out>.unscored.parquet`
    (side_files); nothing is dropped unsaid. Every path is checked before the model loads."""
    from preprocessing.pipeline import apply_fitted

    out_path = Path(out_path)
    check_output_file(out_path, PREDICTOR, (".parquet", ".csv"), PREDICTION_COLUMNS)
    for side in side_files(out_path).values():
        check_output_file(side, PREDICTOR, (".parquet",))
    check_apart(out_path, {"--input": input_path})
    wrapper = load_pgt_model(model_uri, tracking_uri)
    applied = apply_fitted(input_path, input_format, wrapper.fitted(model_uri))
    frame = predict_applied(wrapper.packed, applied, top_k)
    files = {"predictions": out_path}
    with output_lock(out_path, command=PREDICTOR):
        check_output_file(out_path, PREDICTOR, (".parquet", ".csv"), PREDICTION_COLUMNS)
        if out_path.suffix == ".csv":
            write_file_atomically(out_path, frame.write_csv)
        else:
            write_parquet_marked(out_path, frame, PREDICTOR)
        for kind, table in (("quarantine", applied.quarantine), ("unscored", applied.unscored)):
            side = side_files(out_path)[kind]
            if table is not None and table.height:
                files[kind] = write_parquet_marked(side, table, PREDICTOR)
            elif side.exists():  # ours (checked above): an earlier run's, which would mislead
                side.unlink()
    return RawPrediction(frame, applied.counts, applied.unscored, files)


@torch.no_grad()
def predict_file(model_uri: str, input_path: Path, out_path: Path, top_k: int = 5, tracking_uri: str | None = None) -> int:
    """Write, for every sequence of `input_path`, its top-k predictions and their probabilities (highest first).

    Output columns: row (the input's row number), user, top_locations (location ids; 1 is a place unseen in
    train), top_places (the dataset-wide place id where a prediction is an unseen place of the history, i.e. a
    slot of the extended vocabulary, else null), top_probabilities, new_place_probability (the probability of
    id 1: a new place, none of the known or visited ones, for a model with slots; any place unseen in train
    without), and target and target_place when the input has them. Returns the number of rows."""
    check_output_file(Path(out_path), PREDICTOR, (".parquet",))  # before the model's download
    check_apart(Path(out_path), {"--input": input_path})
    SequenceDataset.check_columns(input_path, require_target=False)
    model, trained_on = load_model_and_manifest(model_uri, tracking_uri)
    check_lineage(trained_on, Path(input_path).parent, model_uri)  # where the sequences sit in a preprocess folder
    dataset = SequenceDataset.from_parquet(input_path, model.cfg.max_len, require_target=False)
    _check_vocab(model, dataset, input_path)
    top = top_k_predictions(model, dataset, top_k)
    locations, places, probabilities, new_place = top.locations, top.places, top.probabilities, top.new_place
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
    with output_lock(Path(out_path), command=PREDICTOR):
        check_output_file(Path(out_path), PREDICTOR, (".parquet",))
        write_parquet_marked(Path(out_path), pa.table(columns), PREDICTOR)
    return len(dataset)


def check_lineage(trained_on: dict | None, data_dir: Path, model_uri: str) -> None:
    """ValueError unless the `pgt preprocess` folder data_dir comes from the preprocessing the model was trained on:
    its input (sha256) and settings, or, for an output of `--fitted`, the fitted run's. Its ids would otherwise
    mean other places and other people. A folder without a manifest, or a model logged before models carried
    theirs, leaves only the vocabulary check (_check_vocab)."""
    from preprocessing.output import read_manifest

    data = read_manifest(data_dir)
    if not trained_on or data is None:
        return

    def settings(manifest: dict) -> dict:
        return {k: v for k, v in (manifest.get("config") or {}).items() if k != "latest_valid_time"}

    fitted = data.get("mode") == "fitted"
    source = (data.get("fitted") or {}).get("input_sha256") if fitted else data.get("input_sha256")
    expected = trained_on.get("input_sha256")
    if source != expected or settings(data) != settings(trained_on):
        what = "was applied with the fitted preprocessing of another run" if fitted else "comes from another preprocessing run"
        problem = (f"input sha256 {str(source)[:12]}, the model's {str(expected)[:12]}" if source != expected
                   else "same input, other settings")
        raise ValueError(f"{data_dir}: {what} than the one {model_uri} was trained on ({problem}); its ids mean other "
                         "places and people: score that run's own data, or new data through `pgt preprocess --fitted` "
                         "of the model's training folder (or `pgt predict --format`)")


def _check_vocab(model, dataset: SequenceDataset, path: Path) -> None:
    """Ids and features beyond the model's tables mean the sequences come from another preprocessing run (or are
    not a split's): one line naming the column, before the model would index past a table."""
    stored = (dataset.locations, dataset.users, dataset.times, dataset.weekdays, dataset.recency, dataset.durations)
    for (column, top), values in zip(input_tables(model.cfg).items(), stored):
        shift = 0 if column in ("locations", "user") else 1  # features are stored + 1; the message shows the split's
        if len(values) and int(values.max()) > top:
            raise ValueError(f"{path}: column {column} holds {int(values.max()) - shift}, but the model knows "
                             f"0..{top - shift}; score sequences from the preprocessing run the model was trained on")


def last_days(points: pl.DataFrame, days: float, time_column: str = "tracked_at") -> pl.DataFrame:
    """Each user's rows of their last `days` days (the input of a prediction: the recent past)."""
    start = pl.col(time_column).max().over("user_id") - pl.duration(seconds=int(days * 86_400))
    return points.filter(pl.col(time_column) > start)


def plot_predicted_places(predictions: pl.DataFrame, out_png: Path, max_users: int = 12) -> Path:
    """A map (longitude, latitude) of each user's top-k next places from the latest samples: one colour per user,
    marker area proportional to the probability, the most probable place ringed. Users beyond max_users are left
    out (the title says how many)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latest = predictions.filter((pl.col("sample") != "evaluation") & pl.col("latitude").is_not_null())
    users = latest["source_user_id"].unique(maintain_order=True)
    shown = users.head(max_users)
    fig, ax = plt.subplots(figsize=(8, 7))
    colours = plt.get_cmap("tab20")
    for i, user in enumerate(shown.to_list()):
        rows = latest.filter(pl.col("source_user_id") == user)
        ax.scatter(rows["longitude"], rows["latitude"], s=40 + 800 * rows["probability"].to_numpy(),
                   color=colours(i % 20), alpha=0.55, label=f"user {user}")
        top = rows.filter(pl.col("rank") == rows["rank"].min())
        ax.scatter(top["longitude"], top["latitude"], s=60 + 800 * top["probability"].to_numpy(), facecolors="none",
                   edgecolors="black", linewidths=1.2)
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    more = f" ({len(users) - len(shown)} more not shown)" if len(users) > len(shown) else ""
    ax.set_title(f"predicted next places of {len(shown)} users{more}\narea = probability, ringed = most probable")
    if len(shown):
        ax.legend(fontsize=7, loc="best", ncols=2)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def prediction_summary(predictions: pl.DataFrame) -> dict:
    """Counts and scores of a predict_raw output: users scored, evaluation samples and their strict Acc@1 (the
    most probable place is the exact place visited next), the mean new-place probability."""
    latest = predictions.filter(sample="latest")
    first = predictions.filter((pl.col("sample") == "evaluation") & (pl.col("rank") == 1))
    strict = float(100 * (first["place_id"] == first["target_place"]).fill_null(False).mean()) if first.height else None
    return {"users": latest["sample_index"].n_unique(), "evaluation_samples": first.height,
            "evaluation_strict_acc@1": strict,
            "mean_new_place_probability": float(latest.group_by("sample_index").agg(pl.col("new_place_probability").first())
                                                ["new_place_probability"].mean() or 0.0)}


def predict_summary(result: RawPrediction, top_k: int, shown: int = 10) -> str:
    """What `pgt predict --format` prints: the files, who was scored, what was quarantined, who was not and why."""
    frame, counts = result.frame, result.counts
    latest = frame.filter(pl.col("sample") == "latest")
    unknown = latest.filter(pl.col("user") == 0)["sample_index"].n_unique()
    lines = [f"wrote {result.files['predictions']}: top-{top_k} next places of {latest['sample_index'].n_unique():,} "
             f"users ({unknown:,} unknown to the model, scored as user 0), and of "
             f"{frame.filter(pl.col('sample') == 'evaluation')['sample_index'].n_unique():,} evaluation samples"]
    quarantined = counts["positionfixes_quarantined"]
    lines.append(f"rows: {counts['positionfixes_read']:,} read, {quarantined:,} quarantined"
                 + (f" (written to {result.files['quarantine']})" if "quarantine" in result.files else ""))
    if result.unscored.height:
        named = "; ".join(f"{u} ({r})" for u, r in result.unscored.head(shown).iter_rows())
        more = f"; and {result.unscored.height - shown:,} more" if result.unscored.height > shown else ""
        lines.append(f"not scored: {result.unscored.height:,} users, listed with the reason in "
                     f"{result.files['unscored']}: {named}{more}")
    return "\n".join(lines)

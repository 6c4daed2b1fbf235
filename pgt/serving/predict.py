"""`pgt predict`: a model logged in MLflow ranks the next places of new data, raw GPS points or staypoints through
its own fitted preprocessing (predict_raw) or sequences of its own preprocessing run (predict_file), written to
files with what could not be scored beside them; and the summaries and map of such predictions."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from infra.output import check_apart, check_output_file, output_lock, write_file_atomically, write_parquet_marked
from pgt.config import TOP_K
from pgt.data.dataset import MemoryLayout, SequenceDataset
from pgt.serving.inference import (
    PREDICTION_COLUMNS,
    check_lineage,
    check_top_k,
    check_vocabulary,
    live_folder,
    predict_applied,
    top_k_predictions,
)
from pgt.serving.models import check_model_uri, load_model_and_manifest, load_pgt_model
from pgt.tracking.lineage import model_version
from preprocessing.fitted import apply_fitted

PREDICTOR = "pgt predict"  # the producer mark of predict's output files (infra.output.written_by)


class RawPrediction(NamedTuple):
    """What `pgt predict --format` wrote and what it could not score."""

    frame: pl.DataFrame  # place_predictions of the latest and the evaluation samples (written to `out`)
    counts: dict  # the applied data's counts: rows read and quarantined, staypoints, users, samples
    unscored: pl.DataFrame  # source_user_id, reason: people of the input without a prediction
    files: dict[str, Path]  # what was written: "predictions", and "quarantine" / "unscored" where there were any
    model_uri: str  # the model that answered: an alias's version URI (answering_model), else the URI given


MODEL_KEY = "pgt.model_uri"  # a prediction file's metadata: the model that answered (a version URI where resolved)


def answering_model(model_uri: str, tracking_uri: str | None = None) -> str:
    """The URI that names the model a prediction gets: an alias's registered version now (models:/NAME/VERSION,
    which still names it once the alias moves), else the URI as given (also where the alias cannot be read: loading
    the model then says why in one line)."""
    if "@" not in model_uri or not model_uri.startswith("models:/"):
        return model_uri
    from mlflow.exceptions import MlflowException

    uri = check_model_uri(model_uri, tracking_uri)  # an unreachable server: one line, in seconds
    try:
        version = model_version(uri, model_uri)
    except MlflowException:  # a missing alias or model: the load that follows reports it with its own message
        return model_uri
    return version["version_uri"] if version else model_uri


def side_files(out_path: Path) -> dict[str, Path]:
    """The files predict writes beside its output: the quarantined rows and the people it could not score."""
    out_path = Path(out_path)
    return {"quarantine": out_path.with_name(f"{out_path.stem}.quarantine.parquet"),
            "unscored": out_path.with_name(f"{out_path.stem}.unscored.parquet")}


def predict_raw(model_uri: str, input_path: Path, input_format: str, out_path: Path, top_k: int = TOP_K,
                tracking_uri: str | None = None, at: datetime | None = None) -> RawPrediction:
    """`pgt predict --format F`: raw GPS points or staypoints through the model's own fitted preprocessing, then
    the top-k next places of every user at the moment `at` (by default the end of each user's last visit; recency
    counts from its day) and of every evaluation sample (anchored at its last history visit, as a live row), written to
    out_path (.parquet or .csv; place_predictions gives the columns). Rows the readers quarantined go to
    `<out>.quarantine.parquet` and the people without a prediction, with the reason, to `<out>.unscored.parquet`
    (side_files); nothing is dropped unsaid. Every path is checked before the model loads."""
    check_top_k(top_k, "--top-k")
    out_path = Path(out_path)
    check_output_file(out_path, PREDICTOR, (".parquet", ".csv"), PREDICTION_COLUMNS)
    for side in side_files(out_path).values():
        check_output_file(side, PREDICTOR, (".parquet",))
    check_apart(out_path, {"--input": input_path})
    with output_lock(out_path, command=PREDICTOR):  # one writer, from before the model loads: a second is refused
        return _predict_raw(model_uri, input_path, input_format, out_path, top_k, tracking_uri, at)


def _predict_raw(model_uri: str, input_path: Path, input_format: str, out_path: Path, top_k: int,
                 tracking_uri: str | None, at: datetime | None) -> RawPrediction:
    model_uri = answering_model(model_uri, tracking_uri)  # after the checks: nothing is asked of MLflow before
    wrapper = load_pgt_model(model_uri, tracking_uri)
    applied = apply_fitted(input_path, input_format, wrapper.fitted(model_uri), at=at,
                           memory=bool(wrapper.packed.cfg.memory_size))
    frame = predict_applied(wrapper.packed, applied, top_k)
    files = {"predictions": out_path}
    check_output_file(out_path, PREDICTOR, (".parquet", ".csv"), PREDICTION_COLUMNS)
    if out_path.suffix == ".csv":
        write_file_atomically(out_path, frame.write_csv)
    else:
        write_parquet_marked(out_path, frame, PREDICTOR, {MODEL_KEY: model_uri})
    for kind, table in (("quarantine", applied.quarantine), ("unscored", applied.unscored)):
        side = side_files(out_path)[kind]
        if table is not None and table.height:
            files[kind] = write_parquet_marked(side, table, PREDICTOR)
        elif side.exists():  # ours (checked above): an earlier run's, which would mislead
            side.unlink()
    return RawPrediction(frame, applied.counts, applied.unscored, files, model_uri)


@torch.no_grad()
def predict_file(model_uri: str, input_path: Path, out_path: Path, top_k: int = TOP_K,
                 tracking_uri: str | None = None) -> tuple[int, str]:
    """Write, for every sequence of `input_path`, its top-k predictions and their probabilities (highest first).

    Output columns: row (the input's row number), user, top_locations (location ids; 1 is a place unseen in
    train), top_places (the dataset-wide place id where a prediction is an unseen place of the history, i.e. a
    slot of the extended vocabulary, else null), top_probabilities, new_place_probability (the probability of
    id 1: a new place, none of the known or visited ones, for a model with slots; any place unseen in train
    without; with the odds its training's new_place_weight took restored: inference.TopK), and target and
    target_place when the input has them. Returns the number of rows and the model that answered
    (answering_model)."""
    check_top_k(top_k, "--top-k")
    check_output_file(Path(out_path), PREDICTOR, (".parquet",))  # before the model's download
    check_apart(Path(out_path), {"--input": input_path})
    SequenceDataset.check_columns(input_path, require_target=False)
    with output_lock(Path(out_path), command=PREDICTOR):  # one writer, from before the model loads
        return _predict_file(model_uri, input_path, Path(out_path), top_k, tracking_uri)


def _predict_file(model_uri: str, input_path: Path, out_path: Path, top_k: int, tracking_uri: str | None) -> tuple[int, str]:
    model_uri = answering_model(model_uri, tracking_uri)
    model, trained_on = load_model_and_manifest(model_uri, tracking_uri)
    check_lineage(trained_on, Path(input_path).parent, model_uri)  # where the sequences sit in a preprocess folder
    dataset = SequenceDataset.from_parquet(input_path, model.cfg.max_len, require_target=False,
                                           memory=MemoryLayout.of(model.cfg))
    check_vocabulary(model.cfg, dataset, input_path)
    top = top_k_predictions(model, dataset, top_k, live=live_folder(Path(input_path).parent))
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
    check_output_file(out_path, PREDICTOR, (".parquet",))
    write_parquet_marked(out_path, pa.table(columns), PREDICTOR, {MODEL_KEY: model_uri})
    return len(dataset), model_uri


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

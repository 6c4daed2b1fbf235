"""Apply a fitted preprocessing to new data: the run a model was trained on decides every id.

New GPS points (or staypoints) go through the same staypoint, activity and merge rules as the fitted
run. Their activity staypoints join the fitted run's places as if they had been part of its DBSCAN
(preprocessing.fitted_places); clusters of them without a fitted place are new places. Known users keep their ids;
users the fitted data never saw get UNKNOWN_USER, the user table's zero row
(a zero embedding the model accepts). No user filter applies: every person is scored.

With the fitted run's visits (its staypoints.parquet), samples also carry the long-term memory
(preprocessing.memory): a known person's earlier places come from the fitted visits before the new data's first
visit and from the new data's own visits; a person the fitted data never saw remembers the new data only.

The result holds, per user, the latest sample (the history up to the end of the new data, nothing to
predict yet) and, where the new data has them, evaluation samples with targets, built like a test
split (the first `history_days` of the new data only serve as history).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import polars as pl

from infra.errors import InputError, SettingsError
from infra.settings import stored_settings
from preprocessing.config import PreprocessConfig
from preprocessing.fitted_places import join_fitted_places
from preprocessing.locations import merge_staypoints
from preprocessing.memory import MemoryRule, generate_memory
from preprocessing.neighbours import SphereTree
from preprocessing.output import read_manifest
from preprocessing.partitions import InputStaypoints, staypoints_of_input
from preprocessing.queries import collect_in_memory, columns
from preprocessing.rows import instant
from preprocessing.sequences import UNSEEN, find_samples, history_lists, sample_table, time_features
from preprocessing.stages import StageLog

UNKNOWN_USER = 0  # the user id of people absent from the fitted data (the padding row of the user table)
FITTED_FILES = ("manifest.json", "places.parquet", "location_staypoints.parquet", "users.parquet")
VISITS_FILE = "staypoints.parquet"  # the fitted run's visits: what a known person's memory remembers
VISIT_COLUMNS = ("user", "location_id", "location", "started_at", "finished_at", "time_slot", "weekday")
APPLIED_FILES = ("evaluation.parquet", "latest.parquet", "quarantine.parquet", "staypoints.parquet", "places.parquet",
                 "users.parquet", "manifest.json")


@dataclass
class FittedPreprocessing:
    """What a fitted run hands new data: its config, table sizes, places, their core staypoints and users."""

    config: PreprocessConfig  # the fitted run's settings (latest_valid_time dropped: new data is later)
    vocab: dict  # the fitted manifest's `vocab`: the table sizes the model was built with
    places: pl.DataFrame  # location_id, latitude, longitude, location (vocabulary id; 1 = unseen in train)
    clustered: pl.DataFrame  # location_id (null: noise), latitude, longitude, is_core: the staypoints DBSCAN saw
    users: pl.DataFrame  # user (1..), source_user_id
    source: str  # where it came from: a folder or a model URI
    input_sha256: str = ""  # the fitted run's input
    _tree: object = field(default=None, repr=False)  # SphereTree over `clustered`, built on first use
    _clustered_arrays: tuple | None = field(default=None, repr=False)  # (place, is_core) of `clustered`, as numpy
    _known_places: pl.DataFrame | None = field(default=None, repr=False)  # `places` with is_new (False), built once
    # the fitted run's visits, which a known person's memory remembers (preprocessing.memory): user (model id),
    # location_id, location, started_at, finished_at, time_slot, weekday; None where the run's output lacks them
    visits: pl.DataFrame | None = None

    @classmethod
    def from_tables(cls, manifest: dict, places: pl.DataFrame, clustered: pl.DataFrame, users: pl.DataFrame,
                    source: str, visits: pl.DataFrame | None = None) -> FittedPreprocessing:
        if not isinstance(manifest.get("config"), dict) or not isinstance(manifest.get("vocab"), dict):
            raise InputError(source, "the manifest has no `config` and `vocab`; expected a `pgt preprocess` output")
        config = PreprocessConfig.from_dict({**stored_settings(manifest["config"]), "latest_valid_time": None}, source)
        kinds = {"location_id": "integer", "location": "integer", "user": "integer", "latitude": "float",
                 "longitude": "float", "is_core": "boolean", "source_user_id": None}
        for name, table, needed in (("places", places, ("location_id", "latitude", "longitude", "location")),
                                    ("location_staypoints", clustered, ("location_id", "latitude", "longitude", "is_core")),
                                    ("users", users, ("user", "source_user_id"))):
            missing = [c for c in needed if c not in table.columns]
            if missing:
                raise InputError(source, f"{name} table lacks column(s) {', '.join(missing)}")
            for column in needed:
                dtype, kind = table.schema[column], kinds[column]
                ok = (kind is None or (kind == "integer" and dtype.is_integer()) or (kind == "float" and dtype.is_float())
                      or (kind == "boolean" and dtype == pl.Boolean))
                if not ok:
                    raise InputError(source, f"{name} table's column {column} has type {dtype}, expected {kind}; "
                                             "the folder was not written by `pgt preprocess`, or was changed since")
        if visits is not None:
            missing = [c for c in VISIT_COLUMNS if c not in visits.columns]
            if missing:
                raise InputError(source, f"staypoints table lacks column(s) {', '.join(missing)}; the folder was not "
                                         "written by `pgt preprocess`, or was changed since")
            visits = visits.select(VISIT_COLUMNS)
        return cls(config, manifest["vocab"], places.select("location_id", "latitude", "longitude", "location"),
                   clustered.select("location_id", "latitude", "longitude", "is_core"),
                   users.select("user", "source_user_id"),
                   source, str(manifest.get("input_sha256", "")), visits=visits)

    @classmethod
    def from_folder(cls, folder: Path | str) -> FittedPreprocessing:
        """The fitted tables of a full `pgt preprocess` output folder."""
        folder = Path(folder)
        if folder.is_file():
            raise InputError(folder, "is a file; --fitted names the folder `pgt preprocess` wrote for the model's "
                                     "training data")
        if not folder.is_dir():
            raise InputError(folder, "no such folder; expected the `pgt preprocess` output a model was trained on")
        manifest = read_manifest(folder)
        if manifest is None:
            raise InputError(folder, "no manifest.json; expected the `pgt preprocess` output a model was trained on")
        if manifest.get("mode") == "fitted":
            raise InputError(folder, "is itself the output of --fitted; pass the folder of the run the model was trained on")
        missing = [name for name in FITTED_FILES if not (folder / name).is_file()]
        if missing:
            raise InputError(folder, f"lacks {', '.join(missing)}, which `pgt preprocess` writes since the fitted "
                                     "pipeline exists; preprocess the training input again")
        tables = {}
        for name in FITTED_FILES[1:]:
            try:
                tables[name] = pl.read_parquet(folder / name)
            except (pl.exceptions.PolarsError, OSError) as exc:
                raise InputError(folder / name, f"unreadable Parquet ({str(exc).strip().splitlines()[0]})") from None
        visits = None
        if (folder / VISITS_FILE).is_file():
            try:
                visits = pl.read_parquet(folder / VISITS_FILE, columns=list(VISIT_COLUMNS))
            except (pl.exceptions.PolarsError, OSError) as exc:
                raise InputError(folder / VISITS_FILE, f"unreadable Parquet of the fitted visits "
                                                       f"({str(exc).strip().splitlines()[0]})") from None
        return cls.from_tables(manifest, tables["places.parquet"], tables["location_staypoints.parquet"],
                               tables["users.parquet"], str(folder), visits)

    def _coordinates(self, frame: pl.DataFrame) -> np.ndarray:
        axes = ("latitude", "longitude") if self.config.location_axis_order == "lat_lon" else ("longitude", "latitude")
        return np.radians(np.column_stack([frame[a].to_numpy().astype(np.float64) for a in axes])).reshape(-1, 2)

    @property
    def tree(self) -> SphereTree:
        """Radius queries over `clustered` (radians, in the DBSCAN axis order), built on first use."""
        if self._tree is None:
            self._tree = SphereTree(self._coordinates(self.clustered))
        return self._tree

    @property
    def clustered_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(place id, -1 for noise; is_core) of each row of `clustered` as numpy arrays, built on first use: a
        request's staypoints index them instead of gathering table rows."""
        if self._clustered_arrays is None:
            self._clustered_arrays = (self.clustered["location_id"].fill_null(-1).to_numpy().astype(np.int64),
                                      self.clustered["is_core"].to_numpy().astype(bool))
        return self._clustered_arrays

    @property
    def known_places(self) -> pl.DataFrame:
        """`places` (location as Int32) with is_new = False: the fitted part of every applied run's places."""
        if self._known_places is None:
            self._known_places = self.places.with_columns(pl.col("location").cast(pl.Int32),
                                                          pl.lit(False).alias("is_new"))
        return self._known_places

    @property
    def first_new_place(self) -> int:
        """New places are numbered from here: after every fitted place id."""
        return int(self.places["location_id"].max()) + 1 if self.places.height else 0


def encode_applied(merged: pl.DataFrame | pl.LazyFrame, fitted: FittedPreprocessing, rows: int | None = None) -> pl.DataFrame:
    """Add location (the fitted vocabulary's id; UNSEEN for places unseen in train and new places) and user
    (the fitted id; UNKNOWN_USER for people the fitted data never saw).

    User ids match as text, and across representations by integer value where one side holds integers:
    fitted integer ids take new text ids by value ("007" is 7), and new integer ids take fitted text ids
    by value when only one has it (GeoLife's folder "000" and the integer 0 of its Parquet). `rows`: about how many
    rows `merged` has, where it is a LazyFrame (collect_in_memory; None: many)."""
    vocab = fitted.places.lazy().select("location_id", pl.col("location").cast(pl.Int32))
    fitted_int = fitted.users.schema["source_user_id"].is_integer()
    new_int = merged.lazy().collect_schema()["user_id"].is_integer()
    users = fitted.users.lazy().select(pl.col("source_user_id").cast(pl.String).alias("_key"), pl.col("user").cast(pl.Int32))
    keyed = merged.lazy().with_columns(pl.col("user_id").cast(pl.String).alias("_key"))
    as_int = pl.col("_key").str.strip_chars().cast(pl.Int64, strict=False)
    if fitted_int and not new_int:  # by value where the text is an integer
        keyed = keyed.with_columns(pl.coalesce(as_int.cast(pl.String), pl.col("_key")).alias("_key"))
    elif new_int and not fitted_int:  # fitted text ids with a unique integer value
        users = users.with_columns(pl.when(as_int.is_not_null() & (as_int.count().over(as_int) == 1))
                                   .then(as_int.cast(pl.String)).otherwise(pl.col("_key")).alias("_key"))
    return collect_in_memory(
        keyed.join(vocab, on="location_id", how="left", maintain_order="left")
        .join(users, on="_key", how="left", maintain_order="left")
        .with_columns(pl.col("location").fill_null(UNSEEN), pl.col("user").fill_null(UNKNOWN_USER))
        .drop("_key"), merged.height if isinstance(merged, pl.DataFrame) else rows)


def remembered_visits(staypoints: pl.DataFrame, fitted_visits: pl.DataFrame | None) -> pl.DataFrame:
    """The visits the memory of new data remembers: each known person's fitted visits that started before their
    first visit in the new data (which then takes over: no visit counts twice), and every visit of the new data,
    keyed by the new data's user_id. A person the fitted data never saw (user UNKNOWN_USER) has the new data's only."""
    columns = ("user_id", "location", "location_id", "started_at", "finished_at", "time_slot", "weekday")
    own = staypoints.select(columns)
    if fitted_visits is None or fitted_visits.height == 0 or staypoints.height == 0:
        return own
    people = staypoints.filter(pl.col("user") != UNKNOWN_USER).group_by("user_id", "user").agg(
        pl.col("started_at").min().alias("_first"))
    schema = own.schema
    earlier = (fitted_visits.join(people, on="user", how="inner")
               .filter(pl.col("started_at").cast(schema["started_at"]) < pl.col("_first"))
               .select([pl.col(c).cast(schema[c]) for c in columns]))
    return pl.concat([earlier, own])


def generate_applied_samples(staypoints: pl.DataFrame, config: PreprocessConfig, evaluation: bool = True,
                             at: datetime | None = None, memory_visits: pl.DataFrame | None = None
                             ) -> tuple[pl.DataFrame | None, pl.DataFrame]:
    """(evaluation samples, latest samples) from encoded merged staypoints with time features.

    A latest sample is a live prediction for the moment `at` (by default the end of each user's last visit):
    its history is the user's visits of the `history_days` days before the day of `at`, that day included, and
    recency counts from that day; users with fewer than `min_history_staypoints` such visits get none. `at`
    before a user's last visit is an error naming the user. Its columns are those of a split without the
    targets, plus source_user_id, history_end (when the last visit ended) and prediction_time.

    Evaluation samples are the test split's rule applied to the whole new period (targets on or after its
    `history_days`-th day with at least `min_history_staypoints` visits in the days before), with the inputs a
    live prediction would have had: recency counts from the day of the last history visit, as in a latest
    sample at its default time, not from the target's day (which is not known before the visit). Without
    `evaluation`, only the latest samples are built (None in their place).

    With `memory_visits` (remembered_visits), both carry the memory columns (preprocessing.memory): a latest
    sample remembers what ended before its prediction time, days counted back from that time's day."""
    marked = find_samples(staypoints.hstack([pl.Series("split", ["test"] * staypoints.height, pl.String)]),
                          config.history_days, config.min_history_staypoints)
    rule = MemoryRule.of(config) if memory_visits is not None else None
    evaluation = sample_table(marked, "test", anchor="last_visit", memory=rule, visits=memory_visits) \
        if evaluation else None
    day = marked["start_day"].to_numpy().astype(np.int64)
    user_rank = marked["user_id"].rle_id().to_numpy().astype(np.int64)  # rows of a user are together
    last = np.flatnonzero(np.append(user_rank[1:] != user_rank[:-1], True)) if len(user_rank) else np.zeros(0, np.int64)
    key = (user_rank << 32) + day
    target_day = day[last]
    if at is not None:
        late = marked.filter(pl.col("started_at") > instant(at))
        if late.height:
            first = late.row(0, named=True)
            raise SettingsError(f"the prediction time (at) {at.isoformat()} is before the last visit of user "
                                f"{first['user_id']} (it starts {first['started_at'].isoformat()}); a prediction is for a "
                                "moment after the history")
        last_date = marked["started_at"].gather(last).dt.convert_time_zone(config.timezone).dt.date().to_numpy()
        at_date = np.datetime64(at.astimezone(ZoneInfo(config.timezone)).date(), "D")
        target_day = day[last] + (at_date - last_date.astype("datetime64[D]")).astype(np.int64)
    starts = np.searchsorted(key, (user_rank[last] << 32) + np.maximum(target_day - config.history_days, 0), side="left")
    enough = (last + 1 - starts) >= config.min_history_staypoints
    rows = marked[last[enough]]
    when = (rows["finished_at"] if at is None  # by default, the end of the last visit
            else pl.Series("prediction_time", [at] * rows.height, dtype=marked["finished_at"].dtype))
    history = history_lists(marked, starts[enough], last[enough] + 1, target_day[enough])
    remembered = {}
    if rule is not None:
        last_date = rows["started_at"].dt.convert_time_zone(config.timezone).dt.date()
        queries = pl.DataFrame({
            "user_id": rows["user_id"],
            "window_start": marked["started_at"].gather(starts[enough]),
            "moment": when,
            # the day recency counts from: the last visit's, moved on to the prediction time's
            "anchor_date": pl.Series(last_date.to_numpy().astype("datetime64[D]")
                                     + (target_day[enough] - day[last[enough]]).astype("timedelta64[D]")),
            "window_places": pl.Series(history["places"]),
        })
        remembered = generate_memory(memory_visits, queries, rule.places, rule.timezone, rule.time_slot_min)
    latest = pl.DataFrame({
        "user": rows["user"],
        "source_user_id": rows["user_id"],
        **history,
        **remembered,
        "history_end": rows["finished_at"],
        "prediction_time": when,
    })
    return evaluation, latest


@dataclass
class AppliedData:
    """The output of applying a fitted preprocessing: samples, tables and counts."""

    evaluation: pl.DataFrame | None  # samples with targets (the columns of a split); None when not asked for
    latest: pl.DataFrame  # one sample per user, without a target
    staypoints: pl.DataFrame  # merged, encoded staypoints of the new data
    places: pl.DataFrame  # the fitted places and the new ones: location_id, latitude, longitude, location, is_new
    users: pl.DataFrame | None  # source_user_id, user (UNKNOWN_USER = 0 for people the fitted data never saw), known
    quarantine: pl.DataFrame
    counts: dict
    details: dict
    unscored: pl.DataFrame  # source_user_id (as text), reason: the input's people without a latest sample
    # whether the latest samples' recency counts from their last visit's day (no prediction time given), as the
    # evaluation samples' always does; else from the prediction time's day
    latest_at_last_visit: bool = True
    # (users is None, and counts lack its entries, where apply_fitted was asked for no users table)


def apply_fitted_stages(found: InputStaypoints, fitted: FittedPreprocessing, evaluation: bool = True,
                        at: datetime | None = None, users_table: bool = True, memory: bool = False) -> AppliedData:
    """Fitted places -> merge -> features -> samples, from the new data's staypoints (with the activity flag:
    partitions.staypoints_of_input), and who was not scored, and why. Counts reconcile: activity staypoints = on
    fitted places + on new places + noise. With `users_table`, also the table of the input's people and their model
    ids (what `pgt predict` reports; a served answer does without it). With `memory`, the samples carry the long-term
    memory, from the fitted visits and the new data's (remembered_visits)."""
    if memory and fitted.visits is None:
        raise InputError(fitted.source, f"carries no fitted visits ({VISITS_FILE}), which a model that remembers "
                                        "needs; preprocess the training input again")
    config = fitted.config
    counts, details = dict(found.counts), dict(found.details)
    staypoints = found.staypoints
    activities = collect_in_memory(staypoints.lazy().filter("is_activity").sort("user_id", "started_at",
                                                                                maintain_order=True), staypoints.height)
    labelled, new_places = join_fitted_places(activities, fitted)
    located = labelled.filter(pl.col("location_id").is_not_null())
    counts["staypoints_on_fitted_places"] = int((~located["is_new_place"]).sum())
    counts["staypoints_on_new_places"] = int(located["is_new_place"].sum())
    counts["staypoints_noise"] = labelled.height - located.height
    counts["new_places"] = new_places.height
    merged = merge_staypoints(located, config.merge_max_gap_min)
    counts["staypoints_merged"] = merged.height
    # the time features and the ids in one query (merge_staypoints checked the staypoints)
    featured = time_features(merged.lazy(), config.timezone, config.time_slot_min, config.duration_cap_min,
                             config.duration_bucket_min)
    encoded = encode_applied(featured, fitted, merged.height)
    visits = remembered_visits(encoded, fitted.visits) if memory else None
    evaluation, latest = generate_applied_samples(encoded, config, evaluation, at, visits)
    counts["samples"] = {"evaluation": evaluation.height if evaluation is not None else 0, "latest": latest.height}
    users = None
    if users_table:
        users = collect_in_memory(encoded.lazy().group_by("user_id").agg(pl.col("user").first()).sort("user_id")
                                  .rename({"user_id": "source_user_id"})
                                  .with_columns((pl.col("user") != UNKNOWN_USER).alias("known")), encoded.height)
        counts["users"] = users.height
        counts["users_unknown"] = int((~users["known"]).sum())
    unscored = users_not_scored(found.users, found.quarantine, staypoints, encoded, latest, config, at)
    counts["users_not_scored"] = unscored.height
    fresh = columns(new_places, ("location_id", "latitude", "longitude", "location"))
    places = pl.concat([fitted.known_places, fresh.hstack([pl.Series("is_new", [True] * fresh.height)])])
    kept = [c for c in encoded.columns if c not in ("history_start", "is_activity", "is_target")]
    return AppliedData(evaluation, latest, columns(encoded, kept),
                       places, users, found.quarantine, counts, details, unscored, latest_at_last_visit=at is None)


def users_not_scored(valid_users: pl.Series, quarantine: pl.DataFrame, staypoints: pl.DataFrame,
                     located: pl.DataFrame, latest: pl.DataFrame, config: PreprocessConfig,
                     at: datetime | None = None) -> pl.DataFrame:
    """Every person of the input without a latest sample, and why (source_user_id as text, reason), in the order
    of the rules: every row quarantined; no staypoint; no activity staypoint at a place; too short a recent
    history."""
    def ids(frame: pl.DataFrame, column: str = "user_id") -> set[str]:
        return set(frame[column].cast(pl.String).to_list()) if column in frame.columns else set()

    valid = set(valid_users.cast(pl.String).to_list())
    scored = ids(latest, "source_user_id")
    with_staypoints, with_places = ids(staypoints), ids(located)
    reasons = {user: "every row quarantined" for user in ids(quarantine) - valid if user is not None}
    for user in valid - scored:
        if user not in with_staypoints:
            reasons[user] = "no staypoint (no stay within the staypoint distance and time thresholds)"
        elif user not in with_places:
            reasons[user] = "no activity staypoint at a place"
        else:
            reasons[user] = (f"fewer than {config.min_history_staypoints} visits in the {config.history_days} days "
                             + ("before the last visit" if at is None else f"before the prediction time {at.isoformat()}"))
    return pl.DataFrame({"source_user_id": sorted(reasons), "reason": [reasons[u] for u in sorted(reasons)]},
                        schema={"source_user_id": pl.String, "reason": pl.String})


def fitted_summary(fitted: FittedPreprocessing) -> dict:
    """The manifest's `fitted` entry: where the ids come from."""
    return {"source": fitted.source, "input_sha256": fitted.input_sha256, "places": fitted.places.height,
            "users": fitted.users.height}  # the config is the manifest's own


def apply_fitted(input_path: Path | str | pl.DataFrame, input_format: str, fitted: FittedPreprocessing,
                 log: StageLog | None = None, evaluation: bool = True, at: datetime | None = None,
                 name: str = "request", users_table: bool = True, memory: bool = False) -> AppliedData:
    """New data through a fitted preprocessing, in memory (preprocessing/fitted.py): read and validate with
    the fitted run's rules, then staypoints, fitted places, samples (without `evaluation`: the latest only;
    without `users_table`: no table of the input's people; with `memory`: the long-term memory, apply_fitted_stages).
    `input_path`: a file, or a table in memory (a served request) read exactly as that table in a file, called
    `name` in messages."""
    log = log or StageLog()
    source = input_path if isinstance(input_path, pl.DataFrame) else Path(input_path)
    with log.stage("read, validate, staypoints"):
        found = staypoints_of_input(source, input_format, fitted.config, tracking=False, name=name)
    with log.stage("fitted places and samples"):
        return apply_fitted_stages(found, fitted, evaluation, at, users_table, memory)

"""Applying a fitted preprocessing to new data: ids, samples, reuse, refusals, GeoLife 80/20 (the join: test_fitted_places)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import polars as pl
import pytest

from infra.errors import InputError
from preprocessing.config import PreprocessConfig, SynthConfig
from preprocessing.fitted import UNKNOWN_USER, FittedPreprocessing, apply_fitted, encode_applied
from preprocessing.pipeline import preprocess, preprocess_fitted
from preprocessing.synthetic import generate_positionfixes
from tests.conftest import place_agreement, split_days
from tests.preprocessing.test_fitted_places import hand_fitted


def test_known_users_keep_their_id_and_unknown_users_get_zero():
    merged = pl.DataFrame({"user_id": ["u1", "u9"], "location_id": [0, 7]}, schema_overrides={"location_id": pl.Int64})
    encoded = encode_applied(merged, hand_fitted())
    assert encoded["user"].to_list() == [1, UNKNOWN_USER]
    assert encoded["location"].to_list() == [2, 1]  # place 0 is vocabulary id 2; a new place is 1 (unseen in train)


def test_user_ids_match_across_text_and_integer_representations():
    """A model fitted on integer ids knows "007" as 7; one fitted on GeoLife's folder names knows the integer 0 as
    "000", unless two fitted names share the value."""
    fitted = hand_fitted()
    fitted.users = pl.DataFrame({"user": [1, 2], "source_user_id": [7, 12]})
    merged = pl.DataFrame({"user_id": ["007", "12", "x", "8"], "location_id": [0] * 4})
    assert encode_applied(merged, fitted)["user"].to_list() == [1, 2, UNKNOWN_USER, UNKNOWN_USER]
    fitted.users = pl.DataFrame({"user": [1, 2, 3, 4], "source_user_id": ["000", "001", "05", "005"]})
    merged = pl.DataFrame({"user_id": [0, 1, 5, 2], "location_id": [0] * 4})
    assert encode_applied(merged, fitted)["user"].to_list() == [1, 2, UNKNOWN_USER, UNKNOWN_USER]  # 5 is ambiguous
    merged = pl.DataFrame({"user_id": ["000", "0", "05"], "location_id": [0] * 3})
    assert encode_applied(merged, fitted)["user"].to_list() == [1, UNKNOWN_USER, 3]  # text against text: exact


@pytest.fixture(scope="module")
def synthetic_80_20(tmp_path_factory):
    """Synthetic people: a whole-data run, a run on each person's first 80% of days, and that run applied to the
    last 20% plus a person it never saw (user 999)."""
    root = tmp_path_factory.mktemp("fitted_synth")
    points = generate_positionfixes(SynthConfig(users=10, days=90, seed=5))
    early, late = split_days(points)
    stranger = generate_positionfixes(SynthConfig(users=1, days=20, seed=99)).with_columns(
        pl.lit(999, points.schema["user_id"]).alias("user_id"),
        pl.col("tracked_at") + (late["tracked_at"].min() - pl.col("tracked_at").min()))
    points.write_parquet(root / "all.parquet")
    early.write_parquet(root / "early.parquet")
    pl.concat([late, stranger.select(late.columns)]).write_parquet(root / "late.parquet")
    preprocess(root / "all.parquet", "positionfixes", root / "full", progress=False)
    preprocess(root / "early.parquet", "positionfixes", root / "early", progress=False)
    result = preprocess_fitted(root / "late.parquet", "positionfixes", root / "early", root / "late", progress=False)
    return root, result


def test_places_in_both_periods_keep_the_whole_data_ids(synthetic_80_20):
    root, _ = synthetic_80_20
    agree, compared = place_agreement(root / "full", root / "early", root / "late")
    assert compared > 200 and agree / compared >= 0.98, (agree, compared)


def test_every_user_with_enough_history_gets_a_latest_sample(synthetic_80_20):
    root, result = synthetic_80_20
    config = PreprocessConfig()
    staypoints = pl.read_parquet(root / "late" / "staypoints.parquet")
    recent = staypoints.filter(pl.col("start_day") >= pl.col("start_day").max().over("user_id") - config.history_days)
    enough = recent.group_by("user_id").len().filter(pl.col("len") >= config.min_history_staypoints)["user_id"]
    latest = pl.read_parquet(root / "late" / "latest.parquet")
    assert sorted(latest["source_user_id"].to_list()) == sorted(enough.to_list()) and latest.height >= 9
    # each history ends with the user's last visit
    last = staypoints.group_by("user_id").agg(pl.col("location_id").sort_by("started_at").last())
    ends = latest.select(pl.col("source_user_id").alias("user_id"), pl.col("places").list.last().alias("end"))
    assert ends.join(last, on="user_id").select((pl.col("end") == pl.col("location_id")).all()).item()
    stranger = latest.filter(pl.col("source_user_id") == 999)
    assert stranger["user"].to_list() == [UNKNOWN_USER]
    assert result.manifest["counts"]["users_unknown"] == 1


def test_a_prediction_time_anchors_the_latest_samples_and_evaluation_rows_are_live_rows(synthetic_80_20):
    """--at: recency counts from the day of the moment predicted for, the history is the days before it, and each
    row says when it is for; by default that moment is the end of the user's last visit (recency 0 at the last
    visit). Evaluation rows have the inputs of a live row: recency from their last history visit's day."""
    root, _ = synthetic_80_20
    fitted = FittedPreprocessing.from_folder(root / "early")
    default = apply_fitted(root / "late.parquet", "positionfixes", fitted)
    assert default.latest["recency"].list.last().to_list() == [0] * default.latest.height
    assert default.latest["prediction_time"].to_list() == default.latest["history_end"].to_list()
    assert default.latest_at_last_visit  # what predict_applied reads to mix over the next visit's day
    assert default.evaluation["recency"].list.last().to_list() == [0] * default.evaluation.height
    assert (default.evaluation["recency"].list.first() >= 0).all()

    last_end = default.latest["history_end"].max()
    at = (last_end + timedelta(days=2)).replace(hour=12, minute=0)
    later = apply_fitted(root / "late.parquet", "positionfixes", fitted, at=at)
    assert later.latest["prediction_time"].to_list() == [at] * later.latest.height
    assert not later.latest_at_last_visit
    joined = later.latest.join(default.latest, on="source_user_id", suffix="_default")
    # two or more days on: the last visit is that much further back, and never on the day predicted for
    gap = (joined["recency"].list.last() - joined["recency_default"].list.last())
    assert joined.height and (gap >= 2).all() and (joined["recency"].list.last() >= 2).all()
    assert later.latest.height <= default.latest.height  # older visits fall out of the history window
    assert set(later.unscored["source_user_id"]) >= set(default.unscored["source_user_id"])

    with pytest.raises(ValueError, match=r"^the prediction time \(at\) .* is before the last visit of user"):
        apply_fitted(root / "late.parquet", "positionfixes", fitted, at=last_end - timedelta(days=3))


def test_without_the_users_table_the_samples_places_and_unscored_are_the_same(synthetic_80_20):
    """What a served request asks for (users_table=False, no evaluation): the same latest samples and places, and
    the same list of who was not scored and why, without the table of the input's people."""
    root, _ = synthetic_80_20
    fitted = FittedPreprocessing.from_folder(root / "early")
    late = pl.read_parquet(root / "late.parquet")
    start = late["tracked_at"].max()
    odd = pl.DataFrame({"user_id": [7001, 7001, 7002], "tracked_at": [start, start + timedelta(minutes=1), start],
                        "latitude": [39.9, 39.9, 400.0], "longitude": [116.3, 116.3, 116.3]})  # a glimpse; a bad row
    request = pl.concat([late, odd.cast(late.schema)])
    full = apply_fitted(request, "positionfixes", fitted, evaluation=False)
    answer = apply_fitted(request, "positionfixes", fitted, evaluation=False, users_table=False)
    assert full.latest.height > 0 and answer.latest.equals(full.latest) and answer.places.equals(full.places)
    assert answer.unscored.equals(full.unscored)
    assert dict(answer.unscored.iter_rows()) == {
        "7001": "no staypoint (no stay within the staypoint distance and time thresholds)",
        "7002": "every row quarantined"}
    assert answer.users is None and full.users is not None
    assert "users" in full.counts and "users" not in answer.counts
    assert answer.counts["samples"] == full.counts["samples"]
    assert answer.counts["users_not_scored"] == full.counts["users_not_scored"] == full.unscored.height


def test_counts_reconcile_and_the_manifest_names_the_fitted_run(synthetic_80_20):
    root, result = synthetic_80_20
    counts = result.manifest["counts"]
    assert counts["activity_staypoints"] == (counts["staypoints_on_fitted_places"] + counts["staypoints_on_new_places"]
                                             + counts["staypoints_noise"])
    fitted_manifest = json.loads((root / "early" / "manifest.json").read_text())
    assert result.manifest["vocab"] == fitted_manifest["vocab"]  # the model's tables still fit
    assert result.manifest["fitted"]["input_sha256"] == fitted_manifest["input_sha256"]
    evaluation = pl.read_parquet(root / "late" / "evaluation.parquet")
    assert evaluation.height == counts["samples"]["evaluation"] > 50
    assert evaluation["user"].max() < fitted_manifest["vocab"]["users"]
    assert evaluation["locations"].list.max().max() < fitted_manifest["vocab"]["locations"]
    places = pl.read_parquet(root / "late" / "places.parquet")
    assert places.filter("is_new").height == counts["new_places"]
    assert places["location_id"].n_unique() == places.height  # new ids never reuse a fitted one


def test_a_rerun_is_reused_and_a_changed_fit_is_not(synthetic_80_20):
    root, _ = synthetic_80_20
    again = preprocess_fitted(root / "late.parquet", "positionfixes", root / "early", root / "late", progress=False)
    assert again.reused
    other = preprocess_fitted(root / "late.parquet", "positionfixes", root / "full", root / "late", progress=False)
    assert not other.reused and other.manifest["fitted"]["source"] == str(root / "full")


def test_a_folder_from_before_the_fitted_pipeline_is_refused(synthetic_80_20, tmp_path):
    root, _ = synthetic_80_20
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for f in (root / "early").iterdir():
        if f.name != "location_staypoints.parquet":
            (legacy / f.name).write_bytes(f.read_bytes())
    with pytest.raises(InputError, match="lacks location_staypoints.parquet.*preprocess the training input again"):
        FittedPreprocessing.from_folder(legacy)
    with pytest.raises(InputError, match="itself the output of --fitted"):
        FittedPreprocessing.from_folder(root / "late")


def test_cli_fitted_prints_counts_and_refuses_a_config(synthetic_80_20, tmp_path):
    root, _ = synthetic_80_20
    cli = [sys.executable, "-m", "pgt.cli", "preprocess", "--input", str(root / "late.parquet"), "--format",
           "positionfixes", "--fitted", str(root / "early"), "--no-progress"]
    r = subprocess.run([*cli, "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "at fitted places" in r.stdout and "(1 unknown)" in r.stdout and "samples latest" in r.stdout
    (tmp_path / "c.yaml").write_text("history_days: 5\n")
    r = subprocess.run([*cli, "--out", str(tmp_path / "o2"), "--config", str(tmp_path / "c.yaml")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot be combined with --fitted" in r.stderr


@pytest.mark.slow
def test_geolife_80_20_keeps_place_ids_and_scores_every_user(geolife_parquet, tmp_path):
    """All of GeoLife: fit on each user's first 80% of days, apply to the last 20%. Measured: 2,876 of the 2,881
    later staypoints at places both runs share get the whole-data place (the rest: places that new visits bridge)."""
    early, late = split_days(pl.read_parquet(geolife_parquet))
    early.write_parquet(tmp_path / "early.parquet")
    late.write_parquet(tmp_path / "late.parquet")
    del early, late
    preprocess(geolife_parquet, "positionfixes", tmp_path / "full", progress=False)
    preprocess(tmp_path / "early.parquet", "positionfixes", tmp_path / "early", progress=False)
    result = preprocess_fitted(tmp_path / "late.parquet", "positionfixes", tmp_path / "early", tmp_path / "late",
                               progress=False)
    agree, compared = place_agreement(tmp_path / "full", tmp_path / "early", tmp_path / "late")
    assert compared > 2000 and agree / compared >= 0.99, (agree, compared)
    latest = pl.read_parquet(tmp_path / "late" / "latest.parquet")
    staypoints = pl.read_parquet(tmp_path / "late" / "staypoints.parquet")
    recent = staypoints.filter(pl.col("start_day") >= pl.col("start_day").max().over("user_id") - 7)
    enough = recent.group_by("user_id").len().filter(pl.col("len") >= 3)["user_id"]
    assert sorted(latest["source_user_id"].to_list()) == sorted(enough.to_list()) and latest.height >= 80
    assert result.manifest["counts"]["samples"]["evaluation"] > 3000


def test_a_mistyped_or_corrupt_fitted_table_is_named_in_one_line(synthetic_80_20, tmp_path):
    """A fitted folder whose places table was rewritten with text coordinates, or truncated: refused by name."""
    import shutil

    root, _ = synthetic_80_20
    shutil.copytree(root / "early", tmp_path / "fitted")
    places = pl.read_parquet(tmp_path / "fitted" / "places.parquet")
    places.with_columns(pl.col("latitude").cast(pl.String)).write_parquet(tmp_path / "fitted" / "places.parquet")
    with pytest.raises(InputError, match="places table's column latitude has type String, expected float"):
        FittedPreprocessing.from_folder(tmp_path / "fitted")
    (tmp_path / "fitted" / "places.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(InputError, match="places.parquet: unreadable Parquet"):
        FittedPreprocessing.from_folder(tmp_path / "fitted")

"""preprocess() end to end: a hand-built commuter with every count stated, real GeoLife users, reuse, atomicity."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from preprocessing import pipeline
from preprocessing.config import PreprocessConfig
from preprocessing.pipeline import OUTPUT_FILES, preprocess

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
HOME, WORK, MIDWAY = (39.90, 116.30), (39.91, 116.30), (39.905, 116.31)


def commuter_csv(path, days=60, short_days=40):
    """User 1, for `days` days: home until 08:00 (a fix every 10 min), a fix on the way at 08:50, work
    09:00-17:00, on the way 17:50, home from 18:00. User 2 does the same for only `short_days` days.
    Plus two bad rows: a latitude of 95 and a repeated timestamp."""
    rows = []
    for user, n_days in ((1, days), (2, short_days)):
        for d in range(n_days):
            base = T0 + timedelta(days=d)
            rows += [(user, base + timedelta(minutes=m), *HOME) for m in range(0, 8 * 60 + 1, 10)]
            rows.append((user, base + timedelta(hours=8, minutes=50), *MIDWAY))
            rows += [(user, base + timedelta(hours=9, minutes=m), *WORK) for m in range(0, 8 * 60 + 1, 10)]
            rows.append((user, base + timedelta(hours=17, minutes=50), *MIDWAY))
            rows += [(user, base + timedelta(hours=18, minutes=m), *HOME) for m in range(0, 6 * 60, 10)]
    rows.append((1, T0 + timedelta(days=3, hours=12, minutes=5), 95.0, 116.3))
    rows.append((1, T0 + timedelta(days=3, hours=12), 39.91, 116.30))
    df = pl.DataFrame(rows, schema=["user_id", "tracked_at", "latitude", "longitude"], orient="row")
    df.with_columns(pl.col("tracked_at").dt.strftime("%Y-%m-%d %H:%M:%S")).write_csv(path)
    return df.height


def test_hand_built_commuter(tmp_path):
    src = tmp_path / "fixes.csv"
    n = commuter_csv(src)
    result = preprocess(src, "positionfixes", tmp_path / "out", progress=False)
    m = result.manifest
    # staypoints per user: the first morning at home, then per day work (09:00-17:50) and home (18:00-08:50),
    # the last evening ending at its last fix: 2 * days + 1
    assert m["counts"] == {
        "positionfixes_read": n, "positionfixes_quarantined": 2,
        "staypoints": 121 + 81, "activity_staypoints": 121 + 81,
        "users_kept": 1,  # user 2 tracks 39 days
        "locations": 2, "staypoints_merged": 121,
        # last day 59: train days 0..35, validation 36..47, test 48..59; targets from the 8th day of each
        # split on, two a day: train days 7..35, validation 43..47, test 55..59
        "samples": {"train": 58, "validation": 10, "test": 10},
    }
    assert m["vocab"] == {"locations": 4, "users": 2}
    assert set(m["details"]["quarantine_reasons"]) == {"latitude outside [-90, 90]",
                                                      "repeats the (user_id, tracked_at) of an earlier fix"}
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    test = pl.read_parquet(out / "test.parquet").sort("target_started_at")
    first = test.row(0, named=True)  # work on day 55: history = day 48's work and home ... day 54's home
    assert first["target"] == 3 and first["user"] == 1  # DBSCAN labels home 0 (seen first) and work 1 -> 2, 3
    assert first["locations"] == [3, 2] * 7
    assert first["recency"] == [7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1]
    assert first["time_slots"] == [36, 72] * 7
    assert first["durations"] == [530 // 30, 890 // 30] * 7  # 09:00-17:50 and 18:00-08:50
    q = pl.read_parquet(out / "quarantine.parquet")
    assert q.height == 2 and q["latitude"].to_list() == ["95.0", "39.91"]


def test_reconciles_and_is_well_formed(geolife_few_users, tmp_path):
    result = preprocess(geolife_few_users, "positionfixes", tmp_path / "out", progress=False)
    m, out = result.manifest, tmp_path / "out"
    c = m["counts"]
    q = pl.read_parquet(out / "quarantine.parquet")
    assert q.height == c["positionfixes_quarantined"] > 0
    assert c["positionfixes_read"] == pl.scan_parquet(geolife_few_users).select(pl.len()).collect().item()
    assert c["staypoints"] >= c["activity_staypoints"] >= c["staypoints_merged"] > 0
    assert c["users_kept"] == 5 and m["vocab"]["users"] == 6  # all five have samples in every split
    assert m["input_sha256"] == pipeline.input_sha256(geolife_few_users, "positionfixes")
    for split in ("train", "validation", "test"):
        s = pl.read_parquet(out / f"{split}.parquet")
        assert s.height == c["samples"][split] > 0
        lengths = s["locations"].list.len()
        assert (lengths >= 3).all()
        for col in ("time_slots", "weekdays", "durations", "recency"):
            assert (s[col].list.len() == lengths).all()
        assert s["recency"].list.min().min() >= 0 and s["recency"].list.max().max() <= 7
        assert s["time_slots"].list.max().max() <= 95 and s["durations"].list.max().max() <= 95
        assert s["target"].min() >= 1 and s["target"].max() < m["vocab"]["locations"]
        assert s["user"].min() >= 1 and s["user"].max() < m["vocab"]["users"]
        if split == "train":
            assert s["target"].min() >= 2  # every train location is in the vocabulary
    staypoints = pl.read_parquet(out / "staypoints.parquet")
    assert staypoints.height == m["details"]["staypoints_of_users_with_samples"]


def test_reuse_force_and_config_change(tmp_path):
    src = tmp_path / "fixes.csv"
    commuter_csv(src)
    out = tmp_path / "out"
    first = preprocess(src, "positionfixes", out, progress=False)
    stamp = (out / "train.parquet").stat().st_mtime_ns
    again = preprocess(src, "positionfixes", out, progress=False)
    assert again.reused and again.manifest == first.manifest
    assert (out / "train.parquet").stat().st_mtime_ns == stamp
    forced = preprocess(src, "positionfixes", out, force=True, progress=False)
    assert not forced.reused and (out / "train.parquet").stat().st_mtime_ns != stamp
    changed = preprocess(src, "positionfixes", out, PreprocessConfig(history_days=6), progress=False)
    assert not changed.reused and changed.manifest["config"]["history_days"] == 6
    assert json.loads((out / "manifest.json").read_text())["config"]["history_days"] == 6
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folders left


def test_a_crash_leaves_no_half_output(tmp_path, monkeypatch):
    src = tmp_path / "fixes.csv"
    commuter_csv(src)
    out = tmp_path / "out"
    calls = []

    def failing_write(self, path, **kwargs):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        return original(self, path, **kwargs)

    original = pl.DataFrame.write_parquet
    monkeypatch.setattr(pl.DataFrame, "write_parquet", failing_write)
    with pytest.raises(OSError, match="disk full"):
        preprocess(src, "positionfixes", out, progress=False)
    assert not out.exists() and list(tmp_path.iterdir()) == [src]
    monkeypatch.setattr(pl.DataFrame, "write_parquet", original)
    good = preprocess(src, "positionfixes", out, progress=False)
    calls.clear()
    monkeypatch.setattr(pl.DataFrame, "write_parquet", failing_write)
    with pytest.raises(OSError):
        preprocess(src, "positionfixes", out, force=True, progress=False)
    assert json.loads((out / "manifest.json").read_text()) == good.manifest  # the previous output is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixes.csv", "out"]


def test_staypoint_and_plt_inputs(plt_sample, trackintel_staypoints, tmp_path):
    plt = preprocess(plt_sample, "geolife-plt", tmp_path / "plt", progress=False).manifest["counts"]
    assert plt["positionfixes_read"] == 164_531 and plt["positionfixes_quarantined"] == 213
    assert plt["staypoints"] > 0 and plt["users_kept"] == 0  # the sample spans about three weeks
    sp = preprocess(trackintel_staypoints, "staypoints", tmp_path / "sp", progress=False).manifest["counts"]
    assert (sp["positionfixes_read"], sp["positionfixes_quarantined"], sp["staypoints"]) == (58, 0, 58)
    assert sp["activity_staypoints"] == 3  # lasting at least 25 min: 713, 704 and 136 min (the file's own flag differs)


def test_an_occupied_folder_is_not_overwritten(tmp_path):
    src = tmp_path / "fixes.csv"
    commuter_csv(src)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    from preprocessing.errors import InputError

    with pytest.raises(InputError, match="holds files that `pgt preprocess` did not write \\(notes.txt\\)"):
        preprocess(src, "positionfixes", tmp_path / "mine", progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"

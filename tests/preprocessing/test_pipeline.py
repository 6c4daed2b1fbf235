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
    assert m["vocab"] == {"locations": 4, "users": 2, "time_slots": 96, "weekdays": 7, "recency": 8, "durations": 96,
                          "max_history": 16}
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

    def failing_write(table, path, **kwargs):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        return original(table, path, **kwargs)

    original = pipeline.write_parquet  # the writer of the final tables
    monkeypatch.setattr(pipeline, "write_parquet", failing_write)
    with pytest.raises(OSError, match="disk full"):
        preprocess(src, "positionfixes", out, progress=False)
    assert not out.exists() and list(tmp_path.iterdir()) == [src]
    monkeypatch.setattr(pipeline, "write_parquet", original)
    good = preprocess(src, "positionfixes", out, progress=False)
    calls.clear()
    monkeypatch.setattr(pipeline, "write_parquet", failing_write)
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
    from infra.errors import InputError

    with pytest.raises(InputError, match="holds files that `pgt preprocess` did not write \\(notes.txt\\)"):
        preprocess(src, "positionfixes", tmp_path / "mine", progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


def test_force_never_deletes_files_it_did_not_write(tmp_path):
    """An output folder in which the user keeps a notes file: reuse, --force and a changed config all refuse,
    naming the file; nothing is replaced. Taking the file out lets the run replace the folder."""
    from infra.errors import InputError

    src = tmp_path / "fixes.csv"
    commuter_csv(src)
    out = tmp_path / "out"
    first = preprocess(src, "positionfixes", out, progress=False)
    assert first.manifest["producer"] == "pgt preprocess"
    (out / "notes.txt").write_text("precious")
    (out / "runs").mkdir()
    for kwargs in ({}, {"force": True}, {"config": PreprocessConfig(history_days=6)}):
        with pytest.raises(InputError, match=r"also holds files that `pgt preprocess` did not write \(notes.txt, runs\)"):
            preprocess(src, "positionfixes", out, progress=False, **kwargs)
        assert (out / "notes.txt").read_text() == "precious"
    (out / "notes.txt").unlink()
    (out / "runs").rmdir()
    assert not preprocess(src, "positionfixes", out, force=True, progress=False).reused


def test_a_folder_with_someone_elses_manifest_is_refused(tmp_path):
    from infra.errors import InputError

    src = tmp_path / "fixes.csv"
    commuter_csv(src)
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "my npm package"}')
    with pytest.raises(InputError, match="did not write \\(manifest.json\\)"):
        preprocess(src, "positionfixes", out, force=True, progress=False)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="did not write"):
        preprocess(src, "positionfixes", out, progress=False)
    assert (out / "manifest.json").read_text() == "{not json"


def test_stale_temporaries_of_killed_runs_are_removed(tmp_path):
    """A hidden temporary folder of a process that no longer runs goes; one of a live process stays."""
    import os
    import subprocess

    src = tmp_path / "fixes.csv"
    commuter_csv(src)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".out.tmp-{dead.pid}-0123abcd"
    stale.mkdir()
    (stale / "train.parquet").write_bytes(b"half")
    live = tmp_path / f".out.tmp-{os.getppid()}-0123abcd"
    live.mkdir()
    preprocess(src, "positionfixes", tmp_path / "out", progress=False)
    assert not stale.exists() and live.exists()


def test_a_second_writer_is_refused_naming_the_first_and_a_later_run_reuses(tmp_path):
    """While another command holds the output (its lock, here held by this test's process), `pgt preprocess` into it
    is refused in one line naming that command and its process, writing nothing; once it ended, the run writes, and
    the next one reuses."""
    import os

    from infra.output import output_lock
    from tests.in_process import pgt_here

    src = tmp_path / "fixes.csv"
    commuter_csv(src)
    out = tmp_path / "out"
    args = ("preprocess", "--input", src, "--format", "positionfixes", "--out", out, "--no-progress")
    with output_lock(out, command="pgt preprocess"):
        r = pgt_here(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"another `pgt preprocess` (pid {os.getpid()}) is writing this output" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixes.csv"]  # nothing written, the lock gone with its holder
    verbs = [pgt_here(*args).stdout.split()[0] for _ in range(2)]
    assert verbs == ["wrote", "reused"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixes.csv", "out"]


def test_the_manifest_records_every_feature_table_size(tmp_path):
    src = tmp_path / "fixes.csv"
    commuter_csv(src)
    config = PreprocessConfig(time_slot_min=10, history_days=5, duration_bucket_min=60)
    vocab = preprocess(src, "positionfixes", tmp_path / "out", config, progress=False).manifest["vocab"]
    assert {k: vocab[k] for k in ("time_slots", "weekdays", "recency", "durations")} == {
        "time_slots": 144, "weekdays": 7, "recency": 6, "durations": 48}
    train = pl.read_parquet(tmp_path / "out" / "train.parquet")
    assert train["time_slots"].explode().max() < 144 and train["recency"].explode().max() <= 5


def test_the_runner_s_bar_covers_every_stage_once():
    """The runner owns progress: the steps of the table cover the bar's stages between hashing and writing, in
    order, each once; the stages themselves take no progress argument."""
    import inspect

    from preprocessing.pipeline import STEPS
    from preprocessing.stages import STAGES, stage_locations, stage_sequences, stage_staypoints

    assert [name for step in STEPS for name in step.shows] == list(STAGES[1:-1])
    for stage in (stage_staypoints, stage_locations, stage_sequences):
        assert not {"advance", "bar"} & set(inspect.signature(stage).parameters), stage.__name__

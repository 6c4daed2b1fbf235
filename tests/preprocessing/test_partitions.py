"""Preprocessing partition by partition, and on Ray: the outputs are byte-identical to one partition's, in
every format, with bad rows and text user ids spread over the partitions."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from infra.errors import InputError
from preprocessing.config import PreprocessConfig
from preprocessing.engine import EngineConfig
from preprocessing.partitions import auto_partitions, staypoints_of_input
from preprocessing.pipeline import OUTPUT_FILES, preprocess
from tests.conftest import PROJECT_ROOT, ray_cluster

CONFIG = PreprocessConfig(latest_valid_time="2030-01-01")  # one window for every run compared


def digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in OUTPUT_FILES if name.endswith(".parquet")}


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def assert_same_outputs(a: Path, b: Path) -> None:
    assert digests(a) == digests(b)
    ma, mb = manifest(a), manifest(b)
    assert (ma["counts"], ma["vocab"], ma["details"]) == (mb["counts"], mb["vocab"], mb["details"])


@pytest.mark.real_data
def test_partitions_and_tiles_give_byte_identical_outputs(geolife_few_users, tmp_path):
    """Five GeoLife users (599,079 fixes): one partition (the automatic count here), 4 partitions, and 4
    partitions with DBSCAN by 0.01-degree tiles write the same nine Parquet files, byte for byte."""
    assert auto_partitions(geolife_few_users, "positionfixes") == 1
    runs = {}
    for name, engine in {"one": EngineConfig(), "four": EngineConfig(partitions=4),
                         "tiles": EngineConfig(partitions=4, tile_deg=0.01)}.items():
        runs[name] = preprocess(geolife_few_users, "positionfixes", tmp_path / name, CONFIG, progress=False, engine=engine)
    assert runs["one"].manifest["counts"]["positionfixes_read"] == 599_079
    assert runs["one"].manifest["engine"]["partitions_used"] == 1 and runs["four"].manifest["engine"]["partitions_used"] == 4
    assert runs["one"].manifest["counts"]["locations"] > 20
    assert_same_outputs(tmp_path / "one", tmp_path / "four")
    assert_same_outputs(tmp_path / "one", tmp_path / "tiles")
    # a rerun with another engine is the same result: reused, not recomputed
    again = preprocess(geolife_few_users, "positionfixes", tmp_path / "one", CONFIG, progress=False,
                       engine=EngineConfig(partitions=2))
    assert again.reused


def odd_csv(path: Path) -> Path:
    """12 users written as pandas writes a float column ("3.0"), 40 fixes each over 3 hours at 2 places, plus
    a bad time, a (0, 0) fix, a missing user and a repeated fix: 484 rows, 4 of them quarantined."""
    rows = []
    for user in range(12):
        for i in range(40):
            lat = 39.9 + 0.01 * user + (0.005 if i >= 20 else 0.0)
            rows.append((f"{user}.0", f"2008-10-23 {i // 12 + 1:02d}:{(i % 12) * 5:02d}:00", lat, 116.3))
    rows += [("3.0", "not a time", 39.9, 116.3), ("4.0", "2008-10-24 01:00:00", 0.0, 0.0),
             ("", "2008-10-24 01:00:00", 39.9, 116.3), rows[5]]
    pl.DataFrame(rows, schema=["user_id", "tracked_at", "latitude", "longitude"], orient="row").write_csv(path)
    return path


@pytest.mark.parametrize("partitions", [2, 5, 12])
def test_text_user_ids_and_bad_rows_spread_over_partitions(tmp_path, partitions):
    path = odd_csv(tmp_path / "points.csv")
    whole = staypoints_of_input(path, "positionfixes", CONFIG)  # one partition: the input itself
    parted = staypoints_of_input(path, "positionfixes", CONFIG, partitions, work_dir=tmp_path)
    assert parted.counts == whole.counts == {"positionfixes_read": 484, "positionfixes_quarantined": 4,
                                             "staypoints": 24, "activity_staypoints": 24}
    assert parted.details == whole.details
    for name in ("staypoints", "tracking", "quarantine"):
        assert_frame_equal(getattr(parted, name), getattr(whole, name))
    assert sorted(parted.users.to_list()) == sorted(whole.users.to_list()) == list(range(12))
    assert parted.staypoints["user_id"].dtype == pl.Int64  # "3.0" is user 3 in every partition
    assert parted.quarantine["source_row"].to_list() == [480, 481, 482, 483]
    assert parted.quarantine["reason"][-1] == "repeats the (user_id, tracked_at) of an earlier fix"
    assert [p.name for p in tmp_path.iterdir() if "pgt-partitions" in p.name] == []  # parts removed


def test_a_table_in_memory_is_one_partition_read_as_the_same_table_in_a_file(tmp_path):
    """A served request's table takes the one path as its file would, without a scratch folder."""
    path = odd_csv(tmp_path / "points.csv")
    frame = pl.read_csv(path, infer_schema=False)  # as stored: text, like the CSV's columns
    scratch = tmp_path / "scratch"
    in_memory = staypoints_of_input(frame, "positionfixes", CONFIG, partitions=4, work_dir=scratch, tracking=False,
                                    name="request")
    from_file = staypoints_of_input(path, "positionfixes", CONFIG, tracking=False)
    assert not scratch.exists() and in_memory.tracking is None
    assert in_memory.counts == from_file.counts
    assert_frame_equal(in_memory.staypoints, from_file.staypoints)
    assert_frame_equal(in_memory.quarantine.drop("source_file"), from_file.quarantine.drop("source_file"))
    assert set(in_memory.quarantine["source_file"]) == {"request"}
    with pytest.raises(InputError, match="^request: no valid rows: all 1 rows were quarantined"):
        staypoints_of_input(frame.head(1).with_columns(pl.lit("x").alias("tracked_at")), "positionfixes", CONFIG)


def test_parts_of_a_killed_run_are_removed_by_the_next(tmp_path):
    """A run killed while splitting leaves `.pgt-partitions.split-<pid>-<id>`; the next run in that work dir
    removes it when that process is gone, and leaves a running one's alone."""
    path = odd_csv(tmp_path / "points.csv")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".pgt-partitions.split-{int(dead.stdout)}-0000abcd"
    live = tmp_path / f".pgt-partitions.split-{os.getppid()}-0000abcd"
    for folder in (stale, live):
        (folder / "_part=0").mkdir(parents=True)
    staypoints_of_input(path, "positionfixes", CONFIG, 2, work_dir=tmp_path)
    assert not stale.exists() and live.exists()


@pytest.mark.real_data
def test_geolife_folder_partitions_by_user_folder(plt_sample, trackintel_staypoints):
    """The .plt sample by user folders, and trackintel's staypoints by hashed users: the whole-input tables."""
    for path, fmt in ((plt_sample, "geolife-plt"), (trackintel_staypoints, "staypoints")):
        whole = staypoints_of_input(path, fmt, CONFIG)
        parted = staypoints_of_input(path, fmt, CONFIG, 3)
        assert parted.counts == whole.counts and parted.details == whole.details
        for name in ("staypoints", "tracking", "quarantine"):
            assert_frame_equal(getattr(parted, name), getattr(whole, name))


def test_tiles_are_automatic_past_200k_staypoints():
    assert EngineConfig().tiles_for(200_000) == 0.0 and EngineConfig().tiles_for(200_001) == 0.05
    assert EngineConfig(tile_deg=0).tiles_for(10**7) == 0.0 and EngineConfig(tile_deg=0.2).tiles_for(10) == 0.2


def test_engine_settings_are_checked_at_the_door():
    with pytest.raises(ValueError, match="engine must be one of local, ray, got 'spark'"):
        EngineConfig(engine="spark")
    with pytest.raises(ValueError, match=r"partitions must be in \[0, 1048576\], got -1"):
        EngineConfig(partitions=-1)
    with pytest.raises(ValueError, match=r"tile_deg must be in \[0.0, inf\), got -0.1"):
        EngineConfig(tile_deg=-0.1)
    with pytest.raises(ValueError, match="address is for engine 'ray' only"):
        EngineConfig(address="127.0.0.1:6379")


@pytest.mark.slow
@pytest.mark.real_data
def test_ray_engine_on_a_two_node_cluster_writes_the_local_engines_outputs(geolife_few_users, tmp_path):
    """`pgt preprocess --engine ray --address HOST:PORT` on a head and a worker node on loopback: partitions and
    DBSCAN tiles run as Ray tasks on both nodes, and the outputs are those of the local engine, byte for byte."""
    preprocess(geolife_few_users, "positionfixes", tmp_path / "local", CONFIG, progress=False)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(CONFIG.to_dict()))
    with ray_cluster('{"node_a": 1}', '{"node_b": 1}') as (address, env):
        r = subprocess.run([sys.executable, "-m", "pgt.cli", "preprocess", "--input", str(geolife_few_users),
                            "--format", "positionfixes", "--out", str(tmp_path / "ray"), "--config", str(config_file),
                            "--engine", "ray", "--address", address, "--partitions", "6", "--tile-deg", "0.01",
                            "--no-progress"], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_outputs(tmp_path / "local", tmp_path / "ray")
    engine = manifest(tmp_path / "ray")["engine"]
    assert engine["engine"] == "ray" and engine["partitions_used"] == 6
    assert len(engine["ray_tasks_per_node"]) == 2  # both nodes ran tasks


@pytest.mark.parametrize("engine, partitions", [("local", 1), ("local", 3), ("ray", 1)])
def test_a_page_that_cannot_be_decoded_is_one_line_in_every_engine(tmp_path, engine, partitions):
    """The input is decoded lazily: in the split (3 partitions), in the task that reads it (1 partition), or
    in a Ray task. Each way the CLI prints one line naming the file and the column, and exits with 2."""
    from tests.test_bad_inputs import _base, _corrupt_page

    _base(tmp_path).write_parquet(tmp_path / "base.parquet", compression="uncompressed")
    _corrupt_page(tmp_path / "base.parquet", tmp_path / "corrupt.parquet", 2)
    r = subprocess.run([sys.executable, "-m", "pgt.cli", "preprocess", "--input", str(tmp_path / "corrupt.parquet"),
                        "--format", "positionfixes", "--out", str(tmp_path / "out"), "--engine", engine,
                        "--partitions", str(partitions), "--work-dir", str(tmp_path)],
                       cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stderr.strip().splitlines() if "Started a local Ray instance" not in line and line]
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1, lines  # Ray's own banner aside; the progress bars are hidden too
    assert lines[0].startswith(f"error: {tmp_path / 'corrupt.parquet'}: unreadable Parquet (column latitude)"), lines
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if "pgt-partitions" in p.name] == []

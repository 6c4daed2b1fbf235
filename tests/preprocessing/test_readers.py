"""The three readers on real files, every bad-row class, and reconciling counts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from infra.errors import InputError
from preprocessing.geolife import read_geolife_plt
from preprocessing.readers import _staypoint_rules, read_positionfixes, read_staypoints
from preprocessing.rows import TimeWindow

UTC = timezone.utc


def test_geolife_plt_sample(plt_sample):
    r = read_geolife_plt(plt_sample)
    assert r.rows_read == 164_531  # the README's count for the 11 users' 111 files
    assert r.rows_read == r.table.height + r.quarantine.height
    assert set(r.quarantine["reason"]) == {"repeats the (user_id, tracked_at) of an earlier fix"}
    assert r.table["user_id"].unique().sort().to_list() == [f"{i:03d}" for i in range(11)]  # folder names, as text
    first = r.table.row(0, named=True)  # Data/000/Trajectory/20081023025304.plt, first fix
    assert first == {"user_id": "000", "tracked_at": datetime(2008, 10, 23, 2, 53, 4, tzinfo=UTC),
                     "latitude": 39.984702, "longitude": 116.318417}
    q = r.quarantine.row(0, named=True)  # originals kept as text, with file and row
    assert q["source_file"].endswith(".plt") and q["user_id"] == "010" and q["date"] and q["time"]
    # the folder may also be given as Data itself
    assert read_geolife_plt(plt_sample / "Data").rows_read == 164_531


def test_trackintel_staypoints(trackintel_staypoints):
    r = read_staypoints(trackintel_staypoints)
    assert (r.rows_read, r.table.height, r.quarantine.height) == (58, 58, 0)
    assert r.table.schema["user_id"] == pl.Int64  # 0.0, 1.0 ... as trackintel writes them
    first = r.table.row(0, named=True)
    assert first["started_at"] == datetime(2008, 10, 23, 3, 5, 5, tzinfo=UTC)
    assert (first["longitude"], first["latitude"]) == pytest.approx((116.2987203333333, 39.98398866666667))


def test_geolife_parquet_few_users(geolife_few_users):
    raw = pl.read_parquet(geolife_few_users)
    r = read_positionfixes(geolife_few_users)
    repeats = raw.height - raw.select(pl.struct("user_id", "tracked_at").n_unique()).item()
    assert r.rows_read == raw.height
    assert r.quarantine.height == repeats  # these users have no other defect
    assert r.table.height == raw.height - repeats
    assert r.table.select(pl.struct("user_id", "tracked_at").is_unique().all()).item()
    assert r.table.select((pl.col("tracked_at").diff().over("user_id").dt.total_milliseconds() > 0).all()).item()
    # originals are the Parquet's exact decimal text
    assert r.quarantine["latitude"].str.contains(r"^\d+\.\d{8}$").all()


BAD_POSITIONFIXES = """user_id,tracked_at,latitude,longitude
1,2008-10-23 02:53:04,39.9847,116.3184
1,2008-10-23 02:53:10,39.9846,116.3185
,2008-10-23 02:53:15,39.98,116.31
1,,39.98,116.31
1,yesterday,39.98,116.31
1,2008-10-23 02:53:20,,116.31
1,2008-10-23 02:53:25,north,116.31
1,2008-10-23 02:53:30,400.17,116.31
1,2008-10-23 02:53:35,39.98,
1,2008-10-23 02:53:40,39.98,east
1,2008-10-23 02:53:45,39.98,-181
1,2008-10-23T02:53:04Z,39.99,116.32
2,2008-10-23 02:53:04+08:00,39.98,116.31
"""


def test_every_bad_row_class_is_quarantined_with_its_reason(tmp_path):
    path = tmp_path / "fixes.csv"
    path.write_text(BAD_POSITIONFIXES)
    r = read_positionfixes(path)
    assert (r.rows_read, r.table.height, r.quarantine.height) == (13, 3, 10)
    reasons = dict(zip(r.quarantine["source_row"], r.quarantine["reason"]))
    assert reasons == {
        2: "missing user_id",
        3: "missing tracked_at",
        4: "unparseable tracked_at (expected ISO 8601 such as 2008-10-23 02:53:04)",
        5: "missing latitude",
        6: "unparseable latitude (expected decimal degrees)",
        7: "latitude outside [-90, 90]",
        8: "missing longitude",
        9: "unparseable longitude (expected decimal degrees)",
        10: "longitude outside [-180, 180]",
        11: "repeats the (user_id, tracked_at) of an earlier fix",  # same instant as row 0, written with Z
    }
    row7 = r.quarantine.filter(pl.col("source_row") == 7).row(0, named=True)
    assert (row7["latitude"], row7["tracked_at"], row7["source_file"]) == ("400.17", "2008-10-23 02:53:30", str(path))
    # the kept rows, sorted; the +08:00 offset is honoured
    assert r.table["tracked_at"].to_list() == [
        datetime(2008, 10, 23, 2, 53, 4, tzinfo=UTC), datetime(2008, 10, 23, 2, 53, 10, tzinfo=UTC),
        datetime(2008, 10, 22, 18, 53, 4, tzinfo=UTC)]


def test_the_first_fix_in_file_order_wins_a_repeated_time(tmp_path):
    path = tmp_path / "fixes.csv"
    path.write_text("user_id,tracked_at,latitude,longitude\n7,2008-10-23 03:00:00,1,1\n7,2008-10-23 02:00:00,2,2\n"
                    "7,2008-10-23 03:00:00,3,3\n7,2008-10-23 02:00:00,95,4\n7,2008-10-23 02:00:00,5,5\n")
    r = read_positionfixes(path)
    assert r.table["latitude"].to_list() == [2.0, 1.0]
    assert r.quarantine.sort("source_row")["source_row"].to_list() == [2, 3, 4]
    assert r.quarantine.sort("source_row")["reason"].to_list()[1] == "latitude outside [-90, 90]"


BAD_STAYPOINTS = """started_at,finished_at,geom,user_id
2008-10-23 03:05:05,2008-10-23 04:05:05,POINT (116.29 39.98),0.0
2008-10-23 05:05:05,2008-10-23 04:05:05,POINT (116.29 39.98),0.0
2008-10-23 06:05:05,2008-10-23 07:05:05,POINT (116.29 39.98),
2008-10-23 06:05:05,2008-10-23 07:05:05,POINT (116.29),1.0
2008-10-23 06:05:05,2008-10-23 07:05:05,POINT (116.29 95),1.0
2008-10-23 06:05:05,later,POINT (116.29 39.98),1.0
2008-10-23 03:05:05,2008-10-23 04:10:00,POINT (116.30 39.99),0.0
2008-10-23 08:00:00,2008-10-23 09:00:00,POINT(116.31 39.97),1.0
"""


def test_bad_staypoint_rows(tmp_path):
    path = tmp_path / "sp.csv"
    path.write_text(BAD_STAYPOINTS)
    r = read_staypoints(path)
    assert (r.rows_read, r.table.height) == (8, 2)
    assert r.quarantine.sort("source_row")["reason"].to_list() == [
        "finished_at before started_at",
        "missing user_id",
        "unparseable geom (expected a WKT or WKB POINT (lon lat))",
        "latitude outside [-90, 90]",
        "unparseable finished_at (expected ISO 8601 such as 2008-10-23 02:53:04)",
        "repeats the (user_id, started_at) of an earlier staypoint",
    ]
    assert r.table["longitude"].to_list() == [116.29, 116.31]


def test_a_table_in_memory_reads_as_the_same_table_in_a_file(tmp_path):
    """A served request is read without a file: the same rows kept and quarantined for the same reasons, its
    messages and quarantine naming it (`name`) instead of a path."""
    csv = tmp_path / "sp.csv"
    csv.write_text(BAD_STAYPOINTS)
    from_file = read_staypoints(csv)
    frame = pl.read_csv(csv, infer_schema=False)  # text columns, as JSON records arrive
    in_memory = read_staypoints(frame, name="request")
    assert in_memory.table.equals(from_file.table) and in_memory.rows_read == 8
    assert in_memory.quarantine.drop("source_file").equals(from_file.quarantine.drop("source_file"))
    assert set(in_memory.quarantine["source_file"]) == {"request"}
    fixes = pl.DataFrame({"user_id": ["a", "a"], "tracked_at": ["2008-10-23 02:53:04", "soon"],
                          "latitude": [39.9, 39.9], "longitude": [116.3, 116.3]})
    read = read_positionfixes(fixes, name="request")
    assert (read.table.height, read.quarantine["reason"].to_list()) == (
        1, ["unparseable tracked_at (expected ISO 8601 such as 2008-10-23 02:53:04)"])
    with pytest.raises(InputError, match=r"^request: missing column latitude; expected user_id, tracked_at, latitude, "
                                         r"longitude; found: user_id, tracked_at, longitude$"):
        read_positionfixes(fixes.drop("latitude"), name="request")
    with pytest.raises(InputError, match=r"^request: no rows$"):
        read_positionfixes(fixes.clear(), name="request")
    with pytest.raises(InputError, match=r"^request: column tracked_at has type Boolean, expected a timestamp"):
        read_positionfixes(fixes.with_columns(pl.lit(True).alias("tracked_at")), name="request")


def test_staypoints_with_latitude_longitude_columns_and_wkb(tmp_path):
    import struct

    path = tmp_path / "sp.parquet"
    wkb = struct.pack("<BIdd", 1, 1, 116.31, 39.97)
    pl.DataFrame({
        "started_at": [datetime(2008, 10, 23, 8, tzinfo=UTC)], "finished_at": [datetime(2008, 10, 23, 9, tzinfo=UTC)],
        "geom": [wkb], "user_id": ["alice"],
    }).write_parquet(path)
    r = read_staypoints(path)
    assert r.table.select("user_id", "latitude", "longitude").row(0) == ("alice", 39.97, 116.31)
    path = tmp_path / "sp.csv"
    path.write_text("user_id,started_at,finished_at,latitude,longitude\n3,2008-10-23 08:00,2008-10-23T09:00+01:00,39.9,116.3\n"
                    "3,soon,2008-10-23 09:00,39.9,116.3\n")
    r = read_staypoints(path)
    assert r.table.select("started_at", "finished_at").row(0) == (datetime(2008, 10, 23, 8, tzinfo=UTC),
                                                                 datetime(2008, 10, 23, 8, tzinfo=UTC))
    assert r.quarantine["reason"].to_list() == ["unparseable started_at (expected ISO 8601 such as 2008-10-23 02:53:04)"]


@pytest.mark.parametrize("name,content,problem", [
    ("missing.csv", None, "no such file"),
    ("cols.csv", "user_id,time,latitude,longitude\n1,2008-10-23 02:53:04,1,1\n", "missing column tracked_at"),
    ("header.csv", "user_id,tracked_at,latitude,longitude\n", "header only"),
    ("fake.parquet", "user_id,tracked_at\n", "not a Parquet file"),
    ("garbage.csv", b"\x89\x00\x17\xfe\x00binary\x00" * 50, "binary content"),
    ("utf16.csv", "user_id,tracked_at,latitude,longitude\n1,2008-10-23 02:53:04,1,1\n".encode("utf-16"),
     "UTF-16 text: expected CSV text in UTF-8"),
    ("empty.csv", "", "empty file"),
])
def test_whole_file_problems_name_the_file(tmp_path, name, content, problem):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(InputError, match=problem) as info:
        read_positionfixes(path)
    assert str(path) in str(info.value)


def test_broken_parquet(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1" + b"\x01" * 100)
    with pytest.raises(InputError, match="unreadable Parquet"):
        read_positionfixes(path)


def test_geolife_layout_problems(tmp_path):
    with pytest.raises(InputError, match="not the GeoLife layout"):
        read_geolife_plt(tmp_path)
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        read_geolife_plt(tmp_path / "a.csv")
    traj = tmp_path / "Data" / "000" / "Trajectory"
    traj.mkdir(parents=True)
    header = "Geolife trajectory\nWGS 84\nAltitude is in Feet\nReserved 3\n0,2,255,My Track,0,0,2,8421376\n0\n"
    (traj / "20081023025304.plt").write_text(header)
    with pytest.raises(InputError, match="header only") as info:
        read_geolife_plt(tmp_path)
    assert "20081023025304.plt" in str(info.value)
    (traj / "20081023025304.plt").write_text(header + "39.9,116.3,0,492,39744.12,2008-10-23,02:53:04\n"
                                             "91.5,116.3,0,492,39744.12,2008-10-23,02:53:05\n"
                                             "39.9,116.3,0,492,39744.12,2008-10-23\n")
    r = read_geolife_plt(tmp_path)
    assert (r.rows_read, r.table.height) == (3, 1)
    assert r.quarantine["reason"].to_list() == ["latitude outside [-90, 90]", "missing tracked_at"]
    (traj / "20081024000000.plt").write_bytes(b"\x00\x01garbage" * 100)
    with pytest.raises(InputError, match="binary content"):
        read_geolife_plt(tmp_path)
    (traj / "20081024000000.plt").write_bytes((header + "39.9,116.3,0,492,39744.12,2008-10-23,02:53:04\n").encode("utf-16"))
    with pytest.raises(InputError, match="UTF-16 text: expected a GeoLife .plt text file") as info:
        read_geolife_plt(tmp_path)
    assert "20081024000000.plt" in str(info.value)


def test_the_default_latest_time_is_a_day_after_now_rounded_up_to_the_minute_it_is_written_as():
    before = datetime.now(timezone.utc)
    earliest, latest = TimeWindow().bounds()
    after = datetime.now(timezone.utc)
    assert latest.second == 0 and latest.microsecond == 0
    assert before + timedelta(days=1) < latest <= after + timedelta(days=1, minutes=1)
    assert TimeWindow().describe().endswith(f"to {latest:%Y-%m-%d %H:%M} UTC")
    fixed = datetime(2030, 1, 1, 12, 30, 15, tzinfo=timezone.utc)
    assert TimeWindow(latest=fixed).bounds() == (earliest, fixed)  # a given bound is kept to the second


def test_the_rules_of_a_layout_are_built_once_per_time_window(tmp_path):
    """A served request's rules come from the cache; another window, or another layout, gets its own."""
    frame = pl.DataFrame({"user_id": [1], "started_at": ["2009-07-05 07:08:46"], "finished_at": ["2009-07-05 08:00:00"],
                          "latitude": [39.9], "longitude": [116.3]})
    window = TimeWindow(latest=datetime(2030, 1, 1, tzinfo=timezone.utc))
    read_staypoints(frame, window, name="request")
    hits = _staypoint_rules.cache_info().hits
    again = read_staypoints(frame, window, name="request")
    assert _staypoint_rules.cache_info().hits == hits + 1 and again.table.height == 1
    later = read_staypoints(frame.with_columns(pl.lit("2031-01-01 00:00:00").alias("finished_at")), window, name="request")
    assert later.table.height == 0 and later.quarantine["reason"][0].startswith("finished_at outside the plausible window")
    wider = read_staypoints(frame.with_columns(pl.lit("2031-01-01 00:00:00").alias("finished_at")),
                            TimeWindow(latest=datetime(2032, 1, 1, tzinfo=timezone.utc)), name="request")
    assert wider.table.height == 1

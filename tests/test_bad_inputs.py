"""A directory of inputs real users produce, each run through `pgt preprocess` (in this process: the refusal and its
one line are the subject, not the interpreter).

Every case states its outcome: either "exit 2, one line on stderr that names the file and the problem, no
traceback", or "exit 0, and the counts reconcile": rows read = rows kept + rows quarantined, the
quarantine file holds exactly the quarantined rows, and the case's own expectation holds.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Callable

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.in_process import pgt_here

PLT_HEADER = "Geolife trajectory\nWGS 84\nAltitude is in Feet\nReserved 3\n0,2,255,My Track,0,0,2,8421376\n0\n"


@dataclass
class Case:
    name: str  # the file or folder under the bad-input directory
    format: str  # --format
    refused: str | None = None  # exit 2 with this text in the one line; None: exit 0
    check: Callable[[dict, Path], None] | None = None  # exit 0: (manifest, out_dir) -> asserts


# ---------------------------------------------------------------------------------------------
# the inputs


def _base(root: Path) -> pl.DataFrame:
    """Three synthetic people over 60 days: enough for every split to have samples."""
    from preprocessing.config import SynthConfig
    from preprocessing.synthetic import generate_positionfixes

    return generate_positionfixes(SynthConfig(users=3, days=60, seed=1))


def _staypoints(fixes: pl.DataFrame) -> pl.DataFrame:
    from preprocessing.staypoints import generate_staypoints

    return generate_staypoints(fixes.with_columns(pl.col("user_id").cast(pl.String))).select(
        "user_id", "started_at", "finished_at", "latitude", "longitude")


def _wkb(lon: float, lat: float) -> bytes:
    return struct.pack("<BIdd", 1, 1, lon, lat)


def _corrupt_page(src: Path, dst: Path, column: int) -> None:
    data = bytearray(src.read_bytes())
    start = pq.read_metadata(src).row_group(0).column(column).data_page_offset
    data[start + 30:start + 2000] = b"\xff" * 1970
    dst.write_bytes(bytes(data))


def _plt_rows(fixes: pl.DataFrame) -> list[str]:
    return [f"{r['latitude']:.6f},{r['longitude']:.6f},0,100,{39745 + i / 86400:.10f},"
            f"{r['tracked_at']:%Y-%m-%d},{r['tracked_at']:%H:%M:%S}" for i, r in enumerate(fixes.iter_rows(named=True))]


def make_bad_inputs(root: Path) -> list[Case]:
    root.mkdir(parents=True, exist_ok=True)
    base = _base(root)
    base.write_parquet(root / "base.parquet", compression="uncompressed")
    text = base.with_columns(pl.col("tracked_at").dt.strftime("%Y-%m-%d %H:%M:%S"))
    cases = []

    # --- whole-file problems: exit 2
    _corrupt_page(root / "base.parquet", root / "corrupt_page.parquet", 2)
    cases.append(Case("corrupt_page.parquet", "positionfixes", "unreadable Parquet (column latitude)"))
    (root / "truncated.parquet").write_bytes((root / "base.parquet").read_bytes()[:5000])
    cases.append(Case("truncated.parquet", "positionfixes", "unreadable Parquet"))
    pq.write_table(pa.table([pa.array([1]), pa.array(["2020-01-01 00:00:00"]), pa.array([1.0]), pa.array([2.0]),
                             pa.array([3.0])], names=["user_id", "tracked_at", "latitude", "longitude", "latitude"]),
                   root / "duplicate_columns.parquet")
    cases.append(Case("duplicate_columns.parquet", "positionfixes", "duplicate column name latitude"))
    (root / "duplicate_columns.csv").write_text("user_id,tracked_at,latitude,longitude,user_id\n1,2020-01-01 00:00,1,2,3\n")
    cases.append(Case("duplicate_columns.csv", "positionfixes", "duplicate column name user_id"))
    pl.DataFrame({"user_id": [1], "tracked_at": ["2020-01-01 00:00:00"], "latitude": [[1.0]], "longitude": [2.0]}
                 ).write_parquet(root / "list_latitude.parquet")
    cases.append(Case("list_latitude.parquet", "positionfixes", "column latitude has type List"))
    pl.DataFrame({"user_id": [True], "tracked_at": ["2020-01-01 00:00:00"], "latitude": [1.0], "longitude": [2.0]}
                 ).write_parquet(root / "boolean_user.parquet")
    cases.append(Case("boolean_user.parquet", "positionfixes", "column user_id has type Boolean"))
    base.with_columns(pl.col("tracked_at").dt.epoch("s")).write_parquet(root / "epoch_seconds.parquet")
    cases.append(Case("epoch_seconds.parquet", "positionfixes", "column tracked_at has type Int64"))
    base.with_columns(latitude=pl.lit(0.0), longitude=pl.lit(0.0)).write_parquet(root / "null_island.parquet")
    cases.append(Case("null_island.parquet", "positionfixes",
                      f"no valid rows: all {base.height:,} rows were quarantined (at (0, 0)"))
    text.with_columns(pl.col("tracked_at").str.replace(r"^\d{4}", "1970")).write_csv(root / "epoch_zero.csv")
    cases.append(Case("epoch_zero.csv", "positionfixes", "tracked_at outside the plausible window"))
    (root / "header_only.csv").write_text("user_id,tracked_at,latitude,longitude\n")
    cases.append(Case("header_only.csv", "positionfixes", "header only"))
    (root / "empty.csv").write_bytes(b"")
    cases.append(Case("empty.csv", "positionfixes", "empty file"))
    (root / "latin1.csv").write_bytes("user_id,tracked_at,latitude,longitude\nJosé,2020-01-01 00:00,1,2\n".encode("latin-1"))
    cases.append(Case("latin1.csv", "positionfixes", "not UTF-8 text"))
    text.write_csv(root / "semicolons.csv", separator=";")
    cases.append(Case("semicolons.csv", "positionfixes", "looks ';'-separated: expected comma-separated columns"))
    (root / "csv_named.parquet").write_text("user_id,tracked_at,latitude,longitude\n1,2020-01-01 00:00,1,2\n")
    cases.append(Case("csv_named.parquet", "positionfixes", "not a Parquet file"))
    (root / "a_folder").mkdir()
    (root / "a_folder" / "fixes.csv").write_text("user_id,tracked_at,latitude,longitude\n")
    cases.append(Case("a_folder", "positionfixes", "is a folder"))
    cases.append(Case("a_folder", "geolife-plt", "not the GeoLife layout"))
    binary = root / "binary_plt" / "Data" / "000" / "Trajectory"
    binary.mkdir(parents=True)
    (binary / "1.plt").write_bytes(b"\x00\x01\x02" * 100)
    cases.append(Case("binary_plt", "geolife-plt", "binary content"))
    stays = _staypoints(base)
    stays.drop("latitude", "longitude").write_parquet(root / "staypoints_without_position.parquet")
    cases.append(Case("staypoints_without_position.parquet", "staypoints", "missing column geom or geometry"))

    # --- bad rows inside good files: exit 0, counts reconcile
    lines = (root / "base.csv").write_text("") or text.write_csv(None).splitlines()
    lines[5] += ",surplus"  # data row 4 (line 0 is the header): one field too many
    lines[9] = ",".join(lines[9].split(",")[:3])  # data row 8: the longitude is missing
    (root / "ragged.csv").write_text("\n".join(lines) + "\n")

    def ragged(manifest: dict, out: Path) -> None:
        q = pl.read_parquet(out / "quarantine.parquet")
        reasons = dict(zip(q["source_row"], q["reason"]))
        assert reasons[4] == "more fields than the header's 4" and reasons[8] == "missing longitude"

    cases.append(Case("ragged.csv", "positionfixes", check=ragged))
    ids = text.with_columns(pl.col("user_id").replace_strict({0: "07", 1: "7", 2: "-0"}, return_dtype=pl.String))
    ids.write_csv(root / "ids.csv")

    def distinct_ids(manifest: dict, out: Path) -> None:
        assert sorted(pl.read_parquet(out / "users.parquet")["source_user_id"]) == ["-0", "07", "7"]

    cases.append(Case("ids.csv", "positionfixes", check=distinct_ids))
    (root / "bom.csv").write_bytes(b"\xef\xbb\xbf" + text.write_csv(None).encode())
    cases.append(Case("bom.csv", "positionfixes", check=lambda m, out: None))
    ghost = pl.DataFrame({"user_id": [9, 9, 9, 9], "latitude": [0.0, 0.0, 39.9, 39.9], "longitude": [0.0, 0.0, 116.3, 116.3],
                          "tracked_at": [datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC),
                                         datetime(1970, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)]})
    pl.concat([base, ghost.select(base.columns).cast(base.schema)]).write_parquet(root / "junk_fixes.parquet")

    def junk(manifest: dict, out: Path) -> None:
        reasons = manifest["details"]["quarantine_reasons"]
        assert reasons["at (0, 0): a fix without a real position"] == 2
        assert sum(n for r, n in reasons.items() if r.startswith("tracked_at outside the plausible window")) == 2
        assert 9 not in pl.read_parquet(out / "users.parquet")["source_user_id"].to_list()

    cases.append(Case("junk_fixes.parquet", "positionfixes", check=junk))

    geolife = root / "geolife_odd" / "Data"
    for user in range(3):
        folder = geolife / f"{user:03d}" / "Trajectory"
        folder.mkdir(parents=True)
        rows = _plt_rows(base.filter(pl.col("user_id") == user))
        if user == 0:  # upper-case extension, and one row with an eighth field
            rows[10] += ",surplus"
            (folder / "20240101.PLT").write_text(PLT_HEADER + "\n".join(rows) + "\n")
        elif user == 1:  # a header of 4 lines: the first two fixes would be lost to a fixed skip of 6
            (folder / "20240101.plt").write_text("\n".join(PLT_HEADER.splitlines()[:4]) + "\n" + "\n".join(rows) + "\n")
        else:
            (folder / "20240101.plt").write_text(PLT_HEADER + "\n".join(rows) + "\n")

    def geolife_odd(manifest: dict, out: Path) -> None:
        assert manifest["counts"]["positionfixes_read"] == base.height  # every fix of every file, none skipped
        assert manifest["details"]["quarantine_reasons"].get("more than the 7 fields of a .plt row") == 1
        assert len(manifest["details"]["plt_files_with_short_header"]) == 1 and manifest["details"]["plt_files"] == 3

    cases.append(Case("geolife_odd", "geolife-plt", check=geolife_odd))
    wkb = stays.with_columns(pl.struct("longitude", "latitude").map_elements(
        lambda p: _wkb(p["longitude"], p["latitude"]), return_dtype=pl.Binary).alias("geom")).drop("latitude", "longitude")
    broken = wkb.with_row_index().with_columns(
        pl.when(pl.col("index") == 4).then(pl.lit(b"\x01\x02junk")).otherwise(pl.col("geom")).alias("geom")).drop("index")
    broken.write_parquet(root / "staypoints_wkb.parquet")

    def wkb_quarantine(manifest: dict, out: Path) -> None:
        q = pl.read_parquet(out / "quarantine.parquet")
        row = q.filter(pl.col("source_row") == 4).row(0, named=True)
        assert row["reason"].startswith("unparseable geom") and row["geom"] == b"\x01\x02junk".hex()

    cases.append(Case("staypoints_wkb.parquet", "staypoints", check=wkb_quarantine))
    wkb.rename({"geom": "geometry"}).write_parquet(root / "staypoints_geometry.parquet")

    def geometry(manifest: dict, out: Path) -> None:
        assert manifest["counts"]["positionfixes_quarantined"] == 0 and manifest["counts"]["staypoints"] == stays.height

    cases.append(Case("staypoints_geometry.parquet", "staypoints", check=geometry))
    wkt = stays.with_columns(pl.format("POINT ({} {})", "longitude", "latitude").alias("geom"),
                             pl.col("started_at").dt.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             pl.col("finished_at").dt.strftime("%Y-%m-%dT%H:%M:%S%z")).drop("latitude", "longitude")
    wkt.with_row_index().with_columns(
        pl.when(pl.col("index") == 2).then(pl.lit("POINT (116.3)")).otherwise(pl.col("geom")).alias("geom")
    ).drop("index").write_csv(root / "staypoints_wkt.csv")

    def wkt_quarantine(manifest: dict, out: Path) -> None:
        q = pl.read_parquet(out / "quarantine.parquet")
        assert q.select("source_row", "geom").rows() == [(2, "POINT (116.3)")]

    cases.append(Case("staypoints_wkt.csv", "staypoints", check=wkt_quarantine))
    (root / "prose.csv").write_text("Dear team, here are the GPS logs you asked for.\nBest, Ana\n")
    cases.append(Case("prose.csv", "positionfixes", "missing columns user_id, tracked_at, latitude, longitude"))
    return cases


# ---------------------------------------------------------------------------------------------
# the walk


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory) -> tuple[Path, list[Case]]:
    root = tmp_path_factory.mktemp("bad-inputs")
    return root, make_bad_inputs(root)


def test_every_bad_input_is_refused_in_one_line_or_reconciled(bad_inputs, tmp_path, monkeypatch):
    root, cases = bad_inputs
    monkeypatch.setenv("COLUMNS", "250")  # a line is never wrapped by the terminal's width
    runs = [pgt_here("preprocess", "--input", root / case.name, "--format", case.format, "--out", tmp_path / f"out-{i}",
                     "--no-progress") for i, case in enumerate(cases)]
    failures = []
    for i, (case, r) in enumerate(zip(cases, runs)):
        path = root / case.name
        out = tmp_path / f"out-{i}"
        try:
            assert "Traceback" not in r.stderr, r.stderr[-2000:]
            if case.refused:
                lines = r.stderr.strip().splitlines()
                assert r.returncode == 2, (r.returncode, r.stderr[-500:])
                assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), lines
                assert case.refused in lines[0], lines[0]
                assert not out.exists()
            else:
                assert r.returncode == 0, r.stderr[-2000:]
                manifest = json.loads((out / "manifest.json").read_text())
                counts = manifest["counts"]
                quarantine = pl.read_parquet(out / "quarantine.parquet")
                assert quarantine.height == counts["positionfixes_quarantined"]
                assert sum(manifest["details"]["quarantine_reasons"].values()) == quarantine.height
                assert r.stdout.startswith(f"wrote {out}: {counts['positionfixes_read']:,} rows read, "
                                           f"{quarantine.height:,} quarantined")
                case.check(manifest, out)
        except AssertionError as exc:  # every failing case is reported, not only the first; any other error is a bug
            failures.append(f"{case.name} ({case.format}): {exc}")
    assert not failures, "\n".join(failures)

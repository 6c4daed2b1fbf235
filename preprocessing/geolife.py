"""The GeoLife layout `Data/<user>/Trajectory/*.plt`: six header lines, then lat,lon,0,altitude_ft,days,date,time,
read with the row rules of every input (preprocessing.rows)."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from infra.errors import InputError
from preprocessing.rows import (
    EXTRA,
    QUARANTINE_KEYS,
    UTF16_BOMS,
    ReadResult,
    RowRules,
    TimeWindow,
    coordinate_checks,
    coordinate_exprs,
    extra_flag,
    time_checks,
    validate,
)

PLT_FIELDS = ("latitude", "longitude", "zero", "altitude_ft", "days_since_1899", "date", "time")
PLT_HEADER_LINES = 6
PLT_FIX = re.compile(r"^\s*[-+]?[\d.]+\s*,\s*[-+]?[\d.]+\s*,[^,]*,[^,]*,[^,]*,\s*\d{4}-\d{1,2}-\d{1,2}\s*,")


def find_plt_files(folder: Path | str) -> list[Path]:
    """The .plt files of a GeoLife folder (its root, or its Data folder); InputError if not that layout."""
    folder = Path(folder)
    if not folder.exists():
        raise InputError(folder, "no such folder")
    if not folder.is_dir():
        raise InputError(folder, "not a folder: --format geolife-plt expects the GeoLife folder holding "
                                 "Data/<user>/Trajectory/*.plt")
    data = folder / "Data" if (folder / "Data").is_dir() else folder
    files = sorted(f for f in data.glob("*/Trajectory/*") if f.suffix.lower() == ".plt" and f.is_file())
    if not files:
        found = ", ".join(sorted(p.name for p in folder.iterdir())[:5]) or "nothing"
        raise InputError(folder, f"not the GeoLife layout: expected Data/<user>/Trajectory/*.plt, found {found}")
    return files


def read_geolife_plt(folder: Path | str, window: TimeWindow = TimeWindow(), files: list[Path] | None = None) -> ReadResult:
    """GPS points from the GeoLife layout: six header lines, then lat,lon,0,altitude_ft,days,date,time.

    A file whose header is shorter (its fixes start earlier) is read from its first fix and listed in the
    notes; a row with more than the 7 fields is quarantined; `.PLT` counts like `.plt`. `files`: only these
    of the folder's files (find_plt_files), e.g. one partition's users."""
    files = find_plt_files(folder) if files is None else files
    header_lines = {f: _check_plt_file(f) for f in files}
    user_of = {str(f): f.parent.parent.name for f in files}
    by_header: dict[int, list[Path]] = {}
    for f in files:
        by_header.setdefault(header_lines[f], []).append(f)
    schema = {**{name: pl.String for name in PLT_FIELDS}, EXTRA: pl.String}
    lf = pl.concat([
        pl.scan_csv(group, has_header=False, skip_rows=skip, schema=schema, include_file_paths="source_file",
                    missing_columns="insert", truncate_ragged_lines=True, encoding="utf8-lossy", quote_char=None)
        for skip, group in sorted(by_header.items())
    ])
    lf = lf.with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).over("source_file").alias("source_row"),
        pl.col("source_file").replace_strict(user_of, return_dtype=pl.String).alias("user_id"),
    )
    stamp = pl.concat_str(pl.col("date").str.strip_chars(), pl.lit(" "), pl.col("time").str.strip_chars())
    rules = RowRules.of([
        pl.col("user_id"),
        (pl.col("date").is_null() | pl.col("time").is_null()).alias("_t_missing"),
        stamp.str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False, time_unit="ms", time_zone="UTC").alias("tracked_at"),
        *coordinate_exprs(folder, {"latitude": pl.String, "longitude": pl.String}),
        *extra_flag({EXTRA: pl.String}),
    ], [(f"more than the {len(PLT_FIELDS)} fields of a .plt row", pl.col("_extra_fields")),
        *time_checks("tracked_at", unparseable="unparseable date/time (expected yyyy-mm-dd,HH:MM:SS)", window=window),
        *coordinate_checks()])
    good, bad = validate(lf.select("source_file", "source_row", *rules.parse), rules, ("user_id", "tracked_at"),
                          "repeats the (user_id, tracked_at) of an earlier fix", keep=("source_file",))
    good = good.select("user_id", "tracked_at", "latitude", "longitude")
    originals = (
        lf.join(bad.lazy().select("source_file", "source_row"), on=["source_file", "source_row"], how="semi")
        .select("source_file", "source_row", "user_id", *PLT_FIELDS).collect()
    )
    quarantine = bad.select(*QUARANTINE_KEYS).join(originals, on=["source_file", "source_row"], how="left",
                                                   maintain_order="left")
    short = sorted(str(f) for f, lines in header_lines.items() if lines != PLT_HEADER_LINES)
    notes = {"plt_files": len(files), "plt_files_with_short_header": short} if short else {"plt_files": len(files)}
    return ReadResult(good, quarantine, rows_read=good.height + bad.height, notes=notes)


def _check_plt_file(path: Path) -> int:
    """The number of header lines before the first fix (6 in GeoLife); InputError for binary or fix-less files."""
    with path.open("rb") as fh:
        head = fh.read(4096)
    if head[:2] in UTF16_BOMS:
        raise InputError(path, "UTF-16 text: expected a GeoLife .plt text file in ASCII or UTF-8")
    if b"\x00" in head:
        raise InputError(path, "binary content: expected a GeoLife .plt text file")
    lines = head.decode("utf-8", errors="replace").splitlines()
    header = next((i for i, line in enumerate(lines[:PLT_HEADER_LINES]) if PLT_FIX.match(line)), PLT_HEADER_LINES)
    if len(head) < 4096 and not any(line.strip() for line in lines[header:]):
        raise InputError(path, f"header only: no GPS fixes after the {header} header lines")
    return header

"""Readers for the three input formats, each validated at the door.

- `read_geolife_plt(folder)`: the GeoLife layout `Data/<user>/Trajectory/*.plt`.
- `read_positionfixes(file)`: GPS points as Parquet or CSV (user_id, tracked_at, latitude, longitude).
- `read_staypoints(file)`: staypoints as Parquet or CSV (started_at, finished_at, user_id and either
  a WKT/WKB `geom` (or GeoPandas' `geometry`) POINT (lon lat) or latitude/longitude), as trackintel writes them.

Whole-file problems raise `InputError` naming the file. Bad rows inside a good file are set aside
with the reason in a quarantine table holding the original values as text, so that
rows read = rows kept + rows quarantined.

Times: text without an offset is taken as UTC (GeoLife is in GMT); offsets are honoured.
Plausibility: fixes at exactly (0, 0) and times outside a window (default 1990-01-01 to one day after
the run) are quarantined. User ids are compared as the text written unless the column is numeric:
"07" and "7" are two users.
"""

from __future__ import annotations

import csv
import functools
import re
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from infra.errors import InputError
from preprocessing.queries import collect_in_memory, columns

POSITIONFIX_COLUMNS = ("user_id", "tracked_at", "latitude", "longitude")
STAYPOINT_TIME_COLUMNS = ("user_id", "started_at", "finished_at")
PLT_FIELDS = ("latitude", "longitude", "zero", "altitude_ft", "days_since_1899", "date", "time")
PLT_HEADER_LINES = 6
TIME_FORMATS = ("%Y-%m-%d %H:%M:%S%.f%#z", "%Y-%m-%dT%H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f",
                "%Y-%m-%d %H:%M%#z", "%Y-%m-%dT%H:%M%#z", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M")
UTC_MS = pl.Datetime("ms", "UTC")
QUARANTINE_KEYS = ("source_file", "source_row", "reason")
EXTRA = "__pgt_extra_fields__"  # holds the first field beyond the header's (CSV) or the 7 of a .plt row
EARLIEST_VALID_TIME = datetime(1990, 1, 1, tzinfo=timezone.utc)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
PLT_FIX = re.compile(r"^\s*[-+]?[\d.]+\s*,\s*[-+]?[\d.]+\s*,[^,]*,[^,]*,[^,]*,\s*\d{4}-\d{1,2}-\d{1,2}\s*,")


@dataclass(frozen=True)
class TimeWindow:
    """Times outside [earliest, latest] are implausible for a GPS fix and quarantined."""

    earliest: datetime = EARLIEST_VALID_TIME
    latest: datetime | None = None  # None: one day after now, rounded up to the minute (as describe() writes it)

    def bounds(self) -> tuple[datetime, datetime]:
        if self.latest is not None:
            return self.earliest, self.latest
        now = datetime.now(timezone.utc)
        return self.earliest, now.replace(second=0, microsecond=0) + timedelta(days=1, minutes=1)

    def describe(self) -> str:
        earliest, latest = self.bounds()
        return f"{earliest:%Y-%m-%d %H:%M} to {latest:%Y-%m-%d %H:%M} UTC"


@dataclass
class ReadResult:
    """Valid rows in canonical columns, the quarantined rows, and the number of rows read."""

    table: pl.DataFrame  # positionfixes: user_id, tracked_at, latitude, longitude; staypoints: + started/finished_at
    quarantine: pl.DataFrame  # source_file, source_row (0-based data row), reason, original columns as text
    rows_read: int
    notes: dict = field(default_factory=dict)  # what was read in an unusual way (e.g. .plt files with short headers)

    def __post_init__(self) -> None:
        if self.rows_read != self.table.height + self.quarantine.height:
            raise RuntimeError(
                f"row counts do not reconcile: read {self.rows_read}, kept {self.table.height}, "
                f"quarantined {self.quarantine.height}"
            )


# ---------------------------------------------------------------------------------------------
# public readers


def _unreadable_as_input_error(reader):
    """Turn a failure of the Parquet/CSV engine deep inside a reader into one line naming the file (and, for
    Parquet, the column that cannot be decoded)."""

    @functools.wraps(reader)
    def wrapper(path, *args, **kwargs):
        try:
            return reader(path, *args, **kwargs)
        except UNREADABLE as exc:
            if isinstance(path, pl.DataFrame):  # a table in memory: its name, and what the engine could not take
                raise InputError(kwargs.get("name", "request"), f"unusable table: {' '.join(str(exc).split())[:200]}") from None
            raise unreadable_input(getattr(path, "path", path), exc) from None

    return wrapper


UNREADABLE = (pl.exceptions.PolarsError, pa.ArrowException, OSError)  # what the engines raise on a broken file


def unreadable_input(path: Path | str, exc: Exception) -> InputError:
    """The one-line error for a file the Parquet/CSV engine failed to decode (for Parquet, naming the column
    that cannot be decoded)."""
    path = Path(path)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if path.is_file() and _sniff(path) == "parquet":
        return InputError(path, f"unreadable Parquet{_failing_parquet_column(path)}: {first}")
    return InputError(path, f"unreadable input: {first}")


@dataclass(frozen=True)
class TableInput:
    """A Parquet or CSV input, or a table in memory (a served request), checked at the door: its kind, schema and
    the columns its reader takes."""

    path: Path  # the file; for a table in memory, the name its messages give it (e.g. "request")
    kind: str  # "parquet", "csv" or "frame" (in memory, `frame`)
    schema: dict  # column -> polars dtype as stored (CSV: all text), with EXTRA for CSV
    columns: tuple[str, ...]  # the columns read, in order
    frame: pl.DataFrame | None = field(default=None, compare=False, repr=False)  # the table of kind "frame"

    def scan(self) -> pl.LazyFrame:
        """source_row (the 0-based data row) and the columns read, as stored."""
        if self.kind == "frame":
            lf = self.frame.lazy()
        else:
            lf = pl.scan_parquet(self.path) if self.kind == "parquet" else _scan_csv(self.path)
        return lf.select(*self.columns, *_extra(self.schema)).with_row_index("source_row")

    def collect(self, query: pl.LazyFrame) -> pl.DataFrame:
        """A query over its rows, run as fits them: a table already there in memory (a request: it halves the fixed
        cost of a query on a few rows, collect_in_memory), a file by polars' choice (streamed where it can)."""
        return collect_in_memory(query, self.frame.height) if self.kind == "frame" else query.collect()

    def user_key(self) -> pl.Expr:
        """The user id as the reader compares it (before `_finalize_users`): rows of one user share it."""
        return _user_expr(self.path, self.schema["user_id"])


TableSource = Path | str | pl.DataFrame  # a file, or a table in memory (read exactly as the same table in a file)


def _open_table(source: TableSource, required: tuple[str, ...], name: str) -> tuple[Path, str, dict, pl.DataFrame | None]:
    """(path, kind, schema, frame) of a file or an in-memory table (`name` in its messages), its required columns
    present and at least one row."""
    if not isinstance(source, pl.DataFrame):
        path = _existing_file(source)
        kind = _sniff(path)
        _, schema = _scan_table(path, kind, required)
        return path, kind, schema, None
    path, schema = Path(name), dict(source.schema)
    _check_columns(path, schema, required)
    if source.height == 0:
        raise InputError(path, "no rows")
    return path, "frame", schema, source


@_unreadable_as_input_error
def open_positionfixes(source: TableSource, *, name: str = "request") -> TableInput:
    path, kind, schema, frame = _open_table(source, POSITIONFIX_COLUMNS, name)
    return TableInput(path, kind, schema, POSITIONFIX_COLUMNS, frame)


@_unreadable_as_input_error
def open_staypoints(source: TableSource, *, name: str = "request") -> TableInput:
    path, kind, schema, frame = _open_table(source, STAYPOINT_TIME_COLUMNS, name)
    geom_column = next((name for name in ("geom", "geometry") if name in schema), None)
    if geom_column:
        geometry = (geom_column,)
    elif "latitude" in schema and "longitude" in schema:
        geometry = ("latitude", "longitude")
    else:
        raise InputError(path, f"missing column geom or geometry (or latitude and longitude); found: {', '.join(schema)}")
    return TableInput(path, kind, schema, (*STAYPOINT_TIME_COLUMNS, *geometry), frame)


def parse_positionfixes(source: TableInput, rows: pl.LazyFrame, window: TimeWindow) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Valid fixes (user ids as compared, not yet finalised) sorted by (user_id, tracked_at), and the set-aside
    rows (source_row, reason), of `rows`: source_row and the columns as stored (TableInput.scan or a part of it)."""
    rules = _positionfix_rules(source.path, tuple(source.schema.items()), window.bounds())
    good, bad = _validate(rows.select("source_row", *rules.parse), rules, ("user_id", "tracked_at"),
                          "repeats the (user_id, tracked_at) of an earlier fix", in_file_order=("source_row",),
                          collect=source.collect)
    return columns(good, ("user_id", "tracked_at", "latitude", "longitude")), bad


def parse_staypoints(source: TableInput, rows: pl.LazyFrame, window: TimeWindow) -> tuple[pl.DataFrame, pl.DataFrame]:
    """As parse_positionfixes, for staypoints: sorted by (user_id, started_at)."""
    geom_column = source.columns[-1] if source.columns[-1] in ("geom", "geometry") else None
    rules = _staypoint_rules(source.path, tuple(source.schema.items()), geom_column, window.bounds())
    if geom_column:
        rows = rows.with_columns(_point_from_geom(source.path, geom_column, source.schema[geom_column]))
    good, bad = _validate(rows.select("source_row", *rules.parse), rules, ("user_id", "started_at"),
                          "repeats the (user_id, started_at) of an earlier staypoint", in_file_order=("source_row",),
                          collect=source.collect)
    return columns(good, ("user_id", "started_at", "finished_at", "latitude", "longitude")), bad


@dataclass(frozen=True)
class RowRules:
    """How the rows of one input layout are parsed and checked: the expressions that parse them, and the checks in
    order (a row's reason is its first failing check). The table readers build them once per layout and time window
    (polars expressions are immutable): a served request's few rows cost less to check than these cost to build."""

    parse: tuple[pl.Expr, ...]  # the parsed columns, from the columns as stored
    reasons: tuple[str, ...]  # the reason of each check, in order
    code: pl.Expr  # UInt8: the 1-based index of a row's first failing check, 0 for a valid row

    @classmethod
    def of(cls, parse: list[pl.Expr], checks: list[tuple[str, pl.Expr]]) -> RowRules:
        code = pl.when(checks[0][1]).then(pl.lit(1, pl.UInt8))
        for i, (_, expr) in enumerate(checks[1:], start=2):
            code = code.when(expr).then(pl.lit(i, pl.UInt8))
        return cls(tuple(parse), tuple(text for text, _ in checks), code.otherwise(pl.lit(0, pl.UInt8)))


@functools.lru_cache(maxsize=64)
def _positionfix_rules(path: Path, schema: tuple, bounds: tuple[datetime, datetime]) -> RowRules:
    """The RowRules of GPS points stored as `schema` ((column, dtype) pairs), with times plausible within `bounds`."""
    types = dict(schema)
    parse = [
        _user_expr(path, types["user_id"]).alias("user_id"),
        pl.col("tracked_at").is_null().alias("_t_missing"),
        _time_expr(path, "tracked_at", types["tracked_at"]).alias("tracked_at"),
        *_coordinate_exprs(path, types),
        *_extra_flag(types),
    ]
    checks = [*_field_count_checks(types), ("missing user_id", pl.col("user_id").is_null()),
              *_time_checks("tracked_at", window=TimeWindow(*bounds)), *_coordinate_checks()]
    return RowRules.of(parse, checks)


@functools.lru_cache(maxsize=64)
def _staypoint_rules(path: Path, schema: tuple, geom_column: str | None, bounds: tuple[datetime, datetime]) -> RowRules:
    """The RowRules of staypoints stored as `schema`, their position in `geom_column` (parsed into _lat_raw and
    _lon_raw by _point_from_geom first) or in latitude and longitude."""
    types, window = dict(schema), TimeWindow(*bounds)
    if geom_column:
        coords = [pl.col("_lat_raw").is_null().alias("_latitude_missing"), pl.col("_lat_raw").alias("latitude"),
                  pl.col("_lon_raw").is_null().alias("_longitude_missing"), pl.col("_lon_raw").alias("longitude")]
        geom_checks = [(f"missing {geom_column}", pl.col("_geom_missing")),
                       (f"unparseable {geom_column} (expected a WKT or WKB POINT (lon lat))", pl.col("latitude").is_null())]
    else:
        coords = _coordinate_exprs(path, types)
        geom_checks = []
    parse = [
        _user_expr(path, types["user_id"]).alias("user_id"),
        pl.col("started_at").is_null().alias("_s_missing"),
        _time_expr(path, "started_at", types["started_at"]).alias("started_at"),
        pl.col("finished_at").is_null().alias("_f_missing"),
        _time_expr(path, "finished_at", types["finished_at"]).alias("finished_at"),
        *([pl.col("_geom_missing")] if geom_checks else []),
        *coords,
        *_extra_flag(types),
    ]
    checks = [
        *_field_count_checks(types),
        ("missing user_id", pl.col("user_id").is_null()),
        *_time_checks("started_at", "_s_missing", window=window),
        *_time_checks("finished_at", "_f_missing", window=window),
        *geom_checks,
        *_coordinate_checks(),
        ("finished_at before started_at", pl.col("finished_at") < pl.col("started_at")),
    ]
    return RowRules.of(parse, checks)


def finish_table_read(source: TableInput, good: pl.DataFrame, bad: pl.DataFrame, notes: dict | None = None) -> ReadResult:
    """The ReadResult of valid rows and set-aside rows (sorted by source_row): user ids finalised, and the
    quarantine with the rows' original values."""
    good = _finalize_users(good, source.schema["user_id"])
    quarantine = quarantine_of(source, bad, source.scan())
    return ReadResult(good, quarantine, rows_read=good.height + bad.height, notes=notes or {})


@_unreadable_as_input_error
def read_positionfixes(path: TableSource, window: TimeWindow = TimeWindow(), *, name: str = "request") -> ReadResult:
    """GPS points from a Parquet or CSV file (or a table in memory, called `name` in messages) with user_id,
    tracked_at, latitude, longitude."""
    source = open_positionfixes(path, name=name)
    return finish_table_read(source, *parse_positionfixes(source, source.scan(), window))


@_unreadable_as_input_error
def read_staypoints(path: TableSource, window: TimeWindow = TimeWindow(), *, name: str = "request") -> ReadResult:
    """Staypoints from Parquet or CSV (or a table in memory, called `name` in messages): started_at, finished_at,
    user_id and geom (or geometry) or latitude/longitude."""
    source = open_staypoints(path, name=name)
    return finish_table_read(source, *parse_staypoints(source, source.scan(), window))


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
        *_coordinate_exprs(folder, {"latitude": pl.String, "longitude": pl.String}),
        *_extra_flag({EXTRA: pl.String}),
    ], [(f"more than the {len(PLT_FIELDS)} fields of a .plt row", pl.col("_extra_fields")),
        *_time_checks("tracked_at", unparseable="unparseable date/time (expected yyyy-mm-dd,HH:MM:SS)", window=window),
        *_coordinate_checks()])
    good, bad = _validate(lf.select("source_file", "source_row", *rules.parse), rules, ("user_id", "tracked_at"),
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


# ---------------------------------------------------------------------------------------------
# file checks


def _existing_file(path: Path | str) -> Path:
    path = Path(path)
    if not path.exists():
        raise InputError(path, "no such file")
    if path.is_dir():
        raise InputError(path, "is a folder, expected a Parquet or CSV file")
    if path.stat().st_size == 0:
        raise InputError(path, "empty file, expected a Parquet or CSV file")
    return path


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # how a UTF-16 text file starts (little-, big-endian)


def _sniff(path: Path) -> str:
    """'parquet' or 'csv', from the magic bytes; garbage is refused here."""
    with path.open("rb") as fh:
        head = fh.read(65536)
    if head[:4] == b"PAR1":
        return "parquet"
    if path.suffix.lower() in (".parquet", ".pq"):
        raise InputError(path, "not a Parquet file (no PAR1 magic bytes)")
    if head[:2] in UTF16_BOMS:
        raise InputError(path, "UTF-16 text: expected CSV text in UTF-8 (save or convert it as UTF-8)")
    if b"\x00" in head:
        raise InputError(path, "binary content: expected a Parquet file or CSV text")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # a multi-byte character cut by the 64 KiB window is fine
            raise InputError(path, "not UTF-8 text: expected a Parquet file or CSV text") from None
    return "csv"


def _csv_header(path: Path) -> list[str]:
    """The header's field names as written (a UTF-8 byte order mark removed); duplicates are refused."""
    with path.open(encoding="utf-8-sig", errors="replace", newline="") as fh:
        try:
            header = next(csv.reader(fh), [])
        except csv.Error as exc:
            raise InputError(path, f"unreadable CSV header: {exc}") from None
    names = [name.strip() for name in header]
    _refuse_duplicates(path, names)
    if not any(names):
        raise InputError(path, "empty header line: expected column names such as user_id,tracked_at,latitude,longitude")
    other = next((sep for sep in (";", "\t", "|") if sep in names[0]), None) if len(names) == 1 else None
    if other is not None:  # a spreadsheet's export in a locale whose decimal mark is the comma
        raise InputError(path, f"the header is one field ({names[0][:60]!r}) and looks {other!r}-separated: expected "
                               "comma-separated columns such as user_id,tracked_at,latitude,longitude")
    return names


def _refuse_duplicates(path: Path, names: list[str]) -> None:
    repeated = sorted(name for name, n in Counter(names).items() if n > 1)
    if repeated:
        raise InputError(path, f"duplicate column name{'s' if len(repeated) > 1 else ''} {', '.join(repeated)}: "
                               "each column must be named once")


def _scan_csv(path: Path) -> pl.LazyFrame:
    """The CSV as text columns named by its header, plus EXTRA holding the first field beyond them (a row
    with too many fields); missing trailing fields read as null. Rows are aligned with `source_row`."""
    names = _csv_header(path)
    columns = [*names, EXTRA]
    return pl.scan_csv(path, has_header=False, skip_rows=1, new_columns=columns, infer_schema=False,
                       schema_overrides={name: pl.String for name in columns}, missing_columns="insert",
                       truncate_ragged_lines=True, encoding="utf8-lossy")


def _scan_table(path: Path, kind: str, required: tuple[str, ...]) -> tuple[pl.LazyFrame, dict[str, pl.DataType]]:
    if kind == "parquet":
        try:
            meta = pq.read_metadata(path)
            _refuse_duplicates(path, list(meta.schema.names))
        except InputError:
            raise
        except Exception as exc:  # pyarrow raises several types for broken files
            raise InputError(path, f"unreadable Parquet: {str(exc).splitlines()[0]}") from None
        lf = pl.scan_parquet(path)
        rows = meta.num_rows
    else:
        lf = _scan_csv(path)
        try:
            rows = lf.select(pl.len()).collect().item()
        except pl.exceptions.NoDataError:
            rows = 0
        except pl.exceptions.PolarsError as exc:
            raise InputError(path, f"unreadable CSV: {str(exc).splitlines()[0]}") from None
    if kind == "csv":
        schema = {name: pl.String for name in [*_csv_header(path), EXTRA]}
    else:
        try:
            schema = dict(lf.collect_schema())
        except pl.exceptions.PolarsError as exc:
            raise InputError(path, f"unreadable Parquet: {str(exc).splitlines()[0]}") from None
    _check_columns(path, schema, required)
    if rows == 0:
        raise InputError(path, "header only: no data rows")
    return lf, schema


def _check_columns(path: Path, schema: dict, required: tuple[str, ...]) -> None:
    missing = [c for c in required if c not in schema]
    if missing:
        found = ", ".join(c for c in schema if c != EXTRA) or "none"
        raise InputError(path, f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                               f"expected {', '.join(required)}; found: {found}")


def _failing_parquet_column(path: Path) -> str:
    """' (column x)' for the first column whose pages cannot be decoded, '' when none alone fails."""
    try:
        names = pq.read_schema(path).names
    except Exception:  # noqa: BLE001 - the caller reports the original error
        return ""
    for name in names:
        try:
            pq.read_table(path, columns=[name])
        except Exception:  # noqa: BLE001 - any failure means the same to the caller
            return f" (column {name})"
    return ""


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


# ---------------------------------------------------------------------------------------------
# column parsing


def _user_expr(path: Path, dtype: pl.DataType) -> pl.Expr:
    """user_id as given: integers stay integers; integral floats (trackintel's 0.0) become integers (see
    `_finalize_users`); text stays the text written, surrounding spaces removed (empty means missing), so
    "07" and "7" are two users."""
    col = pl.col("user_id")
    if dtype.is_integer():
        return col
    if dtype.is_float():
        integral = col.is_finite() & (col == col.round(0))
        return pl.when(integral).then(col.cast(pl.Int64).cast(pl.String)).when(col.is_finite()).then(col.cast(pl.String))
    if dtype in (pl.String, pl.Categorical) or isinstance(dtype, (pl.Categorical, pl.Enum)):
        text = col.cast(pl.String).str.strip_chars()
        return pl.when(text.str.len_chars() > 0).then(text)
    raise InputError(path, f"column user_id has type {dtype}, expected integers or text")


def user_id_cast(ids: pl.Series, source_dtype: pl.DataType) -> pl.Expr | None:
    """How the valid rows' user ids (`ids`, all of them, as compared) are finalised: None keeps them. A float
    column whose values are all integral becomes integers; so does a text column in which every value is
    written as an integral float (0.0, 1.0: a float column as pandas writes it to CSV, as in trackintel's
    files). Any other text column stays text: "7", "07" and "7.0" together are three users."""
    if not ids.len() or ids.dtype != pl.String:
        return None
    if source_dtype.is_float() and ids.str.contains(r"^-?\d{1,18}$").all():
        return pl.col("user_id").cast(pl.Int64)
    if ids.str.contains(r"^-?\d{1,18}\.0+$").all():
        return pl.col("user_id").str.replace(r"\.0+$", "").cast(pl.Int64)
    return None


def _finalize_users(df: pl.DataFrame, source_dtype: pl.DataType) -> pl.DataFrame:
    cast = user_id_cast(df["user_id"], source_dtype)
    return df if cast is None else df.with_columns(cast)


def _time_expr(path: Path, name: str, dtype: pl.DataType) -> pl.Expr:
    col = pl.col(name)
    if isinstance(dtype, pl.Datetime):
        col = col.dt.convert_time_zone("UTC") if dtype.time_zone else col.dt.replace_time_zone("UTC")
        return col.cast(UTC_MS)
    if dtype == pl.Date:
        return col.cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")
    if dtype == pl.String:
        text = col.str.strip_chars()
        return pl.coalesce([text.str.to_datetime(f, strict=False, time_unit="ms", time_zone="UTC") for f in TIME_FORMATS])
    raise InputError(path, f"column {name} has type {dtype}, expected a timestamp or ISO 8601 text")


def _extra(schema: dict) -> tuple[str, ...]:
    return (EXTRA,) if EXTRA in schema else ()


def _extra_flag(schema: dict) -> list[pl.Expr]:
    """_extra_fields: the row has a non-empty field beyond the expected ones (a trailing separator is fine)."""
    if EXTRA not in schema:
        return [pl.lit(False).alias("_extra_fields")]
    return [(pl.col(EXTRA).str.strip_chars().str.len_chars() > 0).fill_null(False).alias("_extra_fields")]


def _field_count_checks(schema: dict) -> list[tuple[str, pl.Expr]]:
    if EXTRA not in schema:
        return []
    header = len([c for c in schema if c != EXTRA])
    return [(f"more fields than the header's {header}", pl.col("_extra_fields"))]


def _float_expr(path: Path, name: str, dtype: pl.DataType) -> pl.Expr:
    col = pl.col(name)
    if dtype == pl.String:
        value = col.str.strip_chars().cast(pl.Float64, strict=False)
    elif dtype.is_numeric():
        value = col.cast(pl.Float64)
    else:
        raise InputError(path, f"column {name} has type {dtype}, expected decimal degrees")
    return pl.when(value.is_finite()).then(value)


def _coordinate_exprs(path: Path, schema: dict) -> list[pl.Expr]:
    return [
        pl.col("latitude").is_null().alias("_latitude_missing"),
        _float_expr(path, "latitude", schema["latitude"]).alias("latitude"),
        pl.col("longitude").is_null().alias("_longitude_missing"),
        _float_expr(path, "longitude", schema["longitude"]).alias("longitude"),
    ]


def _point_from_geom(path: Path, name: str, dtype: pl.DataType) -> list[pl.Expr]:
    """geom (or geometry) as WKT text `POINT (lon lat)` or WKB bytes -> _lon_raw, _lat_raw (null if unparseable)."""
    col = pl.col(name)
    if dtype == pl.String:
        parts = col.str.extract_groups(r"(?i)^\s*POINT\s*\(\s*([^\s()]+)\s+([^\s()]+)\s*\)\s*$")
        lon = parts.struct.field("1").cast(pl.Float64, strict=False)
        lat = parts.struct.field("2").cast(pl.Float64, strict=False)
    elif dtype == pl.Binary:
        xy = col.map_elements(_wkb_point, return_dtype=pl.List(pl.Float64))
        lon, lat = xy.list.get(0, null_on_oob=True), xy.list.get(1, null_on_oob=True)
    else:
        raise InputError(path, f"column {name} has type {dtype}, expected WKT text or WKB bytes of a POINT")
    return [
        col.is_null().alias("_geom_missing"),
        pl.when(lon.is_finite() & lat.is_finite()).then(lon).alias("_lon_raw"),
        pl.when(lon.is_finite() & lat.is_finite()).then(lat).alias("_lat_raw"),
    ]


def _wkb_point(blob: bytes) -> list[float] | None:
    if blob is None or len(blob) < 21 or blob[0] not in (0, 1):
        return None
    order = "<" if blob[0] == 1 else ">"
    (geom_type,) = struct.unpack(order + "I", blob[1:5])
    if geom_type & 0xFFFF not in (1, 1001, 2001, 3001) and geom_type != 0x20000001:
        return None
    offset = 9 if geom_type & 0x20000000 else 5  # EWKB carries a 4-byte SRID
    if len(blob) < offset + 16:
        return None
    return list(struct.unpack(order + "dd", blob[offset:offset + 16]))


def instant(moment: datetime) -> pl.Expr:
    """A moment as a literal of UTC_MS, to the millisecond (from its epoch milliseconds: polars converts an integer
    some twenty times faster than a datetime object, which counts in a served request's few milliseconds)."""
    return pl.lit((moment - EPOCH) // timedelta(milliseconds=1), pl.Int64).cast(UTC_MS)


def _time_checks(name: str, missing_flag: str = "_t_missing", unparseable: str | None = None,
                 window: TimeWindow = TimeWindow()) -> list[tuple[str, pl.Expr]]:
    earliest, latest = window.bounds()
    return [
        (f"missing {name}", pl.col(missing_flag)),
        (unparseable or f"unparseable {name} (expected ISO 8601 such as 2008-10-23 02:53:04)", pl.col(name).is_null()),
        (f"{name} outside the plausible window {window.describe()}",
         (pl.col(name) < instant(earliest)) | (pl.col(name) > instant(latest))),
    ]


def _coordinate_checks() -> list[tuple[str, pl.Expr]]:
    return [
        ("missing latitude", pl.col("_latitude_missing")),
        ("unparseable latitude (expected decimal degrees)", pl.col("latitude").is_null()),
        ("latitude outside [-90, 90]", pl.col("latitude").abs() > 90),
        ("missing longitude", pl.col("_longitude_missing")),
        ("unparseable longitude (expected decimal degrees)", pl.col("longitude").is_null()),
        ("longitude outside [-180, 180]", pl.col("longitude").abs() > 180),
        ("at (0, 0): a fix without a real position", (pl.col("latitude") == 0) & (pl.col("longitude") == 0)),
    ]


# ---------------------------------------------------------------------------------------------
# validation and quarantine


def _validate(parsed: pl.LazyFrame, rules: RowRules, key: tuple[str, str], duplicate_reason: str,
              keep: tuple[str, ...] = (), in_file_order: tuple[str, ...] = (),
              collect: Callable[[pl.LazyFrame], pl.DataFrame] = pl.LazyFrame.collect) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Apply the row checks of `rules` in order (the first failing one is the reason), then set aside rows that
    repeat the key of an earlier valid row (the first in file order wins: the sort is stable, and
    `in_file_order` columns, such as a table's source_row, make it so for rows in any order).
    Returns the valid rows sorted by key, and the set-aside rows as (*keep, source_row, reason). `collect` runs
    the checking query (TableInput.collect)."""
    reasons = [*rules.reasons, duplicate_reason]
    data = [c for c in parsed.collect_schema() if not c.startswith("_") and c not in keep and c != "source_row"]
    df = collect(
        parsed.with_columns(rules.code.alias("_code"))
        .select(*keep, "source_row", "_code", *data)
        .sort([*key, *in_file_order], maintain_order=True, nulls_last=True)
        .with_columns(_repeat_code(key, len(reasons)).alias("_code"))
    )
    if not (df["_code"] != 0).any():  # a clean table (a served request, as a rule): its columns, without a query
        good = pl.DataFrame([df[c] for c in data])
        bad = pl.DataFrame(schema={**{c: df.schema[c] for c in (*keep, "source_row")}, "reason": pl.String})
        return good, bad
    # one query per table (a served request's few rows pay each query's fixed cost, not the rows)
    good = collect_in_memory(df.lazy().filter(pl.col("_code") == 0).select(*data), df.height)
    bad = collect_in_memory(df.lazy().filter(pl.col("_code") != 0).select(*keep, "source_row", "_code")
                            .sort([*keep, "source_row"]), df.height)
    del df
    labels = pl.Series("reason", reasons, dtype=pl.String)
    reason = labels.gather(bad["_code"].cast(pl.Int64) - 1)  # a Series operation: no query, no Python callback
    bad = pl.DataFrame([bad[c] for c in (*keep, "source_row")] + [reason])
    return good, bad


@functools.lru_cache(maxsize=8)
def _repeat_code(key: tuple[str, str], code: int) -> pl.Expr:
    """_code, or `code` for a valid row whose key repeats the previous valid row's (rows sorted by key)."""
    valid = pl.col("_code") == 0
    previous_valid = [pl.when(valid).then(pl.col(k)).forward_fill().shift(1) for k in key]
    repeat = valid & pl.all_horizontal([pl.col(k) == prev for k, prev in zip(key, previous_valid)]).fill_null(False)
    return pl.when(repeat).then(pl.lit(code, pl.UInt8)).otherwise(pl.col("_code"))


def _originals_as_text(rows: pl.LazyFrame, columns: tuple[str, ...], wanted: pl.Series) -> pl.DataFrame:
    """The original values of the `wanted` source rows, as text (bytes such as WKB as hex), from `rows`
    (source_row and the columns as stored)."""
    schema = rows.collect_schema()

    def as_text(c: str) -> pl.Expr:
        if schema[c] == pl.Binary:
            return pl.col(c).bin.encode("hex")
        if isinstance(schema[c], (pl.List, pl.Array, pl.Struct)):
            return pl.col(c).map_elements(str, return_dtype=pl.String)
        return pl.col(c).cast(pl.String)

    return (
        rows.select("source_row", *columns)
        .join(pl.LazyFrame({"source_row": wanted.cast(schema["source_row"])}), on="source_row", how="semi")
        .select("source_row", *[as_text(c) for c in columns])
        .collect()
    )


def quarantine_of(source: TableInput, bad: pl.DataFrame, rows: pl.LazyFrame) -> pl.DataFrame:
    """The quarantine of the set-aside rows `bad` (source_row, reason; sorted by source_row) of a table input,
    with their original values from `rows` (source_row and the columns as stored: TableInput.scan or a part)."""
    if bad.height == 0:  # nothing set aside (a clean request): the empty quarantine, without reading the rows again
        return pl.DataFrame(schema={"source_file": pl.String, "source_row": pl.Int64, "reason": pl.String,
                                    **{c: pl.String for c in source.columns}})
    return _quarantine(source.path, bad, _originals_as_text(rows, source.columns, bad["source_row"]))


def _quarantine(path: Path, bad: pl.DataFrame, originals: pl.DataFrame) -> pl.DataFrame:
    bad = bad.with_columns(pl.col("source_row").cast(pl.UInt32))
    out = bad.join(originals, on="source_row", how="left", maintain_order="left")
    return out.select(pl.lit(str(path)).alias("source_file"), pl.col("source_row").cast(pl.Int64), "reason",
                      *originals.columns[1:])

"""Readers for the three input formats, each validated at the door.

- `read_geolife_plt(folder)`: the GeoLife layout `Data/<user>/Trajectory/*.plt` (preprocessing.geolife).
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

The rules every row passes, and the quarantine of those that fail, are preprocessing.rows'.
"""

from __future__ import annotations

import csv
import functools
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from infra.errors import InputError
from preprocessing.queries import collect_in_memory, columns
from preprocessing.rows import (
    EXTRA,
    UTF16_BOMS,
    ReadResult,
    RowRules,
    TimeWindow,
    coordinate_checks,
    coordinate_exprs,
    extra,
    extra_flag,
    field_count_checks,
    finalize_users,
    originals_as_text,
    point_from_geom,
    quarantine,
    time_checks,
    time_expr,
    user_expr,
    validate,
)

POSITIONFIX_COLUMNS = ("user_id", "tracked_at", "latitude", "longitude")
STAYPOINT_TIME_COLUMNS = ("user_id", "started_at", "finished_at")
GEOMETRY_COLUMNS = ("geom", "geometry")  # a staypoint's point as WKT/WKB (trackintel, GeoPandas), for latitude/longitude


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
        return lf.select(*self.columns, *extra(self.schema)).with_row_index("source_row")

    def collect(self, query: pl.LazyFrame) -> pl.DataFrame:
        """A query over its rows, run as fits them: a table already there in memory (a request: it halves the fixed
        cost of a query on a few rows, collect_in_memory), a file by polars' choice (streamed where it can)."""
        return collect_in_memory(query, self.frame.height) if self.kind == "frame" else query.collect()

    def user_key(self) -> pl.Expr:
        """The user id as the reader compares it (before `finalize_users`): rows of one user share it."""
        return user_expr(self.path, self.schema["user_id"])


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
    geom_column = next((name for name in GEOMETRY_COLUMNS if name in schema), None)
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
    good, bad = validate(rows.select("source_row", *rules.parse), rules, ("user_id", "tracked_at"),
                          "repeats the (user_id, tracked_at) of an earlier fix", in_file_order=("source_row",),
                          collect=source.collect)
    return columns(good, ("user_id", "tracked_at", "latitude", "longitude")), bad


def parse_staypoints(source: TableInput, rows: pl.LazyFrame, window: TimeWindow) -> tuple[pl.DataFrame, pl.DataFrame]:
    """As parse_positionfixes, for staypoints: sorted by (user_id, started_at)."""
    geom_column = source.columns[-1] if source.columns[-1] in GEOMETRY_COLUMNS else None
    rules = _staypoint_rules(source.path, tuple(source.schema.items()), geom_column, window.bounds())
    if geom_column:
        rows = rows.with_columns(point_from_geom(source.path, geom_column, source.schema[geom_column]))
    good, bad = validate(rows.select("source_row", *rules.parse), rules, ("user_id", "started_at"),
                          "repeats the (user_id, started_at) of an earlier staypoint", in_file_order=("source_row",),
                          collect=source.collect)
    return columns(good, ("user_id", "started_at", "finished_at", "latitude", "longitude")), bad


@functools.lru_cache(maxsize=64)
def _positionfix_rules(path: Path, schema: tuple, bounds: tuple[datetime, datetime]) -> RowRules:
    """The RowRules of GPS points stored as `schema` ((column, dtype) pairs), with times plausible within `bounds`."""
    types = dict(schema)
    parse = [
        user_expr(path, types["user_id"]).alias("user_id"),
        pl.col("tracked_at").is_null().alias("_t_missing"),
        time_expr(path, "tracked_at", types["tracked_at"]).alias("tracked_at"),
        *coordinate_exprs(path, types),
        *extra_flag(types),
    ]
    checks = [*field_count_checks(types), ("missing user_id", pl.col("user_id").is_null()),
              *time_checks("tracked_at", window=TimeWindow(*bounds)), *coordinate_checks()]
    return RowRules.of(parse, checks)


@functools.lru_cache(maxsize=64)
def _staypoint_rules(path: Path, schema: tuple, geom_column: str | None, bounds: tuple[datetime, datetime]) -> RowRules:
    """The RowRules of staypoints stored as `schema`, their position in `geom_column` (parsed into _lat_raw and
    _lon_raw by point_from_geom first) or in latitude and longitude."""
    types, window = dict(schema), TimeWindow(*bounds)
    if geom_column:
        coords = [pl.col("_lat_raw").is_null().alias("_latitude_missing"), pl.col("_lat_raw").alias("latitude"),
                  pl.col("_lon_raw").is_null().alias("_longitude_missing"), pl.col("_lon_raw").alias("longitude")]
        geom_checks = [(f"missing {geom_column}", pl.col("_geom_missing")),
                       (f"unparseable {geom_column} (expected a WKT or WKB POINT (lon lat))", pl.col("latitude").is_null())]
    else:
        coords = coordinate_exprs(path, types)
        geom_checks = []
    parse = [
        user_expr(path, types["user_id"]).alias("user_id"),
        pl.col("started_at").is_null().alias("_s_missing"),
        time_expr(path, "started_at", types["started_at"]).alias("started_at"),
        pl.col("finished_at").is_null().alias("_f_missing"),
        time_expr(path, "finished_at", types["finished_at"]).alias("finished_at"),
        *([pl.col("_geom_missing")] if geom_checks else []),
        *coords,
        *extra_flag(types),
    ]
    checks = [
        *field_count_checks(types),
        ("missing user_id", pl.col("user_id").is_null()),
        *time_checks("started_at", "_s_missing", window=window),
        *time_checks("finished_at", "_f_missing", window=window),
        *geom_checks,
        *coordinate_checks(),
        ("finished_at before started_at", pl.col("finished_at") < pl.col("started_at")),
    ]
    return RowRules.of(parse, checks)


def finish_table_read(source: TableInput, good: pl.DataFrame, bad: pl.DataFrame, notes: dict | None = None) -> ReadResult:
    """The ReadResult of valid rows and set-aside rows (sorted by source_row): user ids finalised, and the
    quarantine with the rows' original values."""
    good = finalize_users(good, source.schema["user_id"])
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


def quarantine_of(source: TableInput, bad: pl.DataFrame, rows: pl.LazyFrame) -> pl.DataFrame:
    """The quarantine of the set-aside rows `bad` (source_row, reason; sorted by source_row) of a table input,
    with their original values from `rows` (source_row and the columns as stored: TableInput.scan or a part)."""
    if bad.height == 0:  # nothing set aside (a clean request): the empty quarantine, without reading the rows again
        return pl.DataFrame(schema={"source_file": pl.String, "source_row": pl.Int64, "reason": pl.String,
                                    **{c: pl.String for c in source.columns}})
    return quarantine(source.path, bad, originals_as_text(rows, source.columns, bad["source_row"]))


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

"""The rules every input row passes, whatever its format: columns parsed (times, coordinates, WKT/WKB points, user
ids), plausibility checks in order, validation (a row's reason is its first failing check; repeats of a key are set
aside) and the quarantine table of the rows that fail, their original values as text."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl

from infra.errors import InputError
from preprocessing.queries import collect_in_memory

TIME_FORMATS = ("%Y-%m-%d %H:%M:%S%.f%#z", "%Y-%m-%dT%H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f",
                "%Y-%m-%d %H:%M%#z", "%Y-%m-%dT%H:%M%#z", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M")
UTC_MS = pl.Datetime("ms", "UTC")
QUARANTINE_KEYS = ("source_file", "source_row", "reason")
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # how a UTF-16 text file starts (little-, big-endian)
EXTRA = "__pgt_extra_fields__"  # holds the first field beyond the header's (CSV) or the 7 of a .plt row
EARLIEST_VALID_TIME = datetime(1990, 1, 1, tzinfo=timezone.utc)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)



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


# ---------------------------------------------------------------------------------------------
# column parsing


def user_expr(path: Path, dtype: pl.DataType) -> pl.Expr:
    """user_id as given: integers stay integers; integral floats (trackintel's 0.0) become integers (see
    `finalize_users`); text stays the text written, surrounding spaces removed (empty means missing), so
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


def finalize_users(df: pl.DataFrame, source_dtype: pl.DataType) -> pl.DataFrame:
    cast = user_id_cast(df["user_id"], source_dtype)
    return df if cast is None else df.with_columns(cast)


def time_expr(path: Path, name: str, dtype: pl.DataType) -> pl.Expr:
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


def extra(schema: dict) -> tuple[str, ...]:
    return (EXTRA,) if EXTRA in schema else ()


def extra_flag(schema: dict) -> list[pl.Expr]:
    """_extra_fields: the row has a non-empty field beyond the expected ones (a trailing separator is fine)."""
    if EXTRA not in schema:
        return [pl.lit(False).alias("_extra_fields")]
    return [(pl.col(EXTRA).str.strip_chars().str.len_chars() > 0).fill_null(False).alias("_extra_fields")]


def field_count_checks(schema: dict) -> list[tuple[str, pl.Expr]]:
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


def coordinate_exprs(path: Path, schema: dict) -> list[pl.Expr]:
    return [
        pl.col("latitude").is_null().alias("_latitude_missing"),
        _float_expr(path, "latitude", schema["latitude"]).alias("latitude"),
        pl.col("longitude").is_null().alias("_longitude_missing"),
        _float_expr(path, "longitude", schema["longitude"]).alias("longitude"),
    ]


def point_from_geom(path: Path, name: str, dtype: pl.DataType) -> list[pl.Expr]:
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


def time_checks(name: str, missing_flag: str = "_t_missing", unparseable: str | None = None,
                 window: TimeWindow = TimeWindow()) -> list[tuple[str, pl.Expr]]:
    earliest, latest = window.bounds()
    return [
        (f"missing {name}", pl.col(missing_flag)),
        (unparseable or f"unparseable {name} (expected ISO 8601 such as 2008-10-23 02:53:04)", pl.col(name).is_null()),
        (f"{name} outside the plausible window {window.describe()}",
         (pl.col(name) < instant(earliest)) | (pl.col(name) > instant(latest))),
    ]


def coordinate_checks() -> list[tuple[str, pl.Expr]]:
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


def validate(parsed: pl.LazyFrame, rules: RowRules, key: tuple[str, str], duplicate_reason: str,
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


def originals_as_text(rows: pl.LazyFrame, columns: tuple[str, ...], wanted: pl.Series) -> pl.DataFrame:
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


def quarantine(path: Path, bad: pl.DataFrame, originals: pl.DataFrame) -> pl.DataFrame:
    bad = bad.with_columns(pl.col("source_row").cast(pl.UInt32))
    out = bad.join(originals, on="source_row", how="left", maintain_order="left")
    return out.select(pl.lit(str(path)).alias("source_file"), pl.col("source_row").cast(pl.Int64), "reason",
                      *originals.columns[1:])

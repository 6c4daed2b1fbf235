"""Validation at a function's door: a frame's columns, their types and nulls, named in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.errors import InputError

if TYPE_CHECKING:  # only annotations
    import polars as pl


def require_columns(df: pl.DataFrame, what: str, columns: dict) -> None:
    """Validate a frame at the door: the columns exist with the expected dtype class."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(what, f"missing column(s) {', '.join(missing)}; found: {', '.join(df.columns)}")
    for name, dtype in columns.items():
        if dtype is not None and not isinstance(df.schema[name], dtype) and df.schema[name] != dtype:
            raise InputError(what, f"column {name} has type {df.schema[name]}, expected {dtype}")
    nulls = {c: n for c, n in zip(df.columns, df.null_count().row(0)) if c in columns and n}
    if nulls:
        raise InputError(what, f"null values in {', '.join(f'{c} ({n} rows)' for c, n in nulls.items())}")

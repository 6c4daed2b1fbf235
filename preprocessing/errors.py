"""The one error type for whole-input problems: it names the file and what was expected."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: the `pgt` command imports this without polars
    import polars as pl


class InputError(Exception):
    """A whole-file problem (missing path, missing column, header only, not Parquet, ...).

    The CLI prints it as one line, `error: <file>: <problem>`, and exits with code 2.
    """

    def __init__(self, source: Path | str, problem: str):
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")

    def __reduce__(self):  # picklable, so that it crosses from a Ray task to the driver as itself
        return type(self), (self.source, self.problem)


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

"""Queries over the small tables a served request holds, at the cost of their rows rather than of a query's fixed
planning: each call of polars' lazy engine, and each eager call that runs one (a select, a drop, a with_columns), costs
0.1-0.5 ms whatever its rows, a dozen of which a served request would otherwise pay."""

from __future__ import annotations

import polars as pl

SMALL_QUERY_ROWS = 10_000  # a query over fewer rows in memory skips polars' optimizer (collect_in_memory)
NO_OPTIMIZATIONS = pl.QueryOptFlags.none()  # type coercion and checks stay: the same results, without the passes


def columns(frame: pl.DataFrame, names) -> pl.DataFrame:
    """The named columns of `frame`, in that order, as a new frame without running a query (a select or drop runs one,
    whose fixed cost a served request's few rows feel)."""
    return pl.DataFrame([frame.get_column(name) for name in names])


def collect_in_memory(query: pl.LazyFrame, rows: int | None) -> pl.DataFrame:
    """`query` run by polars' in-memory engine over tables of about `rows` rows (None: unknown). Under
    SMALL_QUERY_ROWS it runs without the optimizer's passes (pushdowns, common subexpressions, ...), which cost a
    served request's few staypoints more than the query itself and cannot change its result; larger inputs are
    optimised."""
    if rows is not None and rows < SMALL_QUERY_ROWS:
        return query.collect(engine="in-memory", optimizations=NO_OPTIMIZATIONS)
    return query.collect(engine="in-memory")

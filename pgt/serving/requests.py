"""A request's body as MLflow's scoring protocol reads it (`dataframe_records`, `dataframe_split`, `instances` or
`inputs`, and `params`; or CSV): the model's input and params, or `BadRequest` with one line naming the field,
column or parameter. Records of plain JSON kinds skip pandas (`records_frame`)."""

import io
import json

import numpy as np
import polars as pl

from infra.process import listed, shorten
from pgt.serving.inference import top_k_of

MAX_COLUMNS = 256  # a request's width: the model reads a few columns; more is refused before a frame is built


class BadRequest(Exception):
    """A client's error: HTTP `status` with one line."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def parse_body(body: bytes, content_type: str, polars_records: bool = False):
    """(model input: a pandas DataFrame or an array-like, params dict) of a request, as MLflow's protocol reads it;
    BadRequest with one line otherwise. With `polars_records`, records whose columns each hold one JSON kind come as
    the polars DataFrame that the pandas one would become (records_frame): a request's few rows skip pandas."""
    import pandas as pd

    mime = (content_type or "application/json").split(";")[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the body is not UTF-8 text") from None
    if mime == "text/csv":
        width = text.split("\n", 1)[0].count(",") + 1
        if width > MAX_COLUMNS:
            raise BadRequest(f"the CSV body has {width:,} columns; a request has at most {MAX_COLUMNS}")
        try:
            return pd.read_csv(io.StringIO(text)), {}
        except (ValueError, pd.errors.ParserError) as exc:
            raise BadRequest(f"the CSV body cannot be read ({' '.join(str(exc).split())[:200]})") from None
    if mime != "application/json":
        raise BadRequest(f"content type {mime!r}: send application/json or text/csv", status=415)
    try:
        payload = json.loads(text)
    except RecursionError:
        raise BadRequest("the JSON body is nested too deeply to be a request") from None
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(payload, dict):
        raise BadRequest(f"the JSON body must be an object with one of dataframe_records, dataframe_split, "
                         f"instances or inputs; got a {type(payload).__name__}")
    params = payload.get("params") or {}
    if not isinstance(params, dict):
        raise BadRequest(f"params must be an object, got {type(payload['params']).__name__}")
    if "top_k" in params:
        try:
            params = {**params, "top_k": top_k_of(params)}
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    keys = [k for k in ("dataframe_records", "dataframe_split", "instances", "inputs") if k in payload]
    if len(keys) != 1:
        raise BadRequest("the JSON body needs exactly one of dataframe_records, dataframe_split, instances or "
                         f"inputs; found {', '.join(keys) or 'none'} (keys: {listed(payload)})")
    key, data = keys[0], payload[keys[0]]
    width = request_width(data)
    if width > MAX_COLUMNS:
        raise BadRequest(f"{key} has {'over ' if width > MAX_COLUMNS + 1 else ''}{MAX_COLUMNS} columns; a request has "
                         f"at most {MAX_COLUMNS}")
    if key == "dataframe_split":
        return _split_frame(data), params
    if polars_records and isinstance(data, list) and data and all(isinstance(row, dict) for row in data):
        frame = records_frame(data)
        if frame is not None:
            return frame, params
    return _records_or_array(data, key), params


def request_width(data) -> int:
    """The columns a request's data has, counted up to MAX_COLUMNS + 1 (records: their distinct keys)."""
    if isinstance(data, dict):
        columns = data.get("columns") if isinstance(data.get("columns"), list) else data
        return min(len(columns), MAX_COLUMNS + 1)
    names: set = set()
    if isinstance(data, list):
        for row in data:
            if isinstance(row, dict):
                names.update(row)
                if len(names) > MAX_COLUMNS:
                    break
    return len(names)


def records_frame(records: list[dict]):
    """JSON records as polars, exactly as `pd.DataFrame.from_records` and then the model's pandas-to-polars
    conversion give them (columns in order of first appearance, a missing value null), for columns that each hold
    one JSON kind: text (or null), integers, numbers (integers and decimals, or null), booleans. None for anything
    else (lists, a mix of text and numbers, a column of nulls only, integers beyond int64): pandas reads those. An
    integer column holding a value beyond 64 bits, which pandas cannot hold either, is BadRequest naming it."""
    names = list(dict.fromkeys(key for row in records for key in row))
    columns = []
    for name in names:
        values = [row.get(name) for row in records]
        kinds = set(map(type, values))
        try:
            if str in kinds and kinds <= {str, type(None)}:
                columns.append(pl.Series(name, values, pl.String))
            elif kinds == {int}:
                beyond = next((v for v in values if abs(v) >= 2**64), None)
                if beyond is not None:  # pandas cannot hold it either; say which column
                    raise BadRequest(f"column {name} holds an integer beyond 64 bits ({beyond})")
                columns.append(pl.Series(name, values, pl.Int64))
            elif kinds & {int, float} and kinds <= {int, float, type(None)}:  # pandas: float64, missing as NaN -> null
                array = np.array([np.nan if v is None else v for v in values], np.float64)
                columns.append(pl.Series(name, array, nan_to_null=True))
            elif kinds == {bool}:
                columns.append(pl.Series(name, values, pl.Boolean))
            else:
                return None
        except (OverflowError, TypeError, pl.exceptions.PolarsError):  # an integer in [2**63, 2**64): pandas's uint64
            return None
    return pl.DataFrame(columns)


def _split_frame(data):
    import pandas as pd

    if not isinstance(data, dict) or not isinstance(data.get("columns"), list) or not isinstance(data.get("data"), list):
        raise BadRequest("dataframe_split must be an object with lists `columns` and `data`")
    columns, rows = data["columns"], data["data"]
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise BadRequest(f"dataframe_split.data[{i}] has {len(row) if isinstance(row, list) else 'no'} values for "
                             f"{len(columns)} columns")
    return pd.DataFrame(rows, columns=[str(c) for c in columns])


def _records_or_array(data, key: str):
    """Records (a list of objects) or a column dict as a DataFrame; anything else as the array it is."""
    import pandas as pd

    if isinstance(data, list) and data and all(isinstance(row, dict) for row in data):
        return pd.DataFrame.from_records(data)
    if isinstance(data, list) and any(isinstance(row, dict) for row in data):
        first = next(i for i, row in enumerate(data) if not isinstance(row, dict))
        raise BadRequest(f"{key}[{first}] is not an object like the other records")
    if isinstance(data, dict):
        lengths = {name: len(v) if isinstance(v, list) else None for name, v in data.items()}
        if None in lengths.values() or len(set(lengths.values())) > 1:
            raise BadRequest(f"{key} as columns needs lists of one length; got {shorten(lengths, 200)}")
        return pd.DataFrame(data)
    if not isinstance(data, list) or not data:
        raise BadRequest(f"{key} must be a non-empty list of records or a (B, 7, T) array")
    return data

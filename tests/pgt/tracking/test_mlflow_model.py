"""The served model's own conversions: a request's pandas frame taken as polars exactly as pl.from_pandas takes it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import polars as pl
import pytest

from pgt.serving.mlflow_model import _polars
from pgt.serving.requests import parse_body

FRAMES = [
    # what JSON records give: integer and text ids, ISO text times, float coordinates
    parse_body(b'{"dataframe_records": [{"user_id": 3, "started_at": "2009-07-05T07:08:46+0000", "latitude": 39.9, '
               b'"longitude": 116.3}, {"user_id": 3, "started_at": "2009-07-05T09:00:00+0000", "latitude": 40.0, '
               b'"longitude": 116.4}]}', "application/json")[0],
    parse_body(b'{"dataframe_split": {"columns": ["user_id", "latitude"], "data": [["u1", null], ["u2", 1.5]]}}',
               "application/json")[0],
    # missing values: NaN and None in text, NaN and infinity in floats
    pd.DataFrame({"user_id": ["a", None, "b"], "started_at": ["2020-01-01", np.nan, ""],
                  "latitude": [1.0, np.nan, np.inf], "longitude": [np.nan, 2.0, -0.0]}),
    pd.DataFrame({"user_id": [1, 2], "flag": [True, False], "small": np.array([1, 2], np.uint8)}),
    # what the fast path leaves to pl.from_pandas: nullable and categorical dtypes, times, lists
    pd.DataFrame({"i": pd.array([1, None], dtype="Int64"), "s": pd.array(["x", None], dtype="string"),
                  "c": pd.Categorical(["a", "b"]), "t": pd.to_datetime(["2020-01-01", None]), "l": [[1], [2]]}),
]


@pytest.mark.parametrize("frame", FRAMES, ids=range(len(FRAMES)))
def test_a_request_frame_becomes_what_from_pandas_gives(frame):
    expected = pl.from_pandas(frame)
    got = _polars(frame)
    assert got.schema == expected.schema
    assert got.equals(expected)


def test_a_column_polars_cannot_take_is_one_line_naming_it_and_its_first_odd_row():
    mixed = pd.DataFrame({"user_id": [1, None, "x"], "latitude": [1.0, 2.0, 3.0]})  # an object column of int and text
    with pytest.raises(ValueError, match=r"^request: column user_id mixes numbers and text \(row 2: 'x'\); expected "
                                         r"one kind of value per column$"):
        _polars(mixed)
    listed = pd.DataFrame({"locations": [[1, 2], 7]})  # a list, then a number
    with pytest.raises(ValueError, match=r"^request: column locations mixes lists and numbers \(row 1: 7\)"):
        _polars(listed)
    with pytest.raises(ValueError, match=r"^request: unusable columns \("):
        _polars(pd.DataFrame([[1, 2]], columns=["a", "a"]))  # duplicate names: pl.from_pandas's own refusal

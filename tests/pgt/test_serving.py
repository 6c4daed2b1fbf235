"""`pgt serve`'s request parsing: JSON records taken into polars directly give the frame the pandas path gives."""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import polars as pl
import pytest
from fastapi import FastAPI, Request

from pgt.mlflow_model import _polars
from pgt.serving import BadRequest, asgi_post, parse_body, records_frame

STAY = {"user_id": 3, "started_at": "2009-07-05T07:08:46+0000", "finished_at": "2009-07-05T08:00:00+0000",
        "latitude": 39.9, "longitude": 116.3}

# records the polars path takes: each column one JSON kind
TAKEN = {
    "staypoints": [STAY, {**STAY, "started_at": "2009-07-05T09:00:00+0000", "latitude": 40}],  # an integer latitude
    "text ids, GPS points": [{"user_id": "u1", "tracked_at": "2009-07-05 07:08:46", "latitude": 1.5, "longitude": 2},
                             {"user_id": "u1", "tracked_at": "2009-07-05 07:09:46", "latitude": 1.25, "longitude": 3}],
    "missing keys and nulls": [{"user_id": "a", "latitude": 1.0}, {"latitude": None, "longitude": 2.5, "user_id": None},
                               {"longitude": 7, "user_id": "b"}],
    "an integer column with a null": [{"user_id": 1}, {"user_id": None}],
    "booleans and negative zero": [{"flag": True, "x": -0.0}, {"flag": False, "x": 1e308}],
    "NaN and infinity (Python's JSON reads them)": json.loads('[{"latitude": NaN, "longitude": Infinity}, '
                                                              '{"latitude": 1.0, "longitude": -Infinity}]'),
    "keys in another order per record": [{"b": 1, "a": "x"}, {"a": "y", "c": 2.5, "b": 2}],
}
# records it leaves to pandas
LEFT = {
    "lists (sequences)": [{"user": 1, "locations": [2, 3]}],
    "text and numbers in one column": [{"user_id": 1}, {"user_id": "x"}],
    "a column of nulls only": [{"user_id": None, "latitude": 1.0}],
    "booleans and numbers": [{"flag": True}, {"flag": 2}],
    "an integer beyond int64 (pandas takes it as uint64)": [{"user_id": 2**63}],
    "objects in a column": [{"user_id": {"a": 1}}],
}


@pytest.mark.parametrize("records", TAKEN.values(), ids=TAKEN)
def test_records_become_the_frame_the_pandas_path_gives(records):
    expected = _polars(pd.DataFrame.from_records(records))
    got = records_frame(records)
    assert got is not None
    assert got.schema == expected.schema
    assert got.equals(expected)


@pytest.mark.parametrize("records", LEFT.values(), ids=LEFT)
def test_records_of_mixed_or_nested_kinds_are_left_to_pandas(records):
    assert records_frame(records) is None


def test_parse_body_gives_polars_only_when_asked_and_for_records():
    body = json.dumps({"dataframe_records": TAKEN["staypoints"], "params": {"top_k": 3}}).encode()
    frame, params = parse_body(body, "application/json", polars_records=True)
    assert isinstance(frame, pl.DataFrame) and frame.height == 2 and params == {"top_k": 3}
    assert isinstance(parse_body(body, "application/json")[0], pd.DataFrame)
    nested = json.dumps({"dataframe_records": LEFT["lists (sequences)"]}).encode()
    assert isinstance(parse_body(nested, "application/json", polars_records=True)[0], pd.DataFrame)
    split = json.dumps({"dataframe_split": {"columns": ["a"], "data": [[1]]}}).encode()
    assert isinstance(parse_body(split, "application/json", polars_records=True)[0], pd.DataFrame)
    huge = json.dumps({"dataframe_records": [{"user_id": 2**80, "latitude": 1.0}]}).encode()
    with pytest.raises(BadRequest, match=r"^column user_id holds an integer beyond 64 bits \(1208925819614629174706176\)$"):
        parse_body(huge, "application/json", polars_records=True)
    with pytest.raises(BadRequest, match="not an object like the other records"):
        parse_body(b'{"dataframe_records": [{"a": 1}, 2]}', "application/json", polars_records=True)


def test_asgi_post_sends_a_body_through_an_app_without_a_socket():
    """What the server's warm-up uses: the app's own routing, body reading and answer, in this event loop."""
    app, seen = FastAPI(), []

    @app.post("/echo")
    async def echo(request: Request):
        seen.append(await request.body())
        return {"ok": True}

    assert asyncio.run(asgi_post(app, "/echo", b'{"a": 1}')) == 200 and seen == [b'{"a": 1}']
    assert asyncio.run(asgi_post(app, "/elsewhere", b"{}")) == 404

"""`pgt serve`'s request parsing (JSON records taken into polars directly give the frame the pandas path gives)
and its warm-up over its own socket."""

from __future__ import annotations

import asyncio
import json
import socket

import pandas as pd
import polars as pl
import pytest
import uvicorn
from fastapi import FastAPI, Request

from pgt.serving.mlflow_model import _polars
from pgt.serving.requests import BadRequest, parse_body, records_frame
from pgt.serving.server import WARM_UP_ROUNDS, check_port_free, connect_host, warm_up_over_socket

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_warm_up_waits_for_the_socket_then_posts_each_body_over_it():
    """What `pgt serve` does once uvicorn listens: every body WARM_UP_ROUNDS times over TCP, then ready."""
    app, seen, port = FastAPI(), [], free_port()

    @app.post("/invocations")
    async def invocations(request: Request):
        seen.append(await request.body())
        return {}

    async def main():
        ready = asyncio.Event()
        warm = asyncio.create_task(warm_up_over_socket("127.0.0.1", port, [b'{"a": 1}', b'{"b": 2}'], ready, 30))
        await asyncio.sleep(0.3)  # nothing listens yet: the warm-up waits for the socket
        assert not ready.is_set() and not warm.done()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        serving = asyncio.create_task(server.serve())
        statuses = await warm
        server.should_exit = True
        await serving
        return statuses, ready.is_set()

    statuses, ready = asyncio.run(main())
    assert statuses == [200] * 6 and ready
    assert seen == [b'{"a": 1}'] * WARM_UP_ROUNDS + [b'{"b": 2}'] * WARM_UP_ROUNDS


def test_a_warm_up_that_cannot_connect_gives_up_and_the_server_answers_anyway():
    ready = asyncio.Event()
    assert asyncio.run(warm_up_over_socket("127.0.0.1", free_port(), [b"{}"], ready, timeout_s=0.5)) == []
    assert ready.is_set()
    assert connect_host("0.0.0.0") == "127.0.0.1" and connect_host("::") == "::1"
    assert connect_host("127.0.0.1") == "127.0.0.1"


def test_a_port_another_server_holds_is_named_before_the_model_loads():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ValueError, match=rf"^cannot listen on 127.0.0.1:{port}: in use \(another server\?\); "
                                             r"choose another --port, or stop what holds it$"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # free again once it is closed
    with pytest.raises(ValueError, match=r"^cannot listen on 192\.0\.2\.1:"):  # an address not this machine's
        check_port_free("192.0.2.1", port)

"""A sweep kept on object storage (--out s3://..., a real S3-compatible server): storage it cannot use is refused
before any trial. A whole sweep there, stopped, resumed by URI and through a lost node, is test_cluster.py's."""

from __future__ import annotations

import re
import time

import pytest

from infra.storage import open_storage
from tests.infra.test_storage import bucket
from tests.tune.commands import tune_cli

pytestmark = pytest.mark.slow  # refused before any Ray starts


@pytest.fixture
def s3_env(monkeypatch):
    """What a user sets for an S3-compatible store (moto takes any key), for this process and `pgt tune`."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


@pytest.mark.usefixtures("s3_env")
def test_a_sweep_refuses_storage_it_cannot_use_in_one_line_before_any_trial(training_sequences, s3_server, tmp_path):
    """A bucket that does not exist, an endpoint that does not answer, a folder of someone else's files, and data
    inside the sweep's folder: each one line, in seconds, with nothing written to the bucket."""
    uri = bucket(s3_server, "pgt-sweep-refused")
    out = open_storage(uri)
    out.write_bytes(b"theirs", "notes.txt")
    endpoint = s3_server.removeprefix("http://")
    cases = [(uri.replace("pgt-sweep-refused", "pgt-never"), "no such bucket"),
             (uri.replace(endpoint, "127.0.0.1:9"), "the storage does not answer"),
             (uri, r"did not write \(notes.txt\)")]
    for target, said in cases:
        began = time.monotonic()
        r = tune_cli("--data", training_sequences, "--out", target, "--trials", "1", "--epochs", "1", cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
        assert re.search(said, r.stderr), r.stderr
        assert time.monotonic() - began < 30
    r = tune_cli("--data", out.uri_of("data"), "--out", out.uri_of("data", "sweep"), "--trials", "1", cwd=tmp_path)
    assert r.returncode == 2 and "lies inside --data" in r.stderr, r.stderr[-3000:]
    assert out.files() == ["notes.txt"] and not list(tmp_path.iterdir())

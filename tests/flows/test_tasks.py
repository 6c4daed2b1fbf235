"""The tasks' retry rule: transient I/O retries (a failed read or write, a server that does not answer); bad input
and missing paths fail at once."""

from __future__ import annotations

import httpx
import pytest
from prefect.states import Failed

from flows.tasks import PUBLISH_RETRY_DELAYS_S, _transient_io, publish, publish_predictions
from infra.errors import InputError


@pytest.mark.parametrize(("error", "retried"), [
    (httpx.ConnectError("[Errno 111] Connection refused"), True),  # the Prefect API's server is down or restarting
    (httpx.ReadTimeout("timed out"), True),
    (ConnectionResetError("reset by peer"), True),
    (OSError(5, "Input/output error"), True),
    (FileNotFoundError("points.parquet"), False),
    (PermissionError("points.parquet"), False),
    (InputError("points.parquet", "no valid rows"), False),
    (ValueError("a bug"), False),
])
def test_transient_io_is_retried_and_nothing_else(error, retried):
    assert _transient_io(None, None, Failed(data=error)) is retried


def test_publishing_waits_out_a_prefect_server_s_restart():
    """The artifacts are published last, after the model is registered: their retries span tens of seconds."""
    for step in (publish, publish_predictions):
        assert step.retries == len(PUBLISH_RETRY_DELAYS_S) and step.retry_delay_seconds == PUBLISH_RETRY_DELAYS_S
        assert step.retry_condition_fn is _transient_io
    assert sum(PUBLISH_RETRY_DELAYS_S) >= 30

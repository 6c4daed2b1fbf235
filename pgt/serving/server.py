"""`pgt serve`: a logged model over HTTP, with MLflow's scoring protocol and hard limits.

The routes and bodies are those of `mlflow models serve` (POST /invocations with `dataframe_records`,
`dataframe_split`, `instances` or `inputs`, and `params`; or a CSV body; GET /ping, /health, /version), and the
model is the same pyfunc (pgt/serving/mlflow_model.py). What this server adds:

- a request body larger than `max_request_mb` is refused with HTTP 413 before it is read whole;
- a client's error is HTTP 400 with one line naming the field, column or parameter: no stack trace, no server
  path, never 500, and the worker lives on (JSON nested too deeply to parse included);
- the model is loaded and warmed up before the server answers /ping (503 until then), so the first request is
  as fast as the rest: once uvicorn listens, the server sends the model's own warm-up requests to itself over its
  socket, through every layer a client's request takes (uvicorn's protocol, the app, JSON);
- admission that queues (pgt/serving/admission.py): a body is read only once its bytes fit the worker's budget
  (`max_buffered_mb`) and, for a large one, a place in the queue (`max_queued`) is free; until then the request
  waits unread in its socket, and past `queue_timeout_s` gets 503 with Retry-After. A body must arrive within
  `body_timeout_s` (408 past it), so a slow sender holds neither a slot nor memory for long;
- a small request (up to INLINE_BYTES of body) is answered on the event loop as soon as it is read, a larger one in
  a worker thread, `max_in_flight` at once; /ping never waits behind either;
- a table request's answer holds, beside `predictions`, the rows set aside (`quarantined`) and the people not
  scored (`not_scored`), each with the reason (PGTModel.answer): nothing a request holds is dropped unsaid.

`create_app` reads its settings from the environment (`ServeConfig.from_env`), which is how uvicorn's
worker processes receive them.
"""

import asyncio
import errno
import gc
import io
import json
import logging
import os
import socket
import sys
import time
from contextlib import asynccontextmanager

import polars as pl
import torch

from infra.errors import SettingsError
from pgt.serving.admission import Admission, Busy
from pgt.serving.config import ServeConfig
from pgt.serving.models import check_model_uri
from pgt.serving.requests import BadRequest, parse_body
from pgt.tracking.store import use_tracking_uri

WARM_UP_ROUNDS = 3  # each warm-up request is sent this many times before /ping answers 200
WARM_UP_TIMEOUT_S = 60.0  # the warm-up gives up (and the server answers /ping) after this long
DRAIN_FACTOR = 8  # an over-limit body is read (and dropped) up to this many limits, then the connection closes
INLINE_BYTES = 64 * 1024  # a body up to this size (a person's week of staypoints is about 2 KB) is answered on the
# event loop, where a hop to a worker thread would cost it about a millisecond; a larger one, which may take seconds,
# in a worker thread, so that /ping and other connections are answered meanwhile
RETRY_AFTER_S = 1  # what a 503 tells a busy server's client to wait
SWITCH_INTERVAL_S = 0.001  # how long a thread holds the GIL before it passes it on (Python's default: 0.005)
log = logging.getLogger("pgt.serving.server")


def create_app(config: "ServeConfig | None" = None):
    """The FastAPI app: the model loaded and warmed up, /invocations with the limits of the module docstring."""
    import mlflow
    import pandas as pd
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc.scoring_server import predictions_to_json
    from starlette.requests import ClientDisconnect

    config = config or ServeConfig.from_env()
    torch.set_num_threads(config.torch_threads)  # before the model loads: its warm-up runs as requests will
    use_tracking_uri(check_model_uri(config.model_uri, config.tracking_uri))
    model = mlflow.pyfunc.load_model(config.model_uri)
    wrapper = python_model(model)
    answer_table = getattr(wrapper, "answer", None)  # a model logged before it: MLflow's pandas path, predictions only

    def predict_json(body: bytes, content_type: str) -> str:
        """The JSON answer: a table request's predictions with the rows set aside and the people not scored, in
        polars both ways where the request allows (records_frame), else MLflow's pyfunc predict and its JSON writer."""
        data, params = parse_body(body, content_type, polars_records=answer_table is not None)
        if answer_table is not None and isinstance(data, (pl.DataFrame, pd.DataFrame)):
            return json.dumps(answer_table(data, params))
        out = io.StringIO()
        if answer_table is not None:  # a packed array: the model checks it (its signature describes the tables only)
            predictions_to_json(wrapper.predict(None, data, params or None), out)
        else:
            predictions_to_json(model.predict(data, params=params or None), out)
        return out.getvalue()

    ready = asyncio.Event()  # set when the warm-up is done: /ping answers 503 until then

    @asynccontextmanager
    async def warmed(app):
        """Once uvicorn listens: the model's warm-up requests over the server's own socket, the whole stack (a model
        without them warms itself up in process, or is served cold); /ping answers 200 when they are done."""
        build, bodies = getattr(wrapper, "warm_up_requests", None), []
        if build is None:  # not a PGTModel, or one logged before it had them: its own warm-up, if any
            await asyncio.to_thread(getattr(wrapper, "warm_up", lambda: None))
        else:
            try:
                bodies = [json.dumps({"dataframe_records": records}).encode() for records in build()]
            except ValueError as exc:  # a model that cannot build them (one without its preprocessing): served cold
                log.warning("no warm-up (%s); the first requests may be slower", exc)
        task = asyncio.create_task(warm_up_over_socket(connect_host(config.host), config.port, bodies, ready))
        yield
        task.cancel()

    app = FastAPI(title=f"pgt serve {config.model_uri}", lifespan=warmed)

    def answer(status: int, message: str) -> Response:
        code = {400: "BAD_REQUEST", 408: "REQUEST_TIMEOUT", 413: "REQUEST_TOO_LARGE", 415: "UNSUPPORTED_MEDIA_TYPE",
                503: "TEMPORARILY_UNAVAILABLE"}.get(status, "INTERNAL_ERROR")
        return Response(json.dumps({"error_code": code, "message": message}), status_code=status,
                        media_type="application/json")

    @app.get("/ping")
    @app.get("/health")
    async def ping():
        if not ready.is_set():
            return answer(503, "warming up: the model answers its warm-up requests first")
        return Response("\n", status_code=200, media_type="application/json")

    @app.get("/version")
    async def version():
        return Response(mlflow.__version__, status_code=200, media_type="application/json")

    admission = Admission(config.max_buffered_bytes, config.max_queued, config.max_in_flight)

    async def drain(request: Request, read: int = 0) -> bool:
        """Read the rest of a body and drop it (up to DRAIN_FACTOR limits, within the body deadline), so that a client
        that sends its whole body before reading reads the answer, not a reset. False where it was cut short."""
        try:
            async with asyncio.timeout(config.body_timeout_s):
                async for chunk in request.stream():
                    read += len(chunk)
                    if read > DRAIN_FACTOR * config.max_request_bytes:
                        return False
        except ClientDisconnect:
            pass
        except TimeoutError:
            return False
        return True

    def closing(response: Response) -> Response:
        response.headers["Connection"] = "close"  # uvicorn closes the connection after the answer
        return response

    async def too_large(request: Request, read: int = 0) -> Response:
        drained = await drain(request, read)
        response = answer(413, f"the request body exceeds the server's limit of {config.max_request_mb:g} MB; send "
                               "fewer rows per request (a person's last days suffice), or start the server with a "
                               "larger --max-request-mb")
        return response if drained else closing(response)

    async def busy(request: Request, waited_s: float) -> Response:
        """503 with Retry-After for a request that found no room within the wait limit, once the rest of its body was
        read and dropped (held nowhere), within the body deadline: a client that sends its whole body before reading
        reads the answer, not a reset."""
        drained = await drain(request)
        response = answer(503, f"the server is busy: no room for this request within {waited_s:g} s (bodies held "
                               f"{admission.held / 2**20:.0f} MB of {config.max_buffered_mb:g} MB, large requests "
                               f"waiting {admission.queued} of {config.max_queued}); retry after {RETRY_AFTER_S} s")
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response if drained else closing(response)

    async def read_body(request: Request, ticket) -> "bytes | Response":
        """The whole body, within the body deadline (408 and the connection closed past it), held under the ticket's
        reservation (413 where an undeclared length passes the limit)."""
        chunks, size = [], 0
        try:
            async with asyncio.timeout(config.body_timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > ticket.reserved:  # only an undeclared length can: a declared one is framed by it
                        del chunks
                        return await too_large(request, size)
                    chunks.append(chunk)
        except TimeoutError:
            return closing(answer(408, f"the request body did not arrive within {config.body_timeout_s:g} s "
                                       f"({size:,} bytes came); send it whole, or start the server with a larger "
                                       "--body-timeout-s"))
        except ClientDisconnect:  # the client hung up: nobody reads an answer; one line, no traceback
            log.info("a client hung up after sending %d bytes of its request", size)
            return Response(status_code=499)
        admission.shrink(ticket, size)
        body = b"".join(chunks)
        del chunks
        return body

    @app.post("/invocations")
    async def invocations(request: Request):
        declared = request.headers.get("content-length")
        declared_bytes = int(declared) if declared is not None and declared.isdigit() else None
        if declared_bytes is not None and declared_bytes > config.max_request_bytes:
            return await too_large(request)  # its body is dropped as it comes, never held
        size = config.max_request_bytes if declared_bytes is None else declared_bytes
        try:
            async with admission.admitted(size, size > INLINE_BYTES, config.queue_timeout_s) as ticket:
                body = await read_body(request, ticket)
                if isinstance(body, Response):
                    return body
                content_type = request.headers.get("content-type", "")
                if len(body) <= INLINE_BYTES:  # on the event loop, where a thread hop would cost a millisecond
                    return await respond(body, content_type, in_thread=False)
                async with admission.scoring(ticket):  # a few large requests parsed and scored at once, in threads
                    return await respond(body, content_type, in_thread=True)
        except Busy:
            return await busy(request, config.queue_timeout_s)

    async def respond(body: bytes, content_type: str, in_thread: bool) -> Response:
        """The answer: 200 with the JSON, or the one-line error of a client's request."""
        try:
            if in_thread:
                answer_json = await asyncio.to_thread(predict_json, body, content_type)
            else:
                answer_json = predict_json(body, content_type)
        except BadRequest as exc:
            return answer(exc.status, str(exc))
        except MlflowException as exc:  # the model's one-line client errors (INVALID_PARAMETER_VALUE)
            if exc.get_http_status_code() == 400:
                return answer(400, exc.message.removeprefix("bad request: ").splitlines()[0])
            log.exception("prediction failed")
            return answer(500, "the server failed to answer this request; its log has the details")
        except Exception:  # a bug of ours, not the client's: logged here, one line there
            log.exception("prediction failed")
            return answer(500, "the server failed to answer this request; its log has the details")

        return Response(answer_json, status_code=200, media_type="application/json")

    return app


async def warm_up_over_socket(host: str, port: int, bodies: list[bytes], ready: asyncio.Event,
                              timeout_s: float = WARM_UP_TIMEOUT_S) -> list[int]:
    """POST each JSON body WARM_UP_ROUNDS times to this server's /invocations over TCP, as a client would (uvicorn's
    protocol, the app, JSON: every path a request takes is warm), freeze what is alive then out of the cyclic
    collector's sight (gc.freeze) and set `ready`. It waits for
    the socket to listen; failures are logged, never fatal: `ready` is set whatever happens. The HTTP statuses."""
    start, statuses = time.perf_counter(), []
    deadline = time.monotonic() + timeout_s
    try:
        for body in bodies:
            for _ in range(WARM_UP_ROUNDS):
                statuses.append(await http_post(host, port, "/invocations", body, deadline))
    except (OSError, asyncio.TimeoutError, ValueError) as exc:
        log.warning("the warm-up over %s:%s failed (%s); the first requests may be slower", host, port, exc)
    finally:
        # what is alive now (the model, the libraries: about 300,000 objects) lives as long as the server: frozen
        # out of the cyclic collector's sight, a collection during a burst walks the requests' objects only, and
        # /ping is not held behind a 0.4 s walk of the heap
        gc.collect()
        gc.freeze()
        # the event loop's turn at the GIL comes sooner while large requests are parsed in threads: /ping's worst in
        # a burst of 100 large requests fell from 0.79-0.90 s to 0.73 s, the small request's median within noise
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        ready.set()
    if any(status != 200 for status in statuses):
        log.warning("the warm-up requests answered HTTP %s; the first requests may be slower", statuses)
    elif statuses:  # in uvicorn's own log, beside its startup lines
        logging.getLogger("uvicorn.error").info("warmed up: %d requests over %s:%s in %.2f s", len(statuses), host, port,
                                                time.perf_counter() - start)
    return statuses


async def http_post(host: str, port: int, path: str, body: bytes, deadline: float) -> int:
    """POST a JSON body over HTTP/1.1 (one connection, closed after the answer); the answer's status. Retries a
    refused connection (a server about to listen) until `deadline` (time.monotonic)."""
    while True:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                    max(deadline - time.monotonic(), 0.01))
            break
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.05)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), max(deadline - time.monotonic(), 0.01))
    finally:
        writer.close()
    status_line = answer.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise ValueError(f"not an HTTP answer: {answer[:60]!r}")
    return int(status_line[1])


def connect_host(bind_host: str) -> str:
    """Where this machine reaches a server bound to `bind_host`: a wildcard address is reached on loopback."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind_host, bind_host)


def python_model(model):
    """The PythonModel inside a loaded pyfunc; None for another flavour (a pickled PyTorch one, logged before)."""
    try:
        return model.unwrap_python_model()
    except Exception:
        return None


def check_port_free(host: str, port: int) -> None:
    """SettingsError in one line where `host`:`port` cannot be listened on (another server holds it, or the address is
    not this machine's): said before the model loads, in a moment rather than after it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as exc:
            reason = "in use (another server?)" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise SettingsError(f"cannot listen on {host}:{port}: {reason}; choose another --port, or stop what holds "
                                "it") from None


def serve(config: ServeConfig) -> None:
    """Run the app under uvicorn with config.workers processes (blocking)."""
    import uvicorn

    os.environ.update(config.to_env())
    uvicorn.run("pgt.serving.server:create_app", factory=True, host=config.host, port=config.port, workers=config.workers,
                log_level="info", timeout_graceful_shutdown=10)

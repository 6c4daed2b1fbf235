"""`pgt serve`'s settings: the address, the request limits and the queue (pgt.serving.server), each with its help
and bounds, from which the command's options are built; uvicorn's workers read them back from the environment."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from infra.errors import SettingsError
from infra.settings import check_settings, setting

ENV_PREFIX = "PGT_SERVE_"  # ServeConfig fields reach uvicorn's workers as PGT_SERVE_<FIELD> variables


@dataclass
class ServeConfig:
    model_uri: str  # an MLflow model URI: models:/NAME@champion, runs:/RUN_ID/model, ...
    host: str = setting("127.0.0.1", "Address to bind.")
    port: int = setting(5056, "Port to bind.", low=1, high=65535)
    workers: int = setting(1, "Worker processes, each with its own copy of the model.", low=1, high=256)
    max_request_mb: float = setting(16.0, "Request bodies larger than this get HTTP 413 (a week of one person's GPS "
                                          "at 1 Hz is about 60 MB).", low=0.0, high=4096.0, low_open=True)
    max_in_flight: int = setting(2, "Large requests (bodies over 64 KB) a worker parses and scores at once, each in "
                                    "a thread; small ones are answered on its event loop as soon as they are read.",
                                 low=1, high=4096)
    max_queued: int = setting(16, "Large requests a worker admits and has not begun to score (being read, or read "
                                  "and waiting for a slot); past it a new large request waits unread in its socket.",
                              low=1, high=1 << 20)
    max_buffered_mb: float = setting(64.0, "Request bodies a worker holds at once, all requests together (a body being "
                                           "read reserves its declared size); a request that would pass it waits "
                                           "unread in its socket. At least max_request_mb.",
                                     low=0.0, high=65536.0, low_open=True)
    queue_timeout_s: float = setting(30.0, "A request waits unread at most this long for room (bytes and a place in "
                                           "the queue); past it, HTTP 503 with Retry-After.",
                                     low=0.0, high=86400.0, low_open=True)
    body_timeout_s: float = setting(20.0, "A request's body must arrive within this many seconds of its admission; "
                                          "past it, HTTP 408 and the connection closes (a slow sender gives its room "
                                          "back).", low=0.0, high=86400.0, low_open=True)
    tracking_uri: str | None = setting(None, "Where models:/ and runs:/ URIs resolve; None: $MLFLOW_TRACKING_URI.",
                                       env="MLFLOW_TRACKING_URI")
    torch_threads: int = setting(1, "Torch threads per worker. A request is a few people's sequences, which one thread "
                                    "computes as fast as several; more threads keep spinning after the model's pass and "
                                    "slow the next request's preprocessing on a small machine.", low=1, high=256)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.max_buffered_mb < self.max_request_mb:
            raise SettingsError(f"max_buffered_mb ({self.max_buffered_mb:g}) is below max_request_mb "
                                f"({self.max_request_mb:g}): a request of the largest size could never be read")

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)

    @property
    def max_buffered_bytes(self) -> int:
        return int(self.max_buffered_mb * 2**20)

    def to_env(self) -> dict[str, str]:
        return {f"{ENV_PREFIX}{k.upper()}": str(v) for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_env(cls) -> "ServeConfig":
        values = {}
        for field in dataclasses.fields(cls):
            raw = os.environ.get(f"{ENV_PREFIX}{field.name.upper()}")
            if raw is not None:
                values[field.name] = {"int": int, "float": float}.get(str(field.type), str)(raw)
        return cls(**values)

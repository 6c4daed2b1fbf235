"""ServeConfig reaches uvicorn's worker processes through PGT_SERVE_* variables: the round trip keeps every
setting with its type, and a bad value fails in one line naming the setting."""

from __future__ import annotations

import pytest

from pgt.serving.config import ServeConfig


def test_the_environment_round_trip_keeps_every_setting_and_its_type(monkeypatch):
    config = ServeConfig("models:/pgt@champion", host="127.0.0.2", port=6001, workers=3, max_request_mb=2.5,
                         tracking_uri="http://127.0.0.1:5055", torch_threads=3)
    for key, value in config.to_env().items():
        monkeypatch.setenv(key, value)
    back = ServeConfig.from_env()
    assert back == config and isinstance(back.port, int) and isinstance(back.max_request_mb, float)


@pytest.mark.parametrize("settings, message", [
    ({"port": 0}, "port must be in [1, 65535], got 0"),
    ({"max_request_mb": 0.0}, "max_request_mb must be in (0.0, 4096.0], got 0.0"),
    ({"workers": 0}, "workers must be in [1, 256], got 0"),
    ({"torch_threads": 0}, "torch_threads must be in [1, 256], got 0"),
])
def test_bad_settings_fail_in_one_line(settings, message):
    with pytest.raises(ValueError) as info:
        ServeConfig("models:/pgt@champion", **settings)
    assert str(info.value) == message

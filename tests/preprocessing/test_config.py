from __future__ import annotations

import json

import pytest

from preprocessing.config import PreprocessConfig, load_config
from preprocessing.errors import InputError


def test_defaults_are_the_reference_protocol():
    c = PreprocessConfig()
    assert (c.staypoint_dist_threshold_m, c.staypoint_time_threshold_min, c.staypoint_gap_threshold_min) == (200, 30, 1440)
    assert c.activity_time_threshold_min == 25
    assert c.min_tracking_days == 50 and c.min_mean_window_quality is None
    assert (c.location_epsilon_m, c.location_min_samples, c.merge_max_gap_min) == (20, 2, 1)
    assert (c.train_fraction, c.validation_fraction) == (0.6, 0.2)
    assert (c.history_days, c.min_history_staypoints) == (7, 3)
    assert (c.time_slots, c.duration_buckets) == (96, 96)
    assert c.timezone == "UTC"


@pytest.mark.parametrize("suffix,text", [
    (".yaml", "history_days: 5\ntimezone: Asia/Shanghai\n"),
    (".json", json.dumps({"history_days": 5, "timezone": "Asia/Shanghai"})),
    (".toml", 'history_days = 5\ntimezone = "Asia/Shanghai"\n'),
])
def test_load_config_formats(tmp_path, suffix, text):
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    c = load_config(path)
    assert c.history_days == 5 and c.timezone == "Asia/Shanghai" and c.location_epsilon_m == 20


def test_unknown_setting_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("epsilon: 20\n")
    with pytest.raises(InputError, match=r"c\.yaml: unknown setting\(s\) epsilon"):
        load_config(path)


@pytest.mark.parametrize("text,message", [
    ("history_days: -1\n", "history_days must be positive"),
    ("timezone: Mars/Olympus\n", "timezone must be an IANA zone"),
    ("train_fraction: 0.9\n", "must be below 1"),
    ("location_min_samples: 2.5\n", "location_min_samples must be an integer"),
    ("[1, 2]\n", "expected a mapping"),
])
def test_bad_values_are_explained(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_config(path)

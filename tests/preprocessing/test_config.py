from __future__ import annotations

import json

import pytest

from infra.errors import InputError
from preprocessing.config import PreprocessConfig, load_config


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
    ("history_days: -1\n", r"history_days must be in \[1, 127\], got -1"),
    ("location_epsilon_m: 0\n", r"location_epsilon_m must be in \(0.0, inf\), got 0"),
    ("location_axis_order: xy\n", "location_axis_order must be one of lat_lon, lon_lat, got 'xy'"),
    ("timezone: Mars/Olympus\n", "timezone must be an IANA zone"),
    ("train_fraction: 0.9\n", "must be below 1"),
    ("location_min_samples: 2.5\n", "location_min_samples must be an integer"),
    ("[1, 2]\n", "expected a mapping"),
    ("staypoint_dist_threshold_m: .nan\n", "staypoint_dist_threshold_m must be a finite number, got nan"),
    ("activity_time_threshold_min: .inf\n", "activity_time_threshold_min must be a finite number"),
    ("history_days: 200\n", r"history_days must be in \[1, 127\], got 200"),  # recency is stored as int8
    ("time_slot_min: 2000\n", r"time_slot_min must be in \[1, 1440\], got 2000"),
    ("duration_bucket_min: 1\nduration_cap_min: 100000\n", "100,001 duration buckets; at most 32,000"),
    ("earliest_valid_time: yesterday\n", "earliest_valid_time must be an ISO 8601 date"),
    ("min_mean_window_quality: true\n", r"min_mean_window_quality must be a number, got True"),
])
def test_bad_values_are_explained(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_config(path)


def test_a_file_hears_of_every_problem_at_once(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("history_days: 0\nlocation_min_samples: 2.5\ntimezone: Mars/Olympus\ntrain_fraction: 0.9\n")
    with pytest.raises(InputError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}: location_min_samples must be an integer, got 2.5; history_days must be in [1, 127], got 0; "
        "train_fraction + validation_fraction must be below 1 (the test split takes the rest); timezone must be an "
        "IANA zone such as 'UTC' or 'Asia/Shanghai', got 'Mars/Olympus'")


def test_feature_sizes_and_time_window_follow_the_settings(tmp_path):
    c = PreprocessConfig(time_slot_min=10, history_days=3, duration_bucket_min=60)
    assert (c.time_slots, c.recency_days, c.duration_buckets) == (144, 4, 48)
    assert PreprocessConfig(time_slot_min=7).time_slots == 206  # 1439 // 7 + 1: the last slot is partial
    path = tmp_path / "c.yaml"
    path.write_text("earliest_valid_time: 2000-01-01\nlatest_valid_time: 2030-06-01T12:00:00+02:00\n")  # YAML dates
    earliest, latest = load_config(path).time_window()
    assert (earliest.isoformat(), latest.isoformat()) == ("2000-01-01T00:00:00+00:00", "2030-06-01T10:00:00+00:00")
    assert PreprocessConfig().time_window()[1] is None  # one day after the run

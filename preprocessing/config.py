"""PreprocessConfig: every threshold of the reference protocol, with its unit in its name."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from infra.errors import InputError, SettingsError
from infra.settings import check_settings, renamed_hint, setting, setting_problems

FORMATS = ("geolife-plt", "positionfixes", "staypoints")  # what an input may hold (preprocessing.readers)
SPLITS = ("train", "validation", "test")  # the protocol's per-user day splits, in time order
# the day a sample's recency counts back from: the target's (the protocol's splits), or the history's last visit's
# (what a live prediction knows at its default moment: the next visit's day is not known before it happens)
ANCHORS = ("target_day", "last_visit")
APPLIED_SPLIT = "evaluation"  # the samples with targets of new data under a fitted preprocessing (preprocessing.fitted)

POSITIVE = {"low": 0.0, "low_open": True}
AXIS_ORDERS = ("lat_lon", "lon_lat")


@dataclass(frozen=True)
class PreprocessConfig:
    # staypoints (sliding method, as trackintel's generate_staypoints(method="sliding"))
    staypoint_dist_threshold_m: float = setting(200.0, "A fix this far (haversine, m) from the anchor ends the stay.",
                                                **POSITIVE)
    staypoint_time_threshold_min: float = setting(30.0, "A stay must last at least this long (min).", **POSITIVE)
    staypoint_gap_threshold_min: float = setting(1440.0, "A gap longer than this between fixes resets the anchor "
                                                         "(min).", **POSITIVE)
    # activity flag
    activity_time_threshold_min: float = setting(25.0, "Staypoints at least this long are activities (min).",
                                                 **POSITIVE)
    # user quality filter
    min_tracking_days: int = setting(50, "Keep users whose tracking spans more than this many whole days.",
                                     **POSITIVE)
    quality_window_weeks: int = setting(10, "Sliding window of the optional coverage filter (weeks).", **POSITIVE)
    min_mean_window_quality: float | None = setting(None, "Optional: the least mean staypoint coverage (0..1) over "
                                                          "the windows; None (GeoLife's protocol): no such filter.",
                                                    low=0.0, high=1.0)
    # locations (DBSCAN over all users' staypoints, haversine)
    location_epsilon_m: float = setting(20.0, "DBSCAN neighbourhood radius (m).", **POSITIVE)
    location_min_samples: int = setting(2, "DBSCAN core point size; staypoints left as noise are dropped.",
                                        **POSITIVE)
    location_axis_order: str = setting("lat_lon", "lon_lat feeds DBSCAN (lon, lat) as trackintel 1.x does (see "
                                                  "generate_locations).", choices=AXIS_ORDERS)
    # merging consecutive staypoints at the same location
    merge_max_gap_min: float = setting(1.0, "Merge when the next staypoint starts at most this long after the "
                                            "previous finished (min).", **POSITIVE)
    # per-user split by day
    train_fraction: float = setting(0.6, "First share of each user's days.", low=0.0, high=1.0, low_open=True)
    validation_fraction: float = setting(0.2, "Next share; the test split takes the rest.", low=0.0, high=1.0,
                                         low_open=True)
    # samples (recency is stored as int8)
    history_days: int = setting(7, "History = the split's staypoints that started at most this many days before "
                                   "the target's day.", low=1, high=127)
    min_history_staypoints: int = setting(3, "Samples need at least this many history staypoints.", **POSITIVE)
    memory_size: int = setting(32, "The most earlier places outside the history window a sample remembers; a "
                                     "model reads as many as its own memory_size asks, up to this.",
                                 low=1, high=1024)
    # feature buckets (slots and buckets are stored as int16)
    time_slot_min: int = setting(15, "Time slot = start minute of day // this (0..95 for 15).", low=1, high=1440)
    duration_cap_min: int = setting(2879, "Durations are capped at this many minutes (two days less a minute).",
                                    **POSITIVE)
    duration_bucket_min: int = setting(30, "Duration bucket = capped minutes // this (0..95 for 30).", **POSITIVE)
    timezone: str = setting("UTC", "Days, slots and weekdays are taken in this IANA zone (the reference: UTC).")
    # plausibility: fixes and staypoints outside this window are quarantined
    earliest_valid_time: str = setting("1990-01-01", "Fixes and staypoints before this ISO 8601 date or time (UTC "
                                                     "if no offset) are quarantined.")
    latest_valid_time: str | None = setting(None, "Fixes and staypoints after this ISO 8601 time are quarantined; "
                                                  "None: one day after the run (rounded up to the minute).")

    def __post_init__(self) -> None:
        problems = setting_problems(self) + self._combination_problems()
        if problems:
            raise SettingsError("; ".join(problems))

    def _combination_problems(self) -> list[str]:
        """What the bounds of one setting cannot say: settings that must fit together, and the text settings'
        formats."""
        problems = []
        fractions = (self.train_fraction, self.validation_fraction)
        if all(isinstance(f, (int, float)) for f in fractions) and sum(fractions) >= 1.0:
            problems.append("train_fraction + validation_fraction must be below 1 (the test split takes the rest)")
        cap, bucket = self.duration_cap_min, self.duration_bucket_min
        if isinstance(cap, int) and isinstance(bucket, int) and bucket > 0 and cap // bucket + 1 > 32_000:
            problems.append(f"duration_cap_min // duration_bucket_min gives {cap // bucket + 1:,} duration buckets; "
                            "at most 32,000 are supported")
        try:
            ZoneInfo(str(self.timezone))
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(f"timezone must be an IANA zone such as 'UTC' or 'Asia/Shanghai', got {self.timezone!r}")
        for name in ("earliest_valid_time", "latest_valid_time"):
            value = getattr(self, name)
            if value is None and name == "latest_valid_time":
                continue
            try:
                parse_time(value)
            except (TypeError, ValueError):
                problems.append(f"{name} must be an ISO 8601 date or time such as 1990-01-01, got {value!r}")
        return problems

    @property
    def time_slots(self) -> int:
        """Number of time-of-day slots (96 for 15-minute slots): values 0 .. 1439 // time_slot_min."""
        return 1439 // self.time_slot_min + 1

    @property
    def duration_buckets(self) -> int:
        """Number of duration buckets (96 for 30-minute buckets capped at 2,879 min)."""
        return self.duration_cap_min // self.duration_bucket_min + 1

    @property
    def recency_days(self) -> int:
        """Number of recency values: 0 (the target's day) .. history_days."""
        return self.history_days + 1

    def time_window(self) -> tuple[datetime, datetime | None]:
        """(earliest, latest or None for one day after the run), as UTC datetimes."""
        latest = parse_time(self.latest_valid_time) if self.latest_valid_time is not None else None
        return parse_time(self.earliest_valid_time), latest

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> PreprocessConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(source, f"unknown setting(s) {', '.join(unknown)}{renamed_hint(unknown)}; expected some of: "
                                     f"{', '.join(sorted(known))}")
        values = {k: v.isoformat() if isinstance(v, (date, datetime)) else v for k, v in values.items()}  # YAML dates
        try:
            return cls(**values)
        except (TypeError, SettingsError) as exc:
            raise InputError(source, str(exc)) from None


def parse_time(value: str) -> datetime:
    """An ISO 8601 date or time as a UTC datetime (UTC when it names no offset); TypeError, ValueError otherwise."""
    if not isinstance(value, str):
        raise TypeError(value)
    parsed = datetime.fromisoformat(value.strip())
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)


def load_config(path: Path | None) -> PreprocessConfig:
    """Read a PreprocessConfig from a YAML, JSON or TOML file; None gives the reference protocol."""
    if path is None:
        return PreprocessConfig()
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "config file not found")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix == ".json":
            values = json.loads(text)
        elif path.suffix == ".toml":
            values = tomllib.loads(text)
        else:
            values = yaml.safe_load(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(path, f"not valid {path.suffix.lstrip('.') or 'YAML'}: {first}") from None
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise InputError(path, f"expected a mapping of settings, found {type(values).__name__}")
    values = values.get("preprocess", values) if isinstance(values.get("preprocess"), dict) else values
    return PreprocessConfig.from_dict(values, source=str(path))


@dataclass(frozen=True)
class SynthConfig:
    users: int = setting(50, "People to simulate.", low=1, high=1 << 24)
    days: int = setting(120, "Days of tracking per person.", low=1, high=36_500)
    seed: int = setting(0, "Random seed; the same seed writes the same file.")
    start: str = setting("2024-01-01", "First day (local), an ISO date.")
    city_lat: float = setting(39.9042, "City centre latitude, degrees (Beijing, as GeoLife).", low=-85.0, high=85.0)
    city_lon: float = setting(116.4074, "City centre longitude, degrees.", low=-180.0, high=180.0)
    utc_offset_hours: int = setting(8, "Routines are in local time at this offset; fixes are written in UTC.",
                                    low=-12, high=14)
    city_radius_m: float = setting(12_000.0, "Homes and public places lie within about this radius (m).",
                                   low=100.0, high=1_000_000.0)
    public_places: int = setting(400, "Shops, parks and restaurants everybody shares.", low=1, high=1 << 20)
    employed_share: float = setting(0.8, "People with a workplace; the others keep weekend-like days.",
                                    low=0.0, high=1.0)
    explore_rho: float = setting(0.6, "Exploration: P(new place) = rho * S^-gamma.", low=0.0, high=1.0)
    explore_gamma: float = setting(0.21, "Exploration's decay with the places S seen so far.", low=0.0, high=10.0)
    gps_noise_m: float = setting(8.0, "Standard deviation of the fix error (m).", low=0.0, high=1000.0)
    outlier_prob: float = setting(0.0005, "Chance of a fix thrown 300-1000 m off.", low=0.0, high=1.0)
    duplicate_prob: float = setting(0.003, "Chance of a fix written twice with the same timestamp.", low=0.0, high=1.0)
    stay_interval_s: float = setting(600.0, "Mean time between fixes while staying (the phone sleeps), seconds.",
                                     low=0.0, low_open=True)
    move_interval_s: float = setting(15.0, "Mean time between fixes while moving, seconds.", low=0.0, low_open=True)
    trip_gap_prob: float = setting(0.15, "Chance that a trip loses a stretch of its fixes.", low=0.0, high=1.0)
    phone_off_day_prob: float = setting(0.04, "Chance of a whole day without any fix.", low=0.0, high=1.0)

    def __post_init__(self) -> None:
        check_settings(self)

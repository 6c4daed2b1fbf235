"""A synthetic GPS generator: the project's embedded default dataset, realistic enough to exercise every step.

Each person has a home, maybe a workplace, and favourite places drawn from a city's public places.
Weekdays follow a commute routine (with lunch outings and errands after work), weekends a free
routine of outings. Where to go follows exploration and preferential return (Song et al., 2010): a new
place with probability rho * S^-gamma (S distinct places visited so far), else a known place in
proportion to past visits. Fixes carry GPS noise, rare outliers and repeated timestamps; trips have
sampling gaps (tunnels, a flat battery), and some days the phone stays off altogether.
Routines are in local time (`utc_offset_hours`); fixes are written in UTC like GeoLife's.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from rich.progress import Progress

from infra.errors import InputError
from infra.output import PRODUCER_KEY, temporary_sibling
from preprocessing.config import SynthConfig

M_PER_DEG_LAT = 111_320.0
DAY_S = 86_400
HOUR_S = 3_600
MIN_S = 60


def _offset(lat: np.ndarray | float, lon: np.ndarray | float, dx_m, dy_m):
    """Move points by metres east (dx) and north (dy)."""
    return lat + dy_m / M_PER_DEG_LAT, lon + dx_m / (M_PER_DEG_LAT * np.cos(np.radians(lat)))


def _distances_m(points: np.ndarray, origin: tuple[float, float]) -> np.ndarray:
    """Metres from origin to each (lat, lon) row of points (equirectangular: fine within a city)."""
    dy = (points[:, 0] - origin[0]) * M_PER_DEG_LAT
    dx = (points[:, 1] - origin[1]) * M_PER_DEG_LAT * np.cos(np.radians(origin[0]))
    return np.hypot(dx, dy)


class _Person:
    """One synthetic person: places, visit counts and the exploration/preferential-return choice."""

    def __init__(self, cfg: SynthConfig, rng: np.random.Generator, public: np.ndarray):
        self.cfg, self.rng, self.public = cfg, rng, public
        r = cfg.city_radius_m * np.sqrt(rng.uniform(0.02, 1.0))
        angle = rng.uniform(0, 2 * np.pi)
        self.home = _offset(cfg.city_lat, cfg.city_lon, r * np.cos(angle), r * np.sin(angle))
        self.work = None
        if rng.uniform() < cfg.employed_share:
            d, a = rng.uniform(2_000, 10_000), rng.uniform(0, 2 * np.pi)
            self.work = _offset(self.home[0], self.home[1], d * np.cos(a), d * np.sin(a))
        self.workdays = set(rng.choice(5, size=rng.choice([4, 5], p=[0.2, 0.8]), replace=False).tolist())
        self.places: list[tuple[float, float]] = []  # leisure places visited so far
        self.visits: list[int] = []
        near = np.argsort(_distances_m(public, self.home))[:40]
        for i in rng.choice(near, size=rng.integers(3, 7), replace=False):  # favourites
            self.places.append(tuple(public[i]))
            self.visits.append(int(rng.integers(3, 10)))

    def choose(self, near: tuple[float, float]) -> tuple[float, float]:
        """Exploration and preferential return."""
        cfg, rng = self.cfg, self.rng
        distinct = len(self.places) + 1 + (self.work is not None)
        if rng.uniform() < cfg.explore_rho * distinct ** (-cfg.explore_gamma):
            if rng.uniform() < 0.6:  # a public place, likely near where one is
                d = _distances_m(self.public, near)
                weights = 1.0 / (d + 500.0) ** 2
                place = tuple(self.public[rng.choice(len(self.public), p=weights / weights.sum())])
            else:  # somewhere new and private (a friend's flat, a trailhead)
                d, a = rng.exponential(3_000), rng.uniform(0, 2 * np.pi)
                place = _offset(near[0], near[1], d * np.cos(a), d * np.sin(a))
            if place in self.places:
                self.visits[self.places.index(place)] += 1
            else:
                self.places.append(place)
                self.visits.append(1)
            return place
        weights = np.asarray(self.visits, dtype=float)
        i = int(rng.choice(len(self.places), p=weights / weights.sum()))
        self.visits[i] += 1
        return self.places[i]

    def day_plan(self, day: int, weekday: int) -> list[tuple[tuple[float, float], float, float]]:
        """(place, earliest departure to it in local seconds, minimum stay in seconds) for one day."""
        rng, t0 = self.rng, day * DAY_S
        plan = []
        if self.work is not None and weekday in self.workdays:
            if rng.uniform() < 0.25:  # a stop on the way (a café, the school gate)
                plan.append((self.choose(self.home), t0 + rng.normal(7.5 * HOUR_S, 30 * MIN_S), rng.uniform(30, 50) * MIN_S))
            plan.append((self.work, t0 + rng.normal(8.5 * HOUR_S, 40 * MIN_S), 2 * HOUR_S))
            if rng.uniform() < 0.5:  # lunch somewhere near work
                plan.append((self.choose(self.work), t0 + rng.normal(12 * HOUR_S, 15 * MIN_S), rng.uniform(40, 70) * MIN_S))
                plan.append((self.work, 0.0, HOUR_S))
            leave = t0 + rng.normal(17.5 * HOUR_S, 50 * MIN_S)
            if rng.uniform() < 0.6:  # an errand on the way home
                plan.append((self.choose(self.work), leave, rng.uniform(35, 150) * MIN_S))
                plan.append((self.home, 0.0, 0.0))
            else:
                plan.append((self.home, leave, 0.0))
        else:
            t = t0 + rng.normal(10 * HOUR_S, HOUR_S)
            for k in range(int(rng.choice([0, 1, 2, 3, 4], p=[0.1, 0.25, 0.3, 0.25, 0.1]))):
                plan.append((self.choose(self.home), t, rng.uniform(40, 180) * MIN_S))
                t = 0.0
                if rng.uniform() < 0.5:
                    plan.append((self.home, 0.0, rng.uniform(30, 120) * MIN_S))
            if plan and plan[-1][0] != self.home:
                plan.append((self.home, 0.0, 0.0))
        return plan


def _noisy(rng: np.random.Generator, lat: np.ndarray, lon: np.ndarray, cfg: SynthConfig):
    n = len(lat)
    dx, dy = rng.normal(0, cfg.gps_noise_m, n), rng.normal(0, cfg.gps_noise_m, n)
    out = rng.uniform(size=n) < cfg.outlier_prob
    if out.any():
        d, a = rng.uniform(300, 1_000, out.sum()), rng.uniform(0, 2 * np.pi, out.sum())
        dx[out] += d * np.cos(a)
        dy[out] += d * np.sin(a)
    return _offset(lat, lon, dx, dy)


def _person_fixes(cfg: SynthConfig, rng: np.random.Generator, person: _Person, first_weekday: int):
    times, lats, lons = [], [], []
    here, arrived, min_here = person.home, 0.0, 0.0

    def stay(until: float) -> None:
        if until <= arrived:
            return
        n = max(1, int((until - arrived) / cfg.stay_interval_s))
        t = np.sort(rng.uniform(arrived, until, n))
        t[0] = arrived  # the arrival fix
        times.append(t)
        lats.append(np.full(n, here[0]))
        lons.append(np.full(n, here[1]))

    for day in range(cfg.days):
        for place, earliest, min_stay in person.day_plan(day, (first_weekday + day) % 7):
            if place == here:
                continue
            depart = max(earliest, arrived + max(min_here, 10 * MIN_S))
            stay(depart)
            dist = float(_distances_m(np.array([place]), here)[0])
            speed = 1.4 if dist < 1_500 else rng.uniform(6.0, 12.0)
            duration = dist / speed + rng.uniform(1, 5) * MIN_S
            n = max(2, int(duration / cfg.move_interval_s))
            frac = np.clip((np.arange(n) + rng.uniform(-0.3, 0.3, n)) / (n - 1), 0.0, 1.0)
            if rng.uniform() < cfg.trip_gap_prob and n > 10:  # a tunnel, a flat battery
                a = rng.integers(1, n - 5)
                keep = np.ones(n, bool)
                keep[a:a + rng.integers(3, max(4, n // 2))] = False
                keep[-1] = True
                frac = frac[keep]
            times.append(depart + frac * duration)
            lats.append(here[0] + frac * (place[0] - here[0]))
            lons.append(here[1] + frac * (place[1] - here[1]))
            here, arrived, min_here = place, depart + duration + 1.0, min_stay
    stay(cfg.days * DAY_S)
    t = np.concatenate(times)
    lat, lon = _noisy(rng, np.concatenate(lats), np.concatenate(lons), cfg)
    day = (t // DAY_S).astype(np.int64)
    off_days = np.flatnonzero(rng.uniform(size=cfg.days) < cfg.phone_off_day_prob)
    keep = ~np.isin(day, off_days)
    t, lat, lon = np.floor(t[keep]).astype(np.int64), lat[keep], lon[keep]
    first = np.concatenate([[True], np.diff(t) > 0])  # whole seconds, strictly increasing
    t, lat, lon = t[first], lat[first], lon[first]
    dup = np.flatnonzero(rng.uniform(size=len(t)) < cfg.duplicate_prob)  # same timestamp written twice
    if dup.size:
        d_lat, d_lon = _noisy(rng, lat[dup], lon[dup], cfg)
        order = np.argsort(np.concatenate([np.arange(len(t)), dup]), kind="stable")
        t = np.concatenate([t, t[dup]])[order]
        lat = np.concatenate([lat, d_lat])[order]
        lon = np.concatenate([lon, d_lon])[order]
    return t, lat, lon


def iter_positionfixes(cfg: SynthConfig | None = None, users_per_chunk: int = 64) -> Iterator[pl.DataFrame]:
    """The fixes of generate_positionfixes, `users_per_chunk` people at a time (memory follows the chunk)."""
    cfg = cfg or SynthConfig()
    rng = np.random.default_rng(cfg.seed)
    start = datetime.fromisoformat(cfg.start).replace(tzinfo=timezone.utc)
    r = cfg.city_radius_m * np.sqrt(rng.uniform(0, 1, cfg.public_places))
    a = rng.uniform(0, 2 * np.pi, cfg.public_places)
    public = np.column_stack(_offset(cfg.city_lat, cfg.city_lon, r * np.cos(a), r * np.sin(a)))
    frames = []
    for user in range(cfg.users):
        person = _Person(cfg, rng, public)
        t, lat, lon = _person_fixes(cfg, rng, person, start.weekday())
        utc_s = int(start.timestamp()) - cfg.utc_offset_hours * HOUR_S + t
        frames.append(pl.DataFrame({
            "user_id": np.full(len(t), user, np.int32),
            "tracked_at": pl.Series(utc_s * 1000).cast(pl.Datetime("ms")).dt.replace_time_zone("UTC"),
            "latitude": np.round(lat, 6),
            "longitude": np.round(lon, 6),
        }))
        if len(frames) == users_per_chunk or user == cfg.users - 1:
            yield pl.concat(frames)
            frames = []


def generate_positionfixes(cfg: SynthConfig | None = None) -> pl.DataFrame:
    """GPS fixes of `cfg.users` people over `cfg.days` days: user_id, tracked_at (UTC), latitude, longitude."""
    return pl.concat(list(iter_positionfixes(cfg)))


SYNTHESISER = "pgt synth"  # the producer mark of the Parquet it writes (infra.output.written_by)


def write_positionfixes(cfg: SynthConfig, out_file: Path | str, progress: bool = False) -> Path:
    """Generate and write the points as Parquet, atomically, a chunk of people at a time (memory stays flat
    at any size). The same config writes the same bytes."""
    out_file = Path(out_file)
    if out_file.suffix != ".parquet":
        raise InputError(out_file, "the synthetic points are written as a .parquet file")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(out_file)

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("synthetic people", total=cfg.users)
        writer = None
        try:
            for chunk in iter_positionfixes(cfg):
                table = chunk.to_arrow()
                table = table.replace_schema_metadata({**(table.schema.metadata or {}), PRODUCER_KEY: SYNTHESISER.encode()})
                writer = writer or pq.ParquetWriter(tmp, table.schema, compression="zstd")
                writer.write_table(table, row_group_size=1_000_000)
                bar.advance(task, chunk["user_id"].n_unique())
        except BaseException:
            if writer is not None:
                writer.close()
            tmp.unlink(missing_ok=True)
            raise
        writer.close()
    tmp.replace(out_file)
    return out_file

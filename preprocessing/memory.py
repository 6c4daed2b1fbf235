"""Long-term memory: a person's earlier places outside the history window, known at the moment of prediction.

The history (the window) holds the visits of the last `history_days` days; a place last visited earlier cannot
be copied from it. The memory lists, for every sample, the person's other earlier places, each with what was known
when the prediction was made: only visits that started before the window and ended strictly before the sample's
moment count. Per place: its visits (count), days since the last of them (from the sample's anchor day, as the
history's recency), the peak of its time-of-day and weekday profile (the hour and the weekday most of its
visits started in), and how many of its visits came right after a visit to the place the person is at now (the
history's last visit's): the person's own transitions from here to it. At most `memory_size` places are kept,
the most visited first (ties: the most recently visited, then the lower place id).

One rule for the splits (`preprocessing.sequences.sample_table`), new data (`preprocessing.fitted`) and served
requests: generate_memory takes the visits and the samples' moments and returns the list columns.
"""

from __future__ import annotations

import array
import bisect
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from infra.errors import SettingsError
from preprocessing.validation import require_columns

# the memory's list columns in a split, one entry per remembered place, in priority order
MEMORY_COLUMNS = ("memory_locations", "memory_places", "memory_visits", "memory_days", "memory_time_slots",
                  "memory_weekdays", "memory_after_current")
VISIT_COLUMNS = {"user_id": None, "location": None, "location_id": None, "started_at": pl.Datetime,
                 "finished_at": pl.Datetime, "time_slot": None, "weekday": None}
QUERY_COLUMNS = {"user_id": None, "window_start": pl.Datetime, "moment": pl.Datetime, "anchor_date": pl.Date,
                 "window_places": None}
# what a sample's target is to the person at the moment of prediction (column target_kind, where targets are known):
# a place of the window, a place visited before but not in the window (a return), or a place never visited before
TARGET_KINDS = ("window", "return", "new")


@dataclass(frozen=True)
class MemoryRule:
    """How a memory is built: at most `places` places; dates, hours and weekdays in `timezone`; time slots of
    `time_slot_min` minutes (PreprocessConfig's memory_size, timezone and time_slot_min)."""

    places: int
    timezone: str = "UTC"
    time_slot_min: int = 15

    @classmethod
    def of(cls, config) -> MemoryRule:
        """The rule of a PreprocessConfig."""
        return cls(config.memory_size, config.timezone, config.time_slot_min)


def generate_memory(visits: pl.DataFrame, queries: pl.DataFrame, memory_size: int, timezone: str,
                    time_slot_min: int) -> dict[str, pa.Array]:
    """The memory list columns (MEMORY_COLUMNS) of each row of `queries`, in its order.

    visits: user_id, location (vocabulary id), location_id (place), started_at, finished_at, time_slot (start slot
    of `time_slot_min` minutes, local), weekday (0 = Monday, local); any order. queries: user_id, window_start (the
    start of the history's first visit), moment (when the prediction is made: the end of the history's last visit,
    or a given time), anchor_date (the local day days are counted back from), window_places (the history's places,
    in visit order: the last is where the person is now).
    A visit is remembered by a query of its user when it started before window_start and finished before moment,
    and its place is not in window_places. Where `queries` has target_place, the result also holds target_kind
    (TARGET_KINDS), from every remembered place, not only the kept ones."""
    require_columns(visits, "memory visits", VISIT_COLUMNS)
    require_columns(queries, "memory queries", QUERY_COLUMNS)
    if isinstance(memory_size, bool) or not isinstance(memory_size, int) or memory_size < 1:
        raise SettingsError(f"memory_size must be a positive integer, got {memory_size!r}")
    zone = pl.col("started_at").dt.convert_time_zone(timezone)
    v = visits.select(
        pl.col("user_id").cast(pl.String), "location", "location_id",
        pl.col("started_at").dt.epoch("us").alias("start"), pl.col("finished_at").dt.epoch("us").alias("finish"),
        zone.dt.date().cast(pl.Int32).alias("date"),
        (pl.col("time_slot").cast(pl.Int32) * time_slot_min // 60).clip(0, 23).alias("hour"), pl.col("weekday").cast(pl.Int32),
    ).with_row_index("_i").sort("user_id", "start", "_i")
    q = queries.select(
        pl.col("user_id").cast(pl.String), pl.col("window_start").dt.epoch("us").alias("window_start"),
        pl.col("moment").dt.epoch("us").alias("moment"), pl.col("anchor_date").cast(pl.Int32).alias("anchor"),
        pl.col("window_places"), *([pl.col("target_place")] if "target_place" in queries.columns else []),
    ).with_row_index("_q").sort("user_id", "moment", "window_start", "_q")
    out = _Columns(queries.height)
    slots_per_hour = 60 / time_slot_min
    runs = v.with_row_index("_row").group_by("user_id", maintain_order=True).agg(
        pl.col("_row").first().alias("first"), (pl.col("_row").last() + 1).alias("end"))
    bounds = {user: (first, end) for user, first, end in runs.iter_rows()}  # user -> (first, end) rows of v
    arrays = {name: _ints(v[name]) for name in ("start", "finish", "date", "hour", "weekday", "location_id",
                                                "location")}  # read one at a time, as Python ints
    q_users, q_index = q["user_id"].to_list(), q["_q"].to_numpy()
    q_start, q_moment, q_anchor = q["window_start"].to_numpy(), q["moment"].to_numpy(), q["anchor"].to_numpy()
    # the windows' places as one flat array and offsets (a Python list per query held 25M ints on a 4x GeoLife)
    window_places = q["window_places"].rechunk().to_arrow()
    w_offsets, w_values = window_places.offsets.to_numpy(), window_places.values.to_numpy(zero_copy_only=False)
    q_target = q["target_place"].to_list() if "target_place" in q.columns else None
    kinds = np.zeros(queries.height, np.int8)
    previous_user, memory = None, None
    for k in range(q.height):
        user = q_users[k]
        if user != previous_user:
            memory = _Memory(arrays, *bounds.get(user, (0, 0)))
            previous_user = user
        memory.advance(int(q_start[k]), int(q_moment[k]))
        places = w_values[w_offsets[k]:w_offsets[k + 1]].tolist()
        window = set(places)
        entries = memory.top(memory_size, window)
        current = places[-1] if places else None
        out.put(int(q_index[k]), entries, int(q_anchor[k]), slots_per_hour, current)
        if q_target is not None:
            target = q_target[k]
            kinds[q_index[k]] = 0 if target in window else 1 if target in memory.places else 2
    arrays = out.arrays()
    if q_target is not None:
        arrays["target_kind"] = pa.DictionaryArray.from_arrays(pa.array(kinds), pa.array(TARGET_KINDS))
    return arrays


def _ints(column: pl.Series) -> array.array:
    """A column as a compact array of 64-bit ints (a list of Python ints takes 4x the bytes) that reads as Python
    ints."""
    out = array.array("q")
    out.frombytes(column.cast(pl.Int64).to_numpy().tobytes())
    return out


class _Place:
    """What a person's remembered visits to one place add up to."""

    __slots__ = ("visits", "last_date", "hours", "weekdays", "peak_hour", "peak_weekday", "location", "before")

    def __init__(self, location: int):
        self.visits, self.last_date, self.location = 0, 0, location
        self.hours, self.weekdays = [0] * 24, [0] * 7
        self.peak_hour = self.peak_weekday = 0  # the first hour and weekday with the most visits (numpy's argmax)
        self.before: dict[int, int] = {}  # place visited right before -> visits

    def key(self, place: int) -> tuple[int, int, int]:
        """The memory's order: the most visited first, then the most recently visited, then the lower place id."""
        return -self.visits, -self.last_date, place


class _Memory:
    """One person's remembered visits, grown as the queries' window starts and moments move forward, with their
    places kept in the memory's order (so a query reads its top places without sorting them all)."""

    def __init__(self, arrays: dict[str, list], first: int, end: int):
        self.a, self.first, self.end = arrays, first, end
        self.next, self.pending = first, []  # rows started before the window, not yet finished before the moment
        self.window_start, self.moment = None, None
        self.places: dict[int, _Place] = {}
        self.order: list[tuple[int, int, int]] = []  # _Place.key of every place, sorted

    def advance(self, window_start: int, moment: int) -> None:
        if self.window_start is not None and (window_start < self.window_start or moment < self.moment):
            self.__init__(self.a, self.first, self.end)  # a query earlier than the last: count again from the start
        self.window_start, self.moment = window_start, moment
        start, finish = self.a["start"], self.a["finish"]
        while self.next < self.end and start[self.next] < window_start:
            self.pending.append(self.next)
            self.next += 1
        waiting = []
        for row in self.pending:
            if finish[row] < moment:
                self._add(row)
            else:
                waiting.append(row)
        self.pending = waiting

    def _add(self, row: int) -> None:
        a = self.a
        place = a["location_id"][row]
        entry = self.places.get(place)
        if entry is None:
            entry = self.places[place] = _Place(a["location"][row])
        else:
            del self.order[bisect.bisect_left(self.order, entry.key(place))]
        if row > self.first:  # the person's visit before this one (it started earlier, so before the window too)
            before = a["location_id"][row - 1]
            entry.before[before] = entry.before.get(before, 0) + 1
        entry.visits += 1
        entry.last_date = max(entry.last_date, a["date"][row])
        entry.location = a["location"][row]
        hour, weekday = a["hour"][row], a["weekday"][row]
        entry.hours[hour] += 1
        if entry.hours[hour] > entry.hours[entry.peak_hour] or (entry.hours[hour] == entry.hours[entry.peak_hour]
                                                                 and hour < entry.peak_hour):
            entry.peak_hour = hour
        entry.weekdays[weekday] += 1
        if entry.weekdays[weekday] > entry.weekdays[entry.peak_weekday] or (
                entry.weekdays[weekday] == entry.weekdays[entry.peak_weekday] and weekday < entry.peak_weekday):
            entry.peak_weekday = weekday
        bisect.insort(self.order, entry.key(place))

    def top(self, n: int, exclude: set) -> list[tuple[int, _Place]]:
        found = []
        for _, _, place in self.order:
            if place not in exclude:
                found.append((place, self.places[place]))
                if len(found) == n:
                    break
        return found


class _Columns:
    """The memory list columns, filled one query at a time in any order: the entries' numbers go to one flat int32
    buffer as they come (a Python tuple per entry held 4x the bytes: 2.2 GB of a 4x GeoLife's 27M entries), and are
    put in the queries' order once, at the end."""

    WIDTH = len(MEMORY_COLUMNS)

    def __init__(self, n: int):
        self.lengths = np.zeros(n, np.int64)  # entries per query, by query index
        self.order = array.array("q")  # the query index of each put, in put order
        self.values = array.array("i")  # WIDTH numbers per entry, in put order

    def put(self, index: int, entries: list[tuple[int, _Place]], anchor: int, slots_per_hour: float, current) -> None:
        self.lengths[index] = len(entries)
        self.order.append(index)
        for place, e in entries:
            self.values.extend((e.location, place, e.visits, anchor - e.last_date, int(e.peak_hour * slots_per_hour),
                                e.peak_weekday, e.before.get(current, 0)))

    def arrays(self) -> dict[str, pa.Array]:
        values = np.frombuffer(self.values, dtype=np.int32).reshape(-1, self.WIDTH)
        order = np.frombuffer(self.order, dtype=np.int64)
        put_starts = np.zeros(len(order), np.int64)  # where each put's entries begin in `values`
        np.cumsum(self.lengths[order][:-1], out=put_starts[1:])
        starts = np.zeros(len(self.lengths), np.int64)  # the same, by query index (a query never put has none)
        starts[order] = put_starts
        offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        # entry j of query q sits at starts[q] + j: the rows of `values` in the queries' order
        gather = np.repeat(starts - offsets[:-1], self.lengths) + np.arange(offsets[-1])
        values = values[gather]
        list_offsets = pa.array(offsets.astype(np.int32), pa.int32())
        types = (pa.int32(), pa.int64(), pa.int32(), pa.int32(), pa.int16(), pa.int8(), pa.int32())
        return {name: pa.ListArray.from_arrays(list_offsets, pa.array(values[:, i].astype(t.to_pandas_dtype()), t))
                for i, (name, t) in enumerate(zip(MEMORY_COLUMNS, types))}

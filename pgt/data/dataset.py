"""The Parquet splits of `pgt preprocess` as padded tensors, a Dataset that samplers can shard,
and optional length bucketing. Built with pyarrow and numpy: no Python loop per row."""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from infra.errors import InputError
from pgt.config import MEMORY_AGE_EDGES_DAYS, MEMORY_VISIT_EDGES, ModelConfig
from pgt.network.vocabulary import unseen_slots
from preprocessing.config import SPLITS
from preprocessing.memory import TARGET_KINDS
from preprocessing.sequences import UNSEEN

LIST_COLUMNS = ("locations", "time_slots", "weekdays", "recency", "durations")
SHIFTED = ("time_slots", "weekdays", "recency", "durations")  # stored +1 so that 0 means padding
PLACE_COLUMNS = ("places", "target_place")  # dataset-wide place ids (the DBSCAN location of each visit)
# a split's memory columns (preprocessing.memory) and the history column each becomes as a visit in front of it
MEMORY_AS_VISITS = {"memory_locations": "locations", "memory_places": "places", "memory_time_slots": "time_slots",
                    "memory_weekdays": "weekdays", "memory_days": "recency", "memory_visits": "durations",
                    "memory_after_current": "durations"}


@dataclass(frozen=True)
class MemoryLayout:
    """How a model reads the memory: the first `places` entries of each sample's, as visits in front of its history,
    whose recency is the age bucket after the window's `recency` values and whose duration is the visit-count bucket
    after the window's `durations` buckets, the buckets a second time for a place that came right after the current
    place before (pgt.config.MEMORY_AGE_EDGES_DAYS, MEMORY_VISIT_EDGES)."""

    places: int  # entries read per sample (ModelConfig.memory_size)
    recency: int  # the window's recency values (ModelConfig.recency_days)
    durations: int  # the window's duration buckets (ModelConfig.duration_buckets)

    @classmethod
    def of(cls, cfg: ModelConfig) -> MemoryLayout | None:
        """The layout of a model that reads a memory; None for one that does not."""
        return cls(cfg.memory_size, cfg.recency_days, cfg.duration_buckets) if cfg.memory_size else None

    @classmethod
    def for_data(cls, memory_size: int, vocab: Vocab) -> MemoryLayout | None:
        """The layout of a model reading memory_size places, built for data of the manifest's `vocab`."""
        return cls(memory_size, vocab.recency, vocab.durations) if memory_size else None

    def ages(self, days: np.ndarray | torch.Tensor):
        """Days since a remembered place's last visit -> the recency values of its visit (stored + 1 as every feature)."""
        edges = MEMORY_AGE_EDGES_DAYS
        if isinstance(days, torch.Tensor):
            bucket = torch.bucketize(days, torch.tensor(edges, device=days.device), right=True) - 1
            return self.recency + 1 + bucket.clamp_min(0)
        return self.recency + 1 + np.maximum(np.searchsorted(edges, days, side="right") - 1, 0)

    def visits(self, counts: np.ndarray, after_current: np.ndarray) -> np.ndarray:
        """Visit counts, and visits that came right after the current place -> the duration values of the remembered
        place's visit (stored + 1)."""
        bucket = np.maximum(np.searchsorted(MEMORY_VISIT_EDGES, counts, side="right") - 1, 0)
        return self.durations + 1 + bucket + len(MEMORY_VISIT_EDGES) * (after_current > 0)


# the auxiliary tasks' labels a split may hold beside its targets -> (the dataset's tensor of them, what each is)
TARGET_LABELS = {"target_time_slot": ("target_times", "start slot"),
                 "target_duration_min": ("target_minutes", "duration")}


class Batch(NamedTuple):
    locations: torch.Tensor  # (B, T) location ids, 0 = padding, 1 = unseen in train, right-padded
    users: torch.Tensor  # (B,)
    times: torch.Tensor  # (B, T) time slot + 1
    weekdays: torch.Tensor  # (B, T) weekday + 1
    recency: torch.Tensor  # (B, T) days before the target + 1
    durations: torch.Tensor  # (B, T) duration bucket + 1
    targets: torch.Tensor  # (B,) the protocol's target: a known id, or 1 for any place unseen in train
    slots: torch.Tensor  # (B, T) extended vocabulary: k >= 1 for the row's k-th distinct unseen place, else 0
    target_slots: torch.Tensor  # (B,) the target's slot when its place is one of the history's slots, else 0
    # (B,) the time slot the target visit starts in (0-based, the split's target_time_slot), -1 where unknown:
    # arrival_head's label, never an input
    target_times: torch.Tensor | None = None
    # (B,) how many minutes the target visit lasts (the split's target_duration_min), -1 where unknown: stay_head's
    # label, never an input
    target_minutes: torch.Tensor | None = None

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """The model's positional arguments."""
        return self.locations, self.users, self.times, self.weekdays, self.recency, self.durations, self.slots

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(*(t if t is None else t.to(device, non_blocking=non_blocking) for t in self))

    def packed(self) -> torch.Tensor:
        """The inputs as one (B, 7, T) int64 tensor (the user repeated along T): the interface of
        `pgt.network.packed.PackedModel`, which MLflow logs and serves."""
        users = self.users.unsqueeze(1).expand_as(self.locations)
        return torch.stack([self.locations, users, self.times, self.weekdays, self.recency, self.durations, self.slots],
                           dim=1)

    def extended_targets(self, num_locations: int) -> torch.Tensor:
        """(B,) targets over the extended vocabulary of V = num_locations known ids plus the row's slots: a known
        id stays, a revisited unseen place becomes its slot's column V + slot - 1, a new place is 1 ("new place")."""
        return torch.where(self.target_slots > 0, num_locations + self.target_slots - 1, self.targets)

    def strict_targets(self, num_locations: int) -> torch.Tensor:
        """(B,) the column of the target's exact place, or -1 for a new place, which no column names."""
        extended = self.extended_targets(num_locations)
        return torch.where(extended == UNSEEN, -1, extended)


@dataclass
class Vocab:
    """Table sizes from the manifest's `vocab`. Manifests written before the feature sizes were recorded
    get the reference protocol's sizes (which the model's tables then had)."""

    locations: int  # location table size (0 padding, 1 unseen)
    users: int  # user table size (0 padding)
    time_slots: int = 96  # time-of-day slot values 0 .. time_slots - 1
    weekdays: int = 7  # weekday values 0 (Monday) .. 6
    recency: int = 8  # recency values 0 (the target's day) .. history_days
    durations: int = 99  # duration bucket values 0 .. durations - 1

    FEATURES = {"time_slots": "time_slots", "weekdays": "weekdays", "recency": "recency", "durations": "durations"}

    @classmethod
    def from_manifest(cls, data_dir: Path | str) -> Vocab:
        path = Path(data_dir) / "manifest.json"
        if not path.is_file():
            raise InputError(path, "no manifest.json; expected a `pgt preprocess` output folder")
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(path, f"corrupt manifest, not JSON ({str(exc).splitlines()[0]})") from None
        vocab = manifest.get("vocab") if isinstance(manifest, dict) else None
        if not isinstance(vocab, dict):
            raise InputError(path, "no `vocab` mapping; expected the manifest of a `pgt preprocess` output folder")
        sizes = {}
        for name in ("locations", "users", *cls.FEATURES):
            value = vocab.get(name, getattr(cls, name, None))
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(path, f"vocab.{name} must be a positive integer, got {value!r}")
            sizes[name] = value
        return cls(**sizes)

    def check_features(self, dataset: SequenceDataset, path: Path | str) -> None:
        """InputError naming the file and column when a stored feature lies outside its table."""
        visits = ~dataset.is_memory()  # a remembered place's recency and duration are its age and visit buckets
        for name, column in self.FEATURES.items():
            values = getattr(dataset, {"time_slots": "times"}.get(column, column))
            values = values[visits] if column in ("recency", "durations") else values
            top = int(values.max()) if values.numel() else 0  # stored + 1
            if top > getattr(self, name):
                raise InputError(path, f"column {column} holds {top - 1}, but the manifest's vocab.{name} allows "
                                       f"0..{getattr(self, name) - 1}; preprocess the input again")
        for name, values in (("locations", dataset.locations), ("users", dataset.users)):
            top = int(values.max()) if values.numel() else 0
            if top >= getattr(self, name):
                raise InputError(path, f"column {name[:-1] if name == 'users' else name} holds id {top}, outside the "
                                       f"manifest's vocab.{name} of {getattr(self, name)} rows; preprocess the input again")


class SequenceDataset(Dataset):
    """One split as padded int64 tensors. `dataset[i]` is a one-sample Batch; `__getitems__` (which
    DataLoader uses when given a batch of indices) gathers a whole batch trimmed to its longest history."""

    def __init__(self, locations: np.ndarray, users: np.ndarray, features: dict[str, np.ndarray], targets: np.ndarray,
                 places: np.ndarray, target_places: np.ndarray, memory_days: np.ndarray | None = None,
                 memory: MemoryLayout | None = None):
        self.locations = torch.from_numpy(locations)
        self.users = torch.from_numpy(users)
        self.times = torch.from_numpy(features["time_slots"])
        self.weekdays = torch.from_numpy(features["weekdays"])
        self.recency = torch.from_numpy(features["recency"])
        self.durations = torch.from_numpy(features["durations"])
        self.targets = torch.from_numpy(targets)
        self.places = torch.from_numpy(places)  # (N, T) dataset-wide place of each visit (0 on padding)
        self.target_places = torch.from_numpy(target_places)  # (N,)
        self.lengths = (self.locations != 0).sum(dim=1)
        self.memory = memory  # how remembered places sit in front of each history; None: they do not
        self.target_kinds: np.ndarray | None = None  # (N,) int8 codes of metrics.TARGET_KINDS, where the split has them
        self.target_times = torch.full_like(self.targets, -1)  # (N,) target_time_slot where the split has it, else -1
        self.target_minutes = torch.full_like(self.targets, -1)  # (N,) target_duration_min where it has it, else -1
        # (N, T) days since each remembered place's last visit, 0 on the history's visits and padding
        self.memory_days = torch.from_numpy(memory_days) if memory_days is not None else torch.zeros_like(self.locations)
        self.slots, self.target_slots = torch.zeros_like(self.locations), torch.zeros_like(self.targets)
        for start in range(0, len(self.targets), 4096):  # (chunk, T, T) at a time
            part = slice(start, start + 4096)
            self.slots[part], self.target_slots[part] = unseen_slots(self.locations[part], self.places[part],
                                                                     self.targets[part], self.target_places[part])

    def anchored_at_last_visit(self) -> SequenceDataset:
        """The same samples with recency counted from the day of each history's last visit instead of the
        target's day: the inputs a live prediction has, when the day of the next visit is not known yet (the
        last visit is on day 0, and the target's weekday the model infers becomes the last visit's)."""
        anchored = copy.copy(self)
        last = (self.lengths - 1).clamp(min=0).unsqueeze(1)  # (N, 1)
        shift = self.recency.gather(1, last) - 1  # (N, 1) the last visit's days before the target (stored + 1)
        anchored.recency = torch.where(self.locations != 0, self.recency - shift, 0)  # (N, T), padding stays 0
        if self.memory is not None:  # a remembered place's age counts from the same day
            remembered = self.is_memory()
            anchored.memory_days = torch.where(remembered, self.memory_days - shift, 0)
            anchored.recency = torch.where(remembered, self.memory.ages(anchored.memory_days), anchored.recency)
        return anchored

    def is_memory(self) -> torch.Tensor:
        """(N, T) True where a column holds a remembered place rather than a visit of the history or padding."""
        if self.memory is None:
            return torch.zeros_like(self.locations, dtype=torch.bool)
        return self.recency > self.memory.recency

    @classmethod
    def from_parquet(cls, path: Path | str, max_len: int = ModelConfig.max_len, require_target: bool = True,
                     memory: MemoryLayout | None = None) -> SequenceDataset:
        """Read a split; histories longer than max_len keep their most recent max_len visits. Without
        `require_target` a file may lack the target columns (new sequences to score): targets are then 0. With
        `memory`, each sample's first memory.places remembered places come in front of its history."""
        path = Path(path)
        present = cls.check_columns(path, require_target)
        with_target = "target" in present
        places, target_place = PLACE_COLUMNS
        try:
            targets = ["target", target_place] if with_target else []
            # those present: memory_values names the missing ones
            remembered = [c for c in MEMORY_AS_VISITS if c in present] if memory is not None else []
            kinds = [c for c in ("target_kind", *TARGET_LABELS) if with_target and c in present]
            table = pq.read_table(path, columns=["user", *LIST_COLUMNS, places, *remembered, *targets, *kinds])
        except (pa.ArrowException, OSError) as exc:
            raise InputError(path, f"unreadable Parquet ({str(exc).strip().splitlines()[0]})") from None
        return cls.from_arrow(table, max_len, path, memory)

    @classmethod
    def from_arrow(cls, table: pa.Table, max_len: int = ModelConfig.max_len, path: Path | str = "sequences",
                   memory: MemoryLayout | None = None) -> SequenceDataset:
        """Samples from an Arrow table in the columns of a split (targets 0 where it has none); with `memory`, the
        remembered places in front of each history (MemoryLayout)."""
        with_target = "target" in table.column_names
        offsets = table.column("locations").combine_chunks().offsets.to_numpy()
        lengths = np.diff(offsets)
        if len(lengths) and lengths.min() < 1:
            raise InputError(path, "a sample has an empty history")
        combined = {}  # each column in one chunk, checked
        for name in (*LIST_COLUMNS, "places", "user", *(("target", "target_place") if with_target else ())):
            column = combined[name] = table.column(name).combine_chunks()
            listed = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
            if column.null_count or (listed and column.values.null_count):
                raise InputError(path, f"column {name} holds null values; every visit needs every feature")
            if listed and not np.array_equal(column.offsets.to_numpy(), offsets):
                raise InputError(path, f"column {name} does not have one value per visit of column locations")
            values = (column.values if listed else column).to_numpy(zero_copy_only=False)
            lowest = 1 if name == "locations" else 0
            if len(values) and values.min() < lowest:
                raise InputError(path, f"column {name} holds {int(values.min())}; its ids start at {lowest}"
                                 + (" (0 pads histories)" if lowest else ""))
        n = len(lengths)
        kept = np.minimum(lengths, max_len)
        front, remembered = np.zeros(n, np.int64), {}
        if memory is not None:
            remembered, front = cls.memory_values(table, memory, path)
        width = max(int((front + kept).max()) if n else 1, 1)
        # flat index of every kept value and its (row, column) in the right-padded matrix, after the memory's
        row = np.repeat(np.arange(n), kept)
        col = np.arange(kept.sum()) - np.repeat(np.cumsum(kept) - kept, kept)
        flat = np.repeat(offsets[:-1] + lengths - kept, kept) + col
        col = col + np.repeat(front, kept)
        padded = {}
        for name in (*LIST_COLUMNS, "places"):
            values = combined[name].values.to_numpy().astype(np.int64)
            matrix = np.zeros((n, width), dtype=np.int64)
            matrix[row, col] = values[flat] + (1 if name in SHIFTED else 0)
            padded[name] = matrix
        memory_days = np.zeros((n, width), dtype=np.int64)
        if memory is not None:  # the remembered places fill columns 0 .. front - 1
            m_row = np.repeat(np.arange(n), front)
            m_col = np.arange(front.sum()) - np.repeat(np.cumsum(front) - front, front)
            for name, values in remembered.items():
                (memory_days if name == "days" else padded[name])[m_row, m_col] = values
        users = combined["user"].to_numpy().astype(np.int64)

        def column(name: str) -> np.ndarray:
            return combined[name].to_numpy().astype(np.int64) if with_target else np.zeros(n, np.int64)

        dataset = cls(padded.pop("locations"), users, padded, column("target"), padded.pop("places"),
                      column("target_place"), memory_days if memory is not None else None, memory)
        if with_target and "target_kind" in table.column_names:
            dataset.target_kinds = target_kind_codes(table.column("target_kind").combine_chunks(), path)
        for column, (attribute, what) in TARGET_LABELS.items():
            if not (with_target and column in table.column_names):
                continue
            values = table.column(column).combine_chunks()
            if not pa.types.is_integer(values.type):
                raise InputError(path, f"column {column} has type {values.type}, expected integers")
            if values.null_count:
                raise InputError(path, f"column {column} holds null values; every target needs its {what}")
            setattr(dataset, attribute, torch.from_numpy(values.to_numpy().astype(np.int64)))
        return dataset

    @staticmethod
    def memory_values(table: pa.Table, memory: MemoryLayout,
                      path: Path | str) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """({history column or "days": the values of the first memory.places remembered places of each row, flat},
        (n,) how many each row has), from a table's memory columns (MEMORY_AS_VISITS)."""
        missing = [c for c in MEMORY_AS_VISITS if c not in table.column_names]
        if missing:
            raise InputError(path, f"no memory column(s) {', '.join(missing)}, which a model with memory_size reads; "
                                   "preprocess the input again (older `pgt preprocess` outputs lack them)")
        first = table.column("memory_locations").combine_chunks()
        offsets = first.offsets.to_numpy()
        lengths = np.diff(offsets)
        front = np.minimum(lengths, memory.places)
        flat = np.repeat(offsets[:-1], front) + np.arange(front.sum()) - np.repeat(np.cumsum(front) - front, front)
        values = {}
        for name, visit_column in MEMORY_AS_VISITS.items():
            column = table.column(name).combine_chunks()
            if column.null_count or column.values.null_count:
                raise InputError(path, f"column {name} holds null values; every remembered place needs every feature")
            if not np.array_equal(column.offsets.to_numpy(), offsets):
                raise InputError(path, f"column {name} does not have one value per place of column memory_locations")
            raw = column.values.to_numpy().astype(np.int64)[flat]
            lowest = 1 if name in ("memory_locations", "memory_visits") else 0
            if len(raw) and raw.min() < lowest:
                raise InputError(path, f"column {name} holds {int(raw.min())}; its values start at {lowest}")
            if name == "memory_days":
                values["days"] = raw
                values["recency"] = memory.ages(raw)
            elif name in ("memory_visits", "memory_after_current"):
                values[name] = raw
            else:
                values[visit_column] = raw + (1 if visit_column in SHIFTED else 0)
        values["durations"] = memory.visits(values.pop("memory_visits"), values.pop("memory_after_current"))
        return values, front

    @staticmethod
    def check_columns(path: Path | str, require_target: bool = True) -> set[str]:
        """The file's column names, after checking it has those of a split (InputError otherwise)."""
        path = Path(path)
        if not path.is_file():
            raise InputError(path, "no such file; run `pgt preprocess` first")
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(path, f"unreadable Parquet ({str(exc).strip().splitlines()[0]})") from None
        return SequenceDataset.check_schema(schema, path, require_target)

    @staticmethod
    def check_schema(schema: pa.Schema, path: Path | str, require_target: bool = True) -> set[str]:
        """The column names of a split's schema, after checking it has a split's columns and types (InputError)."""
        present = set(schema.names)
        needed = ["user", *LIST_COLUMNS] + (["target"] if require_target else [])
        missing = [c for c in needed if c not in present]
        if missing:
            raise InputError(path, f"missing column(s) {', '.join(missing)}; expected the columns of a "
                                   f"`pgt preprocess` split: {', '.join(needed)}")
        places = PLACE_COLUMNS if "target" in present else PLACE_COLUMNS[:1]
        if any(c not in present for c in places):
            raise InputError(path, f"no column {' or '.join(c for c in places if c not in present)} (the place of "
                                   "each visit), which older `pgt preprocess` outputs lack; preprocess the input again")
        for name in [*needed, *places]:
            column_type = schema.field(name).type
            is_list = pa.types.is_list(column_type) or pa.types.is_large_list(column_type)
            wants_list = name in (*LIST_COLUMNS, PLACE_COLUMNS[0])
            value_type = column_type.value_type if is_list else column_type
            if not (pa.types.is_integer(value_type) or pa.types.is_null(value_type)) or is_list != wants_list:
                raise InputError(path, f"column {name} has type {column_type}, expected "
                                       f"{'lists of integers' if wants_list else 'integers'}")
        return present

    def concatenated(self, other: SequenceDataset) -> SequenceDataset:
        """This split's samples, then `other`'s (train + validation, for refit), padded to the wider of the two."""
        joined = copy.copy(self)
        for name, mine in vars(self).items():
            if isinstance(mine, torch.Tensor):
                theirs = getattr(other, name)
                if mine.dim() == 2:  # (N, T) histories: right-padded with 0 to a common width
                    width = max(mine.shape[1], theirs.shape[1])
                    mine, theirs = (F.pad(t, (0, width - t.shape[1])) for t in (mine, theirs))
                setattr(joined, name, torch.cat([mine, theirs]))
        if self.target_kinds is not None and other.target_kinds is not None:
            joined.target_kinds = np.concatenate([self.target_kinds, other.target_kinds])
        else:
            joined.target_kinds = None
        return joined

    def subset(self, indices: np.ndarray) -> SequenceDataset:
        """The samples at `indices`, in that order (an index may repeat)."""
        picked = copy.copy(self)
        idx = torch.as_tensor(indices, dtype=torch.long)
        for name, mine in vars(self).items():
            if isinstance(mine, torch.Tensor):
                setattr(picked, name, mine[idx])
        picked.target_kinds = self.target_kinds[indices] if self.target_kinds is not None else None
        return picked

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> Batch:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> Batch:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.gather(idx, int(self.lengths[idx].max()))

    def gather(self, idx: torch.Tensor, width: int) -> Batch:
        """The samples `idx` (on this dataset's device) as a Batch `width` visits wide: no transfer, no sync."""
        return Batch(self.locations[idx, :width], self.users[idx], self.times[idx, :width],
                     self.weekdays[idx, :width], self.recency[idx, :width], self.durations[idx, :width],
                     self.targets[idx], self.slots[idx, :width], self.target_slots[idx], self.target_times[idx],
                     self.target_minutes[idx])

    def to(self, device: torch.device | str) -> SequenceDataset:
        """A copy whose tensors live on `device`."""
        moved = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(moved, name, value.to(device))
        return moved

    def in_history(self) -> np.ndarray:
        """Whether each sample's target id appears among its history's ids (the protocol's view: any unseen
        target is "in the history" when any unseen place is); remembered places are not the history."""
        return ((self.locations == self.targets.unsqueeze(1)) & ~self.is_memory()).any(dim=1).numpy()

    def place_in_history(self) -> np.ndarray:
        """Whether each sample's exact target place is one of its history's visits (remembered places are not)."""
        visits = (self.locations != 0) & ~self.is_memory()
        return ((self.places == self.target_places.unsqueeze(1)) & visits).any(dim=1).numpy()

    def new_place(self) -> np.ndarray:
        """Whether each sample's target is a new place: unseen in train and absent from the history."""
        return ((self.targets == UNSEEN) & (self.target_slots == 0)).numpy()


def target_kind_codes(column: pa.Array, path: Path | str) -> np.ndarray:
    """A split's target_kind column (preprocessing.memory.TARGET_KINDS) as int8 codes in that order."""
    names = column.cast(pa.string()).to_pylist()
    lookup = {kind: code for code, kind in enumerate(TARGET_KINDS)}
    odd = sorted({str(n) for n in names if n not in lookup})
    if odd:
        raise InputError(path, f"column target_kind holds {', '.join(odd[:3])}; expected {', '.join(TARGET_KINDS)}")
    return np.array([lookup[n] for n in names], dtype=np.int8)


def load_splits(data_dir: Path | str, max_len: int = ModelConfig.max_len, vocab: Vocab | None = None,
                names: tuple[str, ...] = SPLITS, memory: MemoryLayout | None = None) -> dict[str, SequenceDataset]:
    """The splits `names` (all three by default); with `vocab`, each is checked against the manifest's table sizes;
    with `memory`, the remembered places come in front of each history (MemoryLayout)."""
    splits = {split: SequenceDataset.from_parquet(Path(data_dir) / f"{split}.parquet", max_len, memory=memory)
              for split in names}
    if vocab is not None:
        for split, dataset in splits.items():
            vocab.check_features(dataset, Path(data_dir) / f"{split}.parquet")
    return splits

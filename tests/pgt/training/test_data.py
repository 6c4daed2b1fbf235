from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from infra.errors import InputError
from pgt.data.dataset import SequenceDataset, Vocab
from pgt.network.vocabulary import unseen_slots
from pgt.training.batches import BucketBatchSampler, keep_batch
from pgt.training.unseen import FirstVisits, UnseenSimulation
from preprocessing.sequences import find_samples, sample_table


def write_split(path, histories, places=None):
    """A split of (user, locations, target) rows. `places` gives each row's (history places, target place);
    by default a visit's place is its location id."""
    rows = []
    for i, (user, locs, target) in enumerate(histories):
        n = len(locs)
        visit_places, target_place = places[i] if places else (locs, target)
        rows.append({"user": user, "locations": locs, "time_slots": list(range(n)), "weekdays": [6] * n,
                     "recency": list(range(n, 0, -1)), "durations": [95] * n, "places": visit_places, "target": target,
                     "target_place": target_place})
    pl.DataFrame(rows, schema={"user": pl.Int32, "locations": pl.List(pl.Int32), "time_slots": pl.List(pl.Int16),
                               "weekdays": pl.List(pl.Int8), "recency": pl.List(pl.Int8),
                               "durations": pl.List(pl.Int16), "places": pl.List(pl.Int64), "target": pl.Int32,
                               "target_place": pl.Int64}).write_parquet(path)


def test_padded_tensors_shifted_features_and_truncation(tmp_path):
    path = tmp_path / "test.parquet"
    write_split(path, [(1, [5, 6, 7], 5), (2, [8, 9, 10, 11, 12], 9), (1, [4], 4)])
    ds = SequenceDataset.from_parquet(path, max_len=4)
    assert ds.locations.tolist() == [[5, 6, 7, 0], [9, 10, 11, 12], [4, 0, 0, 0]]  # the most recent 4 kept
    assert ds.times.tolist()[0] == [1, 2, 3, 0]  # slot + 1, 0 = padding
    assert ds.times.tolist()[1] == [2, 3, 4, 5]  # slots 1..4 of the truncated history
    assert ds.weekdays.tolist()[2] == [7, 0, 0, 0] and ds.durations.tolist()[2] == [96, 0, 0, 0]
    assert ds.recency.tolist()[0] == [4, 3, 2, 0]
    assert ds.users.tolist() == [1, 2, 1] and ds.targets.tolist() == [5, 9, 4]
    assert ds.lengths.tolist() == [3, 4, 1]
    assert ds.in_history().tolist() == [True, True, True]
    batch = ds.__getitems__([0, 2])
    assert batch.locations.shape == (2, 3)  # trimmed to the longest history in the batch
    assert ds[2].locations.tolist() == [[4]]


def test_anchored_at_the_last_visit_counts_recency_from_its_day(tmp_path):
    """Deployment inputs: the last visit is day 0 (stored 1), the others keep their distance to it, padding stays
    0; nothing else changes, and the protocol's dataset is left as it was."""
    path = tmp_path / "test.parquet"
    write_split(path, [(1, [5, 6, 7], 5), (2, [8, 9, 10, 11, 12], 9), (1, [4], 4)])  # recency n .. 1 days
    ds = SequenceDataset.from_parquet(path, max_len=4)
    live = ds.anchored_at_last_visit()
    assert ds.recency.tolist() == [[4, 3, 2, 0], [5, 4, 3, 2], [2, 0, 0, 0]]  # stored + 1: days before the target
    assert live.recency.tolist() == [[3, 2, 1, 0], [4, 3, 2, 1], [1, 0, 0, 0]]  # days before the last visit, + 1
    assert live.locations is ds.locations and live.weekdays is ds.weekdays and live.targets is ds.targets
    assert live.__getitems__([0, 1]).recency.tolist() == [[3, 2, 1, 0], [4, 3, 2, 1]]


def test_reanchoring_a_split_gives_the_samples_built_at_the_last_visit():
    """The two ways to the deployment inputs agree: a protocol split re-anchored as tensors
    (anchored_at_last_visit, what training and the deployment block use) equals the same samples built anchored
    at the last visit (sample_table, what `pgt predict`'s evaluation rows use), on irregular days and gaps."""
    rng = np.random.default_rng(3)
    days = np.sort(rng.choice(60, 45, replace=True))
    start = [datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(days=int(d), hours=int(h))
             for d, h in zip(days, rng.integers(0, 20, len(days)))]
    kept = find_samples(pl.DataFrame({
        "user_id": [7] * len(days), "user": pl.Series([1] * len(days), dtype=pl.Int32), "split": ["test"] * len(days),
        "started_at": start, "start_day": pl.Series(days, dtype=pl.Int32),
        "location": pl.Series(rng.integers(1, 9, len(days)), dtype=pl.Int32), "location_id": rng.integers(0, 9, len(days)),
        "time_slot": pl.Series(rng.integers(0, 96, len(days)), dtype=pl.Int16),
        "weekday": pl.Series(rng.integers(0, 7, len(days)), dtype=pl.Int8),
        "duration_bucket": pl.Series(rng.integers(0, 96, len(days)), dtype=pl.Int16),
        "duration_min": pl.Series(rng.integers(0, 3000, len(days)), dtype=pl.Int32)}).sort("started_at"), 7, 3)
    protocol = SequenceDataset.from_arrow(sample_table(kept, "test").to_arrow())
    live = SequenceDataset.from_arrow(sample_table(kept, "test", anchor="last_visit").to_arrow())
    assert len(live) > 20 and not torch.equal(protocol.recency, live.recency)
    assert torch.equal(protocol.anchored_at_last_visit().recency, live.recency)


def test_bucketed_distributed_batches_cover_every_sample_once(tmp_path):
    path = tmp_path / "train.parquet"
    rng = np.random.default_rng(0)
    write_split(path, [(1, rng.integers(2, 50, rng.integers(1, 30)).tolist(), 3) for _ in range(1000)])
    ds = SequenceDataset.from_parquet(path)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=1)
        batches = BucketBatchSampler(sampler, ds.lengths, batch_size=32, bucket_batches=8, seed=1)
        batches.set_epoch(3)
        loader = DataLoader(ds, batch_sampler=batches, collate_fn=keep_batch)
        got = [b for b in batches]
        assert len(got) == len(batches) == len(loader)
        seen += [i for b in got for i in b]
        widths = [int(ds.lengths[b].max() - ds.lengths[b].min()) for b in got]
        assert np.mean(widths) < 6  # similar lengths together (random batches would spread ~25)
    assert sorted(seen) == list(range(1000))


def test_vocab_from_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"vocab": {"locations": 12, "users": 4}}))
    assert Vocab.from_manifest(tmp_path) == Vocab(12, 4)
    with pytest.raises(InputError, match="manifest.json"):
        Vocab.from_manifest(tmp_path / "nope")


def write_first_visit_fixture(root):
    """User 1's train staypoints: location 2 on day 0, 3 on day 1, 4 on day 5 and again on day 6,
    5 on day 9. Two train samples: history 2, 3, 4, 4 with target 5 (day 9), and 2, 3 with target 4 (day 5)."""
    root.mkdir()
    days = [(0, 2), (1, 3), (5, 4), (6, 4), (9, 5)]
    start = datetime(2008, 1, 1, 8, tzinfo=timezone.utc)
    pl.DataFrame({"user": [1] * 5, "location": [loc for _, loc in days],
                  "started_at": [start + timedelta(days=d) for d, _ in days], "start_day": [d for d, _ in days],
                  "split": ["train"] * 5},
                 schema={"user": pl.Int32, "location": pl.Int32, "started_at": pl.Datetime("ms", "UTC"),
                         "start_day": pl.Int32, "split": pl.String}).write_parquet(root / "staypoints.parquet")
    write_split(root / "train.parquet", [(1, [2, 3, 4, 4], 5), (1, [2, 3], 4)])
    started = pl.Series([start + timedelta(days=9), start + timedelta(days=5)], dtype=pl.Datetime("ms", "UTC"))
    pl.read_parquet(root / "train.parquet").with_columns(target_started_at=started).write_parquet(root / "train.parquet")
    return root


@pytest.mark.parametrize("known, history, target", [
    (1.0, [2, 3, 4, 4], 5),  # cutoff day 10: everything known
    (0.5, [2, 3, 4, 4], 1),  # cutoff 0.5 * 9 + 1 = 5.5: only location 5 (first seen on day 9) is new
    (0.3, [2, 3, 1, 1], 1),  # cutoff 3.7: location 4 (day 5) is new too, at both of its visits
    (0.0, [2, 1, 1, 1], 1),  # cutoff 1: only day 0's location stays known
])
def test_unseen_simulation_turns_later_first_visits_into_id_1(tmp_path, known, history, target):
    root = write_first_visit_fixture(tmp_path / "data")
    visits = FirstVisits.from_data_dir(root, Vocab(locations=6, users=2))
    assert visits.sample_day.tolist() == [9.0, 5.0]
    assert visits.first_day[1, 2:].tolist() == [0.0, 1.0, 5.0, 9.0] and visits.first_day[0, 2] == float("inf")
    ds = SequenceDataset.from_parquet(root / "train.parquet")
    batch = UnseenSimulation(ds, visits, known, known)[0]
    assert batch.locations.tolist() == [history] and batch.targets.tolist() == [target]
    assert batch.times.tolist() == ds[0].times.tolist()  # only locations change


def test_unseen_simulation_draws_per_sample_and_keeps_padding(tmp_path):
    root = write_first_visit_fixture(tmp_path / "data")
    ds = SequenceDataset.from_parquet(root / "train.parquet")
    sim = UnseenSimulation(ds, FirstVisits.from_data_dir(root, Vocab(locations=6, users=2)), 0.0, 1.0)
    torch.manual_seed(0)
    targets = np.array([sim[0].targets.item() for _ in range(1000)])
    assert 0.84 < np.mean(targets == 1) < 0.94  # day 9 >= 9 f + 1 when f <= 8/9
    batch = sim.__getitems__([0, 1])
    assert batch.locations.shape == (2, 4) and (batch.locations[0] > 0).all()
    assert batch.locations[1, 2:].tolist() == [0, 0] and (batch.locations[1, :2] > 0).all()  # padding stays padding


def test_first_visits_of_train_and_validation_cover_both_splits(tmp_path):
    """Refit's training set: validation adds user 1's location 3 on day 12 (first seen there) and location 5 on
    day 12 (seen in train on day 9), and one sample, whose target (3) is on day 12."""
    root = write_first_visit_fixture(tmp_path / "data")
    start = datetime(2008, 1, 1, 8, tzinfo=timezone.utc)
    staypoints = pl.read_parquet(root / "staypoints.parquet")
    later = [start + timedelta(days=12), start + timedelta(days=12, hours=3)]
    extra = pl.DataFrame({"user": [1, 1], "location": [5, 3], "started_at": later,
                          "start_day": [12, 12], "split": ["validation"] * 2}, schema=staypoints.schema)
    pl.concat([staypoints, extra]).write_parquet(root / "staypoints.parquet")
    write_split(root / "validation.parquet", [(1, [5, 5], 3)])
    pl.read_parquet(root / "validation.parquet").with_columns(
        target_started_at=pl.Series([later[1]], dtype=pl.Datetime("ms", "UTC"))
    ).write_parquet(root / "validation.parquet")
    vocab = Vocab(locations=6, users=2)
    train_only = FirstVisits.from_data_dir(root, vocab)
    both = FirstVisits.from_data_dir(root, vocab, ("train", "validation"))
    assert train_only.sample_day.tolist() == [9.0, 5.0] and both.sample_day.tolist() == [9.0, 5.0, 12.0]
    assert both.first_day[1, 2:].tolist() == [0.0, 1.0, 5.0, 9.0]  # location 3 was first seen on day 1 all the same
    joined = SequenceDataset.from_parquet(root / "train.parquet").concatenated(
        SequenceDataset.from_parquet(root / "validation.parquet"))
    batch = UnseenSimulation(joined, both, 0.5, 0.5)[2]  # cutoff 0.5 * 12 + 1 = 7: location 5 (day 9) is new
    assert batch.locations.tolist() == [[1, 1]] and batch.targets.tolist() == [3]


def test_two_splits_concatenate_padded_to_the_wider(tmp_path):
    write_split(tmp_path / "a.parquet", [(1, [5, 6, 7], 5), (2, [4], 4)])
    write_split(tmp_path / "b.parquet", [(1, [8, 1, 10, 1, 12], 1)], places=[([8, 100, 10, 100, 12], 100)])
    a, b = SequenceDataset.from_parquet(tmp_path / "a.parquet"), SequenceDataset.from_parquet(tmp_path / "b.parquet")
    both = a.concatenated(b)
    assert both.locations.tolist() == [[5, 6, 7, 0, 0], [4, 0, 0, 0, 0], [8, 1, 10, 1, 12]]
    assert both.lengths.tolist() == [3, 1, 5] and both.users.tolist() == [1, 2, 1] and both.targets.tolist() == [5, 4, 1]
    assert both.recency[0].tolist() == [4, 3, 2, 0, 0]  # stored + 1, padding 0
    assert both.slots[2].tolist() == [0, 1, 0, 1, 0] and both.target_slots.tolist() == [0, 0, 1]  # unseen place 100
    assert len(a) == 2 and a.locations.shape == (2, 3)  # the parts are left as they were


def test_first_visits_refuse_targets_without_a_staypoint(tmp_path):
    root = write_first_visit_fixture(tmp_path / "data")
    pl.read_parquet(root / "staypoints.parquet").head(4).write_parquet(root / "staypoints.parquet")
    with pytest.raises(ValueError, match=r"train.parquet: 1 of 2 targets have no staypoint"):
        FirstVisits.from_data_dir(root, Vocab(locations=6, users=2))


def test_unseen_places_get_slots_in_order_of_first_visit(tmp_path):
    """Row 0: known 5, unseen places 100, 200, 100 again; the target is place 100 -> slot 1.
    Row 1: unseen 200, known 7, unseen 300; the target is place 999, in no history -> a new place.
    Row 2: known 5 and 6; the target is known 6."""
    path = tmp_path / "test.parquet"
    write_split(path, [(1, [5, 1, 1, 1], 1), (2, [1, 7, 1], 1), (1, [5, 6], 6)],
                places=[([50, 100, 200, 100], 100), ([200, 70, 300], 999), ([50, 60], 60)])
    ds = SequenceDataset.from_parquet(path)
    assert ds.slots.tolist() == [[0, 1, 2, 1], [1, 0, 2, 0], [0, 0, 0, 0]]  # two visits to place 100 share slot 1
    assert ds.target_slots.tolist() == [1, 0, 0]
    batch = ds.__getitems__([0, 1, 2])
    V = 10  # known ids 2..9; slot k is column V + k - 1
    assert batch.extended_targets(V).tolist() == [10, 1, 6]  # a new place is 1 ("new place") for the loss
    assert batch.strict_targets(V).tolist() == [10, -1, 6]  # and no column for the strict metric
    assert ds.place_in_history().tolist() == [True, False, True]
    assert ds.new_place().tolist() == [False, True, False]
    assert ds.in_history().tolist() == [True, True, True]  # the protocol sees id 1 in both unseen histories


def test_slots_of_the_same_place_differ_between_rows_and_padding_has_none():
    locations = torch.tensor([[1, 1, 0], [1, 4, 1]])
    places = torch.tensor([[7, 8, 7], [8, 40, 8]])  # the padding's place (7) equals a real one: ignored
    slots, target_slots = unseen_slots(locations, places, torch.tensor([1, 4]), torch.tensor([8, 40]))
    assert slots.tolist() == [[1, 2, 0], [1, 0, 1]]
    assert target_slots.tolist() == [2, 0]  # a known target (row 1) never takes a slot


def test_outputs_without_places_are_refused_with_a_hint(tmp_path):
    path = tmp_path / "test.parquet"
    write_split(path, [(1, [5, 6, 7], 5)])
    pl.read_parquet(path).drop("places", "target_place").write_parquet(path)
    with pytest.raises(ValueError, match=r"test.parquet: no column places or target_place .* preprocess the input again"):
        SequenceDataset.from_parquet(path)


@pytest.mark.parametrize(("column", "values", "message"), [
    ("target_duration_min", ["90", "15"], "column target_duration_min has type (string|large_string), expected integers"),
    ("target_duration_min", [90, None], "column target_duration_min holds null values; every target needs its duration"),
    ("target_time_slot", [1.5, 2.0], "column target_time_slot has type double, expected integers"),
])
def test_the_auxiliary_tasks_labels_are_read_as_integers_and_odd_ones_refused(tmp_path, column, values, message):
    """target_time_slot and target_duration_min become the dataset's target_times and target_minutes (-1 where the
    split has no such column); a column of another type, or with nulls, is one line naming the file and the column."""
    path = tmp_path / "test.parquet"
    write_split(path, [(1, [5, 6, 7], 5), (2, [8, 9], 9)])
    ds = SequenceDataset.from_parquet(path)
    assert ds.target_times.tolist() == [-1, -1] and ds.target_minutes.tolist() == [-1, -1]
    labelled = pl.read_parquet(path).with_columns(target_time_slot=pl.Series([40, 95], dtype=pl.Int16),
                                                  target_duration_min=pl.Series([90, 0], dtype=pl.Int32))
    labelled.write_parquet(path)
    ds = SequenceDataset.from_parquet(path)
    assert ds.target_times.tolist() == [40, 95] and ds.target_minutes.tolist() == [90, 0]
    assert ds.__getitems__([1, 0]).target_minutes.tolist() == [0, 90]
    labelled.with_columns(pl.Series(column, values)).write_parquet(path)
    with pytest.raises(InputError, match=rf"test.parquet: {message}"):
        SequenceDataset.from_parquet(path)


def test_simulated_unseen_places_get_slots(tmp_path):
    root = write_first_visit_fixture(tmp_path / "data")
    ds = SequenceDataset.from_parquet(root / "train.parquet")
    visits = FirstVisits.from_data_dir(root, Vocab(locations=6, users=2))
    batch = UnseenSimulation(ds, visits, 0.3, 0.3)[0]  # location 4 (two visits) and the target 5 become unseen
    assert batch.locations.tolist() == [[2, 3, 1, 1]] and batch.slots.tolist() == [[0, 0, 1, 1]]
    assert batch.target_slots.tolist() == [0]  # place 5 is not in the history: a new place
    batch = UnseenSimulation(ds, visits, 0.0, 0.0)[1]  # history 2, 3 -> 2, 1; target 4 (day 5) unseen, not visited
    assert batch.slots.tolist() == [[0, 1]] and batch.extended_targets(6).tolist() == [1]

"""The long-term memory in the model's inputs and its second pointer, on hand-built samples with stated tensors."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
import torch

from pgt.data.dataset import MemoryLayout, SequenceDataset, Vocab
from pgt.network.model import build_model
from pgt.network.pointer import memory_pointer
from pgt.network.stacked import StackedTransformer

LAYOUT = MemoryLayout(places=2, recency=8, durations=96)  # the reference protocol's 8 recency values, 96 buckets


def write_split(path, rows):
    """(locations, recency, memory places, memory visits, memory days[, visits after the current place]) per sample;
    places are the location ids."""
    table = []
    for locations, recency, remembered, visits, days, *after in rows:
        n, m = len(locations), len(remembered)
        table.append({"user": 1, "locations": locations, "time_slots": [3] * n, "weekdays": [0] * n, "recency": recency,
                      "durations": [2] * n, "places": locations, "memory_locations": remembered,
                      "memory_places": remembered, "memory_visits": visits, "memory_days": days,
                      "memory_time_slots": [40] * m, "memory_weekdays": [5] * m,
                      "memory_after_current": after[0] if after else [0] * m, "target": remembered[0] if m else locations[-1],
                      "target_place": remembered[0] if m else locations[-1], "target_kind": "return" if m else "window"})
    pl.DataFrame(table, schema={
        "user": pl.Int32, "locations": pl.List(pl.Int32), "time_slots": pl.List(pl.Int16),
        "weekdays": pl.List(pl.Int8), "recency": pl.List(pl.Int8), "durations": pl.List(pl.Int16),
        "places": pl.List(pl.Int64), "memory_locations": pl.List(pl.Int32), "memory_places": pl.List(pl.Int64),
        "memory_visits": pl.List(pl.Int32), "memory_days": pl.List(pl.Int32), "memory_time_slots": pl.List(pl.Int16),
        "memory_weekdays": pl.List(pl.Int8), "memory_after_current": pl.List(pl.Int32), "target": pl.Int32,
        "target_place": pl.Int64,
        "target_kind": pl.Enum(["window", "return", "new"])}).write_parquet(path)


@pytest.fixture
def split(tmp_path):
    path = tmp_path / "test.parquet"
    write_split(path, [
        ([2, 3, 4], [3, 1, 0], [7, 8, 9], [5, 1, 30], [10, 400, 9], [0, 2, 0]),  # three remembered, two read
        ([5], [0], [], [], []),  # nothing remembered: as without a memory
    ])
    return path


def test_remembered_places_come_in_front_of_the_history_as_visits_with_age_and_visit_buckets(split):
    ds = SequenceDataset.from_parquet(split, max_len=8, memory=LAYOUT)
    assert ds.locations.tolist() == [[7, 8, 2, 3, 4], [5, 0, 0, 0, 0]]
    # recency: the window's days + 1; a remembered place's age bucket after the window's 8 values (+ 1):
    # 10 days is the bucket from 8 (1), 400 days the bucket from 366 (8)
    assert ds.recency.tolist() == [[8 + 1 + 1, 8 + 1 + 8, 4, 2, 1], [1, 0, 0, 0, 0]]
    # durations: the window's bucket + 1; a remembered place's visit bucket after the 96 buckets: 5 visits -> the
    # bucket from 4 (3), 1 visit -> 0, and 8 buckets further for place 8, whose visits twice followed the current place
    assert ds.durations.tolist() == [[96 + 1 + 3, 96 + 1 + 0 + 8, 3, 3, 3], [3, 0, 0, 0, 0]]
    assert ds.times.tolist()[0] == [41, 41, 4, 4, 4] and ds.weekdays.tolist()[0] == [6, 6, 1, 1, 1]
    assert ds.is_memory().tolist()[0] == [True, True, False, False, False]
    assert ds.memory_days.tolist()[0] == [10, 400, 0, 0, 0]
    assert ds.place_in_history().tolist() == [False, True] and ds.target_kinds.tolist() == [1, 0]
    plain = SequenceDataset.from_parquet(split, max_len=8)  # a model without a memory reads the history only
    assert plain.locations.tolist() == [[2, 3, 4], [5, 0, 0]]


def test_a_live_anchor_counts_the_memory_s_ages_from_the_last_visit_s_day(split):
    ds = SequenceDataset.from_parquet(split, max_len=8, memory=LAYOUT).anchored_at_last_visit()
    # the last visit was on the target's day (recency 0): nothing moves
    assert ds.memory_days.tolist()[0] == [10, 400, 0, 0, 0]
    shifted = SequenceDataset.from_parquet(split, max_len=8, memory=LAYOUT)
    shifted.recency[0, 2:] += 3  # the history's visits 3 days earlier: the last visit 3 days before the target
    anchored = shifted.anchored_at_last_visit()
    assert anchored.memory_days.tolist()[0] == [7, 397, 0, 0, 0]
    assert anchored.recency.tolist()[0] == [8 + 1 + 0, 8 + 1 + 8, 4, 2, 1]  # 7 days: the first bucket


def test_the_manifest_s_feature_check_skips_the_memory_s_buckets(split):
    ds = SequenceDataset.from_parquet(split, max_len=8, memory=LAYOUT)
    Vocab(locations=10, users=2).check_features(ds, split)  # recency 17 and duration 100 are buckets, not days


def test_a_model_without_memory_columns_in_its_data_is_told_to_preprocess_again(tmp_path):
    path = tmp_path / "old.parquet"
    pl.DataFrame({"user": [1], "locations": [[2]], "time_slots": [[1]], "weekdays": [[1]], "recency": [[0]],
                  "durations": [[1]], "places": [[2]], "target": [2], "target_place": [2]}).write_parquet(path)
    with pytest.raises(ValueError, match="no memory column.*preprocess the input again"):
        SequenceDataset.from_parquet(path, memory=LAYOUT)


def test_the_two_pointers_and_the_gate():
    logits = torch.log(torch.tensor([[1.0, 1.0, 2.0], [1.0, 5.0, 2.0]]))  # window, memory, generator
    memory = torch.tensor([[True, True, False, False], [False, False, False, False]])
    pad = torch.tensor([[False, False, False, True], [False, False, True, True]])
    scores = torch.zeros(2, 4)
    gate, attention = memory_pointer(logits, scores, pad, memory)
    # row 0: weights 1/4, 1/4, 1/2; each pointer uniform over its columns
    assert gate.tolist()[0] == pytest.approx(0.5)
    assert attention.tolist()[0] == pytest.approx([0.25, 0.25, 0.5, 0.0])
    # row 1 remembers nothing: the memory's logit is masked, window 1/3 and generator 2/3
    assert gate.tolist()[1] == pytest.approx(1 / 3)
    assert attention.tolist()[1] == pytest.approx([0.5, 0.5, 0.0, 0.0])


def test_a_model_that_remembers_can_name_a_remembered_place_and_is_not_stacked(split, tiny_config):
    cfg = dataclasses.replace(tiny_config, memory_size=2)
    ds = SequenceDataset.from_parquet(split, max_len=cfg.max_len, memory=MemoryLayout.of(cfg))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    batch = ds.__getitems__([0, 1])
    out = model(*batch.inputs())
    assert torch.allclose(out.log_probs.exp().sum(dim=1), torch.ones(2), atol=1e-5)
    assert out.attention[0, :2].sum() > 0 and out.attention[1, 1:].sum() == 0  # row 1: no memory, one visit
    # the pointer's mass on a remembered place reaches its id (plus what the generator gives it)
    assert out.log_probs[0, 7].exp() >= out.gate[0] * out.attention[0, 0] * 0.999
    assert not StackedTransformer.stackable(model)
    with pytest.raises(ValueError, match="variant 'pgt'"):
        dataclasses.replace(tiny_config, memory_size=2, variant="lstm-pg")


def test_a_remembered_place_that_followed_the_current_place_before_has_that_relation(split, tiny_config):
    from pgt.network.pointer import visit_relations

    cfg = dataclasses.replace(tiny_config, memory_size=2, visit_relations=True, time_slots=96, duration_buckets=96)
    ds = SequenceDataset.from_parquet(split, max_len=cfg.max_len, memory=MemoryLayout.of(cfg))
    b = ds.__getitems__([0])
    relation, _ = visit_relations(b.locations, b.slots, b.times, b.weekdays, b.recency, b.durations,
                                  (b.locations != 0).sum(1), cfg)
    # place 7: never after the current place (0); place 8: twice (2 = "followed the current place"); the history:
    # 2 and 3 are not the current place 4, nor after it; 4 is it (1)
    assert relation.tolist() == [[0, 2, 0, 0, 1]]


def test_without_its_own_gate_one_pointer_spans_the_history_and_the_memory(split, tiny_config):
    cfg = dataclasses.replace(tiny_config, memory_size=2, memory_gate=False)
    ds = SequenceDataset.from_parquet(split, max_len=cfg.max_len, memory=MemoryLayout.of(cfg))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    assert model.gate[-1].out_features == 1
    out = model(*ds.__getitems__([0, 1]).inputs())
    assert torch.allclose(out.attention.sum(dim=1), torch.ones(2), atol=1e-6)
    assert (out.attention[0, :2] > 0).all()  # the remembered places share the one softmax

from __future__ import annotations

import pytest
import torch

from infra.errors import SettingsError
from pgt.config import TrainConfig
from pgt.data.dataset import SequenceDataset
from pgt.training.augment import VisitDropout
from pgt.training.state import check_streamable
from pgt.training.train import train_loop_per_worker
from tests.pgt.training.test_data import write_split


def dataset(tmp_path):
    """Two rows: user 1's history 5, 1 (place 11), 7, 1 (place 12), 9 with target place 12 (unseen in train, id 1),
    and user 2's 3, 4, 6 with target 4."""
    path = tmp_path / "train.parquet"
    write_split(path, [(1, [5, 1, 7, 1, 9], 1), (2, [3, 4, 6], 4)],
                places=[([5, 11, 7, 12, 9], 12), ([3, 4, 6], 4)])
    return SequenceDataset.from_parquet(path)


def test_rate_zero_leaves_the_batch_as_it_was(tmp_path):
    ds = dataset(tmp_path)
    batch = ds.__getitems__([0, 1])
    same = VisitDropout(ds, 0.0).__getitems__([0, 1])
    for name in batch._fields:
        assert torch.equal(getattr(batch, name), getattr(same, name)), name
    assert batch.slots.tolist() == [[0, 1, 0, 2, 0], [0, 0, 0, 0, 0]] and batch.target_slots.tolist() == [2, 0]


def test_left_out_visits_close_up_and_the_last_visit_stays(tmp_path):
    """Near rate 1 only the last visit is left, at the front, with its own features; padding follows."""
    ds = dataset(tmp_path)
    torch.manual_seed(0)
    batch = VisitDropout(ds, 0.999).__getitems__([0, 1])
    assert batch.locations.tolist() == [[9, 0, 0, 0, 0], [6, 0, 0, 0, 0]]
    assert batch.times.tolist() == [[5, 0, 0, 0, 0], [3, 0, 0, 0, 0]]  # the last visit's slot + 1
    assert batch.recency.tolist() == [[2, 0, 0, 0, 0], [2, 0, 0, 0, 0]]  # still its days before the target + 1
    assert batch.targets.tolist() == [1, 4] and batch.users.tolist() == [1, 2]
    # the unseen target's place is no longer in the history: a new place, with no slot to point at
    assert batch.slots.abs().sum() == 0 and batch.target_slots.tolist() == [0, 0]


def test_kept_visits_keep_their_order_and_slots_are_numbered_again(tmp_path):
    ds = dataset(tmp_path)
    full = ds.__getitems__([0, 1])
    counts = torch.zeros(2)
    torch.manual_seed(1)
    for _ in range(400):
        batch = VisitDropout(ds, 0.3).__getitems__([0, 1])
        lengths = (batch.locations != 0).sum(dim=1)
        for row in range(2):
            kept = batch.times[row, :lengths[row]].tolist()
            assert kept == sorted(kept) and kept[-1] == full.times[row, (full.locations[row] != 0).sum() - 1]
            assert (batch.locations[row, lengths[row]:] == 0).all() and (batch.times[row, lengths[row]:] == 0).all()
        counts += lengths
        # user 1's unseen visits: place 11 (time slot 1 + 1) gets the first slot only when kept, place 12 (slot 3 +
        # 1) the next; the target (place 12) keeps its slot exactly when its visit was kept
        unseen = batch.locations[0] == 1
        assert batch.slots[0, unseen].tolist() == list(range(1, int(unseen.sum()) + 1))
        assert batch.target_slots[0] == (batch.slots[0][batch.times[0] == 4].sum() if (batch.times[0] == 4).any() else 0)
    # each of the earlier visits is kept 70% of the time: 4 earlier visits and the last one, 2 and the last one
    assert counts[0] / 400 == pytest.approx(1 + 4 * 0.7, abs=0.15)
    assert counts[1] / 400 == pytest.approx(1 + 2 * 0.7, abs=0.15)


def test_over_the_unseen_simulation_the_slots_are_numbered_once_over_what_both_leave(tmp_path):
    """Location 7 of user 1, first visited on day 5, is unseen at a cutoff of 0.3 * 10 + 1 = 4: its place gets a slot
    between those of places 11 and 12 (the target's). Visits left out at rate 0 leave the simulation's batch as it
    was; at rate 0.999 only the last visit stays and the target, whose place is no longer visited, has no slot."""
    from pgt.training.unseen import FirstVisits, UnseenSimulation

    ds = dataset(tmp_path)
    first_day = torch.zeros(3, 10)
    first_day[1, 7] = 5.0
    simulated = UnseenSimulation(ds, FirstVisits(first_day, torch.tensor([10.0, 10.0])), 0.3, 0.3)
    torch.manual_seed(0)
    alone = simulated.__getitems__([0, 1])
    assert alone.locations[0].tolist() == [5, 1, 1, 1, 9] and alone.slots[0].tolist() == [0, 1, 2, 3, 0]
    assert alone.target_slots.tolist() == [3, 0]
    torch.manual_seed(0)
    kept = VisitDropout(simulated, 0.0).__getitems__([0, 1])
    for name in alone._fields:
        assert torch.equal(getattr(alone, name), getattr(kept, name)), name
    torch.manual_seed(0)
    dropped = VisitDropout(simulated, 0.999).__getitems__([0, 1])
    assert dropped.locations[0].tolist() == [9, 0, 0, 0, 0] and dropped.targets.tolist() == [1, 4]
    assert dropped.slots.abs().sum() == 0 and dropped.target_slots.tolist() == [0, 0]


def test_visit_dropout_trains_and_is_refused_where_it_cannot_apply(synthetic_sequences, tmp_path):
    base = {"data_dir": str(synthetic_sequences), "epochs": 1, "d_model": 16, "nhead": 2, "unseen_slots": True,
            "simulate_unseen": True, "seed": 3}
    plain = train_loop_per_worker({**base, "out_dir": str(tmp_path / "plain")})
    dropped = train_loop_per_worker({**base, "out_dir": str(tmp_path / "dropped"), "visit_dropout": 0.3})
    assert dropped["history"][0]["samples"] == plain["history"][0]["samples"]  # every sample, shorter histories
    assert dropped["history"][0]["train_loss"] != plain["history"][0]["train_loss"]
    with pytest.raises(SettingsError, match="visit_dropout numbers"):
        check_streamable(TrainConfig.from_dict({"data_dir": ".", "out_dir": ".", "visit_dropout": 0.1}))
    with pytest.raises(SettingsError, match="set memory_size 0"):
        TrainConfig.from_dict({"data_dir": ".", "out_dir": ".", "visit_dropout": 0.1, "memory_size": 8})
    with pytest.raises(SettingsError, match="visit_dropout"):
        TrainConfig.from_dict({"data_dir": ".", "out_dir": ".", "visit_dropout": 1.0})

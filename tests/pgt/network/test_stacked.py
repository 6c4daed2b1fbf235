"""pgt/network/stacked.py: an ensemble's (or one network's) batched pass gives what its members give one by one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pgt.config import ModelConfig
from pgt.data.dataset import SequenceDataset
from pgt.network.model import Ensemble, LSTMPointerGenerator, build_model, networks, set_place_coordinates
from pgt.network.stacked import StackedTransformer, for_inference

SWITCHES = {
    "plain": {},
    "slots, relations of order 2": {"unseen_slots": True, "visit_relations": True, "relation_inputs": True,
                                    "relation_order": 2},
    "previous location, slots without identity": {"previous_location": True, "unseen_slots": True,
                                                  "slot_identity": False, "nhead": 1},
    "previous location and its slot": {"previous_location": True, "unseen_slots": True, "visit_relations": True},
    "place distance, slots": {"place_distance": True, "unseen_slots": True},
    "usual places, slots, relations": {"usual_places": True, "unseen_slots": True, "visit_relations": True},
    "usual places": {"usual_places": True},
    "distance head (training's only), slots": {"distance_head": 0.5, "unseen_slots": True},
    "arrival head (training's only), relations": {"arrival_head": 0.5, "visit_relations": True},
    "arrival and stay heads (training's only)": {"arrival_head": 1.0, "stay_head": 0.5, "visit_relations": True},
}


def perturbed(cfg: ModelConfig, seed: int = 0) -> torch.nn.Module:
    """A model of cfg whose every weight is random, the biases that start at zero included."""
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def samples(synthetic_sequences) -> SequenceDataset:
    return SequenceDataset.from_parquet(synthetic_sequences / "test.parquet", 16)


@pytest.mark.parametrize("switches", SWITCHES.values(), ids=SWITCHES.keys())
@pytest.mark.parametrize("variant", ["pgt", "mhsa", "pointer"])
@pytest.mark.parametrize("members", [1, 3])
def test_the_stacked_pass_gives_what_the_members_give(samples, switches, variant, members):
    if variant == "mhsa" and switches.get("visit_relations"):
        switches = {k: v for k, v in switches.items() if "relation" not in k and k != "usual_places"}  # pointer only
    shape = {"d_model": 16, "nhead": 2, "num_layers": 2, "dim_feedforward": 24, "dropout": 0.3, "max_len": 16}
    cfg = ModelConfig(num_locations=int(samples.locations.max()) + 1, num_users=int(samples.users.max()) + 1,
                      variant=variant, members=members, time_slots=96, weekdays=7, recency_days=8,
                      duration_buckets=96, **(shape | switches))
    model = perturbed(cfg)
    if cfg.place_distance:  # places 0.5 to 50 km apart; ids 0 and 1 have no coordinates
        coords = torch.rand(cfg.num_locations, 2, generator=torch.Generator().manual_seed(1)) * 0.5 + torch.tensor([39.8, 116.2])
        set_place_coordinates(model, coords.index_fill(0, torch.tensor([0, 1]), float("nan")))
    stacked = StackedTransformer.of(model)
    unseen = (samples.locations == 1).any(dim=1)  # histories with places unseen in train, and others
    picked = torch.cat([torch.nonzero(unseen).flatten()[:20], torch.nonzero(~unseen).flatten()[:20]])
    batch = samples.__getitems__(picked.tolist())
    if cfg.unseen_slots:
        assert int(batch.slots.max()) >= 1  # the test split holds places unseen in train
    with torch.no_grad():
        expected, got = model(*batch.inputs()), stacked(*batch.inputs())
    assert torch.allclose(got.log_probs.exp(), expected.log_probs.exp(), atol=1e-5)  # float32 sums in other orders
    assert torch.equal(got.log_probs.argmax(1), expected.log_probs.argmax(1))
    assert torch.allclose(got.gate, expected.gate, atol=1e-6)
    assert torch.allclose(got.attention, expected.attention, atol=1e-6)
    assert (got.members is None) == (members == 1)
    if members > 1:
        assert torch.allclose(got.members.exp(), expected.members.exp(), atol=1e-5)


def test_transformers_are_stacked_and_the_lstm_model_is_not(tiny_config):
    """One network is stacked too (the folded embedding takes fewer ops than its own eval path); an LSTM model or
    ensemble runs as it is, member by member."""
    single = build_model(tiny_config)
    assert isinstance(for_inference(single), StackedTransformer) and not for_inference(single).training
    lone_lstm = build_model(dataclasses.replace(tiny_config, variant="lstm-pg"))
    assert for_inference(lone_lstm) is lone_lstm and not lone_lstm.training
    ensemble = build_model(dataclasses.replace(tiny_config, members=2))
    assert isinstance(for_inference(ensemble), StackedTransformer)
    lstm = build_model(dataclasses.replace(tiny_config, variant="lstm-pg", members=2))
    assert isinstance(lstm, Ensemble) and all(isinstance(n, LSTMPointerGenerator) for n in networks(lstm))
    assert StackedTransformer.of(lstm) is None and for_inference(lstm) is lstm
    with pytest.raises(ValueError, match="PointerGeneratorTransformer members only"):
        StackedTransformer(lstm)


def test_a_moved_stacked_model_passes_with_its_moved_weights(tiny_config):
    """The pass reads its weights from plain dicts: moving or casting the module rebuilds them."""
    stacked = StackedTransformer(build_model(dataclasses.replace(tiny_config, members=2))).double()
    assert stacked.w and all(t.dtype == torch.float64 for t in stacked.w.values())
    assert all(a is b for a, b in zip(stacked.w.values(), stacked.weights.values()))

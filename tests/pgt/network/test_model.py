from __future__ import annotations

import dataclasses

import pytest
import torch

from pgt.config import VARIANTS, ModelConfig
from pgt.network.model import (
    Ensemble,
    FastDropout,
    build_model,
    networks,
    positions_from_end,
    set_place_coordinates,
)
from pgt.network.places import DISTANCE_EDGES_KM, distance_bands, usual_places


@pytest.mark.parametrize("variant", VARIANTS)
def test_probabilities_sum_to_one(tiny_batch, tiny_config, variant):
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(tiny_config, variant=variant)).eval()
    out = model(*tiny_batch.inputs())
    assert out.log_probs.shape == (3, 10)
    assert torch.allclose(out.log_probs.exp().sum(dim=1), torch.ones(3), atol=1e-5)
    assert ((out.gate > 0) & (out.gate < 1)).all() if variant in ("pgt", "lstm-pg") else True


def test_gate_is_fixed_in_one_sided_variants(tiny_batch, tiny_config):
    torch.manual_seed(0)
    mhsa = build_model(dataclasses.replace(tiny_config, variant="mhsa")).eval()
    pointer = build_model(dataclasses.replace(tiny_config, variant="pointer")).eval()
    assert (mhsa(*tiny_batch.inputs()).gate == 0).all()
    out = pointer(*tiny_batch.inputs())
    assert (out.gate == 1).all()
    # pointer only: all mass on history locations, a repeated location accumulates its attention
    probs = out.log_probs.exp()
    a = out.attention
    assert torch.allclose(probs[0, 5], a[0, 0] + a[0, 2], atol=1e-6)
    assert torch.allclose(probs[0, 3], a[0, 1], atol=1e-6) and torch.allclose(probs[0, 7], a[0, 3], atol=1e-6)
    outside = torch.ones(10, dtype=torch.bool)
    outside[[5, 3, 7]] = False
    assert probs[0, outside].max() < 1e-8
    assert torch.allclose(probs[2, 9], torch.tensor(1.0), atol=1e-6)  # a one-visit history


@pytest.mark.parametrize("variant", ["pgt", "lstm-pg"])
def test_padding_gets_no_attention_and_does_not_matter(tiny_batch, tiny_config, variant):
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(tiny_config, variant=variant)).eval()
    out = model(*tiny_batch.inputs())
    assert (out.attention[1, 2:] == 0).all() and (out.attention[2, 1:] == 0).all()
    assert torch.allclose(out.attention.sum(dim=1), torch.ones(3))
    # the same histories with more padding give the same output
    padded = [torch.nn.functional.pad(t, (0, 3)) if t.dim() == 2 else t for t in tiny_batch.inputs()]
    assert torch.allclose(model(*padded).log_probs, out.log_probs, atol=1e-5)


def test_gate_mixes_the_two_distributions(tiny_batch, tiny_config):
    torch.manual_seed(0)
    model = build_model(tiny_config).eval()
    out = model(*tiny_batch.inputs())
    # location 8 is in no history: its probability comes from the generator alone, scaled by 1 - g
    model.cfg.variant = "mhsa"
    gen_only = model(*tiny_batch.inputs()).log_probs.exp()
    assert torch.allclose(out.log_probs.exp()[:, 8], (1 - out.gate) * gen_only[:, 8], atol=1e-6)


def test_positions_from_end():
    lengths, pos = positions_from_end(torch.tensor([[4, 5, 6], [7, 0, 0]]))
    assert lengths.tolist() == [3, 1] and pos.tolist() == [[3, 2, 1], [1, 0, 0]]


def test_config_checks():
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(num_locations=10, num_users=3, d_model=30, nhead=4)
    with pytest.raises(ValueError, match="variant"):
        ModelConfig(num_locations=10, num_users=3, variant="gpt")


def test_fast_dropout_keeps_the_expected_share():
    torch.manual_seed(0)
    d = FastDropout(0.15)
    y = d(torch.ones(200, 1000))
    assert abs((y == 0).float().mean().item() - 0.15) < 0.005
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.85))
    assert torch.equal(d.eval()(torch.ones(3)), torch.ones(3))


def test_a_pointer_at_a_slot_is_a_strict_and_a_protocol_hit(tiny_config):
    """History: known 5, unseen place A, unseen place B, A again (slots 0, 1, 2, 1); the target is place A.
    A pointer-only model whose attention goes to the last visit names slot 1 (column V) first."""
    from pgt.data.dataset import Batch
    from pgt.data.metrics import target_ranks
    from pgt.data.scoring import model_scores

    cfg = dataclasses.replace(tiny_config, variant="pointer", unseen_slots=True, slot_identity=False)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        model.position_bias[1] = 50.0  # position from end 1: the last visit takes the attention
    locations = torch.tensor([[5, 1, 1, 1]])
    batch = Batch(locations=locations, users=torch.tensor([1]), times=torch.ones_like(locations),
                  weekdays=torch.ones_like(locations), recency=torch.ones_like(locations),
                  durations=torch.ones_like(locations), targets=torch.tensor([1]), slots=torch.tensor([[0, 1, 2, 1]]),
                  target_slots=torch.tensor([1]))
    scores = model_scores(model)(batch)
    assert scores.extended.shape == (1, 12) and scores.protocol.shape == (1, 10)  # V + 2 slots; V
    assert torch.allclose(scores.extended.exp().sum(), torch.tensor(1.0), atol=1e-5)

    assert target_ranks(scores.extended, batch.strict_targets(10)).tolist() == [1]  # slot 1 is column 10
    assert target_ranks(scores.protocol, batch.targets).tolist() == [1]  # the slot counts as id 1
    # without slots the same model puts the mass on id 1: a protocol hit, never a strict one
    plain = build_model(dataclasses.replace(cfg, unseen_slots=False)).eval()
    plain.load_state_dict(model.state_dict())
    scores = model_scores(plain)(batch)
    assert scores.extended.shape == (1, 10)
    assert target_ranks(scores.extended, batch.strict_targets(10)).tolist() == [0]
    assert target_ranks(scores.protocol, batch.targets).tolist() == [1]


@pytest.mark.parametrize("variant", VARIANTS)
def test_slots_move_the_unseen_mass_without_changing_the_protocols_probabilities(tiny_config, variant):
    from pgt.network.vocabulary import merge_slots

    torch.manual_seed(0)
    locations = torch.tensor([[5, 1, 1, 1], [1, 2, 0, 0]])
    inputs = (locations, torch.tensor([1, 2]), *(torch.where(locations > 0, 3, 0) for _ in range(4)))
    slots = torch.tensor([[0, 1, 2, 1], [1, 0, 0, 0]])
    # the pointer's routing alone (slot_identity would also change the inputs' embeddings)
    model = build_model(dataclasses.replace(tiny_config, variant=variant, unseen_slots=True, slot_identity=False)).eval()
    with_slots = model(*inputs, slots).log_probs
    model.cfg.unseen_slots = False
    without = model(*inputs, slots).log_probs
    assert with_slots.shape == (2, 12) and without.shape == (2, 10)
    assert torch.allclose(merge_slots(with_slots, 10).exp(), without.exp(), atol=1e-6)


def test_slot_identity_tells_unseen_visits_apart(tiny_config):
    """Two histories of unseen visits that differ only in which visits are the same place: without the slot
    embedding the model cannot tell them apart, with it their encodings differ."""
    torch.manual_seed(0)
    locations = torch.tensor([[1, 1, 1], [1, 1, 1]])
    features = [torch.ones_like(locations)] * 4
    slots = torch.tensor([[1, 2, 1], [1, 2, 2]])  # A B A against A B B
    for identity in (False, True):
        cfg = dataclasses.replace(tiny_config, variant="mhsa", unseen_slots=True, slot_identity=identity)
        out = build_model(cfg).eval()(locations, torch.tensor([1, 1]), *features, slots).log_probs
        assert torch.allclose(out[0, :10], out[1, :10]) != identity


def test_previous_location_reaches_the_next_visits_embedding(tiny_config):
    """Per-visit embeddings see only their own visit, unless previous_location adds the visit before."""
    from pgt.network.model import VisitEmbedding

    torch.manual_seed(0)
    ones = torch.ones(2, 3, dtype=torch.long)
    locations = torch.tensor([[2, 5, 6], [3, 5, 6]])  # only the first visit differs
    pos = torch.tensor([[3, 2, 1], [3, 2, 1]])
    for previous in (False, True):
        embed = VisitEmbedding(dataclasses.replace(tiny_config, previous_location=previous)).eval()
        x = embed(locations, torch.tensor([1, 1]), ones, ones, ones, ones, pos)  # (2, 3, d)
        assert not torch.allclose(x[0, 0], x[1, 0])
        assert torch.allclose(x[0, 1], x[1, 1]) != previous  # visit 2 sees visit 1's location only with the option
        assert torch.allclose(x[0, 2], x[1, 2])  # two visits back: never


def test_visit_relations_on_a_hand_built_history(tiny_config):
    """Relations to the last visit and the clock buckets, computed by hand (values stored + 1, 0 = padding)."""
    from pgt.network.pointer import visit_relations

    cfg = dataclasses.replace(tiny_config, unseen_slots=True, time_slots=96, weekdays=7, duration_buckets=96)
    locations = torch.tensor([[2, 3, 2, 4, 2, 0], [1, 1, 5, 1, 0, 0]])
    slots = torch.tensor([[0, 0, 0, 0, 0, 0], [1, 2, 0, 1, 0, 0]])  # row 1: unseen places A, B, then A again
    times = torch.tensor([[33, 41, 65, 1, 33, 0], [1, 5, 9, 13, 0, 0]])  # 8:00, 10:00, 16:00, 0:00, 8:00
    weekdays = torch.tensor([[1, 1, 2, 3, 3, 0], [1, 1, 1, 1, 0, 0]])
    recency = torch.tensor([[3, 3, 2, 1, 1, 0], [2, 2, 2, 2, 0, 0]])  # row 0 ends on the target's day
    durations = torch.tensor([[2, 2, 2, 2, 5, 0], [1, 1, 1, 1, 0, 0]])  # row 0's last visit: 4 buckets = 2 h
    lengths, _ = positions_from_end(locations)
    relation, clock = visit_relations(locations, slots, times, weekdays, recency, durations, lengths, cfg)
    # 2 * (the visit before was at the current place) + (it is the current place)
    assert relation[0, :5].tolist() == [1, 2, 1, 2, 1]  # current place 2, followed by 3 and 4
    assert relation[1, :4].tolist() == [1, 2, 0, 1]  # current place: slot A; B followed A; 5 followed B
    # now = 8:00 + 2 h = 10:00 in row 0: hours from now 22, 0, 6, 14, 22; the target's weekday is stored 3
    assert (clock[0, :5] // 2).tolist() == [22, 0, 6, 14, 22]
    assert (clock[0, :5] % 2).tolist() == [0, 0, 0, 1, 1]
    # row 1: now = 3:00 (slot 12, no duration); the target is a day later, so no visit shares its weekday
    assert (clock[1, :4] // 2).tolist() == [21, 22, 23, 0] and (clock[1, :4] % 2).tolist() == [0, 0, 0, 0]
    without = dataclasses.replace(cfg, unseen_slots=False)  # every unseen visit is then the one place id 1
    assert visit_relations(locations, slots, times, weekdays, recency, durations, lengths, without)[0][1, :4].tolist() \
        == [1, 3, 2, 1]


def test_visit_relations_start_neutral_and_move_the_pointer(tiny_batch, tiny_config):
    """The relation biases start at zero (the model's output is that of the plain pointer) and shift attention."""
    torch.manual_seed(0)
    plain = build_model(tiny_config).eval()
    related = build_model(dataclasses.replace(tiny_config, visit_relations=True)).eval()
    related.load_state_dict(plain.state_dict(), strict=False)
    assert torch.allclose(plain(*tiny_batch.inputs()).log_probs, related(*tiny_batch.inputs()).log_probs)
    with torch.no_grad():
        related.relation_bias[1] = 5.0  # favour visits at the current place
    a0, a1 = plain(*tiny_batch.inputs()).attention, related(*tiny_batch.inputs()).attention
    assert not torch.allclose(a0, a1)


def test_second_order_relations_mark_what_followed_the_last_two_places(tiny_config):
    from pgt.network.pointer import visit_relations

    cfg = dataclasses.replace(tiny_config, visit_relations=True, relation_order=2)
    locations = torch.tensor([[3, 2, 4, 3, 2, 5, 4, 2, 0]])  # the last two places: 4, then 2
    ones = torch.ones_like(locations)
    lengths, _ = positions_from_end(locations)
    relation, _ = visit_relations(locations, None, ones, ones, ones, ones, lengths, cfg)
    # 4 and 5 followed the current place 2, but after 3, not after 4: no second-order match
    assert relation[0, :8].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    locations = torch.tensor([[3, 2, 4, 3, 2, 5, 3, 2]])  # now the last two are 3, 2: visits 2 and 5 followed them
    lengths, _ = positions_from_end(locations)
    relation, _ = visit_relations(locations, None, ones[:, :8], ones[:, :8], ones[:, :8], ones[:, :8], lengths, cfg)
    assert relation[0].tolist() == [0, 1, 6, 0, 1, 6, 0, 1]
    first = dataclasses.replace(cfg, relation_order=1)
    assert visit_relations(locations, None, ones[:, :8], ones[:, :8], ones[:, :8], ones[:, :8], lengths, first)[0][0] \
        .tolist() == [0, 1, 2, 0, 1, 2, 0, 1]


def test_relation_inputs_reach_the_encoder(tiny_batch, tiny_config):
    """With relation_inputs the context depends on the relations: the same history under another clock differs."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_config, visit_relations=True, relation_inputs=True)
    model = build_model(cfg).eval()
    with torch.no_grad():
        model.relation_bias.zero_()
        model.clock_bias.zero_()
        base = model(*tiny_batch.inputs()).log_probs
        # every tiny visit starts at 2:15 (slot 9) and lasts 90 min (bucket 3): now is 3:45, so each visit starts
        # 22 hours after now, on weekday 1 while the target's is 3: clock 2 * 22 + 0
        model.relation_inputs[1].weight[44].add_(1.0)
        moved = model(*tiny_batch.inputs()).log_probs
    assert not torch.allclose(base, moved)
    with pytest.raises(ValueError, match="needs visit_relations"):
        dataclasses.replace(tiny_config, relation_inputs=True)
    with pytest.raises(ValueError, match="variant 'pgt' or 'pointer'"):
        dataclasses.replace(tiny_config, variant="lstm-pg", visit_relations=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_ensemble_predicts_the_mean_of_its_members_probabilities(tiny_batch, tiny_config, variant):
    """members 3: three networks with their own initial weights; the prediction is the mean of their
    probabilities, and Output.members holds each one's log-probabilities as that network alone gives them."""
    torch.manual_seed(0)
    ensemble = build_model(dataclasses.replace(tiny_config, variant=variant, members=3)).eval()
    members = networks(ensemble)
    assert len(members) == 3 and all(m.cfg.members == 1 for m in members)
    first = [p for p in members[0].parameters() if p.dim() > 1][0]
    assert not torch.equal(first, [p for p in members[1].parameters() if p.dim() > 1][0])  # own initial weights
    out = ensemble(*tiny_batch.inputs())
    alone = torch.stack([m(*tiny_batch.inputs()).log_probs for m in members])  # (3, B, V)
    assert torch.allclose(out.members, alone)
    assert torch.allclose(out.log_probs.exp(), alone.exp().mean(0), atol=1e-6)
    assert torch.allclose(out.log_probs.exp().sum(dim=1), torch.ones(3), atol=1e-5)
    assert out.gate.shape == (3,) and out.attention.shape == tiny_batch.locations.shape


def test_one_member_is_the_plain_network(tiny_config):
    """members 1 (the default) builds the network itself: its state_dict, and every checkpoint of it, is unchanged."""
    model = build_model(tiny_config)
    assert not isinstance(model, Ensemble) and networks(model) == [model]
    torch.manual_seed(0)
    two = build_model(dataclasses.replace(tiny_config, members=2))
    assert sorted({key.split(".")[1] for key in two.state_dict()}) == ["0", "1"]


def test_a_one_hot_lookup_gives_the_tables_rows_and_their_gradients():
    """Stated values: rows 2, 0 and 2 of a 3-row table; the gradient sums row 2's twice and gives the padding row
    (0) nothing, as nn.Embedding(padding_idx=0) does; a bias vector (1-D) likewise."""
    from pgt.network.model import one_hot_lookup

    table = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], requires_grad=True)
    idx = torch.tensor([[2, 0, 2]])
    out = one_hot_lookup(table, idx, padding_idx=0)
    assert out.tolist() == [[[5.0, 6.0], [1.0, 2.0], [5.0, 6.0]]]
    out.sum().backward()
    assert table.grad.tolist() == [[0.0, 0.0], [0.0, 0.0], [2.0, 2.0]]
    bias = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    picked = one_hot_lookup(bias, idx)
    assert picked.tolist() == [[2.0, 0.5, 2.0]]
    (picked * torch.tensor([[1.0, 3.0, 1.0]])).sum().backward()
    assert bias.grad.tolist() == [3.0, 0.0, 2.0]


@pytest.mark.parametrize("members", [1, 2])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the one-hot lookup's own device: CUDA; none here"))])
def test_the_one_hot_lookup_trains_what_the_embedding_lookup_trains(tiny_batch, tiny_config, monkeypatch, members,
                                                                    device):
    """The tuned model's switches (slots, relations as biases and inputs), one network and an ensemble: the loss,
    and every parameter's gradient, are the embedding lookup's whether the small tables are looked up as one-hot
    products (as CUDA training does; forced on the CPU) or not (ONE_HOT_ROWS 0); the location table (more rows
    than ONE_HOT_ROWS allows) stays an embedding either way, and evaluation never takes the product."""
    from pgt.network import model as network

    cfg = dataclasses.replace(tiny_config, unseen_slots=True, visit_relations=True, relation_inputs=True, members=members)
    torch.manual_seed(0)
    model = build_model(cfg).to(device).train()
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in tiny_batch.inputs()]
    calls = []

    def gradients() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = -model(*inputs).log_probs[:, 5].sum()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    monkeypatch.setattr(network, "ONE_HOT_ROWS", 0)
    plain_loss, plain = gradients()
    original = network.one_hot_lookup
    monkeypatch.setattr(network, "ONE_HOT_DEVICES", (device,))
    monkeypatch.setattr(network, "ONE_HOT_ROWS", 9)  # the 10-row location table stays an embedding
    monkeypatch.setattr(network, "one_hot_lookup", lambda w, i, p=None: calls.append(w.shape[0]) or original(w, i, p))
    one_hot_loss, one_hot = gradients()
    assert calls and 10 not in calls and max(calls) <= 9
    assert torch.allclose(one_hot_loss, plain_loss, atol=1e-5)
    assert one_hot.keys() == plain.keys()
    for name in plain:
        assert torch.allclose(one_hot[name], plain[name], atol=1e-5, rtol=1e-4), name
    calls.clear()
    with torch.no_grad():
        model.eval()(*inputs)
    assert calls == []


def test_distance_bands_place_each_known_place_by_its_distance_from_the_current_place():
    """Band 0: no coordinates (ids 0 and 1, or an unknown current place); then by the edges: the current place itself
    (0 km), 111 m, 11.1 km, and 111 km beyond the last edge."""
    nan = float("nan")
    coords = torch.tensor([[nan, nan], [nan, nan], [39.9, 116.4], [39.901, 116.4], [40.0, 116.4], [40.9, 116.4]])
    edges = torch.tensor(DISTANCE_EDGES_KM)
    bands = distance_bands(coords, edges, torch.tensor([2, 1]))
    last = len(DISTANCE_EDGES_KM) + 1
    assert bands.tolist() == [[0, 0, 1, 2, 8, last], [0, 0, 0, 0, 0, 0]]  # 11.1 km: below 16, the 8th edge


def test_place_distance_biases_the_generator_by_the_bands(tiny_batch, tiny_config):
    """A model with place_distance: with every band's bias at 0 it scores as without; a bias on the band of the
    places near the current one raises exactly those places' generator probability. Coordinates of another
    vocabulary are refused."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_config, variant="mhsa", place_distance=True)
    model = build_model(cfg).eval()
    coords = torch.tensor([[float("nan")] * 2] * 2 + [[39.9 + 0.5 * (i % 2), 116.4] for i in range(8)])
    set_place_coordinates(model, coords)
    before = model(*tiny_batch.inputs()).log_probs
    torch.manual_seed(0)
    plain = build_model(dataclasses.replace(tiny_config, variant="mhsa")).eval()
    assert torch.allclose(before, plain(*tiny_batch.inputs()).log_probs)
    with torch.no_grad():
        model.distance_bias[1] = 3.0  # below 100 m: the current place and the other places at its latitude
    after = model(*tiny_batch.inputs()).log_probs
    near = distance_bands(coords, model.distance_edges, tiny_batch.locations[torch.arange(3), torch.tensor([3, 1, 0])]) == 1
    assert (after > before)[near].all() and (after < before)[~near].all()
    with pytest.raises(ValueError, match="takes \\(10, 2\\) coordinates"):
        set_place_coordinates(model, coords[:5])


def test_usual_places_flag_the_windows_most_visited_night_and_day_places():
    """Time slots of 15 minutes, stored + 1: 23:00 is slot 93, 03:00 slot 13, 10:00 slot 41, 14:00 slot 57. Place 5 has
    two night visits, place 7 one night and one day visit, place 9 two day visits; padding and a remembered place
    (not the window's) count for nothing; a window without night visits has no night place."""
    ids = torch.tensor([[5, 7, 5, 9, 9, 7, 8, 0], [4, 4, 6, 0, 0, 0, 0, 0]])
    times = torch.tensor([[93, 13, 13, 41, 57, 41, 93, 0], [41, 57, 41, 0, 0, 0, 0, 0]])
    window = (ids != 0) & torch.tensor([[True] * 6 + [False] * 2, [True] * 8])  # the 8 is remembered, not the window's
    flags = usual_places(ids, times, window, 96)
    assert flags.tolist() == [[2, 0, 2, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]



def test_the_distance_head_predicts_the_next_moves_band_while_training_and_predictions_ignore_it(tiny_batch,
                                                                                              tiny_config):
    """distance_head: in training mode the model gives (B, bands) logits and the (B, V) bands from the current place;
    the loss adds distance_loss at the setting's weight, averaged over the rows whose target has coordinates (target
    6 has none here: its row counts for nothing). In eval mode there is neither, and the head changes no prediction:
    the same weights without it predict the same. An ensemble gives each member's logits."""
    import torch.nn.functional as F

    from pgt.config import TrainConfig
    from pgt.training.loss import criterion, distance_loss, training_loss

    nan = float("nan")
    coords = torch.tensor([[nan, nan]] * 2 + [[39.9 + 0.01 * i, 116.4] for i in range(2, 10)])
    coords[6] = nan
    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_config, distance_head=0.5)
    model = build_model(cfg)
    set_place_coordinates(model, coords)
    out = model.train()(*tiny_batch.inputs())
    current = torch.tensor([7, 4, 9])  # each row's last visit
    assert out.distance.shape == (3, len(DISTANCE_EDGES_KM) + 2)
    assert torch.equal(out.bands, distance_bands(coords, model.distance_edges, current))
    target_bands = out.bands[torch.arange(3), tiny_batch.targets]  # targets 5, 6, 9
    assert target_bands[1] == 0 and (target_bands[[0, 2]] > 0).all()
    expected = F.cross_entropy(out.distance[[0, 2]], target_bands[[0, 2]])
    assert torch.allclose(distance_loss(out.distance, out.bands, tiny_batch), expected)
    train_cfg = TrainConfig(data_dir="d", out_dir="o")
    assert torch.allclose(training_loss(out, tiny_batch, cfg, train_cfg),
                          criterion(out.log_probs, tiny_batch, cfg, train_cfg) + 0.5 * expected)

    served = model.eval()(*tiny_batch.inputs())
    assert served.distance is None and served.bands is None
    plain = build_model(tiny_config).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items()
                           if not k.startswith("distance_head.") and k != "place_coords"})
    assert torch.allclose(plain(*tiny_batch.inputs()).log_probs, served.log_probs)

    ensemble = build_model(dataclasses.replace(cfg, members=2))
    set_place_coordinates(ensemble, coords)
    both = ensemble.train()(*tiny_batch.inputs())
    assert both.distance.shape == (2, 3, len(DISTANCE_EDGES_KM) + 2) and torch.equal(both.bands, out.bands)
    with pytest.raises(Exception, match="lstm-pg"):
        dataclasses.replace(tiny_config, variant="lstm-pg", distance_head=0.5)


def test_the_arrival_head_predicts_the_next_visits_hour_while_training_and_predictions_ignore_it(tiny_batch,
                                                                                               tiny_config):
    """arrival_head: in training mode the model gives (B, 24) logits; the loss adds arrival_loss at the setting's
    weight: the cross-entropy against each target's start hour (slot * 24 // time_slots: slots 95, 40 and 0 of 96
    are hours 23, 10 and 0), averaged over the rows that have one (-1: the second has none). In eval mode there is
    none, and the head changes no prediction. An ensemble gives each member's logits; a batch without target times
    is refused."""
    import torch.nn.functional as F

    from pgt.config import HOURS, TrainConfig
    from pgt.training.loss import arrival_loss, criterion, training_loss

    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_config, arrival_head=0.3, time_slots=96)
    model = build_model(cfg)
    batch = tiny_batch._replace(target_times=torch.tensor([95, -1, 0]))
    out = model.train()(*batch.inputs())
    assert out.arrival.shape == (3, HOURS) and out.distance is None
    expected = F.cross_entropy(out.arrival[[0, 2]], torch.tensor([23, 0]))
    assert torch.allclose(arrival_loss(out.arrival, batch, 96), expected)
    assert torch.allclose(arrival_loss(out.arrival, tiny_batch._replace(target_times=torch.tensor([40, 40, 40])), 96),
                          F.cross_entropy(out.arrival, torch.tensor([10, 10, 10])))
    train_cfg = TrainConfig(data_dir="d", out_dir="o")
    assert torch.allclose(training_loss(out, batch, cfg, train_cfg),
                          criterion(out.log_probs, batch, cfg, train_cfg) + 0.3 * expected)
    with pytest.raises(ValueError, match="target_times"):
        arrival_loss(out.arrival, tiny_batch, 96)

    served = model.eval()(*batch.inputs())
    assert served.arrival is None
    plain = build_model(dataclasses.replace(cfg, arrival_head=0.0)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("arrival_head.")})
    assert torch.allclose(plain(*batch.inputs()).log_probs, served.log_probs)

    ensemble = build_model(dataclasses.replace(cfg, members=2))
    both = ensemble.train()(*batch.inputs())
    assert both.arrival.shape == (2, 3, HOURS)
    assert torch.allclose(training_loss(both, batch, cfg, train_cfg),
                          sum(criterion(each, batch, cfg, train_cfg) + 0.3 * arrival_loss(a, batch, 96)
                              for each, a in zip(both.members, both.arrival, strict=True)))
    with pytest.raises(Exception, match="lstm-pg"):
        dataclasses.replace(tiny_config, variant="lstm-pg", arrival_head=0.5)


def test_the_stay_head_predicts_how_long_the_next_visit_lasts_while_training_and_predictions_ignore_it(tiny_batch,
                                                                                                  tiny_config):
    """stay_head: in training mode the model gives (B, 7) logits; the loss adds stay_loss at the setting's weight: the
    cross-entropy against each target's duration band (below 30, 60, 120, 240, 480, 960 minutes or beyond: 29 min is
    band 0, 30 band 1, 2,000 band 6), averaged over the rows that know it (-1: the second does not). In eval mode there
    is none, and the head changes no prediction. An ensemble gives each member's logits; a batch without durations
    is refused, and so is the LSTM."""
    import torch.nn.functional as F

    from pgt.config import STAY_EDGES_MIN, TrainConfig
    from pgt.training.loss import criterion, stay_loss, training_loss

    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_config, stay_head=0.4, arrival_head=0.3, time_slots=96)
    model = build_model(cfg)
    batch = tiny_batch._replace(target_times=torch.tensor([95, 40, 0]), target_minutes=torch.tensor([29, -1, 2000]))
    out = model.train()(*batch.inputs())
    assert out.stay.shape == (3, len(STAY_EDGES_MIN) + 1) == (3, 7) and out.arrival.shape == (3, 24)
    expected = F.cross_entropy(out.stay[[0, 2]], torch.tensor([0, 6]))
    assert torch.allclose(stay_loss(out.stay, batch), expected)
    bands = stay_loss(out.stay, tiny_batch._replace(target_minutes=torch.tensor([30, 30, 30])))
    assert torch.allclose(bands, F.cross_entropy(out.stay, torch.tensor([1, 1, 1])))
    train_cfg = TrainConfig(data_dir="d", out_dir="o")
    from pgt.training.loss import arrival_loss
    assert torch.allclose(training_loss(out, batch, cfg, train_cfg), criterion(out.log_probs, batch, cfg, train_cfg)
                          + 0.3 * arrival_loss(out.arrival, batch, 96) + 0.4 * expected)
    with pytest.raises(ValueError, match="target_minutes"):
        stay_loss(out.stay, tiny_batch)

    served = model.eval()(*batch.inputs())
    assert served.stay is None
    plain = build_model(dataclasses.replace(cfg, stay_head=0.0)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("stay_head.")})
    assert torch.allclose(plain(*batch.inputs()).log_probs, served.log_probs)

    ensemble = build_model(dataclasses.replace(cfg, members=2, arrival_head=0.0))
    both = ensemble.train()(*batch.inputs())
    assert both.stay.shape == (2, 3, 7)
    assert torch.allclose(training_loss(both, batch, cfg, train_cfg),
                          sum(criterion(each, batch, cfg, train_cfg) + 0.4 * stay_loss(s, batch)
                              for each, s in zip(both.members, both.stay, strict=True)))
    with pytest.raises(Exception, match="lstm-pg"):
        dataclasses.replace(tiny_config, variant="lstm-pg", stay_head=0.5)


def test_arrival_days_counts_the_hour_from_the_midnight_before_the_last_visits_day(tiny_batch, tiny_config):
    """arrival_days 2: (B, 48) logits; each target's class is its start hour plus 24 for each day after the last
    visit's day the protocol's recency tells (stored + 1: recency 1 is the same day, 2 the next, 5 three days later,
    counted as the last day). Slots 40 of 96 are hour 10: classes 10, 34 and 34. Refused without the head, and with
    anchor last_visit, whose recency does not tell the day."""
    import torch.nn.functional as F

    from infra.errors import SettingsError
    from pgt.config import HOURS, TrainConfig
    from pgt.training.loss import arrival_loss

    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_config, arrival_head=1.0, arrival_days=2, time_slots=96)
    valid = (tiny_batch.locations != 0).long()
    recency = valid * torch.tensor([[1], [2], [5]])  # every visit of row 0 on the target's day, ...
    batch = tiny_batch._replace(recency=recency, target_times=torch.tensor([40, 40, 40]))
    out = build_model(cfg).train()(*batch.inputs())
    assert out.arrival.shape == (3, 2 * HOURS)
    assert torch.allclose(arrival_loss(out.arrival, batch, 96), F.cross_entropy(out.arrival, torch.tensor([10, 34, 34])))
    with pytest.raises(SettingsError, match="set arrival_head too"):
        TrainConfig.from_recipe("paper", arrival_days=2, data_dir="d", out_dir="o")
    with pytest.raises(SettingsError, match="set arrival_head too"):  # a network's settings alone, too
        dataclasses.replace(tiny_config, arrival_days=2)
    with pytest.raises(SettingsError, match="anchor last_visit"):
        TrainConfig.from_recipe("paper", arrival_head=1.0, arrival_days=2, anchor="last_visit", data_dir="d",
                                out_dir="o")


def test_arrival_classes_group_the_day_s_time_slots_evenly(tiny_batch, tiny_config):
    """arrival_classes 12: (B, 12) logits, slots 95, 40 and 0 of 96 are the classes 11, 5 and 0 (two hours each); with
    arrival_days 2 (recency 1, 2 and 5: the same day, the next, three days later as the last), slot 40 is 5, 17 and 17;
    the training loss reads the setting. Refused without the head, and outside its bounds."""
    import torch.nn.functional as F

    from infra.errors import SettingsError
    from pgt.config import TrainConfig
    from pgt.training.loss import arrival_loss, criterion, training_loss

    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_config, arrival_head=1.0, arrival_classes=12, time_slots=96)
    batch = tiny_batch._replace(target_times=torch.tensor([95, 40, 0]))
    out = build_model(cfg).train()(*batch.inputs())
    assert out.arrival.shape == (3, 12)
    expected = F.cross_entropy(out.arrival, torch.tensor([11, 5, 0]))
    assert torch.allclose(arrival_loss(out.arrival, batch, 96, 12), expected)
    train_cfg = TrainConfig(data_dir="d", out_dir="o")
    assert torch.allclose(training_loss(out, batch, cfg, train_cfg), criterion(out.log_probs, batch, cfg, train_cfg)
                          + expected)

    two_days = dataclasses.replace(cfg, arrival_days=2)
    valid = (tiny_batch.locations != 0).long()
    later = tiny_batch._replace(recency=valid * torch.tensor([[1], [2], [5]]), target_times=torch.tensor([40, 40, 40]))
    out = build_model(two_days).train()(*later.inputs())
    assert out.arrival.shape == (3, 24)
    assert torch.allclose(arrival_loss(out.arrival, later, 96, 12), F.cross_entropy(out.arrival,
                                                                                   torch.tensor([5, 17, 17])))
    with pytest.raises(SettingsError, match="set arrival_head too"):
        dataclasses.replace(tiny_config, arrival_classes=12)
    with pytest.raises(SettingsError, match="arrival_classes must be in"):
        TrainConfig.from_recipe("paper", arrival_head=1.0, arrival_classes=1, data_dir="d", out_dir="o")

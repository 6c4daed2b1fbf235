"""The Pointer Generator Transformer and its neural variants.

Notation: B batch, T history length, d model width, V locations. Histories are right-padded with
location 0; every feature index 0 is padding (the data loader shifts real values by one).

    embeddings -> pre-LN transformer encoder -> context c at the last valid visit
    P = g * P_ptr + (1 - g) * P_gen,  g = sigmoid(MLP(c)),  output log(P + 1e-10)

Extended vocabulary (`unseen_slots`, See et al. 2017's "P(w) over V + max_oov"): the distinct places of a
history that are unseen in train (id 1) get per-sample slots after the V known ids. The pointer puts
each visit's attention on its slot, so two unseen places are told apart; the generator spreads over
the known ids plus id 1, which then means "a new place". The output is then (B, V + S), S the most
slots of any row in the batch, or with `pad_slots` T (a shape fixed by the input's: training's static_width).
Without it, the pointer scatters onto the location ids as the paper has it.

Visit relations (`visit_relations`): the pointer adds learned biases for each visit's relation to the last one
(it followed the current place, it is the current place, its start in hours after now in the day, its weekday is
the target's); with `relation_inputs` the encoder's inputs embed them too, so the history is read relative to now.

Ensembles (`members` K > 1): K networks of one configuration from their own initial weights, trained side by
side each on its own loss; the prediction is the mean of their probabilities.

Auxiliary tasks (`distance_head`, `arrival_head`, `stay_head`): heads on the context c that predict the next move's
distance band, the hour the next visit starts and how long it lasts, trained jointly (pgt.training.loss); in eval mode
the model gives none of them.

Variants: "pgt" (learned gate), "mhsa" (generation only, g = 0), "pointer" (pointer only, g = 1),
and "lstm-pg": the original pointer-generator (See et al., 2017) adapted to one prediction step:
BiLSTM encoder, additive (Bahdanau) attention from the reduced last state, p_gen from context,
state and input.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from pgt.config import STAY_EDGES_MIN, ModelConfig
from pgt.network.daygap import END_HOURS
from pgt.network.places import DISTANCE_EDGES_KM, USUAL_KINDS, distance_bands, usual_places
from pgt.network.pointer import (
    CLOCK_BUCKETS,
    RELATIONS,
    memory_pointer,
    mix,
    pointer_distribution,
    remembered_places,
    visit_relations,
)
from pgt.network.vocabulary import visit_ids

EPS = 1e-10
# Tables of at most this many rows are looked up as a one-hot product while training on these devices (lookup).
# A CUDA embedding's backward sorts the batch's indices and adds their duplicates one after another: the small
# tables (7 weekdays, 96 time slots, position and relation biases) get thousands of duplicates a batch, and their
# backward took a third of a captured tuned step's kernel time. The product's backward is one matrix product.
ONE_HOT_ROWS = 256
ONE_HOT_DEVICES = ("cuda",)


def lookup(weight: torch.Tensor, idx: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """weight[idx] ((*idx.shape, *weight.shape[1:])), with nn.Embedding's gradient: none for the padding row.
    While training a small table on ONE_HOT_DEVICES, as one_hot_lookup; else as an embedding lookup."""
    if (weight.shape[0] <= ONE_HOT_ROWS and idx.device.type in ONE_HOT_DEVICES and weight.requires_grad
            and torch.is_grad_enabled()):
        return one_hot_lookup(weight, idx, padding_idx)
    if weight.dim() == 1:  # a bias per row: plain indexing (it has no padding row)
        return weight[idx]
    return F.embedding(idx, weight, padding_idx)  # nn.Embedding's own forward


def one_hot_lookup(weight: torch.Tensor, idx: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """weight[idx] as one_hot(idx) @ weight in float32, outside autocast: the same values (a one-hot row picks its
    row exactly), the same gradients up to the order of a sum, and no host synchronisation (CUDA graphs capture it).
    The padding row enters detached, so it learns nothing, as nn.Embedding's."""
    if padding_idx is not None:
        weight = torch.cat([weight[:padding_idx], weight[padding_idx:padding_idx + 1].detach(),
                            weight[padding_idx + 1:]])
    rows = torch.arange(weight.shape[0], device=idx.device)
    with torch.autocast(idx.device.type, enabled=False):
        one_hot = (idx.unsqueeze(-1) == rows).to(weight.dtype)  # (*idx.shape, rows)
        return one_hot @ weight.float()  # (*idx.shape, *weight.shape[1:])


class Output(NamedTuple):
    log_probs: torch.Tensor  # (B, V) log(P + 1e-10)
    gate: torch.Tensor  # (B,) weight of the pointer distribution
    attention: torch.Tensor  # (B, T) pointer attention over the history (0 on padding)
    members: torch.Tensor | None = None  # (K, B, V) each member's log_probs (an Ensemble's); None for one network
    # distance_head, while training: (B, bands) logits of the band of the distance to the next place (an Ensemble's
    # (K, B, bands)), and (B, V) the band of each location id from the current place, which the loss reads the
    # target's from; None otherwise
    distance: torch.Tensor | None = None
    bands: torch.Tensor | None = None
    # arrival_head, while training: (B, arrival_classes * arrival_days) logits of the hour (or other share of the
    # day) the next visit starts (an Ensemble's (K, B, arrival_classes * arrival_days))
    arrival: torch.Tensor | None = None
    # stay_head, while training: (B, stay bands) logits of how long the next visit lasts (an Ensemble's (K, B, bands))
    stay: torch.Tensor | None = None


class VisitEmbedding(nn.Module):
    """location (d) + user (d) + time, weekday, recency, duration, position-from-end (d/4 each) -> d.
    With cfg.unseen_slots and cfg.slot_identity, an unseen visit's location embedding (id 1's) gets its slot's
    embedding added (slots number a history's distinct unseen places by first visit), so that the encoder
    can tell which unseen visits are the same place. With cfg.previous_location each visit also carries the
    embedding of the location visited before it (d more inputs to the projection), so that attention from
    the current location finds in one hop the visits that followed it earlier in the history."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, q = cfg.d_model, cfg.d_model // 4
        self.location = nn.Embedding(cfg.num_locations, d, padding_idx=0)
        self.user = nn.Embedding(cfg.num_users, d, padding_idx=0)
        self.time = nn.Embedding(cfg.time_slots + 1, q, padding_idx=0)  # values are stored + 1: 0 is padding
        self.weekday = nn.Embedding(cfg.weekdays + 1, q, padding_idx=0)
        self.recency = nn.Embedding(cfg.recency_rows + 1, q, padding_idx=0)  # with a memory, its age buckets too
        self.duration = nn.Embedding(cfg.duration_rows + 1, q, padding_idx=0)  # with a memory, its visit buckets too
        self.pos_from_end = nn.Embedding(cfg.positions + 1, q, padding_idx=0)  # remembered places: past max_len
        self.slot = nn.Embedding(cfg.positions + 1, d, padding_idx=0) if cfg.unseen_slots and cfg.slot_identity else None
        self.previous = cfg.previous_location
        self.proj = nn.Linear((3 if self.previous else 2) * d + 5 * q, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, locations, users, times, weekdays, recency, durations, pos_from_end, slots=None, memory=None):
        T = locations.shape[1]
        location = embed(self.location, locations)  # (B, T, d)
        if self.slot is not None and slots is not None:
            location = location + embed(self.slot, slots.clamp_max(self.slot.num_embeddings - 1))  # slot 0 adds 0
        parts = [
            location,
            embed(self.user, users).unsqueeze(1).expand(-1, T, -1),  # (B, T, d)
            embed(self.time, times), embed(self.weekday, weekdays), embed(self.recency, recency),
            embed(self.duration, durations), embed(self.pos_from_end, pos_from_end),  # (B, T, d/4) each
        ]
        if self.previous:
            previous = F.pad(location[:, :-1], (0, 0, 1, 0))  # (B, T, d) the location before each visit
            if memory is not None:  # the first visit of the history follows no remembered place
                previous = previous.masked_fill(F.pad(memory[:, :-1], (1, 0)).unsqueeze(-1), 0.0)
            parts.append(previous)
        return self.norm(self.proj(torch.cat(parts, dim=-1)))  # (B, T, d)


def embed(table: nn.Embedding, idx: torch.Tensor) -> torch.Tensor:
    """table(idx), by lookup: small tables as a one-hot product while training on CUDA."""
    return lookup(table.weight, idx, table.padding_idx)


class FastDropout(nn.Module):
    """Dropout with the keep mask drawn 16 bits at a time from int64 draws: the same Bernoulli(1 - p) mask
    (p quantised to 1/65536) at half the cost of nn.Dropout's bernoulli_ on CPU, where dropout is a
    quarter of a training step. It replaces the encoder layers' own dropout modules."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.threshold = int(round(p * 65536)) - 32768  # keep where the int16 draw is >= threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        n = x.numel()
        draws = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)
        keep = draws.view(torch.int16)[:n].view(x.shape) >= self.threshold
        return torch.where(keep, x * (1.0 / (1.0 - self.p)), 0.0)


def positions_from_end(locations: torch.Tensor, memory: torch.Tensor | None = None,
                       max_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths (B,), position from end (B, T): the last visit is 1, padding 0) for right-padded rows. With
    `memory` (B, T), True on the remembered places in front of the history, the k-th of those (k from 0, the most
    visited first) takes position max_len + 1 + k instead: a rank of its own, whatever the history's length."""
    valid = locations != 0  # (B, T)
    lengths = valid.sum(dim=1)  # (B,)
    positions = torch.arange(locations.shape[1], device=locations.device).unsqueeze(0)  # (1, T)
    pos_end = torch.where(valid, lengths.unsqueeze(1) - positions, 0)
    if memory is not None:
        pos_end = torch.where(memory, max_len + 1 + positions, pos_end)  # remembered places sit at columns 0..m-1
    return lengths, pos_end


def sinusoidal_encoding(max_len: int, d: int) -> torch.Tensor:
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(max_len, d)
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)
    return pe  # (max_len, d)


class PointerGeneratorTransformer(nn.Module):
    """PGT and its one-sided variants: mhsa (gate fixed at 0) and pointer (gate fixed at 1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.variant == "lstm-pg":
            raise ValueError("use LSTMPointerGenerator for variant 'lstm-pg' (or build_model)")
        self.cfg = cfg
        d = cfg.d_model
        self.embed = VisitEmbedding(cfg)
        self.register_buffer("pe", sinusoidal_encoding(cfg.positions, d), persistent=False)
        layer = nn.TransformerEncoderLayer(d, cfg.nhead, cfg.dim_feedforward, cfg.dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.num_layers, enable_nested_tensor=False)
        for block in self.encoder.layers:  # same dropout, cheaper masks
            block.dropout, block.dropout1, block.dropout2 = (FastDropout(cfg.dropout) for _ in range(3))
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.position_bias = nn.Parameter(torch.zeros(cfg.positions + 1))  # b[pos_from_end]
        # b[relation to the last visit] and b[hours after now, same weekday as the target] (visit_relations)
        self.relation_bias = nn.Parameter(torch.zeros(RELATIONS)) if cfg.visit_relations else None
        self.clock_bias = nn.Parameter(torch.zeros(CLOCK_BUCKETS)) if cfg.visit_relations else None
        self.usual_bias = nn.Parameter(torch.zeros(USUAL_KINDS)) if cfg.usual_places else None  # b[usual place flags]
        self.relation_inputs = nn.ModuleList([nn.Embedding(RELATIONS, d), nn.Embedding(CLOCK_BUCKETS, d)]) \
            if cfg.relation_inputs else None
        self.generator = nn.Linear(d, cfg.num_locations)
        if cfg.place_distance:  # b[distance band from the current place] over the generator's places
            self.distance_bias = nn.Parameter(torch.zeros(len(DISTANCE_EDGES_KM) + 2))
        # an auxiliary task: the next move's distance band from the context (training only)
        self.distance_head = nn.Linear(d, len(DISTANCE_EDGES_KM) + 2) if cfg.distance_head else None
        # and when it starts (training only)
        self.arrival_head = nn.Linear(d, cfg.arrival_classes * cfg.arrival_days) if cfg.arrival_head else None
        # and how long it lasts (training only)
        self.stay_head = nn.Linear(d, len(STAY_EDGES_MIN) + 1) if cfg.stay_head else None
        if cfg.place_distance or cfg.distance_head:
            # (V, 2) latitude and longitude of each location id in degrees, NaN where none (set_place_coordinates)
            self.register_buffer("place_coords", torch.full((cfg.num_locations, 2), math.nan))
            self.register_buffer("distance_edges", torch.tensor(DISTANCE_EDGES_KM), persistent=False)
        if cfg.day_gaps > 1:  # (END_HOURS, day_gaps) P(next visit's day | the hour the last visit ends) (daygap)
            self.register_buffer("day_gap_prior", torch.full((END_HOURS, cfg.day_gaps), 1 / cfg.day_gaps))
        # with a memory and its own gate, the gate weighs three sources (window, memory, generator) instead of two
        sources = 3 if cfg.memory_size and cfg.memory_gate else 1
        self.gate = nn.Sequential(nn.Linear(d, d // 2), nn.GELU(), nn.Linear(d // 2, sources))
        _xavier(self)

    def forward(self, locations, users, times, weekdays, recency, durations, slots=None, pad_slots=False) -> Output:
        B, T = locations.shape
        memory = remembered_places(recency, self.cfg)  # (B, T) or None
        lengths, pos_end = positions_from_end(locations, memory, self.cfg.max_len)  # (B,), (B, T)
        pad = pos_end == 0  # (B, T) True on padding
        x = self.embed(locations, users, times, weekdays, recency, durations, pos_end, slots, memory)  # (B, T, d)
        if self.relation_bias is not None:
            relation, clock = visit_relations(locations, slots, times, weekdays, recency, durations, lengths, self.cfg)
            if self.relation_inputs is not None:
                x = x + embed(self.relation_inputs[0], relation) + embed(self.relation_inputs[1], clock)  # (B, T, d)
        h = self.encoder(x + self.pe[:T], src_key_padding_mask=pad)  # (B, T, d)
        c = h[torch.arange(B, device=h.device), lengths - 1]  # (B, d) context at the last valid visit

        if self.cfg.variant == "mhsa":
            gate = torch.zeros(B, device=h.device)
        elif self.cfg.variant == "pointer":
            gate = torch.ones(B, device=h.device)
        elif memory is None or not self.cfg.memory_gate:
            gate = torch.sigmoid(self.gate(c)).squeeze(-1)  # (B,)

        scores = torch.einsum("bd,btd->bt", self.query(c), self.key(h)) / math.sqrt(self.cfg.d_model)
        scores = scores + lookup(self.position_bias, pos_end)  # (B, T)
        if self.relation_bias is not None:
            scores = scores + lookup(self.relation_bias, relation) + lookup(self.clock_bias, clock)  # (B, T)
        if self.usual_bias is not None:
            ids = visit_ids(locations, slots if self.cfg.unseen_slots else None, self.cfg.num_locations)
            window = ~pad if memory is None else ~pad & ~memory
            scores = scores + lookup(self.usual_bias, usual_places(ids, times, window, self.cfg.time_slots))  # (B, T)
        if memory is None or not self.cfg.memory_gate:  # one pointer (over the remembered places too, if any)
            attention = torch.softmax(scores.masked_fill(pad, float("-inf")), dim=-1)  # (B, T)
        else:
            gate, attention = memory_pointer(self.gate(c), scores, pad, memory)  # (B,), (B, T)
        logits = self.generator(c)  # (B, V)
        distance_task = self.distance_head is not None and self.training  # the auxiliary tasks: training only
        arrival_task = self.arrival_head is not None and self.training
        stay_task = self.stay_head is not None and self.training
        bands = None
        if self.cfg.place_distance or distance_task:
            current = locations.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)  # (B,) the last visit's place
            bands = distance_bands(self.place_coords, self.distance_edges, current)  # (B, V)
        if self.cfg.place_distance:  # the pointer's visits take no such bias: on validation it did not help
            logits = logits + lookup(self.distance_bias, bands)
        p_gen = torch.softmax(logits, dim=-1)  # (B, V)
        probs = mix(gate, pointer_distribution(attention, locations, slots, self.cfg, pad_slots), p_gen)  # (B, V + S)
        if not (distance_task or arrival_task or stay_task):
            return Output(torch.log(probs + EPS), gate, attention)
        return Output(torch.log(probs + EPS), gate, attention,
                      distance=self.distance_head(c) if distance_task else None,  # (B, bands)
                      bands=bands if distance_task else None,
                      arrival=self.arrival_head(c) if arrival_task else None,  # (B, 24 * arrival_days)
                      stay=self.stay_head(c) if stay_task else None)  # (B, stay bands)


def set_place_coordinates(model: nn.Module, coords: torch.Tensor) -> None:
    """Give every network of a place_distance (or distance_head) model the (V, 2) coordinates of its location ids
    (degrees; NaN where none): the data's, once, before training; a checkpoint carries them with the weights."""
    for net in networks(model):
        if getattr(net, "place_coords", None) is None or net.place_coords.shape != coords.shape:
            raise ValueError(f"set_place_coordinates: a place_distance or distance_head network of "
                             f"{net.cfg.num_locations} locations "
                             f"takes ({net.cfg.num_locations}, 2) coordinates, got {tuple(coords.shape)}")
        net.place_coords.copy_(coords)


def set_day_gap_prior(model: nn.Module, prior: torch.Tensor) -> None:
    """Give every network of a day_gaps model the prior of the data it learns from (daygap.fit_day_gap_prior), once,
    before training; a checkpoint carries it with the weights."""
    for net in networks(model):
        if getattr(net, "day_gap_prior", None) is None or net.day_gap_prior.shape != prior.shape:
            raise ValueError(f"set_day_gap_prior: a network of day_gaps {net.cfg.day_gaps} takes a ({END_HOURS}, "
                             f"{net.cfg.day_gaps}) prior, got {tuple(prior.shape)}")
        net.day_gap_prior.copy_(prior)


class LSTMPointerGenerator(nn.Module):
    """The original pointer-generator adapted to next-location prediction (one decoding step)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed = VisitEmbedding(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.LSTM(d, d // 2, num_layers=cfg.num_layers, batch_first=True, bidirectional=True,
                               dropout=cfg.dropout if cfg.num_layers > 1 else 0.0)
        self.reduce_h = nn.Linear(d, d)  # [fw; bw] final states -> decoder state s
        self.reduce_c = nn.Linear(d, d)
        self.W_h = nn.Linear(d, d, bias=False)  # additive attention: v^T tanh(W_h h_i + W_s s + b)
        self.W_s = nn.Linear(d, d)
        self.v = nn.Linear(d, 1, bias=False)
        self.vocab = nn.Sequential(nn.Linear(2 * d, d), nn.Linear(d, cfg.num_locations))
        self.p_gen = nn.Linear(4 * d, 1)  # from context, state (h and c) and the input x
        _xavier(self)

    def forward(self, locations, users, times, weekdays, recency, durations, slots=None, pad_slots=False) -> Output:
        B, T = locations.shape
        lengths, pos_end = positions_from_end(locations)
        pad = pos_end == 0
        x = self.dropout(self.embed(locations, users, times, weekdays, recency, durations, pos_end, slots))  # (B, T, d)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, (h_n, c_n) = self.encoder(packed)
        H, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)  # (B, T, d)
        s = F.relu(self.reduce_h(torch.cat([h_n[-2], h_n[-1]], dim=-1)))  # (B, d) last layer, fw and bw
        cell = F.relu(self.reduce_c(torch.cat([c_n[-2], c_n[-1]], dim=-1)))  # (B, d)
        scores = self.v(torch.tanh(self.W_h(H) + self.W_s(s).unsqueeze(1))).squeeze(-1)  # (B, T)
        attention = torch.softmax(scores.masked_fill(pad, float("-inf")), dim=-1)
        context = torch.einsum("bt,btd->bd", attention, H)  # (B, d)
        x_last = x[torch.arange(B, device=x.device), lengths - 1]  # (B, d) the decoder's input
        p_gen = torch.sigmoid(self.p_gen(torch.cat([context, s, cell, x_last], dim=-1))).squeeze(-1)  # (B,)
        p_vocab = torch.softmax(self.vocab(torch.cat([s, context], dim=-1)), dim=-1)  # (B, V)
        gate = 1 - p_gen  # weight of the pointer
        probs = mix(gate, pointer_distribution(attention, locations, slots, self.cfg, pad_slots), p_vocab)  # (B, V + S)
        return Output(torch.log(probs + EPS), gate, attention)


def _xavier(model: nn.Module) -> None:
    """Xavier-uniform initialisation of every matrix, as the reference implementation does."""
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)


class Ensemble(nn.Module):
    """cfg.members networks of one configuration, each from its own initial weights; the prediction is the mean of
    their probabilities. Output.members keeps each one's, so that training gives every member its own loss and
    they learn as they would apart (pgt.training.loss.criterion); only the validation score, and so the best epoch, is
    the ensemble's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        one = dataclasses.replace(cfg, members=1)
        self.members = nn.ModuleList(build_model(one) for _ in range(cfg.members))  # drawn one after another

    @classmethod
    def of(cls, members: list[nn.Module], cfg: ModelConfig) -> Ensemble:
        """An ensemble of networks drawn elsewhere (pgt.training.state.fused_seed_model: each from a seed of its own)."""
        if len(members) != cfg.members:
            raise ValueError(f"an ensemble of {cfg.members} members got {len(members)} networks")
        ensemble = cls.__new__(cls)
        nn.Module.__init__(ensemble)
        ensemble.cfg, ensemble.members = cfg, nn.ModuleList(members)
        return ensemble

    def forward(self, locations, users, times, weekdays, recency, durations, slots=None, pad_slots=False) -> Output:
        outs = [member(locations, users, times, weekdays, recency, durations, slots, pad_slots)
                for member in self.members]
        each = torch.stack([out.log_probs for out in outs])  # (K, B, V + S)
        log_probs = mean_probability(each)  # (B, V + S)
        gate = torch.stack([out.gate for out in outs]).mean(0)  # (B,)
        attention = torch.stack([out.attention for out in outs]).mean(0)  # (B, T)
        distance = None if outs[0].distance is None else torch.stack([out.distance for out in outs])  # (K, B, bands)
        arrival = None if outs[0].arrival is None else torch.stack([out.arrival for out in outs])  # (K, B, 24)
        stay = None if outs[0].stay is None else torch.stack([out.stay for out in outs])  # (K, B, stay bands)
        return Output(log_probs, gate, attention, each, distance, outs[0].bands, arrival, stay)


def mean_probability(each: torch.Tensor) -> torch.Tensor:
    """(K, B, V + S) members' log-probabilities -> (B, V + S) the log of their mean probability: an ensemble's."""
    return torch.logsumexp(each, dim=0) - math.log(each.shape[0])


def networks(model: nn.Module) -> list[nn.Module]:
    """The networks a model is made of: an Ensemble's members, else the model itself (gradient clipping and
    the plots of learned biases take them one at a time)."""
    return list(model.members) if isinstance(model, Ensemble) else [model]


def build_model(cfg: ModelConfig) -> nn.Module:
    if cfg.members > 1:
        return Ensemble(cfg)
    return LSTMPointerGenerator(cfg) if cfg.variant == "lstm-pg" else PointerGeneratorTransformer(cfg)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

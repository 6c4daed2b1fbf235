"""Inference of a transformer model or ensemble in one batched pass: every member's weights stacked along a leading
K axis, so that each step is one op over (K, B, ...) where running the members one by one takes K ops, and none
of nn.TransformerEncoder's per-call checks. It computes what PointerGeneratorTransformer.forward computes in eval
mode (no dropout), member by member; tests/pgt/network/test_stacked.py holds the two equal for every switch of the model.

    StackedTransformer.of(model)  # a PointerGeneratorTransformer or an Ensemble of them; None for lstm-pg
    for_inference(model)          # what serving and `pgt predict` run: transformers stacked, the LSTM model as it is

A request of one person costs about one network's pass plus a tenth per further member, where the members one by
one cost a whole pass each; and with what eval mode lets it fold (the embedding's projection, side-by-side tables),
one network stacked runs in fewer ops than nn.TransformerEncoder's fused eval path (benchmarks/predict.py).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from pgt.network.model import (
    EPS,
    Output,
    PointerGeneratorTransformer,
    mean_probability,
    networks,
    positions_from_end,
)
from pgt.network.places import distance_bands, usual_places
from pgt.network.pointer import visit_relations
from pgt.network.vocabulary import extended_ids, visit_ids


def _linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(K, ..., n) x (K, n, m) transposed weights + (K, 1, m) biases -> (K, ..., m): member k's linear layer on
    member k's x."""
    shape = x.shape
    y = torch.baddbmm(bias, x.reshape(shape[0], -1, shape[-1]), weight_t)
    return y.view(*shape[:-1], weight_t.shape[-1])


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Member k's LayerNorm on (K, ..., d); weight and bias (K, d)."""
    view = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    return F.layer_norm(x, x.shape[-1:], eps=eps) * weight.view(view) + bias.view(view)


def _lookup(table: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Member k's rows of a (K * N, d) table of K stacked (N, d) tables (offsets: (K,) first rows) at (B, ...)
    ids -> (K, B, ..., d)."""
    return F.embedding(ids.unsqueeze(0) + offsets.view((-1,) + (1,) * ids.dim()), table)


class StackedTransformer(nn.Module):
    """The members of an ensemble (or one network) as stacked tensors, for inference. Call it like the model.

    Besides stacking, it folds what eval mode makes constant: the visit embedding's projection into its tables
    (one lookup and a sum instead of eight lookups, a concatenation and a matmul), and the tables looked up with the
    same ids side by side (the relation inputs; the pointer's three biases) into one lookup each."""

    def __init__(self, model: nn.Module):
        super().__init__()
        if not self.stackable(model):
            raise ValueError("StackedTransformer runs PointerGeneratorTransformer members only")
        nets = networks(model)
        self.cfg = model.cfg
        self.ensemble = len(nets) > 1
        first = nets[0]
        named = [dict(net.named_parameters()) for net in nets]
        training_tasks = ("distance_head.", "arrival_head.", "stay_head.")  # heads a prediction never reads
        params = {name: torch.stack([each[name].detach() for each in named])  # (K, ...) each
                  for name in named[0] if not name.startswith(training_tasks)}
        self.slot_rows = first.embed.slot.num_embeddings if first.embed.slot is not None else 0
        self.features = fold_embedding(params, first)  # feature -> its first row in "embed.folded"
        self.starts = {}  # group -> the first row of each of its tables, where ids are looked up side by side
        for group, names in GROUPS.items():
            names = [n for n in names if n in params]
            if names:
                self.starts[group] = list(itertools.accumulate([params[n].shape[1] for n in names[:-1]], initial=0))
                params[group] = torch.cat([params.pop(n) for n in names], dim=1)  # (K, rows of all, width)
        linear = {name for name, module in first.named_modules() if isinstance(module, nn.Linear)}
        for name in [n for n in params if n.rsplit(".", 1)[0] in linear or n.endswith(("in_proj_weight", "in_proj_bias"))]:
            value = params[name]  # batched matmul operands: weights (K, n, m), biases (K, 1, m)
            params[name] = value.transpose(1, 2).contiguous() if value.dim() == 3 else value.unsqueeze(1)
        self.rows = {}  # table -> rows per member
        for name in [n for n in params if n == FOLDED or n in GROUPS]:  # (K * N, width): one lookup for every member
            self.rows[name] = params[name].shape[1]
            params[name] = params[name].reshape(len(nets) * self.rows[name], -1)
            self.register_buffer(f"offsets__{name.replace('.', '__')}", torch.arange(len(nets)) * self.rows[name],
                                 persistent=False)  # the first row of each member's table
        self.weights = nn.ParameterDict({name.replace(".", "__"): nn.Parameter(value, requires_grad=False)
                                         for name, value in params.items()})
        self.register_buffer("pe", first.pe.clone(), persistent=False)
        if self.cfg.place_distance:  # every member holds the data's coordinates: the first's serve them all
            self.register_buffer("place_coords", first.place_coords.clone(), persistent=False)
            self.register_buffer("distance_edges", first.distance_edges.clone(), persistent=False)
        if self.cfg.day_gaps > 1:  # the same data's prior in every member (daygap.live_log_probs reads it)
            self.register_buffer("day_gap_prior", first.day_gap_prior.clone(), persistent=False)
        self.eps = [(block.norm1.eps, block.norm2.eps) for block in first.encoder.layers]
        self.embed_eps = first.embed.norm.eps
        self.layers = len(first.encoder.layers)
        self.nhead = first.encoder.layers[0].self_attn.num_heads
        self._resolve()

    @staticmethod
    def stackable(model: nn.Module) -> bool:
        """Whether every network of the model is a transformer without a memory (the LSTM model, and the memory's
        second pointer, are not stacked: such a model runs its own pass)."""
        return (all(isinstance(net, PointerGeneratorTransformer) for net in networks(model))
                and not model.cfg.memory_size)

    @classmethod
    def of(cls, model: nn.Module) -> StackedTransformer | None:
        """The stacked form of a transformer model or ensemble; None where a member is not a transformer."""
        return cls(model).eval() if cls.stackable(model) else None

    def _resolve(self) -> None:
        """The weights and offsets in plain dicts by name, for the pass (rebuilt whenever the module moves)."""
        self.w = {name.replace("__", "."): value for name, value in self.weights.items()}
        self.offsets = {name: getattr(self, f"offsets__{name.replace('.', '__')}") for name in self.rows}

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        if hasattr(self, "w"):
            self._resolve()
        return module

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Each member's rows of table `name` at (B, ...) ids: (K, B, ..., width)."""
        return _lookup(self.w[name], self.offsets[name], ids)

    def lookup_sum(self, group: str, *ids: torch.Tensor) -> torch.Tensor:
        """The sum of the group's tables, each at its (B, T) ids: (K, B, T, width)."""
        stacked = torch.stack([each + start for each, start in zip(ids, self.starts[group])], dim=-1)  # (B, T, n)
        return self.lookup(group, stacked).sum(dim=3)

    def embed(self, locations, users, times, weekdays, recency, durations, pos_end, slots) -> torch.Tensor:
        """VisitEmbedding.forward, every member at once, from the folded table: (K, B, T, d)."""
        T, at = locations.shape[1], self.features
        ids = [locations + at["location"], (users + at["user"]).unsqueeze(1).expand(-1, T), times + at["time"],
               weekdays + at["weekday"], recency + at["recency"], durations + at["duration"],
               pos_end + at["pos_from_end"]]
        if "slot" in at and slots is not None:
            ids.append(slots.clamp_max(self.slot_rows - 1) + at["slot"])
        if "previous" in at:  # the location (and its slot) of the visit before; none before the first
            ids.append(F.pad(locations[:, :-1] + at["previous"], (1, 0), value=at["zero"]))
            if "previous_slot" in at and slots is not None:
                ids.append(F.pad(slots[:, :-1].clamp_max(self.slot_rows - 1) + at["previous_slot"], (1, 0),
                                 value=at["zero"]))
        x = self.lookup(FOLDED, torch.stack(ids, dim=-1)).sum(dim=3) + self.w["embed.proj.bias"].unsqueeze(1)
        return _layer_norm(x, self.w["embed.norm.weight"], self.w["embed.norm.bias"], self.embed_eps)

    def encoder_layer(self, i: int, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One pre-LN TransformerEncoderLayer (gelu) on (K, B, T, d); mask (K * B, 1, 1, T) is -inf on padding."""
        K, B, T, d = x.shape
        w, p, (eps1, eps2) = self.w, f"encoder.layers.{i}.", self.eps[i]
        h = _layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"], eps1)
        qkv = _linear(h, w[p + "self_attn.in_proj_weight"], w[p + "self_attn.in_proj_bias"])  # (K, B, T, 3d)
        q, k, v = qkv.view(K * B, T, 3, self.nhead, d // self.nhead).permute(2, 0, 3, 1, 4)  # (K * B, H, T, d/H) each
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (K * B, H, T, d/H)
        attended = attended.transpose(1, 2).reshape(K, B, T, d)
        x = x + _linear(attended, w[p + "self_attn.out_proj.weight"], w[p + "self_attn.out_proj.bias"])
        h = _layer_norm(x, w[p + "norm2.weight"], w[p + "norm2.bias"], eps2)
        h = F.gelu(_linear(h, w[p + "linear1.weight"], w[p + "linear1.bias"]))
        return x + _linear(h, w[p + "linear2.weight"], w[p + "linear2.bias"])

    def forward(self, locations, users, times, weekdays, recency, durations, slots=None) -> Output:
        cfg, w = self.cfg, self.w
        B, T = locations.shape
        lengths, pos_end = positions_from_end(locations)  # (B,), (B, T)
        pad = pos_end == 0  # (B, T)
        h = self.embed(locations, users, times, weekdays, recency, durations, pos_end, slots)  # (K, B, T, d)
        if cfg.visit_relations:
            relation, clock = visit_relations(locations, slots, times, weekdays, recency, durations, lengths, cfg)
            if cfg.relation_inputs:
                h = h + self.lookup_sum("relation_inputs", relation, clock)
        h = h + self.pe[:T]
        K = h.shape[0]
        mask = torch.where(pad, float("-inf"), 0.0).to(h.dtype)[:, None, None].repeat(K, 1, 1, 1)  # (K * B, 1, 1, T)
        for i in range(self.layers):
            h = self.encoder_layer(i, h, mask)
        c = h[:, torch.arange(B, device=h.device), lengths - 1]  # (K, B, d)
        if cfg.variant == "mhsa":
            gate = torch.zeros(K, B, device=h.device)
        elif cfg.variant == "pointer":
            gate = torch.ones(K, B, device=h.device)
        else:
            hidden = F.gelu(_linear(c, w["gate.0.weight"], w["gate.0.bias"]))
            gate = torch.sigmoid(_linear(hidden, w["gate.2.weight"], w["gate.2.bias"])).squeeze(-1)  # (K, B)
        query = _linear(c, w["query.weight"], w["query.bias"])  # (K, B, d)
        key = _linear(h, w["key.weight"], w["key.bias"])  # (K, B, T, d)
        scores = torch.einsum("kbd,kbtd->kbt", query, key) / math.sqrt(cfg.d_model)
        biases = (pos_end, relation, clock) if cfg.visit_relations else (pos_end,)
        if cfg.usual_places:  # a stacked model has no memory: every visit that is not padding is the window's
            ids = visit_ids(locations, slots if cfg.unseen_slots else None, cfg.num_locations)
            biases = (*biases, usual_places(ids, times, ~pad, cfg.time_slots))
        scores = scores + self.lookup_sum("pointer_bias", *biases).squeeze(-1)  # (K, B, T)
        attention = torch.softmax(scores.masked_fill(pad, float("-inf")), dim=-1)  # (K, B, T)
        logits = _linear(c, w["generator.weight"], w["generator.bias"])  # (K, B, V)
        if cfg.place_distance:
            current = locations.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)  # (B,)
            logits = logits + w["distance_bias"][:, distance_bands(self.place_coords, self.distance_edges, current)]
        p_gen = torch.softmax(logits, dim=-1)  # (K, B, V)
        ids, width = extended_ids(locations, slots if cfg.unseen_slots else None, cfg.num_locations)  # (B, T)
        p_ptr = torch.zeros(K, B, width, dtype=attention.dtype, device=attention.device)
        p_ptr = p_ptr.scatter_add(2, ids.expand(K, -1, -1), attention)  # (K, B, V + S)
        g = gate.unsqueeze(-1)
        each = torch.log(g * p_ptr + (1 - g) * F.pad(p_gen, (0, width - p_gen.shape[-1])) + EPS)  # (K, B, V + S)
        if not self.ensemble:
            return Output(each[0], gate[0], attention[0])
        return Output(mean_probability(each), gate.mean(0), attention.mean(0), each)


FOLDED = "embed.folded"  # the visit embedding's tables, projected and side by side (fold_embedding)
GROUPS = {"relation_inputs": ("relation_inputs.0.weight", "relation_inputs.1.weight"),  # each looked up as one table
          "pointer_bias": ("position_bias", "relation_bias", "clock_bias", "usual_bias")}


def fold_embedding(params: dict, first: PointerGeneratorTransformer) -> dict[str, int]:
    """VisitEmbedding's projection folded into its tables, for eval: proj(cat(parts)) is the sum over the parts of
    each part's table rows times its block of the projection's columns, plus the bias. Each table becomes a table
    of projected rows (N, d); one lookup of a visit's ids in their concatenation, summed, is the projection. The
    (K, R, d) concatenation, ending in a row of zeros (the previous visit of a history's first), replaces the
    embedding's tables in `params` as FOLDED. Returns each feature's first row in it."""
    embed, d, q = first.embed, first.cfg.d_model, first.cfg.d_model // 4
    parts = [("location", d), ("user", d), ("time", q), ("weekday", q), ("recency", q), ("duration", q),
             ("pos_from_end", q)] + ([("previous", d)] if embed.previous else [])
    weight, block, column = params["embed.proj.weight"], {}, 0  # weight (K, d, inputs): parts in this order
    for part, width in parts:
        block[part], column = weight[:, :, column:column + width], column + width  # (K, d, width)
    # (feature, its table, the part it feeds): a slot adds to its visit's location, and so to the next's previous
    features = [(part, part, part) for part, _ in parts if part != "previous"]
    if embed.slot is not None:
        features.append(("slot", "slot", "location"))
    if embed.previous:
        features.append(("previous", "location", "previous"))
        if embed.slot is not None:
            features.append(("previous_slot", "slot", "previous"))
    tables, first_row, row = [], {}, 0
    for feature, table, part in features:
        tables.append(torch.einsum("kni,kdi->knd", params[f"embed.{table}.weight"], block[part]))  # (K, N, d)
        first_row[feature], row = row, row + tables[-1].shape[1]
    first_row["zero"] = row
    tables.append(torch.zeros_like(tables[0][:, :1]))
    for name in [n for n in params if n.startswith("embed.") and not n.startswith(("embed.norm.", "embed.proj.bias"))]:
        del params[name]
    params[FOLDED] = torch.cat(tables, dim=1)  # (K, R, d)
    return first_row


def for_inference(model: nn.Module) -> nn.Module:
    """The model in its fastest equal form for inference, in eval mode: a transformer or an ensemble of them stacked
    into one batched pass (StackedTransformer), the LSTM model as it is."""
    stacked = StackedTransformer.of(model)
    return (stacked if stacked is not None else model).eval()

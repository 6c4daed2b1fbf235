"""Inference of a transformer model or ensemble in one batched pass: every member's weights stacked along a leading
K axis, so that each step is one op over (K, B, ...) where running the members one by one takes K ops, and none
of nn.TransformerEncoder's per-call checks. It computes what PointerGeneratorTransformer.forward computes in eval
mode (no dropout), member by member; tests/pgt/test_stacked.py holds the two equal for every switch of the model.

    StackedTransformer.of(model)  # a PointerGeneratorTransformer or an Ensemble of them; None for lstm-pg
    for_inference(model)          # what serving and `pgt predict` run: an ensemble stacked, else the model

For one network the stacked pass is no faster than nn.TransformerEncoder's fused eval path, so only ensembles take
it: a request of one person then costs about one network's pass plus a tenth per further member, where the members
one by one cost a whole pass each (benchmarks/predict.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from pgt.model import (
    EPS,
    Output,
    PointerGeneratorTransformer,
    mean_probability,
    networks,
    positions_from_end,
    visit_relations,
)
from pgt.vocabulary import extended_ids


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
    """The members of an ensemble (or one network) as stacked tensors, for inference. Call it like the model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        if not self.stackable(model):
            raise ValueError("StackedTransformer runs PointerGeneratorTransformer members only")
        nets = networks(model)
        self.cfg = model.cfg
        self.ensemble = len(nets) > 1
        first = nets[0]
        named = [dict(net.named_parameters()) for net in nets]
        params = {name: torch.stack([each[name].detach() for each in named]) for name in named[0]}  # (K, ...) each
        linear = {name for name, module in first.named_modules() if isinstance(module, nn.Linear)}
        for name in [n for n in params if n.rsplit(".", 1)[0] in linear or n.endswith(("in_proj_weight", "in_proj_bias"))]:
            value = params[name]  # batched matmul operands: weights (K, n, m), biases (K, 1, m)
            params[name] = value.transpose(1, 2).contiguous() if value.dim() == 3 else value.unsqueeze(1)
        tables = {f"{name}.weight" for name, module in first.named_modules() if isinstance(module, nn.Embedding)}
        tables |= {"position_bias", "relation_bias", "clock_bias"}
        for name in [n for n in params if n in tables]:  # (K * N, d): one embedding lookup for every member
            params[name] = params[name].reshape(len(nets) * params[name].shape[1], -1)
        self.rows = {name: first.get_parameter(name).shape[0] for name in params if name in tables}  # N of each
        for name, rows in self.rows.items():  # the first row of each member's table
            self.register_buffer(f"offsets__{name.replace('.', '__')}", torch.arange(len(nets)) * rows, persistent=False)
        self.weights = nn.ParameterDict({name.replace(".", "__"): nn.Parameter(value, requires_grad=False)
                                         for name, value in params.items()})
        self.register_buffer("pe", first.pe.clone(), persistent=False)
        self.eps = [(block.norm1.eps, block.norm2.eps) for block in first.encoder.layers]
        self.embed_eps = first.embed.norm.eps
        self.layers = len(first.encoder.layers)
        self.nhead = first.encoder.layers[0].self_attn.num_heads

    @staticmethod
    def stackable(model: nn.Module) -> bool:
        """Whether every network of the model is a transformer (the LSTM model is not stacked)."""
        return all(isinstance(net, PointerGeneratorTransformer) for net in networks(model))

    @classmethod
    def of(cls, model: nn.Module) -> StackedTransformer | None:
        """The stacked form of a transformer model or ensemble; None where a member is not a transformer."""
        return cls(model).eval() if cls.stackable(model) else None

    def w(self, name: str) -> torch.Tensor:
        return self.weights[name.replace(".", "__")]

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Each member's table `name` at (B, ...) ids: (K, B, ..., d), or (K, B, ...) for a bias vector."""
        found = _lookup(self.w(name), getattr(self, f"offsets__{name.replace('.', '__')}"), ids)
        return found if name.endswith(".weight") else found.squeeze(-1)

    def has(self, name: str) -> bool:
        return name.replace(".", "__") in self.weights

    def embed(self, locations, users, times, weekdays, recency, durations, pos_end, slots) -> torch.Tensor:
        """VisitEmbedding.forward, every member at once: (K, B, T, d)."""
        T, cfg = locations.shape[1], self.cfg
        location = self.lookup("embed.location.weight", locations)  # (K, B, T, d)
        if self.has("embed.slot.weight") and slots is not None:
            location = location + self.lookup("embed.slot.weight", slots.clamp_max(self.rows["embed.slot.weight"] - 1))
        parts = [location, self.lookup("embed.user.weight", users).unsqueeze(2).expand(-1, -1, T, -1),
                 self.lookup("embed.time.weight", times), self.lookup("embed.weekday.weight", weekdays),
                 self.lookup("embed.recency.weight", recency), self.lookup("embed.duration.weight", durations),
                 self.lookup("embed.pos_from_end.weight", pos_end)]
        if cfg.previous_location:
            parts.append(F.pad(location[:, :, :-1], (0, 0, 1, 0)))
        x = _linear(torch.cat(parts, dim=-1), self.w("embed.proj.weight"), self.w("embed.proj.bias"))
        return _layer_norm(x, self.w("embed.norm.weight"), self.w("embed.norm.bias"), self.embed_eps)

    def encoder_layer(self, i: int, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One pre-LN TransformerEncoderLayer (gelu) on (K, B, T, d); mask (K * B, 1, 1, T) is -inf on padding."""
        K, B, T, d = x.shape
        p, (eps1, eps2) = f"encoder.layers.{i}.", self.eps[i]
        h = _layer_norm(x, self.w(p + "norm1.weight"), self.w(p + "norm1.bias"), eps1)
        qkv = _linear(h, self.w(p + "self_attn.in_proj_weight"), self.w(p + "self_attn.in_proj_bias"))  # (K, B, T, 3d)
        q, k, v = qkv.view(K * B, T, 3, self.nhead, d // self.nhead).permute(2, 0, 3, 1, 4)  # (K * B, H, T, d/H) each
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (K * B, H, T, d/H)
        attended = attended.transpose(1, 2).reshape(K, B, T, d)
        x = x + _linear(attended, self.w(p + "self_attn.out_proj.weight"), self.w(p + "self_attn.out_proj.bias"))
        h = _layer_norm(x, self.w(p + "norm2.weight"), self.w(p + "norm2.bias"), eps2)
        h = F.gelu(_linear(h, self.w(p + "linear1.weight"), self.w(p + "linear1.bias")))
        return x + _linear(h, self.w(p + "linear2.weight"), self.w(p + "linear2.bias"))

    def forward(self, locations, users, times, weekdays, recency, durations, slots=None) -> Output:
        cfg = self.cfg
        B, T = locations.shape
        lengths, pos_end = positions_from_end(locations)  # (B,), (B, T)
        pad = pos_end == 0  # (B, T)
        x = self.embed(locations, users, times, weekdays, recency, durations, pos_end, slots)  # (K, B, T, d)
        if cfg.visit_relations:
            relation, clock = visit_relations(locations, slots, times, weekdays, recency, durations, lengths, cfg)
            if cfg.relation_inputs:
                x = x + self.lookup("relation_inputs.0.weight", relation) + self.lookup("relation_inputs.1.weight", clock)
        h = x + self.pe[:T]
        K = h.shape[0]
        mask = torch.zeros(B, 1, 1, T, dtype=h.dtype, device=h.device).masked_fill(pad[:, None, None], float("-inf"))
        mask = mask.repeat(K, 1, 1, 1)  # (K * B, 1, 1, T): no attention to padding
        for i in range(self.layers):
            h = self.encoder_layer(i, h, mask)
        c = h[:, torch.arange(B, device=h.device), lengths - 1]  # (K, B, d)
        if cfg.variant == "mhsa":
            gate = torch.zeros(K, B, device=h.device)
        elif cfg.variant == "pointer":
            gate = torch.ones(K, B, device=h.device)
        else:
            hidden = F.gelu(_linear(c, self.w("gate.0.weight"), self.w("gate.0.bias")))
            gate = torch.sigmoid(_linear(hidden, self.w("gate.2.weight"), self.w("gate.2.bias"))).squeeze(-1)  # (K, B)
        query = _linear(c, self.w("query.weight"), self.w("query.bias"))  # (K, B, d)
        key = _linear(h, self.w("key.weight"), self.w("key.bias"))  # (K, B, T, d)
        scores = torch.einsum("kbd,kbtd->kbt", query, key) / math.sqrt(cfg.d_model)
        scores = scores + self.lookup("position_bias", pos_end)  # (K, B, T)
        if cfg.visit_relations:
            scores = scores + self.lookup("relation_bias", relation) + self.lookup("clock_bias", clock)
        attention = torch.softmax(scores.masked_fill(pad, float("-inf")), dim=-1)  # (K, B, T)
        p_gen = torch.softmax(_linear(c, self.w("generator.weight"), self.w("generator.bias")), dim=-1)  # (K, B, V)
        ids, width = extended_ids(locations, slots if cfg.unseen_slots else None, cfg.num_locations)  # (B, T)
        p_ptr = torch.zeros(K, B, width, dtype=attention.dtype, device=attention.device)
        p_ptr = p_ptr.scatter_add(2, ids.expand(K, -1, -1), attention)  # (K, B, V + S)
        g = gate.unsqueeze(-1)
        each = torch.log(g * p_ptr + (1 - g) * F.pad(p_gen, (0, width - p_gen.shape[-1])) + EPS)  # (K, B, V + S)
        if not self.ensemble:
            return Output(each[0], gate[0], attention[0])
        return Output(mean_probability(each), gate.mean(0), attention.mean(0), each)


def for_inference(model: nn.Module) -> nn.Module:
    """The model in its fastest equal form for inference, in eval mode: an Ensemble of transformers stacked into one
    batched pass (StackedTransformer), anything else as it is."""
    stacked = StackedTransformer.of(model) if len(networks(model)) > 1 else None
    return (stacked if stacked is not None else model).eval()

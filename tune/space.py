"""The search space of a sweep, declared once (RULES) and centred on the recipe the sweep starts from.

Each rule names a training setting and how far around the base recipe's value a trial may go: d_model, nhead
and dropout (the design card's), the learning rate, weight decay and layers, and, where the recipe uses them,
the new-place weight and the order of the visit relations. Every other setting stays the recipe's. The
feed-forward width keeps the recipe's ratio to d_model (the paper's 2 * d_model).

Optuna's TPE gets a define-by-run space: nhead is drawn from the divisors of the drawn d_model, under a name
per d_model (`nhead_d96`), as Optuna wants conditional parameters. Random search draws the same space with Ray
Tune's own samplers, nhead as a uniform number (`nhead_draw`) that picks among the divisors of the drawn d_model:
a `tune.sample_from` function would be left in a trial that Tune created but had not started when the sweep was
interrupted, as Ray's placeholder `("__fn_ph", id)`, and the resumed sweep would train and summarise it with that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from infra.errors import SettingsError

KINDS = ("choice", "int", "uniform", "log")  # a set of values, an integer range, a range, a log-scale range
HEADS = (1, 2, 4, 8)  # the head counts a trial may draw (those dividing its d_model)
NHEAD_DRAW = "nhead_draw"  # random search's draw in [0, 1) of nhead among the heads dividing d_model


@dataclass(frozen=True)
class Dimension:
    name: str  # the TrainConfig setting a trial replaces
    kind: str  # one of KINDS
    values: tuple  # the choices ("choice"), or (low, high)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SettingsError(f"{self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.values or (self.kind != "choice" and not (len(self.values) == 2 and self.values[0] <= self.values[1])):
            raise SettingsError(f"{self.name}: a {self.kind} dimension needs (low, high) with low <= high, got {self.values}")
        if self.kind == "log" and self.values[0] <= 0:
            raise SettingsError(f"{self.name}: a log range must be positive, got {self.values}")


def _widths(d: int) -> tuple[int, ...]:
    """d_model choices around d: half to three times (a sweep around 64 had good trials at its edge, 128), multiples
    of 4 that some head count divides."""
    return tuple(sorted({w for w in (d // 2, 3 * d // 4, d, 3 * d // 2, 2 * d, 3 * d) if w >= 16 and w % 4 == 0}))


# What a sweep searches, around the base recipe's settings (a flat TrainConfig dict): rules in one place.
RULES: tuple[Callable[[dict], Dimension | None], ...] = (
    lambda b: Dimension("d_model", "choice", _widths(b["d_model"])),
    lambda b: Dimension("nhead", "choice", HEADS),  # drawn among those dividing the drawn d_model
    lambda b: Dimension("num_layers", "int", (max(1, b["num_layers"] - 1), b["num_layers"] + 1)),
    lambda b: Dimension("dropout", "uniform", (round(max(0.0, b["dropout"] - 0.2), 6),
                                               round(min(0.6, b["dropout"] + 0.2), 6))),
    lambda b: Dimension("lr", "log", (b["lr"] / 3, b["lr"] * 3)),
    lambda b: Dimension("weight_decay", "log", (b["weight_decay"] / 4, b["weight_decay"] * 4)),
    # from no weight at all (validation found strict Acc@1 flat from 0 to 0.05) to 0.4 above the recipe's
    lambda b: Dimension("new_place_weight", "uniform", (round(max(0.0, b["new_place_weight"] - 0.4), 6),
                                                        round(b["new_place_weight"] + 0.4, 6))) if b["unseen_slots"] else None,
    lambda b: Dimension("relation_order", "choice", (1, 2)) if b["visit_relations"] else None,
    # a recipe that remembers: with fewer, as many, more remembered places, or none
    lambda b: Dimension("memory_size", "choice", tuple(sorted({0, b["memory_size"] // 2, b["memory_size"],
                                                                 2 * b["memory_size"]})))
    if b.get("memory_size") else None,
)


@dataclass(frozen=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]  # what a trial draws
    feedforward_ratio: float = 2.0  # dim_feedforward = ratio * d_model (the base recipe's ratio)

    def __post_init__(self) -> None:
        widths = self.dimension("d_model")
        if widths is not None:
            for d in widths.values:
                if d % 4 or not self.heads_for(d):
                    raise SettingsError(f"d_model {d} must be divisible by 4 and by one of the nhead choices "
                                        f"{self.head_choices}")

    @classmethod
    def around(cls, base: dict) -> SearchSpace:
        """The space of RULES centred on a base recipe's settings (a flat TrainConfig dict)."""
        dimensions = tuple(d for rule in RULES if (d := rule(base)) is not None)
        return cls(dimensions, feedforward_ratio=feedforward_ratio_of(base))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dimensions)

    def dimension(self, name: str) -> Dimension | None:
        return next((d for d in self.dimensions if d.name == name), None)

    @property
    def head_choices(self) -> tuple[int, ...]:
        heads = self.dimension("nhead")
        return tuple(heads.values) if heads is not None else HEADS

    def heads_for(self, d_model: int) -> list[int]:
        return [h for h in self.head_choices if d_model % h == 0]

    def optuna_space(self):
        """A define-by-run function for ray.tune.search.optuna.OptunaSearch (picklable: Tune saves the searcher)."""
        return functools.partial(_define, self)

    def random_space(self) -> dict:
        """A Ray Tune param_space for random search (the BasicVariantGenerator)."""
        from ray import tune

        samplers = {"choice": lambda d: tune.choice(list(d.values)), "int": lambda d: tune.randint(d.values[0], d.values[1] + 1),
                    "uniform": lambda d: tune.uniform(*d.values), "log": lambda d: tune.loguniform(*d.values)}
        space = {d.name: samplers[d.kind](d) for d in self.dimensions if d.name != "nhead"}
        if self.dimension("nhead") is not None:
            space[NHEAD_DRAW] = tune.uniform(0.0, 1.0)  # which of the drawn d_model's heads: resolve() picks it
        return space

    def resolve(self, config: dict) -> dict:
        """A trial's drawn config as TrainConfig settings (nhead_dNN -> nhead; the feed-forward width by ratio)."""
        hyper = {}
        for d in self.dimensions:
            if d.name == "nhead":
                continue
            value = config[d.name]
            hyper[d.name] = float(value) if d.kind in ("uniform", "log") else int(value) if d.kind == "int" else value
        if "d_model" in hyper:
            d = int(hyper["d_model"])
            hyper["d_model"] = d
            hyper["dim_feedforward"] = max(1, round(self.feedforward_ratio * d))
            if self.dimension("nhead") is not None:
                nhead = config.get("nhead", config.get(f"nhead_d{d}"))
                if nhead is None and NHEAD_DRAW in config:  # random search: a uniform pick of the dividing heads
                    heads = self.heads_for(d)
                    nhead = heads[min(int(float(config[NHEAD_DRAW]) * len(heads)), len(heads) - 1)] if heads else None
                if nhead is None or d % int(nhead):
                    raise ValueError(f"trial config {config} has no nhead dividing d_model {d}")
                hyper["nhead"] = int(nhead)
        return hyper

    def to_dict(self) -> dict:
        return {"dimensions": [{"name": d.name, "kind": d.kind, "values": list(d.values)} for d in self.dimensions],
                "feedforward_ratio": self.feedforward_ratio}

    @classmethod
    def from_dict(cls, values: dict) -> SearchSpace:
        return cls(tuple(Dimension(d["name"], d["kind"], tuple(d["values"])) for d in values["dimensions"]),
                   values.get("feedforward_ratio", 2.0))


def feedforward_ratio_of(base: dict) -> float:
    """The base recipe's feed-forward width over its d_model."""
    return base["dim_feedforward"] / base["d_model"] if base.get("d_model") else 2.0


def _define(space: SearchSpace, trial) -> None:
    for d in space.dimensions:
        if d.name == "nhead":
            width = trial.params.get("d_model")
            trial.suggest_categorical(f"nhead_d{width}", space.heads_for(width))
        elif d.kind == "choice":
            trial.suggest_categorical(d.name, list(d.values))
        elif d.kind == "int":
            trial.suggest_int(d.name, *d.values)
        else:
            trial.suggest_float(d.name, *d.values, log=d.kind == "log")

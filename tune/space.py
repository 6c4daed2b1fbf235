"""The search space of a sweep: d_model, nhead (only values that divide d_model), dropout, learning rate,
weight decay and layers. The feed-forward width follows the paper's rule, 2 * d_model.

Optuna's TPE gets a define-by-run space: nhead is drawn from the divisors of the drawn d_model, under a
name per d_model (`nhead_d96`), as Optuna wants conditional parameters. Random search draws the same
space with Ray Tune's own samplers.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass


@dataclass
class SearchSpace:
    d_model: tuple[int, ...] = (32, 64, 96, 128)  # model widths (each divisible by 4, for the d/4 embeddings)
    nhead: tuple[int, ...] = (1, 2, 4, 8)  # attention heads; a trial only draws those dividing its d_model
    num_layers: tuple[int, ...] = (1, 2, 3)  # encoder layers
    dropout: tuple[float, float] = (0.0, 0.4)  # uniform range
    lr: tuple[float, float] = (1e-4, 2e-3)  # log-uniform range of the peak learning rate
    weight_decay: tuple[float, float] = (1e-3, 1e-1)  # log-uniform range

    def __post_init__(self) -> None:
        for d in self.d_model:
            if d % 4 or not self.heads_for(d):
                raise ValueError(f"d_model {d} must be divisible by 4 and by one of the nhead choices {self.nhead}")
        for name in ("dropout", "lr", "weight_decay"):
            low, high = getattr(self, name)
            if not low <= high:
                raise ValueError(f"{name} range must be (low, high) with low <= high, got {(low, high)}")

    def heads_for(self, d_model: int) -> list[int]:
        return [h for h in self.nhead if d_model % h == 0]

    def optuna_space(self):
        """A define-by-run function for ray.tune.search.optuna.OptunaSearch (picklable: Tune saves the searcher)."""
        return functools.partial(_define, self)

    def random_space(self) -> dict:
        """A Ray Tune param_space for random search (the BasicVariantGenerator)."""
        from ray import tune

        return {
            "d_model": tune.choice(list(self.d_model)),
            "nhead": tune.sample_from(lambda spec: random.choice(self.heads_for(spec.config["d_model"]))),
            "num_layers": tune.choice(list(self.num_layers)),
            "dropout": tune.uniform(*self.dropout),
            "lr": tune.loguniform(*self.lr),
            "weight_decay": tune.loguniform(*self.weight_decay),
        }

    @staticmethod
    def resolve(config: dict) -> dict:
        """A trial's drawn config as TrainConfig settings (nhead_dNN -> nhead, feed-forward 2 * d_model)."""
        d = int(config["d_model"])
        nhead = config.get("nhead", config.get(f"nhead_d{d}"))
        if nhead is None or d % int(nhead):
            raise ValueError(f"trial config {config} has no nhead dividing d_model {d}")
        return {"d_model": d, "nhead": int(nhead), "num_layers": int(config["num_layers"]),
                "dim_feedforward": 2 * d, "dropout": float(config["dropout"]), "lr": float(config["lr"]),
                "weight_decay": float(config["weight_decay"])}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> SearchSpace:
        return cls(**{k: tuple(v) for k, v in values.items()})


def _define(space: SearchSpace, trial) -> None:
    d = trial.suggest_categorical("d_model", list(space.d_model))
    trial.suggest_categorical(f"nhead_d{d}", space.heads_for(d))
    trial.suggest_int("num_layers", min(space.num_layers), max(space.num_layers))
    trial.suggest_float("dropout", *space.dropout)
    trial.suggest_float("lr", *space.lr, log=True)
    trial.suggest_float("weight_decay", *space.weight_decay, log=True)


SEARCHED = ("d_model", "nhead", "num_layers", "dropout", "lr", "weight_decay")

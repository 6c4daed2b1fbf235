"""SweepConfig: one Ray Tune sweep, every default once; and the registries `pgt tune` offers. No Ray import."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from pgt.config import TrainConfig
from tune.space import SearchSpace

OBJECTIVES = ("strict_acc@1", "acc@1")  # validation scores a sweep may maximise (pgt.metrics: strict, protocol)
SEARCH_ALGS = ("optuna", "random")  # how trials are proposed: Optuna's TPE, or at random


@dataclass
class SweepConfig:
    data_dir: str  # a `pgt preprocess` folder
    out_dir: str  # tune.json, sweep.json, trials/<id>/ and the Tune experiment under ray/
    trials: int = 20  # configurations to try
    epochs: int = 30  # at most, per trial (ASHA's max_t)
    max_concurrent: int = 2  # trials at once
    workers_per_trial: int = 1  # 1: train in the trial's process; W > 1: a TorchTrainer of W workers per trial
    cpus_per_trial: float = 1.0  # Ray CPUs a one-worker trial reserves (its torch threads)
    cpus_per_worker: float = 1.0  # with W > 1: Ray CPUs per training worker (the trial's driver takes 0.5 more)
    gpus_per_worker: float = 0.0  # GPUs per training worker (per trial when W == 1)
    search: str = "optuna"  # one of SEARCH_ALGS: "optuna" (TPE) or "random"
    grace_period: int = 3  # ASHA: epochs every trial gets before it may be stopped
    reduction_factor: int = 2  # ASHA: keep the best 1/reduction_factor at each rung
    seed: int = 0  # the searcher's seed and every trial's training seed
    objective: str = "strict_acc@1"  # the validation score ASHA, the searcher and the best trial follow (OBJECTIVES)
    select_on: str = "strict_acc@1"  # training's early stopping inside a trial (see TrainConfig)
    unseen_slots: bool | None = None  # trials point at unseen places of the history; None: the recipe's
    simulate_unseen: bool | None = None  # trials train on samples that show unseen locations; None: the recipe's
    recipe: dict = field(default_factory=dict)  # the TrainConfig fields every trial starts from (a recipe's)
    recipe_name: str = "paper"  # where they came from: a name in pgt.config.RECIPES or a recipe file
    max_failures: int = 2  # a crashed trial restarts from its last reported checkpoint this many times (-1: no limit)
    space: SearchSpace = field(default_factory=SearchSpace)

    def __post_init__(self) -> None:
        if isinstance(self.space, dict):
            self.space = SearchSpace.from_dict(self.space)
        if self.search not in SEARCH_ALGS:
            raise ValueError(f"search must be one of {', '.join(SEARCH_ALGS)}, got {self.search!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if min(self.trials, self.epochs, self.max_concurrent, self.workers_per_trial) < 1:
            raise ValueError("trials, epochs, max_concurrent and workers_per_trial must be at least 1")
        self.train_config({}, Path(self.out_dir))  # a recipe that cannot train is refused now, not in every trial

    @property
    def metric(self) -> str:
        """The name of the objective among the metrics each epoch reports (distributed.flat_metrics)."""
        return f"validation_{self.objective}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> SweepConfig:
        return cls(**values)

    def train_config(self, hyper: dict, out_dir: Path) -> TrainConfig:
        """A trial's TrainConfig: the recipe's settings, the sweep's own (epochs, seed, selection, threads, the
        switches given), and the drawn hyper-parameters over them; nothing else of the recipe is replaced."""
        threads = max(1, int(self.cpus_per_trial)) if self.workers_per_trial == 1 else 0
        switches = {name: getattr(self, name) for name in ("unseen_slots", "simulate_unseen")
                    if getattr(self, name) is not None}
        return TrainConfig.from_recipe(self.recipe, data_dir=self.data_dir, out_dir=str(out_dir), epochs=self.epochs,
                                       seed=self.seed, select_on=self.select_on, threads=threads,
                                       **switches, **hyper)

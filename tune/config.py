"""SweepConfig: one Ray Tune sweep, every default once; and the registries `pgt tune` offers. No Ray import."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from infra.settings import check_settings, setting
from pgt.config import SELECT_ON, TrainConfig
from tune.space import SearchSpace

OBJECTIVES = ("strict_acc@1", "acc@1")  # validation scores a sweep may maximise (pgt.data.metrics: strict, protocol)
SEARCH_ALGS = ("optuna", "random")  # how trials are proposed: Optuna's TPE, or at random
# what a trial never takes from its recipe: a trial is scored on validation, so it must not learn from it
TRIAL_FIXED = {"refit": False, "train_on": "train"}


@dataclass
class SweepConfig:
    data_dir: str  # a `pgt preprocess` folder
    out_dir: str  # tune.json, sweep.json, trials/<id>/ and the Tune experiment under ray/
    trials: int = setting(20, "Configurations to try.", low=1, high=1 << 20)
    epochs: int = setting(30, "At most this many epochs per trial (ASHA's max_t; it may stop a trial sooner).",
                          low=1, high=1 << 20)
    max_concurrent: int = setting(2, "Trials at once.", low=1, high=4096)
    reuse_actors: bool = setting(True, "Start a trial in the process of a finished one (Tune's reuse_actors): no new "
                                       "Python, imports or CUDA context per trial. Off: a fresh process per trial.")
    workers_per_trial: int = setting(1, "1 trains in the trial's process; W > 1 runs a TorchTrainer of W workers per "
                                        "trial.", low=1, high=4096)
    cpus_per_trial: float = setting(1.0, "Ray CPUs a one-worker trial reserves (its torch threads).",
                                    low=0.0, low_open=True)
    cpus_per_worker: float = setting(1.0, "With W > 1: Ray CPUs per training worker (the trial's driver takes 0.5 "
                                          "more).", low=0.0, low_open=True)
    gpus_per_worker: float = setting(0.0, "GPUs per training worker, per trial when W == 1 (fractions share one).",
                                     low=0.0)
    search: str = setting("optuna", "How trials are proposed: optuna (TPE) or random.", choices=SEARCH_ALGS)
    grace_period: int = setting(3, "ASHA: epochs every trial gets before it may be stopped.", low=1, high=1 << 20)
    reduction_factor: int = setting(2, "ASHA: keep the best 1/reduction_factor at each rung.", low=2, high=64)
    seed: int = setting(0, "The searcher's seed and every trial's training seed.", low=0, high=2**31 - 1)
    objective: str = setting("strict_acc@1", "The validation score the sweep maximises and early stopping follows: "
                                             "strict_acc@1 (the exact place) or acc@1 (the protocol's).",
                             choices=OBJECTIVES)
    select_on: str = setting("strict_acc@1", "Training's early stopping inside a trial (TrainConfig's select_on).",
                             choices=SELECT_ON)
    recipe: dict = field(default_factory=dict)  # the TrainConfig settings every trial starts from (a recipe's)
    recipe_name: str = "paper"  # where they came from: a name in pgt.recipes.RECIPES or a recipe file
    time_budget_s: float | None = setting(None, "Stop the sweep after this many seconds, with as many trials as fit "
                                                "(those running are stopped; the best finished one wins); None: all "
                                                "trials.", low=0.0, low_open=True)
    max_failures: int = setting(2, "A crashed trial restarts from its last reported checkpoint this many times "
                                   "(-1: no limit).", low=-1, high=1 << 20)
    finalists: int = setting(3, "After the search, this many of the best trials (distinct configurations) and the "
                                "base recipe are trained again on seeds the search did not use; the best mean "
                                "validation objective wins, so the base recipe is beaten only on that evidence. 0: no "
                                "confirmation (the best trial wins on its one seed).", low=0, high=64)
    confirm_seeds: int = setting(3, "Seeds each finalist is trained on (seed + 1, seed + 2, ...), side by side in one "
                                    "run (TrainConfig.fused_seeds).", low=1, high=64)
    final: bool = setting(True, "After the search (and confirmation), train the winner's recipe once more on the "
                                "sweep's seed, as `pgt train --recipe-file` would: the sweep's model, scored once on "
                                "test, logged, and registered with --register. Off: the sweep ends with the winner's "
                                "recipe file; test is not read and no model is logged.")
    space: SearchSpace | None = None  # what trials draw; None: the space of tune.space.RULES around the recipe

    def __post_init__(self) -> None:
        if isinstance(self.space, dict):
            self.space = SearchSpace.from_dict(self.space)
        check_settings(self)
        self.train_config({}, Path(self.out_dir))  # a recipe that cannot train is refused now, not in a trial
        if self.space is None:
            self.space = SearchSpace.around(self.train_config({}, Path(self.out_dir)).to_dict())

    @property
    def metric(self) -> str:
        """The name of the objective among the metrics each epoch reports (pgt.training.ray_train.flat_metrics)."""
        return f"validation_{self.objective}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> SweepConfig:
        return cls(**values)

    def train_config(self, hyper: dict, out_dir: Path) -> TrainConfig:
        """A trial's TrainConfig: the recipe's settings, the sweep's own (epochs, seed, selection, threads), and the
        drawn hyper-parameters over them; nothing else of the recipe is replaced but TRIAL_FIXED (the winner's recipe
        file keeps the recipe's, for its training)."""
        threads = max(1, int(self.cpus_per_trial)) if self.workers_per_trial == 1 else 0
        return TrainConfig.from_recipe(self.recipe, data_dir=self.data_dir, out_dir=str(out_dir), epochs=self.epochs,
                                       seed=self.seed, select_on=self.select_on, threads=threads,
                                       **hyper, **TRIAL_FIXED)

    def confirmation_seeds(self) -> list[list[int]]:
        """The seeds after the search's (seed + 1, ..., seed + confirm_seeds), grouped by run: all in one run side by
        side (fused_seeds), or one run each where the recipe is an ensemble (its members are side by side already)."""
        seeds = list(range(self.seed + 1, self.seed + 1 + self.confirm_seeds))
        fused = self.train_config({}, Path(self.out_dir)).network.members == 1
        return [seeds] if fused else [[seed] for seed in seeds]

    def confirmation_config(self, hyper: dict, out_dir: Path, seeds: list[int]) -> TrainConfig:
        """A finalist's confirmation run on a group of confirmation_seeds: the trial's configuration, scored on
        validation only (test is read once, by the winner's final run)."""
        return dataclasses.replace(self.train_config(hyper, out_dir), seed=seeds[0], fused_seeds=len(seeds),
                                   evaluate_test=False)

    def base_hyper(self) -> dict:
        """The base recipe's values of the searched settings: the finalist that stands for where the sweep started."""
        base = self.train_config({}, Path(self.out_dir)).to_dict()
        return {name: base[name] for name in self.space.names}

"""The typed configs of the model, training and its launch, and the registries the `pgt` command and the
flows build their choices from. Every default lives here, once; nothing here imports torch, so the command
line can show them without loading it.

    ModelConfig   the network's shape and feature sizes (pgt.model builds it)
    TrainConfig   one training run (pgt.train runs it); a named recipe sets some fields (RECIPES)
    LaunchConfig  where it runs: this process or Ray Train workers (pgt.distributed launches it)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import yaml

DATA_ENGINES = ("memory", "ray")  # how Ray Train workers get the train split: loaded whole, or streamed by Ray Data


VARIANTS = ("pgt", "mhsa", "pointer", "lstm-pg")  # the neural models (pgt.model)


@dataclass
class ModelConfig:
    num_locations: int  # location vocabulary incl. 0 (padding) and 1 (unseen in train)
    num_users: int  # user vocabulary incl. 0 (padding)
    d_model: int = 64  # width d of embeddings and encoder
    nhead: int = 4  # attention heads; must divide d_model
    num_layers: int = 2  # transformer encoder layers (LSTM layers for lstm-pg)
    dim_feedforward: int = 128  # encoder feed-forward width (2d by default)
    dropout: float = 0.15  # dropout inside the encoder layers (and on the LSTM's inputs)
    max_len: int = 64  # longest history; longer ones keep their most recent max_len visits
    variant: str = "pgt"  # one of VARIANTS
    unseen_slots: bool = False  # extended vocabulary: the pointer points at per-sample slots of unseen places
    slot_identity: bool = True  # with unseen_slots: visits to the same unseen place share a learned slot embedding
    previous_location: bool = False  # each visit also embeds the location visited before it (its transition source)
    visit_relations: bool = False  # the pointer adds learned biases for each visit's relation to the last one
    # (pgt.model.visit_relations: it followed the current place, is the current place, starts near now in time of day)
    relation_inputs: bool = False  # with visit_relations: the encoder's inputs also embed those relations (d each)
    relation_order: int = 1  # with visit_relations: transitions from the current place (1) or from the last two (2)
    time_slots: int = 96  # time-of-day slot values (the manifest's vocab); tables get one more row for padding
    weekdays: int = 7  # weekday values
    recency_days: int = 8  # recency values: days 0 .. history_days before the target's day
    duration_buckets: int = 99  # duration bucket values

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.d_model % self.nhead or self.d_model % 4:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by nhead ({self.nhead}) and by 4")
        if self.num_locations < 3 or self.num_users < 2:
            raise ValueError(f"vocabularies too small: {self.num_locations} locations, {self.num_users} users")
        if self.visit_relations and self.variant not in ("pgt", "pointer"):
            raise ValueError(f"visit_relations biases the transformer's pointer: variant 'pgt' or 'pointer', "
                             f"got {self.variant!r}")
        if self.relation_order not in (1, 2):
            raise ValueError(f"relation_order must be 1 or 2, got {self.relation_order!r}")
        if self.relation_inputs and not self.visit_relations:
            raise ValueError("relation_inputs embeds the visit relations: it needs visit_relations")
        small = [name for name in ("time_slots", "weekdays", "recency_days", "duration_buckets") if getattr(self, name) < 1]
        if small:
            raise ValueError(f"feature tables need at least one value: {', '.join(small)}")


NEURAL_MODELS = VARIANTS  # the models trained by gradient descent
# the smallest vocabulary a model can be built for: TrainConfig checks its model settings against it when built,
# before any data is read (the real sizes come from the data's manifest)
SMALLEST_VOCAB = SimpleNamespace(locations=3, users=2, time_slots=1, weekdays=1, recency=1, durations=1)
BASELINES = ("markov", "most-frequent")
MODELS = NEURAL_MODELS + BASELINES

# Named training recipes: the TrainConfig fields each sets over the defaults, which are the paper's (SPEC §3.8).
RECIPES: dict[str, dict] = {
    "paper": {},
    # ours, chosen on GeoLife's validation split only (benchmarks/recipe_search.py): the extended vocabulary with
    # slot identity, train samples that show unseen places as later splits do, new-place targets at half weight,
    # each visit's relations to the last one in the encoder's inputs and the pointer's scores, more dropout, a
    # higher peak learning rate, and the best epoch by strict validation Acc@1
    "tuned": {"unseen_slots": True, "simulate_unseen": True, "new_place_weight": 0.5, "visit_relations": True,
              "relation_inputs": True, "dropout": 0.4, "lr": 1e-3, "select_on": "strict_acc@1"},
}


# validation scores that early stopping and the best epoch may follow; each is "higher is better" once signed
SELECT_ON = ("acc@1", "strict_acc@1", "loss")


def selection_score(validation: dict, select_on: str) -> float:
    """The validation score named by select_on, signed so that higher is better."""
    if select_on == "loss":
        return -validation["loss"]
    return validation["strict"]["acc@1"] if select_on == "strict_acc@1" else validation["acc@1"]


def recipe_settings(recipe: str) -> dict:
    """The TrainConfig fields a named recipe sets; ValueError for a name not in RECIPES."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    return dict(RECIPES[recipe])


RECIPE_FREE = ("data_dir", "out_dir", "resume")  # where and whether: what a run decides, never a recipe


def load_recipe_file(path) -> dict:
    """The TrainConfig fields of a recipe file: YAML (or JSON) mapping field names to values, as a sweep writes
    its winner. ValueError naming the file for anything that is not such a mapping or does not build a config."""
    path = Path(path)
    try:
        settings = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: unreadable recipe file ({' '.join(str(exc).split())[:160]})") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: a recipe file maps TrainConfig fields to values; found {type(settings).__name__}")
    settings = settings.get("train", settings)  # a sweep's winner nests them under `train`
    fixed = sorted(set(settings) & set(RECIPE_FREE))
    if fixed:
        raise ValueError(f"{path}: {', '.join(fixed)} belong to a run, not to a recipe")
    try:
        TrainConfig.from_dict({**settings, "data_dir": ".", "out_dir": "."})
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    return settings


def base_settings(recipe: str | None = None, recipe_file=None) -> dict:
    """The TrainConfig fields a run starts from: a recipe file's, else a named recipe's (paper by default)."""
    if recipe_file is not None:
        if recipe not in (None, "paper"):
            raise ValueError("--recipe and --recipe-file name two bases; give one")
        return load_recipe_file(recipe_file)
    return recipe_settings(recipe or "paper")


@dataclass
class TrainConfig:
    data_dir: str  # a `pgt preprocess` output folder
    out_dir: str  # metrics.json, best.pt and checkpoints/ go here
    model: str = "pgt"  # one of MODELS
    # model shape: ModelConfig's defaults (the paper's GeoLife configuration)
    d_model: int = ModelConfig.d_model
    nhead: int = ModelConfig.nhead
    num_layers: int = ModelConfig.num_layers
    dim_feedforward: int = ModelConfig.dim_feedforward
    dropout: float = ModelConfig.dropout
    max_len: int = ModelConfig.max_len  # histories keep their most recent max_len visits
    # optimisation
    epochs: int = 50  # at most
    min_epochs: int = 8  # no early stop before this many epochs
    patience: int = 5  # stop after this many epochs without a better validation score
    select_on: str = "acc@1"  # validation score for early stopping and the best epoch: one of SELECT_ON
    batch_size: int = 128  # global batch, split evenly over workers
    eval_batch_size: int = 1024
    lr: float = 6.5e-4  # peak learning rate, reached after warmup
    min_lr: float = 1e-6  # floor of the cosine decay
    warmup_epochs: int = 5
    weight_decay: float = 0.015
    beta1: float = 0.9
    beta2: float = 0.98
    label_smoothing: float = 0.03
    unseen_slots: bool = False  # extended vocabulary: the pointer names unseen places of the history (ModelConfig)
    slot_identity: bool = True  # with unseen_slots: same-place unseen visits share a slot embedding (ModelConfig)
    previous_location: bool = False  # each visit also embeds the location visited before it (ModelConfig)
    visit_relations: bool = False  # the pointer also scores each visit's relation to the last one (ModelConfig)
    relation_inputs: bool = False  # with visit_relations: the encoder's inputs embed those relations too (ModelConfig)
    relation_order: int = 1  # with visit_relations: transitions from the last 1 or 2 places (ModelConfig)
    new_place_weight: float = 1.0  # with unseen_slots: the loss weight of train samples whose target is a new place
    simulate_unseen: bool = False  # train samples show id 1 as later splits do (data.UnseenSimulation)
    known_fraction_min: float = 0.8  # with simulate_unseen, locations first visited after a fraction f of the
    known_fraction_max: float = 1.0  # user's days before the sample become id 1; f is drawn uniformly in [min, max]
    grad_clip: float = 0.8  # max gradient norm
    weight_average: float = 0.0  # decay of a moving average of the weights, updated every step and evaluated (and
    # kept) instead of them; 0 = off
    seed: int = 42
    bucket_by_length: bool = True  # batch similar history lengths together (less padding)
    amp: bool = True  # mixed precision (bfloat16/float16 autocast) when training on CUDA
    threads: int = 0  # torch CPU threads per worker; 0 = all cores in one process, the reserved CPUs under Ray
    resume: bool = True  # continue from the latest checkpoint in out_dir/checkpoints
    keep_checkpoints: int = 2  # epoch checkpoints kept on disk (the best model is kept apart)
    evaluate_test: bool = True  # score the best model on test at the end; off while choosing settings on validation

    # (low, high, whether high is allowed) of every numeric setting that has bounds
    RANGES = {"lr": (0.0, math.inf, False), "min_lr": (0.0, math.inf, False), "dropout": (0.0, 1.0, False),
              "label_smoothing": (0.0, 1.0, False), "beta1": (0.0, 1.0, False), "beta2": (0.0, 1.0, False),
              "weight_decay": (0.0, math.inf, False), "grad_clip": (0.0, math.inf, False),
              "d_model": (1, 1 << 16, True), "nhead": (1, 1 << 10, True), "num_layers": (1, 64, True),
              "dim_feedforward": (1, 1 << 18, True), "max_len": (1, 1 << 16, True), "min_epochs": (0, 1 << 20, True),
              "patience": (1, 1 << 20, True), "eval_batch_size": (1, 1 << 24, True), "warmup_epochs": (0, 1 << 20, True),
              "threads": (0, 4096, True), "keep_checkpoints": (1, 1 << 20, True)}

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{f.name} must be a number, got {value!r}")
            if f.type == "int" and not isinstance(value, int):
                raise ValueError(f"{f.name} must be an integer, got {value!r}")
            if f.type == "float" and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value!r}")
        for name, (low, high, closed) in self.RANGES.items():
            value = getattr(self, name)
            if not (low <= value <= high if closed else low <= value < high):
                raise ValueError(f"{name} must be in [{low}, {high}{']' if closed else ')'}, got {value!r}")
        if self.lr <= 0 or self.grad_clip <= 0 or self.min_lr > self.lr:
            raise ValueError(f"lr and grad_clip must be positive and min_lr at most lr, got lr={self.lr!r}, "
                             f"grad_clip={self.grad_clip!r}, min_lr={self.min_lr!r}")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.select_on not in SELECT_ON:
            raise ValueError(f"select_on must be one of {', '.join(SELECT_ON)}, got {self.select_on!r}")
        if not 0.0 <= self.known_fraction_min <= self.known_fraction_max <= 1.0:
            raise ValueError("known_fraction_min and known_fraction_max must satisfy 0 <= min <= max <= 1, got "
                             f"{self.known_fraction_min} and {self.known_fraction_max}")
        if not 0.0 <= self.weight_average < 1.0:
            raise ValueError(f"weight_average must be in [0, 1), got {self.weight_average}")
        if not self.new_place_weight >= 0.0:
            raise ValueError(f"new_place_weight must be a number >= 0, got {self.new_place_weight}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError("epochs and batch_size must be at least 1")
        if self.model in NEURAL_MODELS:  # the model's own checks (d_model by nhead, the relation switches), now
            self.model_config(SMALLEST_VOCAB)

    @classmethod
    def from_recipe(cls, recipe: str | dict, **fields) -> TrainConfig:
        """A recipe's settings (a name in RECIPES, or the settings themselves), then `fields` over them."""
        return cls.from_dict({**(recipe_settings(recipe) if isinstance(recipe, str) else recipe), **fields})

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown training setting(s): {', '.join(unknown)}")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def model_config(self, vocab) -> ModelConfig:
        """The model of these settings for a vocabulary (pgt.data.Vocab: the sizes in a manifest)."""
        return ModelConfig(num_locations=vocab.locations, num_users=vocab.users, d_model=self.d_model,
                           nhead=self.nhead, num_layers=self.num_layers, dim_feedforward=self.dim_feedforward,
                           dropout=self.dropout, max_len=self.max_len, variant=self.model,
                           unseen_slots=self.unseen_slots, slot_identity=self.slot_identity,
                           previous_location=self.previous_location, visit_relations=self.visit_relations,
                           relation_inputs=self.relation_inputs, relation_order=self.relation_order,
                           time_slots=vocab.time_slots,
                           weekdays=vocab.weekdays, recency_days=vocab.recency, duration_buckets=vocab.durations)



@dataclass
class LaunchConfig:
    workers: int = 0  # DDP workers under Ray Train; 0 = train in this process, without Ray
    use_gpu: bool | None = None  # one GPU per worker; None = when the Ray cluster has enough GPUs
    address: str | None = None  # a Ray cluster to join ("auto", "ray://host:10001", "host:6379"); None: $RAY_ADDRESS, else local
    max_failures: int = 0  # worker-group restarts (from the last checkpoint) before the run fails
    cpus_per_worker: float = 1.0  # Ray CPU resources each worker reserves
    gpus_per_worker: float = 1.0  # Ray GPU resources each worker reserves when use_gpu (fractions share a GPU)
    data_engine: str = "memory"  # "memory": every worker loads the train split; "ray": each streams its Ray Data shard

    def __post_init__(self) -> None:
        if self.workers < 0 or self.max_failures < -1 or self.cpus_per_worker <= 0:
            raise ValueError("workers must be >= 0, max_failures >= -1 (-1 = no limit), cpus_per_worker > 0")
        if self.data_engine not in DATA_ENGINES:
            raise ValueError(f"data_engine must be one of {', '.join(DATA_ENGINES)}, got {self.data_engine!r}")
        if self.data_engine == "ray" and self.workers < 1:
            raise ValueError("data_engine 'ray' streams shards to Ray Train workers: it needs workers >= 1")

"""The typed configs of the model, training and its launch, and the registries the `pgt` command and the flows build
their choices from. Every default lives here, once; nothing here imports torch, so the command line can show them
without loading it. Each setting is one field with its help, bounds and choices (infra.settings.setting).

    ModelSettings the network's shape and switches: what a recipe or a sweep chooses
    ModelConfig   those settings with the data's sizes (pgt.network.model builds it)
    TrainConfig   one training run (pgt.training.train runs it), holding its ModelSettings (`network`); a named recipe
                  sets some settings (pgt.recipes). Its dict (to_dict, from_dict) is flat: the network's settings
                  sit beside the others, as recipe files, sweeps and MLflow params name them.
    LaunchConfig  where it runs: this process or Ray Train workers (pgt.training.run launches it)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from infra.errors import SettingsError
from infra.process import listed, load_yaml, read_small_file, shorten
from infra.settings import check_settings, flat_settings, nested, setting, unflatten
from pgt.recipes import RECIPE_FREE, recipe_settings
from preprocessing.config import ANCHORS

TOP_K = 5  # places per prediction unless asked otherwise (`pgt predict --top-k`, the flow, a request's params)
MAX_TOP_K = 1000  # the most places one answer may list
DATA_ENGINES = ("loaded", "ray")  # how Ray Train workers get the train split: loaded whole, or streamed by Ray Data
VARIANTS = ("pgt", "mhsa", "pointer", "lstm-pg")  # the neural models (pgt.network.model)
# The memory's entries enter the model as visits in front of the history: the recency of one is its age bucket
# (days since the place's last visit, counted back from the sample's anchor day, at least each lower edge) after
# the window's recency values, its duration its visit-count bucket after the window's duration buckets, those
# buckets twice: without and with an earlier visit that came right after the current place (pgt.data.dataset.MemoryLayout).
# A window spans days 0 .. history_days, so ages start past it, but the live anchor (the last visit's day) brings
# them closer.
MEMORY_AGE_EDGES_DAYS = (0, 8, 11, 15, 22, 31, 61, 121, 366)
MEMORY_VISIT_EDGES = (1, 2, 3, 4, 6, 10, 20, 50)


HOURS = 24  # arrival_head's classes a day by default (arrival_classes): the hour of day the next visit starts
# stay_head's classes: how long the next visit lasts, in bands below each edge (minutes) and one beyond the last
STAY_EDGES_MIN = (30, 60, 120, 240, 480, 960)


@dataclass
class ModelSettings:
    """The network's shape and switches: what a recipe or a sweep chooses. TrainConfig holds them (`network`);
    ModelConfig adds the sizes the data gives."""

    d_model: int = setting(64, "Width of the embeddings and the encoder; divisible by nhead and by 4.",
                           low=4, high=1 << 16)
    nhead: int = setting(4, "Attention heads; must divide d_model.", low=1, high=1 << 10)
    num_layers: int = setting(2, "Encoder layers (LSTM layers for lstm-pg).", low=1, high=64)
    dim_feedforward: int = setting(128, "Feed-forward width of the encoder layers (the paper's 2 * d_model).",
                                   low=1, high=1 << 18)
    dropout: float = setting(0.15, "Dropout inside the encoder layers (and on the LSTM's inputs).",
                             low=0.0, high=1.0, high_open=True)
    max_len: int = setting(64, "Longest history; longer ones keep their most recent visits.", low=1, high=1 << 16)
    unseen_slots: bool = setting(False, "Extended vocabulary: the pointer names the unseen places of the history "
                                        "(each its own slot) and the generator's id 1 means a new place.")
    slot_identity: bool = setting(True, "With unseen_slots: visits to the same unseen place share a learned slot "
                                        "embedding in the input.")
    previous_location: bool = setting(False, "Each visit also embeds the location visited before it.")
    visit_relations: bool = setting(False, "The pointer scores each visit also by learned biases for its relation to "
                                           "the last visit: it followed the current place, is the current place, "
                                           "starts so many hours after now (pgt.network.model.visit_relations).")
    relation_inputs: bool = setting(False, "With visit_relations: the encoder's inputs embed them too.")
    relation_order: int = setting(1, "With visit_relations: transitions from the current place (1) or from the last "
                                     "two places (2).", choices=(1, 2))
    memory_size: int = setting(0, "Long-term memory: the person's earlier places outside the 7-day window the model "
                                    "reads (the data's first N: the most visited), in front of the history, with a "
                                    "pointer and a gate of their own; 0 reads none (pgt.network.model, preprocessing.memory).",
                                 low=0, high=1024)
    memory_gate: bool = setting(True, "With memory_size: the remembered places get a pointer and a gate weight of "
                                      "their own (window, memory, generator); off, one pointer over the history and "
                                      "the remembered places together, the gate as without a memory.")
    usual_places: bool = setting(False, "The pointer scores each visit also by learned biases for being at the "
                                        "window's usual night and day places (pgt.network.places.usual_places).")
    place_distance: bool = setting(False, "The generator scores each known place also by a learned bias for its "
                                          "distance from the current place, in bands (pgt.network.places).")
    distance_head: float = setting(0.0, "Auxiliary task while training: a head on the context predicts the band of "
                                        "the distance from the current place to the next known one "
                                        "(pgt.network.places), its cross-entropy added to the loss at this weight; "
                                        "predictions ignore it. 0: no head.", low=0.0, high=10.0)
    arrival_head: float = setting(0.0, "Auxiliary task while training: a head on the context predicts the hour of day "
                                       "the next visit starts (the split's target_time_slot), its cross-entropy added "
                                       "to the loss at this weight; predictions ignore it. 0: no head.",
                                  low=0.0, high=10.0)
    arrival_days: int = setting(1, "The days arrival_head's hours span: 1, the hour of day the next visit starts; N > "
                                   "1, its hour counted from the midnight before the last visit's day, over N days "
                                   "(later starts in the last day's hours), the day read off the protocol's recency.",
                                low=1, high=4)
    arrival_classes: int = setting(HOURS, "The classes of a day in arrival_head's task, the day's time slots "
                                          "grouped evenly: 24, the hour the next visit starts; 12, its two hours; "
                                          "48, its half hour (finer than the data's time slots, some classes are "
                                          "never a target).", low=2, high=96)
    stay_head: float = setting(0.0, "Auxiliary task while training: a head on the context predicts the band of how "
                                    "long the next visit lasts (the split's target_duration_min: below 30, 60, 120, "
                                    "240, 480, 960 minutes or beyond), its cross-entropy added to the loss at this "
                                    "weight; predictions ignore it. 0: no head.", low=0.0, high=10.0)
    day_gaps: int = setting(1, "Live predictions (recency from the last visit's day, the next visit's day unknown) "
                               "mix the predictions for the next visit on the last visit's day and the N - 1 days "
                               "after, each weighted by how often it followed a last visit ending at that hour in the "
                               "training data (pgt.network.daygap); 1: read as if on the last visit's day.",
                            low=1, high=8)
    members: int = setting(1, "Networks trained side by side from their own initial weights, each on its own loss; "
                              "the prediction is the mean of their probabilities (an ensemble). Each member costs "
                              "its forward and backward pass.", low=1, high=64)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.d_model % self.nhead or self.d_model % 4:
            raise SettingsError(f"d_model ({self.d_model}) must be divisible by nhead ({self.nhead}) and by 4")
        if self.relation_inputs and not self.visit_relations:
            raise SettingsError("relation_inputs embeds the visit relations: it needs visit_relations")
        if self.arrival_days > 1 and not self.arrival_head:
            raise SettingsError("arrival_days spans the hours of arrival_head's task: set arrival_head too, or "
                                "arrival_days 1")
        if self.arrival_classes != HOURS and not self.arrival_head:
            raise SettingsError("arrival_classes are the classes of arrival_head's task: set arrival_head too, or "
                                f"arrival_classes {HOURS}")


@dataclass
class ModelConfig(ModelSettings):
    """What pgt.network.model builds: the settings, the variant, and the vocabulary sizes of the data (its manifest)."""

    num_locations: int = dataclasses.field(kw_only=True)  # location vocabulary incl. 0 (padding) and 1 (unseen)
    num_users: int = dataclasses.field(kw_only=True)  # user vocabulary incl. 0 (padding)
    variant: str = "pgt"  # one of VARIANTS
    time_slots: int = 96  # time-of-day slot values (the manifest's vocab); tables get one more row for padding
    weekdays: int = 7  # weekday values
    recency_days: int = 8  # recency values: days 0 .. history_days before the target's day
    duration_buckets: int = 99  # duration bucket values
    # added to a new place's log-probability in the protocol's view (pgt.network.vocabulary.restore_new_place_odds):
    # TrainConfig.protocol_new_place_log_odds, by default log(1 / the new_place_weight the network was trained with),
    # which undoes what that loss weight did to a new place's odds (logit adjustment, Menon et al. 2021); strict
    # rankings never see it
    new_place_log_odds: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.variant not in VARIANTS:
            raise SettingsError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.num_locations < 3 or self.num_users < 2:
            raise SettingsError(f"vocabularies too small: {self.num_locations} locations, {self.num_users} users")
        if self.visit_relations and self.variant not in ("pgt", "pointer"):
            raise SettingsError(f"visit_relations biases the transformer's pointer: variant 'pgt' or 'pointer', "
                                f"got {self.variant!r}")
        if self.variant == "lstm-pg" and (self.place_distance or self.usual_places or self.distance_head
                                          or self.arrival_head or self.stay_head):
            raise SettingsError("place_distance, usual_places, distance_head, arrival_head and stay_head are the "
                                "transformer's: not variant 'lstm-pg'")
        if self.day_gaps > 1 and self.variant == "lstm-pg":
            raise SettingsError("day_gaps keeps its prior in the transformer: not variant 'lstm-pg'")
        if self.memory_size and self.variant != "pgt":
            raise SettingsError(f"memory_size gives the transformer's gate a memory to point at: variant 'pgt', "
                                f"got {self.variant!r}")
        small = [name for name in ("time_slots", "weekdays", "recency_days", "duration_buckets") if getattr(self, name) < 1]
        if small:
            raise SettingsError(f"feature tables need at least one value: {', '.join(small)}")

    @property
    def recency_rows(self) -> int:
        """Recency values the model embeds: the window's, then the memory's age buckets (MEMORY_AGE_EDGES_DAYS)."""
        return self.recency_days + (len(MEMORY_AGE_EDGES_DAYS) if self.memory_size else 0)

    @property
    def duration_rows(self) -> int:
        """Duration values the model embeds: the window's buckets, then the memory's visit-count buckets, without and
        with a visit that followed the current place."""
        return self.duration_buckets + (2 * len(MEMORY_VISIT_EDGES) if self.memory_size else 0)

    @property
    def positions(self) -> int:
        """The widest input: max_len visits of the window and memory_size places of the memory."""
        return self.max_len + self.memory_size

    def settings(self) -> ModelSettings:
        """The chosen part, without the data's sizes."""
        return ModelSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelSettings)})


NEURAL_MODELS = VARIANTS  # the models trained by gradient descent
# the smallest vocabulary a model can be built for: TrainConfig checks its model settings against it when built,
# before any data is read (the real sizes come from the data's manifest)
SMALLEST_VOCAB = SimpleNamespace(locations=3, users=2, time_slots=1, weekdays=1, recency=1, durations=1)
BASELINES = ("markov", "most-frequent")
MODELS = NEURAL_MODELS + BASELINES

# validation scores that early stopping and the best epoch may follow; each is "higher is better" once signed
SELECT_ON = ("acc@1", "strict_acc@1", "loss")


def selection_score(validation: dict, select_on: str) -> float:
    """The validation score named by select_on, signed so that higher is better."""
    if select_on == "loss":
        return -validation["loss"]
    return validation["strict"]["acc@1"] if select_on == "strict_acc@1" else validation["acc@1"]


EVAL_BATCH_SIZE = 1024  # samples a scoring pass takes at once: training's validation, evaluate, predict, explain
TRAIN_ON = ("train", "train+validation")  # the splits a run learns from
REFIT_EPOCHS = ("selected", "scaled")  # how many epochs a refit trains (TrainConfig.refit_epochs)

def load_recipe_file(path) -> dict:
    """The TrainConfig fields of a recipe file: YAML (or JSON) mapping field names to values, as a sweep writes
    its winner. ValueError naming the file for anything that is not such a mapping or does not build a config."""
    path = Path(path)
    settings = load_yaml(read_small_file(path, "recipe file"), path)
    if not isinstance(settings, dict):
        raise SettingsError(f"{path}: a recipe file maps TrainConfig fields to values; found {type(settings).__name__}")
    if "train" in settings:  # a sweep's winner nests them under `train`
        settings = settings["train"]
        if not isinstance(settings, dict):
            raise SettingsError(f"{path}: `train:` maps TrainConfig fields to values; found {type(settings).__name__}")
    odd = [key for key in settings if not isinstance(key, str)]
    if odd:
        raise SettingsError(f"{path}: keys are TrainConfig field names; found {listed(repr(k) for k in odd)}")
    fixed = sorted(set(settings) & set(RECIPE_FREE))
    if fixed:
        raise SettingsError(f"{path}: {', '.join(fixed)} belong to a run, not to a recipe")
    try:
        TrainConfig.from_dict({**settings, "data_dir": ".", "out_dir": "."})
    except (ValueError, TypeError) as exc:
        raise SettingsError(f"{path}: {shorten(exc)}") from None
    return settings


def base_settings(recipe: str | None = None, recipe_file=None) -> dict:
    """The TrainConfig fields a run starts from: a recipe file's, else a named recipe's (paper by default)."""
    if recipe_file is not None:
        if recipe not in (None, "paper"):
            raise SettingsError("--recipe and --recipe-file name two bases; give one")
        return load_recipe_file(recipe_file)
    return recipe_settings(recipe or "paper")


@dataclass
class TrainConfig:
    data_dir: str  # a `pgt preprocess` output folder
    out_dir: str  # metrics.json, best.pt and checkpoints/ go here
    model: str = setting("pgt", "The model or baseline to train.", choices=MODELS)
    network: ModelSettings = nested(ModelSettings)  # the network's shape and switches
    # optimisation
    epochs: int = setting(50, "At most this many epochs (early stopping may end sooner).", low=1, high=1 << 20)
    min_epochs: int = setting(8, "No early stop before this many epochs.", low=0, high=1 << 20)
    patience: int = setting(5, "Epochs without a better validation score before stopping.", low=1, high=1 << 20)
    stop_after_epochs: int = setting(0, "Train exactly this many epochs and keep the last, whatever validation says "
                                        "(the learning-rate schedule still spans `epochs`); 0 = early stopping and "
                                        "the best epoch by select_on.", low=0, high=1 << 20)
    train_on: str = setting("train", "The splits training learns from: train, or train+validation (validation then "
                                     "cannot choose the epoch: it needs stop_after_epochs).", choices=TRAIN_ON)
    refit: bool = setting(False, "Choose the epoch on validation (a run in <out>/selection), then train again from the "
                                 "same initial weights on train + validation for refit_epochs and keep the last: "
                                 "the model knows the weeks just before test. Its validation metrics are the "
                                 "selection run's, held out.")
    refit_epochs: str = setting("selected", "With refit: the epochs the refit trains: selected (the selection run's "
                                            "best epoch) or scaled (that times the ratio of train + validation samples "
                                            "to train samples, at most epochs).", choices=REFIT_EPOCHS)
    select_on: str = setting("acc@1", "Validation score for early stopping and the best epoch: acc@1 (protocol), "
                                      "strict_acc@1 (the exact place) or loss.", choices=SELECT_ON)
    batch_size: int = setting(128, "Global batch, split evenly over the workers.", low=1, high=1 << 24)
    eval_batch_size: int = setting(EVAL_BATCH_SIZE, "Batch of the validation and test passes.", low=1, high=1 << 24)
    lr: float = setting(6.5e-4, "Peak learning rate, reached after warmup.", low=0.0, low_open=True)
    min_lr: float = setting(1e-6, "Floor of the cosine decay; at most lr.", low=0.0)
    warmup_epochs: int = setting(5, "Epochs of linear warmup to the peak learning rate.", low=0, high=1 << 20)
    weight_decay: float = setting(0.015, "AdamW weight decay.", low=0.0)
    beta1: float = setting(0.9, "AdamW beta1.", low=0.0, high=1.0, high_open=True)
    beta2: float = setting(0.98, "AdamW beta2.", low=0.0, high=1.0, high_open=True)
    label_smoothing: float = setting(0.03, "Label smoothing of the cross-entropy.", low=0.0, high=1.0, high_open=True)
    new_place_weight: float = setting(1.0, "With unseen_slots: loss weight of train samples whose target is a new "
                                           "place.", low=0.0)
    new_place_log_odds: float | None = setting(None, "Added to a new place's log-probability in the protocol's view "
                                                     "(id 1; strict rankings never see it); None = log(1 / "
                                                     "new_place_weight) with unseen_slots, else 0.", low=0.0)
    anchor: str = setting("target_day", "The day recency counts from in the model's inputs: target_day, the "
                                        "protocol's (the target's day, known only afterwards), or last_visit (the "
                                        "last history visit's, what a live prediction knows). A last_visit model "
                                        "is trained, selected and scored on such inputs.", choices=ANCHORS)
    simulate_unseen: bool = setting(False, "Train on samples where locations first visited after a random cutoff are "
                                           "id 1 (unseen in train), as in later splits.")
    known_fraction_min: float = setting(0.8, "With simulate_unseen: the cutoff's lowest fraction of the user's days "
                                             "before each sample.", low=0.0, high=1.0)
    known_fraction_max: float = setting(1.0, "With simulate_unseen: the cutoff's highest fraction (at least the "
                                             "lowest).", low=0.0, high=1.0)
    recent_repeat: float = setting(0.0, "Each person's latest samples, this fraction of them, twice an epoch.", low=0.0, high=1.0)
    visit_dropout: float = setting(0.0, "Each train history visit but the last left out at this rate, drawn anew every "
                                        "epoch (pgt.training.augment); 0 = off.", low=0.0, high=1.0, high_open=True)
    grad_clip: float = setting(0.8, "Largest gradient norm.", low=0.0, low_open=True)
    weight_average: float = setting(0.0, "Decay of a moving average of the weights, evaluated and kept instead of "
                                         "them (e.g. 0.99); 0 = off.", low=0.0, high=1.0, high_open=True)
    seed: int = setting(42, "Seed of the weights, the batches and the unseen-place simulation.", low=0,
                        high=2**32 - 1 - 1024)  # numpy's seeds are 32-bit; fused seeds and ranks add to it
    bucket_by_length: bool = setting(True, "Batch similar history lengths together (less padding).")
    resident_data: bool = setting(False, "Hold the train split on the training device and gather each batch there "
                                         "(no per-batch host work; the same batches as without).")
    static_width: int = setting(0, "With resident_data: pad each batch's history width up to a multiple of this and "
                                   "fill short batches to full size, so batches take a few fixed shapes (CUDA graphs, "
                                   "torch.compile); 0 = off.", low=0, high=1 << 16)
    compile_model: bool = setting(False, "With static_width: torch.compile the model's training pass, one graph per "
                                         "batch width (on CUDA mode reduce-overhead: CUDA graphs, no launches from "
                                         "Python). The first epoch pays the compilation; validation and test run "
                                         "the model as it is.")
    capture_step: bool = setting(False, "With static_width, on one worker: the whole training step (the batch's "
                                        "gather, forward, loss, backward, clipping, optimizer, weight average) as one "
                                        "unit, captured on CUDA as one CUDA graph per batch width and replayed (no "
                                        "Python or launches between kernels); the same step, uncaptured, on a CPU "
                                        "(pgt.training.step).")
    fused_seeds: int = setting(1, "Train this many seeds (seed, seed + 1, ...) as one model of side-by-side networks: "
                                  "each from its own seed's initial weights, all on the first seed's batches, each "
                                  "scored and its best epoch chosen on validation apart (metrics.json's `seeds`). Several "
                                  "seeds' evidence for about one run's cost on a GPU; writes no best.pt. Not with refit "
                                  "or members.", low=1, high=64)
    amp: bool = setting(True, "Mixed precision (bfloat16/float16 autocast) when training on CUDA.")
    threads: int = setting(0, "torch CPU threads per worker; 0 = $OMP_NUM_THREADS where set (under Ray: the reserved "
                              "CPUs), else the cores this process may use / workers.", low=0, high=4096)
    resume: bool = setting(True, "Continue from the latest checkpoint in the output folder.")
    keep_checkpoints: int = setting(2, "Epoch checkpoints kept on disk (the best model is kept apart).",
                                    low=1, high=1 << 20)
    evaluate_test: bool = setting(True, "Score the best model on test at the end; off while choosing settings on "
                                        "validation.")

    def __post_init__(self) -> None:
        check_settings(self)  # types, bounds and choices, from each field's one definition
        if self.min_lr > self.lr:
            raise SettingsError(f"min_lr must be at most lr, got min_lr={self.min_lr!r}, lr={self.lr!r}")
        if self.static_width and not self.resident_data:
            raise SettingsError("static_width pads the batches of resident_data: set resident_data too, or static_width 0")
        if self.compile_model and not self.static_width:
            raise SettingsError("compile_model compiles one graph per batch shape: set static_width (and resident_data) "
                                "too, or compile_model off")
        if self.capture_step and not self.static_width:
            raise SettingsError("capture_step captures one graph per batch shape: set static_width (and resident_data) "
                                "too, or capture_step off")
        if self.fused_seeds > 1 and (self.refit or self.network.members > 1):
            raise SettingsError("fused_seeds trains seeds side by side, each choosing its own best epoch: not with refit "
                                "(each seed would refit for its own epochs) or members > 1; set refit false and members 1")
        if self.network.day_gaps > 1 and self.anchor == "last_visit":
            raise SettingsError("day_gaps mixes the days a protocol-trained model's live inputs may count from; a "
                                "model of anchor last_visit learns from those inputs themselves: set day_gaps 1")
        if self.network.arrival_days > 1 and self.anchor == "last_visit":
            raise SettingsError("arrival_days reads the next visit's day off the protocol's recency, which counts from "
                                "the target's day; anchor last_visit counts it from the last visit's: set arrival_days 1")
        if self.fused_seeds > 1 and self.model not in NEURAL_MODELS:
            raise SettingsError(f"fused_seeds trains networks side by side; {self.model} is not a neural model")
        if self.train_on != "train" and not self.stop_after_epochs:
            raise SettingsError(f"train_on {self.train_on!r} learns from validation, so validation cannot choose the "
                                "epoch: set stop_after_epochs (refit does)")
        if self.stop_after_epochs > self.epochs:
            raise SettingsError(f"stop_after_epochs ({self.stop_after_epochs}) must be at most epochs ({self.epochs})")
        if self.refit and (self.train_on != "train" or self.stop_after_epochs):
            raise SettingsError("refit chooses the epoch on validation and then sets train_on and stop_after_epochs "
                                "itself: leave them at their defaults")
        if self.visit_dropout and self.network.memory_size:
            raise SettingsError("visit_dropout leaves out history visits, and the remembered places sit in front of "
                                "the history: set memory_size 0 with it")
        if self.known_fraction_min > self.known_fraction_max:
            raise SettingsError("known_fraction_min must be at most known_fraction_max, got "
                                f"{self.known_fraction_min} and {self.known_fraction_max}")
        if self.model in NEURAL_MODELS:  # the model's own checks (d_model by nhead, the relation switches), now
            self.model_config(SMALLEST_VOCAB)

    @classmethod
    def from_recipe(cls, recipe: str | dict, **fields) -> TrainConfig:
        """A recipe's settings (a name in pgt.recipes.RECIPES, or the settings themselves), then `fields` over them."""
        return cls.from_dict({**(recipe_settings(recipe) if isinstance(recipe, str) else recipe), **fields})

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        """A config from its flat dict (to_dict's): the network's settings sit beside the others, as recipes,
        recipe files, sweeps and MLflow params name them."""
        return cls(**unflatten(cls, values, "training setting"))

    def to_dict(self) -> dict:
        """The flat dict of every setting (the network's among them): what Ray, MLflow and a recipe file hold."""
        return flat_settings(self)

    def model_config(self, vocab) -> ModelConfig:
        """The model of these settings for a vocabulary (pgt.data.dataset.Vocab: the sizes in a manifest)."""
        return ModelConfig(**dataclasses.asdict(self.network), variant=self.model, num_locations=vocab.locations,
                           num_users=vocab.users, time_slots=vocab.time_slots, weekdays=vocab.weekdays,
                           recency_days=vocab.recency, duration_buckets=vocab.durations,
                           new_place_log_odds=self.protocol_new_place_log_odds)

    @property
    def protocol_new_place_log_odds(self) -> float:
        """ModelConfig.new_place_log_odds of these settings: new_place_log_odds where set; else log(1 /
        new_place_weight) where that weight is applied (with unseen_slots), which undoes what the weight did to a new
        place's odds; 0 where it is not applied, or is 0 (a loss that never asks for a new place leaves no odds to
        restore)."""
        if self.new_place_log_odds is not None:
            return self.new_place_log_odds
        weighted = self.network.unseen_slots and self.new_place_weight > 0
        return -math.log(self.new_place_weight) if weighted else 0.0


@dataclass
class LaunchConfig:
    workers: int = setting(0, "DDP workers under Ray Train; 0 = train in this process, without Ray.", low=0, high=4096)
    gpu: bool | None = setting(None, "One GPU per worker; None = when the Ray cluster has enough GPUs.")
    address: str | None = setting(None, "A Ray cluster to join from one of its nodes (auto, host:6379); None = "
                                        "$RAY_ADDRESS, else a local Ray.", env="RAY_ADDRESS")
    max_failures: int = setting(0, "Restarts of the worker group from the last checkpoint when a worker dies, before "
                                   "the run fails (-1: no limit).", low=-1, high=1 << 20)
    cpus_per_worker: float = setting(1.0, "Ray CPUs each worker reserves.", low=0.0, low_open=True)
    gpus_per_worker: float = setting(1.0, "Ray GPUs each worker reserves with gpu (fractions share a GPU).",
                                     low=0.0)
    data_engine: str = setting("loaded", "loaded: each worker loads the train split whole; ray (with workers >= 1): each "
                                         "streams its shard with Ray Data, for splits larger than a worker's memory "
                                         "(a local shuffle buffer, no length bucketing).", choices=DATA_ENGINES)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.data_engine == "ray" and self.workers < 1:
            raise SettingsError("data_engine 'ray' streams shards to Ray Train workers: it needs workers >= 1")


@dataclass
class TrackingConfig:
    tracking_uri: str | None = setting(None, "MLflow tracking URI (http://127.0.0.1:5055 for a server, "
                                             "sqlite:////abs/mlflow.db); None: $MLFLOW_TRACKING_URI, else a SQLite "
                                             "store under the state folder.", env="MLFLOW_TRACKING_URI")
    experiment: str = setting("pgt", "The MLflow experiment the runs go to.")
    register: str | None = setting(None, "Register the best checkpoint under this model name; its alias champion "
                                         "moves to the new version only when its mean strict validation Acc@1 over "
                                         "its seeds beats the champion's by more than seed noise, on the same data.")
    run_name: str | None = setting(None, "The new MLflow run's name; None: <model>-<out folder>.")
    log_model: bool = setting(True, "Log the best checkpoint as an MLflow model (and the explain PNGs).")
    system_metrics_interval_s: float = setting(5.0, "How often a training run samples CPU, memory and GPU, seconds; "
                                                    "0 = off.", low=0.0, high=86_400.0)
    # what the program sets, never a user
    run_id: str | None = None  # the run rank 0 logs into; set by start_run
    parent_run_id: str | None = None  # nest the new run under this one (a sweep's trials)
    source: str = "pgt train"  # the command or flow that makes the run (the UI's Source column)
    tags: dict = dataclasses.field(default_factory=dict)  # more run tags: pgt.recipe (tracking.RECIPE_TAG), ...
    split_digests: dict | None = None  # split -> SHA-256 of its file, hashed once by a sweep's driver for every trial

    def __post_init__(self) -> None:
        check_settings(self)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TrackingConfig:
        return cls(**values)


@dataclass(frozen=True)
class PredictConfig:
    """What a prediction is for: how many places, and the moment (`pgt predict`, the predict flow; a served
    request's params name the same)."""

    top_k: int = setting(TOP_K, "Places per prediction.", low=1, high=MAX_TOP_K)
    at: str | None = setting(None, "With raw GPS points or staypoints: the moment the prediction is for (ISO 8601, "
                                   "UTC unless it names an offset); recency and the weekday count from its day. "
                                   "None: the end of each user's last visit.")

    def __post_init__(self) -> None:
        check_settings(self)

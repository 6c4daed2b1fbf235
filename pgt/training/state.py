"""What one training run carries from epoch to epoch (`TrainState`) and how it starts (`setup`): seeds, data, model,
optimizer and schedule, resumed from the newest checkpoint there is. The epochs themselves are train.py's; the
end of a run is finish.py's."""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, DistributedSampler

from infra.errors import InputError, SettingsError
from pgt.config import ModelConfig, TrainConfig
from pgt.data.dataset import (
    TARGET_LABELS,
    Batch,
    MemoryLayout,
    SequenceDataset,
    Vocab,
    load_splits,
)
from pgt.data.fetch import local_data
from pgt.data.tables import latest_samples, place_coordinates
from pgt.network.checkpoint import check_resumable, latest_checkpoint, read_checkpoint, rng_state, set_rng_state
from pgt.network.daygap import fit_day_gap_prior
from pgt.network.model import (
    Ensemble,
    build_model,
    count_parameters,
    networks,
    set_day_gap_prior,
    set_place_coordinates,
)
from pgt.training.augment import TransformedSplit, VisitDropout
from pgt.training.batches import BucketBatchSampler, ResidentBatches, StreamedBatches, keep_batch
from pgt.training.compilation import compiled
from pgt.training.loss import batch_loss, cross_entropy_sum
from pgt.training.step import WholeStep, check_capturable, portable_optimizer_state, use_device_learning_rate
from pgt.training.unseen import FirstVisits, UnseenSimulation
from pgt.training.worker import Worker, broadcast_text, default_threads, seed_everything, wrap_ddp
from preprocessing.config import SPLITS

# each auxiliary head (a NetworkConfig field, its weight), the label column it learns from (TARGET_LABELS says where a
# split keeps it) and what that column tells, for the refusals of a run that cannot give a head its label
HEAD_LABELS = (("arrival_head", "target_time_slot", "start time"), ("stay_head", "target_duration_min", "duration"))


def check_streamable(cfg: TrainConfig) -> None:
    """SettingsError unless the train split can be streamed (--data-engine ray) under these settings."""
    if cfg.resident_data:
        raise SettingsError("resident_data holds the train split on the device: use --data-engine loaded with it")
    if cfg.refit or cfg.train_on != "train":
        raise SettingsError("refit (train_on train+validation) learns from two splits in memory; the streamed path reads "
                            "train.parquet alone: use --data-engine loaded")
    if cfg.recent_repeat:
        raise SettingsError("recent_repeat repeats the latest samples of the train split in memory; the streamed path "
                            "reads train.parquet as it is: use --data-engine loaded")
    if cfg.simulate_unseen:
        raise SettingsError("simulate_unseen needs the train split in memory (it reads every sample's first visits); "
                            "use --data-engine loaded, or a recipe without it")
    if cfg.visit_dropout:
        raise SettingsError("visit_dropout numbers each batch's unseen places again from the split in memory; use "
                            "--data-engine loaded")
    if cfg.network.day_gaps > 1:
        raise SettingsError("day_gaps counts the train split's days between last visits and targets in memory; the "
                            "streamed path reads train.parquet as it goes: use --data-engine loaded")
    for head, _, what in HEAD_LABELS:
        if getattr(cfg.network, head):
            raise SettingsError(f"{head} learns from each target's {what}, which the streamed path does not read; "
                                "use --data-engine loaded")


def split_rows(data_dir: str, split: str = "train") -> int:
    """A split's sample count, from its Parquet footer (the streamed path does not load the train split)."""
    return pq.read_metadata(Path(data_dir) / f"{split}.parquet").num_rows


def refit_epoch_count(cfg: TrainConfig, selected: int) -> int:
    """The epochs a refit trains (TrainConfig.refit_epochs): the selection run's best epoch, or that times the
    ratio of train + validation samples to train samples, rounded, within 1..cfg.epochs."""
    if cfg.refit_epochs == "selected":
        return selected
    data_dir = local_data(cfg.data_dir)
    train, validation = split_rows(data_dir, "train"), split_rows(data_dir, "validation")
    return min(cfg.epochs, max(1, round(selected * (train + validation) / train)))


def lr_factor(epoch: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr for a 0-based epoch: linear warmup, then cosine decay to min_lr."""
    if epoch < cfg.warmup_epochs:
        return (epoch + 1) / cfg.warmup_epochs
    progress = (epoch - cfg.warmup_epochs) / max(1, cfg.epochs - cfg.warmup_epochs)
    return (cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))) / cfg.lr


def train_loader(dataset: SequenceDataset | TransformedSplit, cfg: TrainConfig,
                 worker: Worker) -> DataLoader | ResidentBatches:
    sampler = DistributedSampler(dataset, num_replicas=worker.world_size, rank=worker.rank, shuffle=True,
                                 seed=cfg.seed, drop_last=False)
    per_worker = max(1, cfg.batch_size // worker.world_size)
    # a bucket of one batch sorts within the batch only: the same batches as plain random batching
    batches = BucketBatchSampler(sampler, dataset.lengths, per_worker, bucket_batches=50 if cfg.bucket_by_length else 1,
                                 seed=cfg.seed)
    if cfg.resident_data:  # the same batches, gathered on the device
        return ResidentBatches(dataset, batches, worker.device, cfg.static_width)
    return DataLoader(dataset, batch_sampler=batches, collate_fn=keep_batch, num_workers=0)


def _resume_point(cfg: TrainConfig, worker: Worker, out_dir: Path) -> Path | None:
    """Where to resume from. Under Ray Train, the checkpoint Ray hands back (each rank its own copy of it, which
    may be a download of cloud storage). Else the newest of the one a runtime restored (a Tune trial's) and
    the latest one rank 0 wrote under out_dir; rank 0 decides for all ranks."""
    if worker.ray_owned:
        return worker.restored
    candidates = [p for p in (worker.restored, latest_checkpoint(out_dir) if cfg.resume or worker.restored else None) if p]
    chosen = max(candidates, key=lambda p: p.parent.name) if candidates else None  # epoch_NNN sorts by epoch
    if worker.world_size > 1:
        text = broadcast_text(str(chosen) if chosen else "", worker)
        chosen = Path(text) if text else None
    return chosen


@dataclass
class TrainState:
    """What one run carries from epoch to epoch, and what a checkpoint saves of it."""

    cfg: TrainConfig
    worker: Worker
    model_cfg: ModelConfig
    model: torch.nn.Module  # the replica this rank trains
    ddp_model: torch.nn.Module  # the model, wrapped in DDP when the world is larger than one
    batch_loss: Callable  # batch_loss, or with compile_model its compiled form
    averaged: torch.nn.Module | None  # the moving average of the weights (cfg.weight_average), or None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None  # autocast's dtype on CUDA; None: no mixed precision
    loader: object  # the train batches: a DataLoader, or StreamedBatches of a Ray Data shard
    splits: dict[str, SequenceDataset]  # validation and test (and train when it is in memory)
    parameters: int
    start_epoch: int = 0
    best_metric: float = -math.inf
    best_epoch: int = -1
    bad_epochs: int = 0
    history: list[dict] = dataclasses.field(default_factory=list)
    resumed_at: list[int] = dataclasses.field(default_factory=list)
    best_state: dict | None = None  # the best epoch's weights (of the averaged model when there is one)
    early_stopped: bool = False
    whole_step: WholeStep | None = None  # capture_step's step (None: the step below, in train_epoch)
    # fused_seeds: each seed's selection, as best_metric/best_epoch/bad_epochs/best_state are the run's
    seeds: list[dict] | None = None

    @property
    def evaluated(self) -> torch.nn.Module:
        """What validation scores and the best state keeps: the averaged weights when there are any."""
        return self.averaged if self.averaged is not None else self.model

    @property
    def streamed(self) -> bool:
        return self.worker.train_shard is not None

    @property
    def side_by_side(self) -> int:
        """The networks trained side by side, each on its own loss: an ensemble's members, or fused seeds."""
        return len(networks(self.model))

    def validation_loss(self) -> Callable[[Batch, torch.Tensor], torch.Tensor]:
        return cross_entropy_sum(self.model_cfg, self.cfg)

    def epochs(self) -> range:
        """The epochs left to run: none after an early stop a checkpoint recorded."""
        return range(self.start_epoch, self.start_epoch if self.early_stopped else self.cfg.epochs)

    def checkpoint(self, epoch: int) -> dict:
        return {"model": self.model.state_dict(), "optimizer": portable_optimizer_state(self.optimizer),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "averaged": self.averaged.state_dict() if self.averaged is not None else None,
                "epoch": epoch, "best_metric": self.best_metric, "best_epoch": self.best_epoch,
                "bad_epochs": self.bad_epochs, "best_model": self.best_state, "history": self.history,
                "rng": rng_state(), "resumed_at": self.resumed_at, "config": self.cfg.to_dict(),
                "model_config": dataclasses.asdict(self.model_cfg), "seeds": self.seeds}

    def restore(self, state: dict) -> None:
        """Continue from a checkpoint: weights, optimizer, schedule, best so far, history and RNG."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if self.averaged is not None:
            self.averaged.load_state_dict(state["averaged"])
        self.start_epoch, self.best_metric, self.best_epoch = state["epoch"] + 1, state["best_metric"], state["best_epoch"]
        self.bad_epochs, self.history, self.best_state = state["bad_epochs"], state["history"], state["best_model"]
        self.resumed_at = state.get("resumed_at", []) + [self.start_epoch]
        self.early_stopped = bool(self.history) and self.history[-1].get("stop", False)
        if self.seeds is not None:
            self.seeds = state["seeds"]
        if self.worker.rank == 0:
            set_rng_state(state["rng"])
        else:  # rank 0's saved RNG state would give every rank the same dropout masks
            torch.manual_seed(self.cfg.seed + 7919 * self.worker.rank + self.start_epoch)


def setup(config: dict, worker: Worker) -> TrainState:
    """Seeds, data, model, optimizer and schedule of a run, resumed from the newest checkpoint there is."""
    cfg = TrainConfig.from_dict(config)
    out_dir = Path(cfg.out_dir)
    seed_everything(cfg.seed, deterministic=worker.device.type == "cpu")
    if worker.device.type == "cpu":
        torch.set_num_threads(cfg.threads or default_threads(worker.world_size))
    data_dir = local_data(cfg.data_dir)  # this node's copy where --data is a URI
    vocab = Vocab.from_manifest(data_dir)
    streamed = worker.train_shard is not None
    if streamed:
        check_streamable(cfg)
    memory = MemoryLayout.for_data(cfg.network.memory_size, vocab)
    splits = load_splits(data_dir, cfg.network.max_len, vocab, names=("validation", "test") if streamed else SPLITS,
                         memory=memory)
    sizes = [len(s) for s in splits.values()] + ([split_rows(data_dir)] if streamed else [])
    if min(sizes) == 0:
        raise InputError(data_dir, "a split has no samples; nothing to train on")
    if not streamed:  # check_streamable refused every head on the streamed path already
        for head, column, _ in HEAD_LABELS:
            if getattr(cfg.network, head) and bool((getattr(splits["train"], TARGET_LABELS[column][0]) < 0).all()):
                raise InputError(Path(data_dir) / "train.parquet", f"no column {column}, which {head} learns from; "
                                                                   "preprocess the input again")
    if cfg.anchor == "last_visit":  # the model only ever sees what a live prediction knows
        splits = {name: split.anchored_at_last_visit() for name, split in splits.items()}
    model_cfg = cfg.model_config(vocab)
    if cfg.fused_seeds > 1:  # model_cfg stays each seed's network; the ensemble only trains them side by side
        model = fused_seed_model(model_cfg, cfg.seed, cfg.fused_seeds).to(worker.device)
    else:
        model = build_model(model_cfg).to(worker.device)
    if model_cfg.place_distance or model_cfg.distance_head:
        set_place_coordinates(model, place_coordinates(data_dir, model_cfg.num_locations).to(worker.device))
    if worker.rank:  # the same initial weights everywhere, but each rank its own dropout masks
        torch.manual_seed(cfg.seed + 7919 * worker.rank)
    parameters = count_parameters(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                  weight_decay=cfg.weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: lr_factor(e, cfg))
    use_amp = cfg.amp and worker.device.type == "cuda"
    amp_dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if use_amp else None
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
    if cfg.capture_step:
        check_capturable(cfg, worker.device, amp_dtype, worker.world_size)
    if streamed:
        loader = StreamedBatches(worker.train_shard, max(1, cfg.batch_size // worker.world_size), cfg.network.max_len,
                                 cfg.seed, vocab=vocab, path=Path(data_dir) / "train.parquet",
                                 at_last_visit=cfg.anchor == "last_visit", memory=memory)
    else:
        learned_from = tuple(cfg.train_on.split("+"))  # ("train",) or ("train", "validation")
        train_set = splits["train"]
        if "validation" in learned_from:
            train_set = train_set.concatenated(splits["validation"])
        if model_cfg.day_gaps > 1:  # counted over the samples the model learns from, each once
            set_day_gap_prior(model, fit_day_gap_prior(train_set.locations, train_set.times, train_set.durations,
                                                       train_set.recency, model_cfg.day_gaps, model_cfg.time_slots,
                                                       model_cfg.duration_buckets).to(worker.device))
        visits = FirstVisits.from_data_dir(data_dir, vocab, learned_from) if cfg.simulate_unseen else None
        if cfg.recent_repeat:  # each person's latest samples once more, after the others
            again = latest_samples(data_dir, learned_from, cfg.recent_repeat)
            train_set = train_set.concatenated(train_set.subset(again))
            visits = visits.extended(again) if visits is not None else None
        if cfg.simulate_unseen:
            train_set = UnseenSimulation(train_set, visits, cfg.known_fraction_min, cfg.known_fraction_max)
        if cfg.visit_dropout:
            train_set = VisitDropout(train_set, cfg.visit_dropout)
        loader = train_loader(train_set, cfg, worker)
    averaged = copy.deepcopy(model) if cfg.weight_average else None
    state = TrainState(cfg, worker, model_cfg, model, model, batch_loss, averaged, optimizer, scheduler, scaler,
                       amp_dtype, loader, splits, parameters,
                       seeds=[{"best_metric": -math.inf, "best_epoch": -1, "bad_epochs": 0, "best_state": None}
                              for _ in range(cfg.fused_seeds)] if cfg.fused_seeds > 1 else None)
    if not cfg.resume and worker.restored is None and worker.is_chief and (out_dir / "checkpoints").exists():
        shutil.rmtree(out_dir / "checkpoints")  # a fresh start: older epochs must not outlive the new ones
    resume_from = _resume_point(cfg, worker, out_dir)
    if resume_from is not None:
        saved = read_checkpoint(resume_from, worker.device)
        check_resumable(saved["config"], cfg, resume_from)
        state.restore(saved)
    if worker.world_size > 1:
        state.ddp_model = wrap_ddp(model, worker)
    if cfg.compile_model:
        state.batch_loss = compiled(batch_loss, cfg, worker.device)
    if cfg.capture_step:  # after the restore: the learning rate the schedule reached, on the device
        use_device_learning_rate(optimizer, worker.device)
        state.whole_step = WholeStep(state)
    return state


def fused_seed_model(model_cfg: ModelConfig, seed: int, seeds: int) -> Ensemble:
    """fused_seeds: `seeds` networks of model_cfg (one network each) side by side, network i drawn from seed + i as a
    run of that seed draws its model. The first seed's is drawn last, so that the global generator then goes on
    (batches, dropout) as in a run of that seed alone."""
    drawn = {}
    for i in reversed(range(seeds)):
        torch.manual_seed(seed + i)
        drawn[i] = build_model(model_cfg)
    return Ensemble.of([drawn[i] for i in range(seeds)], dataclasses.replace(model_cfg, members=seeds))



"""Where a training or scoring loop runs: one process here, or one rank of Ray Train's workers, which supply
rank, world size and device (pgt.training.distributed builds it from ray.train's context)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Worker:
    rank: int = 0
    world_size: int = 1
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    restored: Path | None = None  # a checkpoint.pt the runtime hands back after a failure (Ray's get_checkpoint)
    train_shard: object | None = None  # a Ray Data shard of the train split to stream (--data-engine ray); None: in memory
    ray_owned: bool = False  # under Ray Train: checkpoints go to Ray (reported) and come back only by get_checkpoint;
    # else rank 0 keeps them in out_dir/checkpoints

    @property
    def is_chief(self) -> bool:
        return self.rank == 0



def local_worker() -> Worker:
    return Worker(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))

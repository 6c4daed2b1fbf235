"""Where a training or scoring loop runs: one process here, or one rank of Ray Train's workers, which supply
rank, world size and device (pgt.training.ray_train builds it from ray.train's context); and what a rank does
with the others: seeding, its threads, DDP's wrapping, a mean over ranks, text from rank 0, a check that the
replicas agree."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.deterministic
from torch.nn.parallel import DistributedDataParallel


@dataclass
class Worker:
    rank: int = 0
    world_size: int = 1
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    restored: Path | None = None  # a checkpoint.pt the runtime hands back after a failure (Ray's get_checkpoint)
    train_shard: object | None = None  # a Ray Data shard of the train split to stream (--data-engine ray); None: loaded whole
    ray_owned: bool = False  # under Ray Train: checkpoints go to Ray (reported) and come back only by get_checkpoint;
    # else rank 0 keeps them in out_dir/checkpoints
    outputs: Path | None = None  # where rank 0 writes best.pt and metrics.json at the end; None: the run's out_dir

    @property
    def is_chief(self) -> bool:
        return self.rank == 0



def local_worker() -> Worker:
    return Worker(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed Python, NumPy and torch; `deterministic` turns torch's deterministic algorithms on (else off).

    Training asks for them on CPU only: on CUDA they buy no reproducibility (cuDNN's attention backward has no
    deterministic kernel) and cost the most time of a compiled step, since they make every embedding's backward
    (an index_put that accumulates) sort its indices and add duplicates one by one."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    # deterministic kernels never read memory they did not write; filling each new tensor with NaN first (torch's
    # default in this mode, a debugging aid) cost 384 fills per step on a CPU and 512 kernels of 1,165 on a GPU
    torch.utils.deterministic.fill_uninitialized_memory = False


def default_threads(world_size: int) -> int:
    """A worker's torch threads when TrainConfig.threads is 0: $OMP_NUM_THREADS where it is set (Ray sets it to a
    task's CPUs; a test runner or a shared machine sets it to this process's share), else the cores this process may
    run on, shared by the workers. More threads than cores leaves a parallel op waiting at its barrier for a thread
    the OS has descheduled: on 2 cores beside another busy process, a CPU step took 7 times as long with 2 threads."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, len(os.sched_getaffinity(0)) // world_size)


def broadcast_text(text: str, worker: Worker, src: int = 0) -> str:
    """Rank `src`'s text on every rank, sent as tensors (no pickling; works under gloo and NCCL)."""
    data = torch.tensor(list(text.encode()), dtype=torch.int64, device=worker.device)
    length = torch.tensor([len(data)], dtype=torch.int64, device=worker.device)
    dist.broadcast(length, src=src)
    if worker.rank != src:
        data = torch.zeros(int(length), dtype=torch.int64, device=worker.device)
    if int(length):
        dist.broadcast(data, src=src)
    return bytes(data.cpu().tolist()).decode()


def all_reduce_mean(loss_sum: torch.Tensor, seen: int, worker: Worker) -> tuple[float, int]:
    if worker.world_size > 1:
        packed = torch.stack([loss_sum.float(), torch.tensor(float(seen), device=loss_sum.device)])
        dist.all_reduce(packed)
        return float(packed[0] / packed[1]), int(packed[1])
    return float(loss_sum) / max(seen, 1), seen


def wrap_ddp(model: torch.nn.Module, worker: Worker) -> torch.nn.Module:
    ids = [worker.device.index] if worker.device.type == "cuda" else None
    # the one-sided variants leave the gate (and the pointer variant the generator) out of the graph
    unused = getattr(model, "cfg", None) is not None and model.cfg.variant in ("mhsa", "pointer")
    # broadcast_buffers off: the only buffer is the constant positional encoding, no need to sync it every step
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=unused, broadcast_buffers=False,
                                   gradient_as_bucket_view=True)


def replicas_in_sync(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether every rank holds bit-identical parameters (a digest of their bytes, all-gathered as tensors)."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    mine = torch.tensor(list(digest.digest()), dtype=torch.int64, device=device)  # (32,)
    digests = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(digests, mine)
    return all(torch.equal(d, digests[0]) for d in digests)

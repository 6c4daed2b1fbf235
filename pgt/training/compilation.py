"""torch.compile of a training step (TrainConfig.compile_model), and the toolchain it needs."""

from __future__ import annotations

import importlib.util
import shutil
from typing import Callable

import torch

from infra.errors import SettingsError
from pgt.config import TrainConfig


def c_compiler() -> str | None:
    """The C compiler on PATH (cc, gcc or clang), which torch.compile builds its kernels with; None without one."""
    return next((found for found in map(shutil.which, ("cc", "gcc", "clang")) if found), None)


def check_compile_toolchain(device: torch.device | str | None = None) -> None:
    """SettingsError unless torch.compile can build kernels here (compile_model): a C compiler on PATH (inductor's
    CPU code and Triton's launchers are compiled with it) and, for CUDA, Triton."""
    if c_compiler() is None:
        raise SettingsError("compile_model: torch.compile builds its kernels with a C compiler, and none (cc, gcc, clang) "
                            "is on PATH; install one, or train without --compile-model")
    cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if cuda and importlib.util.find_spec("triton") is None:
        raise SettingsError("compile_model: torch.compile on CUDA needs Triton, which is not installed; install the "
                            "triton that matches torch, or train without --compile-model")


def compiled(step: Callable, cfg: TrainConfig, device: torch.device) -> Callable:
    """torch.compile of a training step's pass and loss (TrainConfig.compile_model): static_width gives the batches
    a few fixed shapes and pad_slots the output one width per shape, so each compiles once (dynamic=False) into one
    graph with no host sync; on CUDA, mode reduce-overhead replays it as a CUDA graph, each call marked as a new
    step (the last one's graph outputs are done with). The model is the one trained: checkpoints, validation and
    test use it as it is."""
    import torch._dynamo.config

    check_compile_toolchain(device)
    shapes = -(-(cfg.network.max_len + cfg.network.memory_size) // cfg.static_width)  # the widths static_width gives
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, shapes + 1)
    if device.type != "cuda" or cfg.capture_step:  # capture_step captures the whole step, compiled kernels and all
        return torch.compile(step, mode="default", dynamic=False)
    graphed = torch.compile(step, mode="reduce-overhead", dynamic=False)

    def new_step(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return graphed(*args, **kwargs)

    return new_step

"""The whole training step as one unit (TrainConfig.capture_step): the batch gathered on the device, the model's
pass, the loss, the backward pass, gradient clipping, the optimizer step, the moving average of the weights and the
epoch's loss sum, all from one static (B,) index tensor. On CUDA each batch width is captured once as a CUDA graph
and replayed: a step then costs one index copy and one graph launch, with no Python, no guard and no launch per
kernel between them. On a CPU the same function runs as it is, so the step that is captured is the step tested.

    step = WholeStep(state)        # after setup(): the model, optimizer and resident batches of a run
    for idx, width in batches:     # ResidentBatches.indices(): (B,) device indices and the batch's width
        step(idx, width)
    step.loss_sum                  # () the epoch's summed loss (a member's mean per sample, times samples)

What capture asks of the step, and why each holds here:
- fixed shapes: static_width fills every batch to full size and rounds its width up (one graph per width);
- no host synchronisation: the resident gather, the unseen simulation, the padded slot columns (pad_slots) and the
  smoothed loss over the real columns stay on the device; clip_grad_norm_ scales by a clamped device tensor;
- an optimizer that reads its learning rate and step count from device memory: AdamW with capturable=True and a
  tensor learning rate, which the per-epoch schedule fills in place (LRScheduler does for a tensor lr);
- no loss scaling: bfloat16 autocast (or float32) needs no GradScaler, whose inf check reads the host.
A width runs eagerly WARMUP_STEPS times on a side stream (cuBLAS handles, the optimizer's state, torch.compile's
kernels with compile_model are made then, as capture requires) before it is captured; those are real steps of the
run, so the weights after any number of steps are those of the uncaptured loop.
"""

from __future__ import annotations

from collections import Counter

import torch

from infra.errors import SettingsError
from pgt.network.model import networks

WARMUP_STEPS = 2  # eager steps of a width before its capture (the CUDA graph docs' warm-up, on a side stream)


def check_capturable(cfg, device: torch.device, amp_dtype: torch.dtype | None, world_size: int) -> None:
    """SettingsError unless the whole step can be captured here: resident, static batches on one worker, and on CUDA
    no float16 loss scaling."""
    if not (cfg.resident_data and cfg.static_width):
        raise SettingsError("capture_step captures one graph per batch shape: set resident_data and static_width too")
    if world_size > 1:
        raise SettingsError("capture_step captures one worker's whole step; with DDP the gradients' all-reduce sits "
                            "inside it: train with one worker (or without capture_step)")
    if device.type == "cuda" and amp_dtype == torch.float16:
        raise SettingsError("capture_step needs bfloat16 autocast (or amp off): float16's loss scaling checks the "
                            "gradients on the host every step, which a CUDA graph cannot hold")


def use_device_learning_rate(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Each parameter group's learning rate as a (0-d) tensor on the device, and on CUDA the optimizer capturable
    (its step count on the device too): the graph reads both at every replay, and the schedule fills the learning
    rate in place. Also after a checkpoint's load_state_dict, which puts back the saved groups (a float, and
    capturable as saved)."""
    cuda = device.type == "cuda"
    for group in optimizer.param_groups:
        # float64 where the fused kernel takes it (the CPU's), so the rate is the float schedule's to the bit
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32 if cuda else torch.float64, device=device)
        group["capturable"] = cuda


def portable_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """optimizer.state_dict() with each group's learning rate as a float: a checkpoint of a captured run resumes
    with or without capture_step, on any device."""
    saved = optimizer.state_dict()
    for group in saved["param_groups"]:
        group["lr"] = float(group["lr"])
        group["capturable"] = False
    return saved


@torch.no_grad()
def average_weights(averaged: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    """averaged <- decay * averaged + (1 - decay) * model, parameter by parameter (buffers are copied)."""
    torch._foreach_lerp_(list(averaged.parameters()), list(model.parameters()), 1.0 - decay)
    for mine, theirs in zip(averaged.buffers(), model.buffers()):
        mine.copy_(theirs)


def train_step(state, batch) -> torch.Tensor:
    """The one training step, launched op by op or captured (WholeStep): the model's pass and loss, the backward
    pass, each network's gradients clipped apart (an ensemble's members, fused seeds, as if trained apart), the
    optimizer step, the moving average of the weights. The batch's loss, on the device. The scaler is float16's
    loss scaling on CUDA, and passes everything through otherwise (a captured step never has it on)."""
    loss = state.batch_loss(state.ddp_model, batch, state.model_cfg, state.cfg, state.amp_dtype)
    state.optimizer.zero_grad(set_to_none=True)
    state.scaler.scale(loss).backward()
    state.scaler.unscale_(state.optimizer)
    for network in networks(state.model):
        torch.nn.utils.clip_grad_norm_(network.parameters(), state.cfg.grad_clip)
    state.scaler.step(state.optimizer)
    state.scaler.update()
    if state.averaged is not None:
        average_weights(state.averaged, state.model, state.cfg.weight_average)
    return loss.detach()


class WholeStep:
    """A run's training step from (B,) batch indices (see the module's docstring). Captured per width on CUDA."""

    def __init__(self, state):
        self.state = state
        self.dataset = state.loader.dataset  # the resident train split, on the device
        self.device = state.worker.device
        self.capture = self.device.type == "cuda"
        self.side_by_side = state.side_by_side
        self.loss_sum = torch.zeros((), device=self.device)
        self.index: dict[int, torch.Tensor] = {}  # width -> the static (B,) indices its graph reads
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.eager_steps: Counter[int] = Counter()
        self.replays = 0

    def __call__(self, idx: torch.Tensor, width: int) -> None:
        static = self.index.get(width)
        if static is None:
            static = self.index[width] = torch.empty_like(idx)
        static.copy_(idx, non_blocking=True)
        graph = self.graphs.get(width)
        if graph is not None:
            graph.replay()
            self.replays += 1
        elif not self.capture:
            self.step(static, width)
        elif self.eager_steps[width] < WARMUP_STEPS:
            self.eager_steps[width] += 1
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.step(static, width)
            torch.cuda.current_stream(self.device).wait_stream(side)
        else:
            graph = torch.cuda.CUDAGraph()
            self.state.optimizer.zero_grad(set_to_none=True)  # captured backward writes fresh gradients
            # thread_local: the system-metrics thread may read the device while this one captures
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.step(static, width)
            self.graphs[width] = graph
            graph.replay()  # capture records the kernels without running them: this batch's step runs now
            self.replays += 1

    def step(self, idx: torch.Tensor, width: int) -> None:
        """A batch gathered on the device, then train_step: the same kernels whether launched one by one or
        replayed from a graph."""
        loss = train_step(self.state, self.dataset.gather(idx, width))
        self.loss_sum += loss * idx.shape[0] / self.side_by_side  # one network's mean loss, times samples

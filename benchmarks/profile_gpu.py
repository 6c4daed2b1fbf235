"""Where a training epoch's time goes: one epoch of a recipe under torch.profiler, after a warm-up epoch.

    python benchmarks/profile_gpu.py --data-dir DIR [--recipe tuned] [--resident-data] [--static-width 16]
                                     [--compile-model] [--capture-step] [--device cuda|cpu]
                                     [--one-hot-rows N] [--results benchmarks/results/profile_gpu.json]

It times the epoch's training loop and its validation pass apart, counts the kernels launched and the
optimizer steps, and sums the time the device spent in kernels. Then it times the test split's forward pass: the
model alone on batches already on the device (FORWARD_BATCHES; with --compile-model also compiled), and the
evaluation pass as training runs it (batches gathered on the host, ranks and metrics). Where the kernels' sum is
a small part of the loop's wall time, the loop is bound by launches and Python, not by arithmetic: the profile says so in
`device_busy_fraction`. The JSON holds the ops that took the most time on the host and on the device, and the
table printed shows the same. `--one-hot-rows 0` looks every table up as an embedding (pgt.network.model.lookup):
the baseline of the one-hot lookup, on the same card in the same call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from train import gpu_machine, harness_options  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "profile_gpu.json"
TOP = 15  # ops listed per table
FORWARD_BATCHES = (1024, 4096)  # batch sizes of the forward-only timing
REPEATS = 10  # timed passes over the test split per batch size (the median counts)
UNPROFILED_EPOCHS = 3  # epochs timed without the profiler after the profiled one (the median counts)


def top_ops(averages, key: str, n: int = TOP) -> list[dict]:
    """The `n` ops with the most self time by `key` ("self_device_time_total" or "self_cpu_time_total")."""
    rows = sorted(averages, key=lambda e: getattr(e, key, 0) or 0, reverse=True)[:n]
    return [{"op": e.key, "calls": e.count, "self_ms": round((getattr(e, key, 0) or 0) / 1e3, 3)} for e in rows]


def forward_speeds(state, device: str, sync) -> dict:
    """Test samples per second: of the model's forward alone over the test split, on batches already on the
    device (the median of REPEATS passes, per FORWARD_BATCHES size, after a warm-up pass), and of the evaluation
    pass as training runs it (score_dataset, eval_batch_size). With compile_model, also the forward compiled (on
    CUDA as CUDA graphs, with pad_slots' static width) at the largest batch size, its warm-up pass compiling."""
    import numpy as np
    import torch

    from pgt.data.scoring import model_scores, score_dataset
    from pgt.training.compilation import compiled as compiled_step

    test, model = state.splits["test"], state.evaluated
    model.eval()
    order = np.argsort(test.lengths.numpy(), kind="stable")  # little padding, as evaluation sorts

    def samples_per_s(forward, size: int) -> float:
        batches = [test.__getitems__(order[i:i + size].tolist()).to(device) for i in range(0, len(test), size)]
        seconds = []
        with torch.inference_mode(), torch.autocast(device, dtype=state.amp_dtype, enabled=state.amp_dtype is not None):
            for _ in range(REPEATS + 1):
                sync()
                began = time.perf_counter()
                for batch in batches:
                    forward(batch)
                sync()
                seconds.append(time.perf_counter() - began)
        return round(len(test) / float(np.median(seconds[1:])), 1)

    speeds = {str(size): samples_per_s(lambda batch: model(*batch.inputs()), size) for size in FORWARD_BATCHES}
    compiled = {}
    if state.cfg.compile_model:
        fast = compiled_step(model, state.cfg, torch.device(device))  # training's torch.compile, CUDA graphs on CUDA
        compiled = {str(FORWARD_BATCHES[-1]): samples_per_s(lambda batch: fast(*batch.inputs(), pad_slots=True),
                                                            FORWARD_BATCHES[-1])}
    began = time.perf_counter()
    score_dataset(model_scores(model), test, state.cfg.eval_batch_size, torch.device(device))
    sync()
    return {"test_samples": len(test), "forward_samples_per_s": speeds, "compiled_forward_samples_per_s": compiled,
            "evaluation_samples_per_s": round(len(test) / (time.perf_counter() - began), 1)}


def profile_epoch(data_dir: Path, recipe: str, device: str, options: dict) -> dict:
    """Warm up one epoch, then profile the next: the loop's and validation's seconds, kernels and top ops."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pgt.config import TrainConfig
    from pgt.data.scoring import evaluate, model_scores
    from pgt.training.state import setup
    from pgt.training.train import train_epoch
    from pgt.training.worker import Worker

    with tempfile.TemporaryDirectory(prefix="pgt-profile-") as out:
        config = TrainConfig.from_recipe(recipe, data_dir=str(data_dir), out_dir=out, resume=False, refit=False,
                                         train_on="train", evaluate_test=False, epochs=50, min_epochs=50,
                                         **options)
        state = setup(config.to_dict(), Worker(device=torch.device(device)))
        train_epoch(state, 0)  # warm-up: allocator, cuBLAS handles, autotuning
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        with profile(activities=activities) as prof:
            sync()
            began = time.perf_counter()
            row = train_epoch(state, 1)
            sync()
            epoch_wall = time.perf_counter() - began
        loops, walls = [], []
        for epoch in range(2, 2 + UNPROFILED_EPOCHS):  # the next epochs without the profiler's own cost
            sync()
            began = time.perf_counter()
            loops.append(train_epoch(state, epoch)["seconds"])
            sync()
            walls.append(time.perf_counter() - began)
        began = time.perf_counter()
        evaluate(model_scores(state.evaluated), state.splits["validation"], config.eval_batch_size,
                 torch.device(device), state.validation_loss(), state.worker)
        sync()
        validation_s = time.perf_counter() - began
        forward = forward_speeds(state, device, sync)
    averages = prof.key_averages()
    events = prof.events()
    device_key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    kernels = [e for e in events if getattr(e, "device_type", None) is not None
               and str(e.device_type).endswith("CUDA")]
    kernel_s = sum(getattr(e, "device_time_total", 0) or 0 for e in kernels) / 1e6
    steps = -(-row["samples"] // config.batch_size)
    return {
        "recipe": recipe, "device": device, "options": options,
        "samples": row["samples"], "steps": steps,
        "loop_s": round(row["seconds"], 4), "epoch_with_validation_s": round(epoch_wall, 4),
        "unprofiled_loop_s": round(statistics.median(loops), 4),
        "unprofiled_epoch_with_validation_s": round(statistics.median(walls), 4),
        "validation_s": round(validation_s, 4),
        # steps whose forward ran as compiled graphs (compile_model; 0 for the eager model)
        "compiled_steps": sum(1 for e in events if e.name.startswith("Torch-Compiled Region")),
        # replays of captured CUDA graphs (compile_model or capture_step on CUDA; 0 where steps launch their kernels)
        "cuda_graph_launches": sum(1 for e in events if e.name == "cudaGraphLaunch"),
        "kernels": len(kernels), "kernels_per_step": round(len(kernels) / max(1, steps), 1),
        "kernel_s": round(kernel_s, 4),
        "device_busy_fraction": round(kernel_s / row["seconds"], 3) if device == "cuda" else None,
        "host_ms_per_step": round(1e3 * row["seconds"] / max(1, steps), 3),
        **forward,
        "top_device_ops": top_ops(averages, device_key),
        "top_host_ops": top_ops(averages, "self_cpu_time_total"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="a `pgt preprocess` output")
    parser.add_argument("--recipe", default="tuned", help="pgt.recipes.RECIPES")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--resident-data", action="store_true", help="TrainConfig.resident_data")
    parser.add_argument("--static-width", type=int, default=0, help="TrainConfig.static_width")
    parser.add_argument("--compile-model", action="store_true", help="TrainConfig.compile_model (the warm-up epoch compiles)")
    parser.add_argument("--capture-step", action="store_true",
                        help="TrainConfig.capture_step (the warm-up epoch captures each width's whole step)")
    parser.add_argument("--one-hot-rows", type=int, default=None,
                        help="pgt.network.model.ONE_HOT_ROWS for this run (0: every table an embedding lookup)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    options = harness_options(args, DEFAULT_RESULTS, DEFAULT_RESULTS)  # a CPU dry run names its file, and so on
    if args.one_hot_rows is not None and args.one_hot_rows < 0:
        raise SystemExit(f"error: --one-hot-rows {args.one_hot_rows}: expected 0 or more")
    if not (args.data_dir / "manifest.json").is_file():
        raise SystemExit(f"error: {args.data_dir}: no manifest.json; expected a `pgt preprocess` output")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("error: --device cuda but torch sees no CUDA device")
    from pgt.network import model as network

    if args.one_hot_rows is not None:
        network.ONE_HOT_ROWS = args.one_hot_rows
    result = profile_epoch(args.data_dir, args.recipe, args.device, options)
    record = {"benchmark": "profile-gpu", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "machine": gpu_machine(args.device), "one_hot_rows": network.ONE_HOT_ROWS, **result}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(record, indent=2) + "\n")

    from rich.console import Console
    from rich.table import Table
    console = Console()
    console.print(f"{args.recipe} on {args.device}: loop {result['loop_s']} s for {result['steps']} steps (unprofiled "
                  f"{result['unprofiled_loop_s']} s) "
                  f"({result['host_ms_per_step']} ms/step), validation {result['validation_s']} s, "
                  f"{result['kernels']} kernels ({result['kernels_per_step']}/step), kernels' time "
                  f"{result['kernel_s']} s, device busy {result['device_busy_fraction']}")
    console.print(f"test forward ({result['test_samples']} samples), model alone: "
                  + ", ".join(f"{v:,.0f} samples/s at batch {k}" for k, v in result["forward_samples_per_s"].items())
                  + "".join(f"; compiled: {v:,.0f} samples/s at batch {k}"
                            for k, v in result["compiled_forward_samples_per_s"].items())
                  + f"; evaluation pass: {result['evaluation_samples_per_s']:,.0f} samples/s")
    for title, key in (("device", "top_device_ops"), ("host", "top_host_ops")):
        table = Table(title=f"top ops by self time on the {title}")
        for column in ("op", "calls", "self ms"):
            table.add_column(column)
        for op in result[key]:
            table.add_row(op["op"][:60], str(op["calls"]), f"{op['self_ms']:.2f}")
        console.print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

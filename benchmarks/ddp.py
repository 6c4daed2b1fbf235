"""Benchmark: DDP scaling of training under Ray Train on the GeoLife sequences.

Trains the PGT (paper defaults) for a fixed number of epochs in this process without Ray, then under
Ray Train with 1 and 2 CPU workers (and 1 GPU worker where CUDA is present), then, for comparison, the
same DDP loop on 2 processes without Ray and 2 independent single-thread runs at once. Reports training
samples/s (median over epochs after the first), the speed-up of 2 workers over 1 and the scaling
efficiency. Writes JSON (default benchmarks/results/ddp.json) and prints a table.

    python benchmarks/ddp.py [--epochs 6] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from preprocess import DEFAULT_INPUT, machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import WORK, sequences  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "ddp.json"
TARGET_SPEEDUP = 1.6  # 2 CPU workers against 1 (issue 4)


def run(data_dir: Path, label: str, workers: int, epochs: int, use_gpu: bool = False) -> dict:
    from pgt.config import LaunchConfig, TrainConfig
    from pgt.training.run import run_training

    cfg = TrainConfig(data_dir=str(data_dir), out_dir=str(WORK / "ddp" / label), epochs=epochs, min_epochs=epochs,
                      resume=False, seed=0)
    began = time.perf_counter()
    result = run_training(cfg, LaunchConfig(workers=workers, gpu=use_gpu)).to_dict()
    wall = time.perf_counter() - began
    speeds = [row["samples_per_second"] for row in result["history"][1:]] or [result["samples_per_second"]]
    return {"label": label, "workers": max(workers, 1), "ray": workers > 0, "gpu": use_gpu, "epochs": result["epochs_run"],
            "samples_per_second_median": round(statistics.median(speeds), 1),
            "samples_per_second_epochs": [round(s, 1) for s in speeds],
            "epoch_seconds_median": round(statistics.median(r["seconds"] for r in result["history"][1:]), 3),
            "wall_s": round(wall, 1), "test_strict_acc@1": round(result["test"]["strict"]["acc@1"], 2),
            "test_acc@1": round(result["test"]["acc@1"], 2),
            "replicas_in_sync": all(r.get("replicas_in_sync", True) for r in result["history"])}


def _torch_ddp_worker(rank: int, world_size: int, port: int, config: dict) -> None:
    import torch.distributed as dist

    from pgt.training.train import train_loop_per_worker
    from pgt.training.worker import Worker

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        train_loop_per_worker(config, worker=Worker(rank=rank, world_size=world_size))
    finally:
        dist.destroy_process_group()


def run_without_ray(data_dir: Path, label: str, processes: int, epochs: int, ddp: bool) -> dict:
    """The same loop on single-thread processes without Ray: one DDP group of `processes` (torch.multiprocessing
    and gloo), or `processes` independent runs at once (the machine's parallel capacity, no communication)."""
    import socket

    import torch.multiprocessing as mp

    def config(tag: str) -> dict:
        return {"data_dir": str(data_dir), "out_dir": str(WORK / "ddp" / tag), "epochs": epochs, "min_epochs": epochs,
                "resume": False, "seed": 0, "threads": 1}

    began = time.perf_counter()
    if ddp:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        mp.spawn(_torch_ddp_worker, args=(processes, port, config(label)), nprocs=processes)
        outs = [WORK / "ddp" / label]
    else:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_independent, args=(config(f"{label}-{i}"),)) for i in range(processes)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        outs = [WORK / "ddp" / f"{label}-{i}" for i in range(processes)]
    wall = time.perf_counter() - began
    histories = [json.loads((out / "metrics.json").read_text())["history"][1:] for out in outs]
    speed = sum(statistics.median(r["samples_per_second"] for r in h) for h in histories)  # combined
    first = json.loads((outs[0] / "metrics.json").read_text())
    return {"label": label, "workers": processes, "ray": False, "gpu": False, "epochs": first["epochs_run"],
            "samples_per_second_median": round(speed, 1), "samples_per_second_epochs": [],
            "epoch_seconds_median": round(statistics.median(r["seconds"] for r in histories[0]), 3),
            "wall_s": round(wall, 1), "test_strict_acc@1": round(first["test"]["strict"]["acc@1"], 2),
            "test_acc@1": round(first["test"]["acc@1"], 2),
            "replicas_in_sync": all(r.get("replicas_in_sync", True) for r in histories[0])}


def _independent(config: dict) -> None:
    from pgt.training.train import train_loop_per_worker

    train_loop_per_worker(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import torch
    from rich.console import Console
    from rich.table import Table

    data_dir = sequences(args.input, None)
    rows = [run(data_dir, "in-process", 0, args.epochs)]
    rows += [run(data_dir, f"ray-{n}-cpu", n, args.epochs) for n in args.workers]
    # what the loop and the machine can do without Ray's own processes
    rows.append(run_without_ray(data_dir, "torch-ddp-2-no-ray", 2, args.epochs, ddp=True))
    rows.append(run_without_ray(data_dir, "2-independent-no-ray", 2, args.epochs, ddp=False))
    if torch.cuda.is_available():
        rows.append(run(data_dir, "ray-1-gpu", 1, args.epochs, use_gpu=True))
    by = {r["label"]: r for r in rows}
    one, two = by.get("ray-1-cpu"), by.get("ray-2-cpu")
    speedup = round(two["samples_per_second_median"] / one["samples_per_second_median"], 3) if one and two else None
    whole = by["in-process"]["samples_per_second_median"]
    result = {
        "benchmark": "ddp", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "data": shown_path(data_dir), "epochs": args.epochs, "runs": rows,
        "speedup_2_over_1": speedup, "scaling_efficiency": round(speedup / 2, 3) if speedup else None,
        "target_speedup": TARGET_SPEEDUP, "meets_target": bool(speedup and speedup >= TARGET_SPEEDUP),
        # one process using every core through torch's intra-op threads, against the 2 single-thread workers
        "ray_2_over_in_process": round(two["samples_per_second_median"] / whole, 3) if two else None,
        "torch_ddp_2_over_ray_1": round(by["torch-ddp-2-no-ray"]["samples_per_second_median"]
                                        / one["samples_per_second_median"], 3) if one else None,
        "independent_2_over_ray_1": round(by["2-independent-no-ray"]["samples_per_second_median"]
                                          / one["samples_per_second_median"], 3) if one else None,
        "note": "Each Ray worker uses as many torch threads as CPUs it reserves (1 here); the in-process run uses "
                "all cores through intra-op threads. The two runs without Ray bound what 2 cores allow: the same "
                "DDP loop on torch.multiprocessing, and two independent runs (their samples/s summed).",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"DDP under Ray Train, PGT on GeoLife ({args.epochs} epochs, {machine()['cores']} cores)")
    for col in ("run", "workers", "samples/s (median)", "epoch s", "wall s", "test strict acc@1", "test acc@1",
                "replicas equal"):
        table.add_column(col, justify="right" if col != "run" else "left")
    for r in rows:
        table.add_row(r["label"], str(r["workers"]), f"{r['samples_per_second_median']:,.0f}", f"{r['epoch_seconds_median']:.2f}",
                      f"{r['wall_s']:.0f}", f"{r.get('test_strict_acc@1', float('nan')):.2f}", f"{r['test_acc@1']:.2f}",
                      str(r["replicas_in_sync"]))
    Console().print(table)
    if speedup:
        Console().print(f"2 workers / 1 worker: {speedup:.2f}x (efficiency {speedup / 2:.0%}; target {TARGET_SPEEDUP}x); "
                        f"2 workers / one process on all cores: {result['ray_2_over_in_process']:.2f}x")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

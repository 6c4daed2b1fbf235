"""Benchmark: DDP scaling of training under Ray Train on the GeoLife sequences.

Trains the PGT (paper defaults) for a fixed number of epochs in this process without Ray, then under
Ray Train with 1 and 2 CPU workers (and 1 GPU worker where CUDA is present), and reports training
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
from preprocess import DEFAULT_INPUT, machine  # noqa: E402
from train import WORK, sequences  # noqa: E402

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "ddp.json"
TARGET_SPEEDUP = 1.6  # 2 CPU workers against 1 (issue 4)


def run(data_dir: Path, label: str, workers: int, epochs: int, use_gpu: bool = False) -> dict:
    from pgt.distributed import LaunchConfig, run_training
    from pgt.train import TrainConfig

    cfg = TrainConfig(data_dir=str(data_dir), out_dir=str(WORK / "ddp" / label), epochs=epochs, min_epochs=epochs,
                      resume=False, seed=0)
    began = time.perf_counter()
    result = run_training(cfg, LaunchConfig(workers=workers, use_gpu=use_gpu))
    wall = time.perf_counter() - began
    speeds = [row["samples_per_second"] for row in result["history"][1:]] or [result["samples_per_second"]]
    return {"label": label, "workers": max(workers, 1), "ray": workers > 0, "gpu": use_gpu, "epochs": result["epochs_run"],
            "samples_per_second_median": round(statistics.median(speeds), 1),
            "samples_per_second_epochs": [round(s, 1) for s in speeds],
            "epoch_seconds_median": round(statistics.median(r["seconds"] for r in result["history"][1:]), 3),
            "wall_s": round(wall, 1), "test_acc@1": round(result["test"]["acc@1"], 2),
            "replicas_in_sync": all(r.get("replicas_in_sync", True) for r in result["history"])}


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
    if torch.cuda.is_available():
        rows.append(run(data_dir, "ray-1-gpu", 1, args.epochs, use_gpu=True))
    by = {r["label"]: r for r in rows}
    one, two = by.get("ray-1-cpu"), by.get("ray-2-cpu")
    speedup = round(two["samples_per_second_median"] / one["samples_per_second_median"], 3) if one and two else None
    result = {
        "benchmark": "ddp", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "data": str(data_dir), "epochs": args.epochs, "runs": rows,
        "speedup_2_over_1": speedup, "scaling_efficiency": round(speedup / 2, 3) if speedup else None,
        "target_speedup": TARGET_SPEEDUP, "meets_target": bool(speedup and speedup >= TARGET_SPEEDUP),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"DDP under Ray Train, PGT on GeoLife ({args.epochs} epochs, {machine()['cpus']} CPUs)")
    for col in ("run", "workers", "samples/s (median)", "epoch s", "wall s", "test acc@1", "replicas equal"):
        table.add_column(col, justify="right" if col != "run" else "left")
    for r in rows:
        table.add_row(r["label"], str(r["workers"]), f"{r['samples_per_second_median']:,.0f}", f"{r['epoch_seconds_median']:.2f}",
                      f"{r['wall_s']:.0f}", f"{r['test_acc@1']:.2f}", str(r["replicas_in_sync"]))
    Console().print(table)
    if speedup:
        Console().print(f"2 workers / 1 worker: {speedup:.2f}x (efficiency {speedup / 2:.0%}; target {TARGET_SPEEDUP}x)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

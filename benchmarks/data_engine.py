"""Benchmark: training on GeoLife with the train split loaded whole (`--data-engine loaded`) and streamed with Ray
Data (`--data-engine ray`).

Trains the PGT (paper's recipe, seed 0) on full GeoLife's sequences under Ray Train with 2 CPU workers,
once with every worker holding the train split and once with each streaming its shard. Reports
validation and test accuracy (strict first), training samples/s and the largest process's peak memory
(sampled from /proc over the run's processes). Writes JSON (default benchmarks/results/data_engine.json)
and prints a table.

    python benchmarks/data_engine.py [--epochs 8]
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
from scale import LargestProcess  # noqa: E402 - after sys.path gains the benchmarks
from train import WORK, sequences  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "data_engine.json"


def run(data_dir: Path, engine: str, epochs: int, workers: int) -> dict:
    from pgt.config import LaunchConfig, TrainConfig
    from pgt.training.run import run_training

    cfg = TrainConfig(data_dir=str(data_dir), out_dir=str(WORK / "data_engine" / engine), epochs=epochs,
                      min_epochs=epochs, resume=False, seed=0)
    sampler = LargestProcess(os.getpid(), every_s=0.5)
    began = time.perf_counter()
    result = run_training(cfg, LaunchConfig(workers=workers, data_engine=engine)).to_dict()
    wall = time.perf_counter() - began
    peak = sampler.stop()
    speeds = [row["samples_per_second"] for row in result["history"][1:]] or [result["samples_per_second"]]
    return {"engine": engine, "workers": workers, "epochs": result["epochs_run"], "best_epoch": result["best_epoch"],
            "wall_s": round(wall, 1), "samples_per_second_median": round(statistics.median(speeds), 1),
            "samples_per_epoch": [row["samples"] for row in result["history"]],
            "peak_gib_largest_process": round(peak / 2**30, 3),
            "validation": {"strict_acc@1": round(result["validation"]["strict"]["acc@1"], 2),
                           "acc@1": round(result["validation"]["acc@1"], 2), "mrr": round(result["validation"]["mrr"], 2)},
            "test": {"strict_acc@1": round(result["test"]["strict"]["acc@1"], 2),
                     "acc@1": round(result["test"]["acc@1"], 2), "mrr": round(result["test"]["mrr"], 2)},
            "replicas_in_sync": all(r.get("replicas_in_sync", True) for r in result["history"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    data_dir = sequences(args.input, None)
    rows = [run(data_dir, engine, args.epochs, args.workers) for engine in ("loaded", "ray")]
    result = {"benchmark": "data_engine", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(data_dir), "recipe": "paper", "seed": 0, "runs": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"PGT on GeoLife, {args.workers} Ray Train workers, {args.epochs} epochs: train split in "
                        "memory or streamed")
    for col in ("data engine", "val strict acc@1", "val acc@1", "test strict acc@1", "test acc@1", "test MRR",
                "samples/s", "largest process GiB", "wall s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["engine"], f"{r['validation']['strict_acc@1']:.2f}", f"{r['validation']['acc@1']:.2f}",
                      f"{r['test']['strict_acc@1']:.2f}", f"{r['test']['acc@1']:.2f}", f"{r['test']['mrr']:.2f}",
                      f"{r['samples_per_second_median']:,.0f}", f"{r['peak_gib_largest_process']:.2f}",
                      f"{r['wall_s']:.0f}")
    Console(width=140).print(table)
    Console().print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

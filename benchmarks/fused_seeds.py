"""Benchmark: what k seeds cost when they train side by side in one run (TrainConfig.fused_seeds) against one seed.

For each k of `--counts` (1 3 5), one run of `--recipe` (tuned; selection only: no refit, test not read) trains k
seeds' networks as one model for exactly `--epochs` epochs (no early stop, so every k runs the same epochs), in
this process on `--device`, with the GPU harness's shape settings (`--resident-data --static-width 16
--capture-step`). It records the training loop's median epoch after the first (which pays for warm-up and
capture), the whole epoch with every seed's validation, the run's wall time and each seed's best validation
strict Acc@1; and the cost of k fused seeds against k runs of one seed (`cost_vs_separate`: fused epoch over k
times the one-seed epoch; below 1 is a saving). Writes JSON and prints a table.

    python benchmarks/fused_seeds.py --data-dir DIR [--counts 1 3 5] [--epochs 12] --resident-data --static-width 16
        --capture-step [--device cuda|cpu] [--results benchmarks/results/fused_seeds_gpu.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from train import gpu_machine, harness_options  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "fused_seeds_gpu.json"
SEED = 100  # the first seed of every run: none of the search's or the reported runs'


def run_fused(data_dir: Path, recipe: str, k: int, epochs: int, device: str, options: dict) -> dict:
    """One run of k fused seeds for exactly `epochs` epochs; its timings and per-seed validation."""
    import torch

    from pgt.config import TrainConfig
    from pgt.training.train import train_loop_per_worker
    from pgt.training.worker import Worker

    ends = []
    with tempfile.TemporaryDirectory(prefix="pgt-fused-") as out:
        config = TrainConfig.from_recipe(recipe, data_dir=str(data_dir), out_dir=out, resume=False, refit=False,
                                         evaluate_test=False, epochs=epochs, min_epochs=epochs, seed=SEED,
                                         fused_seeds=k, **options)
        began = time.perf_counter()
        result = train_loop_per_worker(config.to_dict(), Worker(device=torch.device(device)),
                                       on_epoch=lambda row, checkpoint_dir: ends.append(time.perf_counter()))
        wall = time.perf_counter() - began
    loops = [row["seconds"] for row in result["history"]]
    whole = np.diff([began, *ends])  # each epoch with its validation and checkpoint
    seeds = result.get("seeds") or [{"seed": SEED, "best_epoch": result["best_epoch"],
                                     "validation": result["validation"]}]
    return {"seeds": k, "epochs": len(loops), "loop_epoch_s": round(float(np.median(loops[1:])), 4),
            "first_loop_epoch_s": round(loops[0], 3), "epoch_with_validation_s": round(float(np.median(whole[1:])), 4),
            "wall_s": round(wall, 1), "samples_per_epoch": result["history"][0]["samples"],
            "validation_strict_acc@1": [round(s["validation"]["strict"]["acc@1"], 2) for s in seeds],
            "best_epochs": [s["best_epoch"] for s in seeds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="a `pgt preprocess` output")
    parser.add_argument("--recipe", default="tuned", help="pgt.recipes.RECIPES")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 3, 5], help="seeds per run")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--resident-data", action="store_true", help="TrainConfig.resident_data")
    parser.add_argument("--static-width", type=int, default=0, help="TrainConfig.static_width")
    parser.add_argument("--compile-model", action="store_true", help="TrainConfig.compile_model")
    parser.add_argument("--capture-step", action="store_true", help="TrainConfig.capture_step")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    options = harness_options(args, DEFAULT_RESULTS, DEFAULT_RESULTS)
    if not (args.data_dir / "manifest.json").is_file():
        raise SystemExit(f"error: {args.data_dir}: no manifest.json; expected a `pgt preprocess` output")
    if args.epochs < 2:
        raise SystemExit("error: --epochs must be at least 2 (the first epoch warms up and is not counted)")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("error: --device cuda but torch sees no CUDA device")
    runs = []
    record = {"benchmark": "fused-seeds", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "recipe": args.recipe,
              "options": options, "device": args.device, "machine": gpu_machine(args.device), "runs": runs}
    for k in sorted(set(args.counts)):
        runs.append(run_fused(args.data_dir, args.recipe, k, args.epochs, args.device, options))
        one = next((r for r in runs if r["seeds"] == 1), None)
        for run in runs:  # against k runs of one seed, where one was measured
            if one is not None:
                run["cost_vs_separate"] = round(run["loop_epoch_s"] / (run["seeds"] * one["loop_epoch_s"]), 3)
                run["cost_vs_separate_with_validation"] = round(
                    run["epoch_with_validation_s"] / (run["seeds"] * one["epoch_with_validation_s"]), 3)
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(record, indent=2) + "\n")  # after every run: a cut run keeps the others
        print(f"{k} fused seeds: loop epoch {runs[-1]['loop_epoch_s']} s, with validation "
              f"{runs[-1]['epoch_with_validation_s']} s", file=sys.stderr)
    print_table(record)
    print(f"wrote {args.results}")


def print_table(record: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = record["machine"]
    table = Table(title=f"{record['recipe']}: k seeds fused in one run on {m.get('gpu') or 'CPU'} "
                        f"({', '.join(f'{k}={v}' for k, v in record['options'].items())})")
    for col in ("seeds", "epochs", "loop epoch s", "epoch with validation s", "cost vs k runs", "with validation",
                "validation strict acc@1 per seed"):
        table.add_column(col, justify="left" if col.startswith("validation strict") else "right")
    for r in record["runs"]:
        table.add_row(str(r["seeds"]), str(r["epochs"]), f"{r['loop_epoch_s']:.3f}", f"{r['epoch_with_validation_s']:.3f}",
                      f"{r.get('cost_vs_separate', float('nan')):.2f}",
                      f"{r.get('cost_vs_separate_with_validation', float('nan')):.2f}",
                      " ".join(f"{v:.2f}" for v in r["validation_strict_acc@1"]))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()

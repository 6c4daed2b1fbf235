"""Benchmark: every model on the GeoLife sequences with several seeds, in the shape of SPEC §4.

Preprocesses the full GeoLife Parquet once (reused afterwards), trains each neural model with each
seed (baselines are deterministic: one run), and reports test metrics as mean ± std, training
samples/s (median over epochs) and test forward samples/s, beside the published and reference figures.
A model is trained with the paper's recipe; `MODEL:RECIPE` picks another (pgt.train.RECIPES), e.g.
`pgt:tuned`. Writes JSON (default benchmarks/results/train.json) and prints a table.

    python benchmarks/train.py [--models pgt pgt:tuned mhsa ...] [--seeds 0 1 2] [--epochs 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from preprocess import DEFAULT_INPUT, machine  # noqa: E402

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "train.json"
WORK = ROOT / ".state" / "benchmarks"
METRICS = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1")
PUBLISHED = {  # SPEC §4
    "Pointer Generator Transformer (best published run)": {"acc@1": 53.97, "acc@5": 81.10, "acc@10": 84.38, "mrr": 65.82, "ndcg@10": 70.23},
    "MHSA (best run)": {"acc@1": 33.18, "acc@5": 55.11, "acc@10": 59.02, "mrr": 43.02, "ndcg@10": 46.65},
    "first-order Markov": {"acc@1": 24.18, "acc@5": 37.87, "mrr": 30.34, "ndcg@10": 32.38},
}
REFERENCE_RUN = {  # TARGETS.md: next_loc_clean_v2 on a machine like ours
    "PGT (reference code, this machine)": {"acc@1": 52.97, "acc@5": 81.89, "acc@10": 84.74, "mrr": 65.73, "ndcg@10": 70.31,
                                           "samples_per_second": 725.0},
    "MHSA (reference code, this machine)": {"acc@1": 28.63, "acc@5": 55.46, "acc@10": 60.80, "mrr": 40.50, "ndcg@10": 45.18,
                                            "samples_per_second": 600.0},
}
TARGET = {"pgt_acc@1_mean": 55.0, "pgt_mrr_mean": 67.0, "training_samples_per_second": 1500.0}


def sequences(input_path: Path, config_path: Path | None) -> Path:
    from preprocessing.config import load_config
    from preprocessing.pipeline import preprocess

    out = WORK / ("geolife" if config_path is None else f"geolife-{config_path.stem}")
    preprocess(input_path, "positionfixes", out, load_config(config_path), progress=True)
    return out


def forward_speed(run_dir: Path, data_dir: Path) -> float:
    """Test samples per second of the best model's forward pass (evaluation)."""
    import torch

    from pgt.data import SequenceDataset
    from pgt.explain import load_checkpoint
    from pgt.train import model_scores, predict

    model, cfg = load_checkpoint(run_dir / "best.pt")
    test = SequenceDataset.from_parquet(data_dir / "test.parquet", cfg.max_len)
    score = model_scores(model)
    predict(score, test, 1024, torch.device("cpu"))  # warm-up
    began = time.perf_counter()
    predict(score, test, 1024, torch.device("cpu"))
    return len(test) / (time.perf_counter() - began)


def label(model: str, recipe: str) -> str:
    return model if recipe == "paper" else f"{model} ({recipe})"


def run_one(model: str, recipe: str, seed: int, data_dir: Path, epochs: int) -> dict:
    from pgt.train import BASELINES, TrainConfig, evaluate_baseline, train_loop_per_worker

    out = WORK / "train" / data_dir.name / (model if recipe == "paper" else f"{model}-{recipe}") / f"seed{seed}"
    cfg = TrainConfig.from_recipe(recipe, data_dir=str(data_dir), out_dir=str(out), model=model, seed=seed,
                                  epochs=epochs, resume=False).to_dict()
    began = time.perf_counter()
    result = evaluate_baseline(cfg) if model in BASELINES else train_loop_per_worker(cfg)
    wall = time.perf_counter() - began
    row = {"model": label(model, recipe), "recipe": recipe, "seed": seed, "wall_s": round(wall, 1), "test": result["test"],
           "validation": {k: result["validation"][k] for k in (*METRICS, "n")},
           "best_epoch": result["best_epoch"], "epochs_run": result["epochs_run"], "parameters": result["parameters"]}
    if model not in BASELINES:
        speeds = [h["samples_per_second"] for h in result["history"]]
        row["train_samples_per_second_median"] = round(float(np.median(speeds)), 1)
        row["train_samples_per_second_epochs"] = [round(s, 1) for s in speeds]
        row["test_forward_samples_per_second"] = round(forward_speed(out, data_dir), 1)
    return row


def summarise(rows: list[dict]) -> dict:
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        runs = [r for r in rows if r["model"] == model]
        summary = {"runs": len(runs), "seeds": [r["seed"] for r in runs]}
        for name in METRICS:
            values = np.array([r["test"][name] for r in runs])
            summary[name] = {"mean": round(float(values.mean()), 2), "std": round(float(values.std(ddof=1)) if len(values) > 1 else 0.0, 2)}
        for name in ("train_samples_per_second_median", "test_forward_samples_per_second", "epochs_run", "best_epoch", "parameters"):
            if name in runs[0]:
                summary[name] = round(float(np.mean([r[name] for r in runs])), 1)
        out[model] = summary
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--config", type=Path, default=None, help="PreprocessConfig file (default: the reference protocol)")
    parser.add_argument("--models", nargs="+",
                        default=["pgt", "pgt:tuned", "mhsa", "pointer", "lstm-pg", "markov", "most-frequent"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--keep-others", action="store_true",
                        help="keep the rows of models not run now from the results file (same data and machine)")
    args = parser.parse_args()
    if not args.input.exists():
        raise SystemExit(f"error: {args.input}: no such file (the full GeoLife Parquet lives in ../shared/data)")

    data_dir = sequences(args.input, args.config)
    rows = []
    for name in args.models:
        model, _, recipe = name.partition(":")
        for seed in (args.seeds if model not in ("markov", "most-frequent") else args.seeds[:1]):
            rows.append(run_one(model, recipe or "paper", seed, data_dir, args.epochs))
            t = rows[-1]["test"]
            print(f"{name} seed {seed}: test acc@1 {t['acc@1']:.2f} mrr {t['mrr']:.2f} ({rows[-1]['wall_s']} s)", file=sys.stderr)
    if args.keep_others and args.results.is_file():
        ran = {r["model"] for r in rows}
        rows = [r for r in json.loads(args.results.read_text())["runs"] if r["model"] not in ran] + rows
    summary = summarise(rows)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    # the target is for our pipeline's PGT: the tuned recipe where it ran, else the paper's
    target_row = "pgt (tuned)" if "pgt (tuned)" in summary else "pgt"
    pgt = summary.get(target_row)
    result = {
        "benchmark": "train",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "data": {"input": str(args.input), "config": manifest["config"], "counts": manifest["counts"], "vocab": manifest["vocab"]},
        "summary": summary,
        "published": PUBLISHED,
        "reference_run": REFERENCE_RUN,
        "target": TARGET,
        "target_row": target_row,
        "meets_target": None if pgt is None else {
            "acc@1": pgt["acc@1"]["mean"] >= TARGET["pgt_acc@1_mean"],
            "mrr": pgt["mrr"]["mean"] >= TARGET["pgt_mrr_mean"],
            "training_samples_per_second": pgt["train_samples_per_second_median"] >= TARGET["training_samples_per_second"],
        },
        "runs": rows,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {args.results}")


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = result["data"]["counts"]["samples"]
    table = Table(title=f"GeoLife test metrics, mean ± std over seeds (train {c['train']:,} / test {c['test']:,} samples)")
    for col in ("model", *METRICS, "train samples/s", "test fwd samples/s", "epochs"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for model, s in result["summary"].items():
        table.add_row(f"{model} (n={s['runs']})", *(f"{s[m]['mean']:.2f} ± {s[m]['std']:.2f}" for m in METRICS),
                      f"{s.get('train_samples_per_second_median', 0):.0f}", f"{s.get('test_forward_samples_per_second', 0):.0f}",
                      f"{s.get('epochs_run', 0):.0f}")
    for name, m in {**result["published"], **result["reference_run"]}.items():
        table.add_row(f"[dim]{name}", *(f"[dim]{m[k]:.2f}" if k in m else "[dim]-" for k in METRICS),
                      f"[dim]{m.get('samples_per_second', '-')}", "[dim]-", "[dim]-")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()

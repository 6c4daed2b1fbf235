"""Benchmark: how often the registry's champion moves when the same recipe is registered again on other seeds.

`--recipe` (tuned) is trained on each of `--seeds` (0-9) on the published dataset, as `pgt train --register` trains
it (refit included; test is not read), tracked in a fresh SQLite MLflow store, and registered one after another under one name by
the project's one registry door (pgt.tracking.registry.register_model: the evidence rule). Every challenger is the same
configuration, so no promotion after the first is deserved: each one is a seed's luck. The old rule (promote on any
higher validation score) is replayed on the same sequence of scores beside it. Writes
benchmarks/results/promotion.json (`rule`, `registrations`, `promotions_old_rule`, `promotions_new_rule`: the moves
of the champion after the first registration) and prints a table.

    python benchmarks/promotion.py [--seeds 0 1 ... 9] [--recipe tuned] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from preprocess import DEFAULT_INPUT, machine  # noqa: E402 - after sys.path gains the benchmarks
from train import VARIANTS, WORK, sequences  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "promotion.json"
MODEL_NAME = "pgt-promotion"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--recipe", default="tuned", help="pgt.recipes.RECIPES")
    parser.add_argument("--data-dir", type=Path, default=None, help="a `pgt preprocess` output (default: the "
                                                                     "published variant, preprocessed once)")
    parser.add_argument("--work", type=Path, default=WORK / "promotion")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    from pgt.config import LaunchConfig, TrackingConfig, TrainConfig
    from pgt.tracking.registry import SEED_NOISE_FLOOR, Z, old_rule
    from pgt.training.run import run_training

    data_dir = args.data_dir or sequences(DEFAULT_INPUT, VARIANTS["published"])
    store = args.work / f"mlflow-{int(time.time())}"  # a fresh registry: the first registration is the first champion
    store.mkdir(parents=True)
    tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
    rows, old_champion = [], None
    for seed in args.seeds:
        cfg = TrainConfig.from_recipe(args.recipe, data_dir=str(data_dir), out_dir=str(args.work / f"seed{seed}"),
                                      seed=seed, resume=False, evaluate_test=False)  # promotion reads no test
        tracking = TrackingConfig(tracking_uri, experiment="promotion", register=MODEL_NAME, source="benchmarks/promotion.py")
        began = time.perf_counter()
        result = run_training(cfg, LaunchConfig(workers=0), tracking).to_dict()
        registered = result["mlflow"]["registered"]
        score = registered["validation_strict_acc@1"]
        old = old_rule(score, old_champion)
        old_champion = score if old else old_champion
        rows.append({"seed": seed, "validation_strict_acc@1": round(score, 2), "version": registered["version"],
                     "new_rule": registered["decision"], "new_rule_reason": registered["reason"],
                     "old_rule": "promoted" if old else "kept", "seconds": round(time.perf_counter() - began, 1)})
        print(f"seed {seed}: validation strict {score:.2f}; new rule {registered['decision']}, old rule "
              f"{rows[-1]['old_rule']}", file=sys.stderr)
        write(args.results, rows, args.recipe, Z, SEED_NOISE_FLOOR)
    print_table(json.loads(args.results.read_text()))
    print(f"wrote {args.results}")


def write(path: Path, rows: list[dict], recipe: str, z: float, floor: float) -> None:
    """promotion.json with the registrations so far (after each: a run cut short keeps them)."""
    moves = lambda rule: sum(r[rule] == "promoted" for r in rows[1:])  # noqa: E731 - the first makes the champion
    result = {
        "benchmark": "promotion", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "recipe": recipe, "data": "published (benchmarks/configs/published.yaml)",
        "rule": (f"promote when the challenger's mean validation strict Acc@1 beats the champion's on the same data by "
                 f"more than {z} x sigma x sqrt(1/n + 1/m), sigma the seeds' pooled spread but at least {floor} "
                 "points (pgt.tracking.registry.promotion_decision); the old rule promoted any higher score"),
        "registrations": len(rows),
        "promotions_old_rule": moves("old_rule"),
        "promotions_new_rule": moves("new_rule"),
        "target": "the new rule promotes none of the same-recipe challengers",
        "meets_target": moves("new_rule") == 0,
        "runs": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['recipe']} registered on {result['registrations']} seeds under one name: the champion "
                        f"moved {result['promotions_old_rule']} times by the old rule, {result['promotions_new_rule']} "
                        "by the evidence rule")
    for col in ("seed", "validation strict acc@1", "old rule", "evidence rule"):
        table.add_column(col, justify="right")
    for r in result["runs"]:
        table.add_row(str(r["seed"]), f"{r['validation_strict_acc@1']:.2f}", r["old_rule"], r["new_rule"])
    Console(width=140).print(table)


if __name__ == "__main__":
    main()

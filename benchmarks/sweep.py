"""Benchmark: a 20-trial Ray Tune sweep on GeoLife against the default configuration.

Runs `pgt tune`'s sweep (Optuna TPE + ASHA, 2 trials at once, 1 CPU each) on the GeoLife sequences,
then trains the default configuration under the same conditions (1 thread, the sweep's seed and
epochs), and compares validation Acc@1 (the sweep's criterion) and test metrics. `--sweep DIR` reads
an existing `pgt tune` output instead of running the sweep again. Writes JSON (default
benchmarks/results/sweep.json) and prints a table.

    python benchmarks/sweep.py [--trials 20] [--epochs 30] [--sweep .state/sweeps/geolife20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from preprocess import DEFAULT_INPUT, machine  # noqa: E402 - after sys.path gains the benchmarks
from train import WORK, sequences  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "sweep.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--sweep", type=Path, help="an existing `pgt tune` --out folder to report instead of sweeping")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from rich.console import Console
    from rich.table import Table

    from pgt.config import TrainConfig, selection_score
    from pgt.distributed import run_training
    from tune.config import SweepConfig
    from tune.sweep import headline_metrics, run_sweep

    data_dir = sequences(args.input, None)
    if args.sweep:
        sweep = json.loads((args.sweep / "tune.json").read_text())
    else:
        spec = SweepConfig(data_dir=str(data_dir), out_dir=str(WORK / "tune" / "sweep"), trials=args.trials,
                           epochs=args.epochs, max_concurrent=2)
        sweep = run_sweep(spec)
    spec = sweep["sweep"]
    # the best trial's own metrics.json holds its whole test metrics (protocol and strict)
    best_metrics = json.loads((Path(spec["out_dir"]) / "trials" / sweep["best_trial"] / "metrics.json").read_text())
    sweep["best_test"] = headline_metrics(best_metrics["test"])
    default = run_training(TrainConfig(data_dir=spec["data_dir"], out_dir=str(WORK / "tune" / "default"),
                                       epochs=spec["epochs"], seed=spec["seed"], threads=1, resume=False,
                                       select_on=spec["select_on"]))
    rows = sweep["trials"]
    result = {
        "benchmark": "tune", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "data": spec["data_dir"], "trials": len(rows), "epochs": spec["epochs"],
        "finished": sum(r["status"] == "finished" for r in rows),
        "stopped_by_asha": sum(r["status"] == "stopped (ASHA)" for r in rows),
        "trial_epochs_total": sum(r["epochs"] for r in rows),
        "objective": sweep["objective"], "best_config": sweep["best_config"],
        "best_validation_strict_acc@1": sweep["best_validation_strict_acc@1"],
        "best_validation_acc@1": sweep["best_validation_acc@1"],
        "best_test": sweep["best_test"],
        "default_config": {k: default["config"][k] for k in ("d_model", "nhead", "num_layers", "dim_feedforward",
                                                              "dropout", "lr", "weight_decay")},
        "default_validation_strict_acc@1": default["validation"]["strict"]["acc@1"],
        "default_validation_acc@1": default["validation"]["acc@1"],
        "default_test": headline_metrics(default["test"]),
        "sweep_beats_default": sweep["best_validation_score"] >= selection_score(default["validation"],
                                                                                 sweep["objective"]),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=float) + "\n")

    table = Table(title=f"Ray Tune sweep on GeoLife: {len(rows)} trials, {result['finished']} finished, "
                        f"{result['stopped_by_asha']} stopped by ASHA")
    for col in ("configuration", "validation strict acc@1", "validation acc@1", "test strict acc@1", "test acc@1",
                "test mrr"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for label, key, test in (("best of the sweep", "best", result["best_test"]),
                             ("default (paper)", "default", result["default_test"])):
        table.add_row(label, f"{result[f'{key}_validation_strict_acc@1']:.2f}", f"{result[f'{key}_validation_acc@1']:.2f}",
                      f"{test['strict']['acc@1']:.2f}", f"{test['acc@1']:.2f}", f"{test['mrr']:.2f}")
    Console().print(table)
    print(f"best config: {result['best_config']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Benchmark: a Ray Tune sweep whose trials share one GPU (fractional GPUs), as trials per hour.

Runs `pgt tune` in-process (tune.sweep.run_sweep) around `--recipe` on sequences preprocessed elsewhere
(`--data-dir`): `--trials` trials of at most `--epochs` epochs, `--concurrent` at once, each reserving
1/concurrent of the GPU and `--cpus-per-trial` CPUs, ASHA stopping the weak ones. `--resident-data` and
`--static-width` (and `--capture-step`, `--compile-model`) set those TrainConfig settings in every trial. After
the search, `--finalists` of the best trials and the base recipe are trained on `--confirm-seeds` fresh seeds each
(fused in one run), and the winner's recipe is trained as `pgt train` would (refit and test): the whole sweep.
Writes benchmarks/results/sweep_gpu.json in a fixed form: `trials`, `finished`, `wall_s` (the whole sweep),
`search_wall_s`, `trials_per_hour` (the search's), `seeds_per_trial`, `finalists`, `gpus` (the GPUs the sweep ran
on and each trial's fraction), the best trial's validation strict Acc@1 and config, the confirmation's table and
winner, the final run's test figures, the machine (GPU, CUDA, torch, Ray), and where the search's time went
(`time_breakdown`: the trials' training loops, the rest of the trials' own time, and the slots' time outside any
trial, from Tune's per-trial results). The CPU sweep's trials per hour (benchmarks/results/sweep.json) is set
beside it.

`--device cpu` runs the same harness without a GPU (no GPU reserved) into a `--results` file of its own.

    python benchmarks/sweep_gpu.py --data-dir DIR [--trials 32] [--epochs 10] [--concurrent 8] [--budget-s 600]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from preprocess import shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import WORK, gpu_machine, harness_options  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "sweep_gpu.json"
CPU_SWEEP = ROOT / "benchmarks" / "results" / "sweep.json"
# at least 3,000 ten-epoch trials an hour on one GPU, and a confirmed sweep of 100 trials within 10 minutes
TARGET = {"trials_per_hour": 3000, "trials": 100, "wall_s": 600}


def cpu_trials_per_hour() -> dict | None:
    """The CPU sweep of sweep.json: its trials per hour, and where it ran."""
    if not CPU_SWEEP.is_file():
        return None
    cpu = json.loads(CPU_SWEEP.read_text())
    sweep = cpu["sweep"]
    return {"trials": sweep["trials"], "minutes": sweep["minutes"], "epochs_max": sweep["epochs_max"],
            "trials_per_hour": round(sweep["trials"] / sweep["minutes"] * 60, 1), "machine": cpu["machine"]}


def time_breakdown(sweep_dir: Path, concurrent: int, search_wall_s: float) -> dict:
    """Where the search's slot-seconds (concurrent x search_wall_s) went, per trial from its start (trials/<id>/
    node.json, written as the trial function begins), its reports (result.json in the Tune experiment, one JSON line
    per epoch) and its end (trials/<id>/metrics.json, written once a trial that ran every epoch has scored test;
    else its last report): `train_loop_s`, the epochs' training loops (steps on the shared GPU; a trial's first loop
    also warms up and captures); `in_trial_other_s`, the rest up to its last report (the split and the model set up,
    validation, checkpoints and reports); `after_last_report_s`, from its last report to its end (a finished trial's
    best weights scored on test, its files); `outside_trials_s`, the slots' time in no trial (Ray starting or reusing
    a trial's process, Tune's scheduling and stopping of trials, slots left empty as the search ends). Also the
    epochs reported and the mean time to a trial's first report and per later epoch."""
    from tune.records import EXPERIMENT_NAME

    rows = []
    for result_file in sorted((sweep_dir / "ray" / EXPERIMENT_NAME).glob("trial_*/result.json")):
        reports = [json.loads(line) for line in result_file.read_text().splitlines() if line.strip()]
        trial = sweep_dir / "trials" / result_file.parent.name.removeprefix("trial_")
        if not reports or not (trial / "node.json").is_file():
            continue
        start = json.loads((trial / "node.json").read_text())["started_at"]
        last = start + reports[-1]["time_total_s"]
        end = max(last, (trial / "metrics.json").stat().st_mtime) if (trial / "metrics.json").is_file() else last
        rows.append((reports, last - start, end - last))
    if not rows:
        return {}
    slots = concurrent * search_wall_s
    epochs = sum(len(reports) for reports, _, _ in rows)
    loops = sum(r.get("seconds", 0.0) for reports, _, _ in rows for r in reports)
    reported = sum(span for _, span, _ in rows)
    after = sum(tail for _, _, tail in rows)
    later = [r["time_this_iter_s"] for reports, _, _ in rows for r in reports[1:]]
    return {
        "trials": len(rows), "epochs": epochs, "slot_s": round(slots, 1), "train_loop_s": round(loops, 1),
        "in_trial_other_s": round(reported - loops, 1), "after_last_report_s": round(after, 3),
        "outside_trials_s": round(slots - reported - after, 1),
        "first_report_s_mean": round(sum(reports[0]["time_this_iter_s"] for reports, _, _ in rows) / len(rows), 2),
        "later_epoch_s_mean": round(sum(later) / len(later), 3) if later else None,
        "train_loop_s_mean": round(loops / epochs, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True, help="a `pgt preprocess` output (the published variant)")
    parser.add_argument("--recipe", default="tuned", help="the recipe the sweep searches around (pgt.recipes.RECIPES)")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=10, help="at most, per trial (ASHA's max_t)")
    parser.add_argument("--concurrent", type=int, default=8, help="trials at once, each 1/concurrent of the GPU")
    parser.add_argument("--cpus-per-trial", type=float, default=1.0)
    parser.add_argument("--budget-s", type=float, default=None, help="the sweep's time budget, seconds")
    parser.add_argument("--resident-data", action="store_true", help="TrainConfig.resident_data in every trial")
    parser.add_argument("--static-width", type=int, default=0, help="TrainConfig.static_width in every trial")
    parser.add_argument("--compile-model", action="store_true", help="TrainConfig.compile_model in every trial")
    parser.add_argument("--capture-step", action="store_true", help="TrainConfig.capture_step in every trial")
    parser.add_argument("--finalists", type=int, default=3, help="SweepConfig.finalists: confirmed after the search")
    parser.add_argument("--confirm-seeds", type=int, default=3, help="SweepConfig.confirm_seeds")
    parser.add_argument("--reuse-actors", action=argparse.BooleanOptionalAction, default=True,
                        help="SweepConfig.reuse_actors: a trial starts in the process of a finished one")
    parser.add_argument("--search", choices=["random", "optuna"], default="random",
                        help="random needs no optuna (a GPU machine without PyPI lacks it)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: the same harness without a GPU (a dry run; needs --results)")
    parser.add_argument("--work", type=Path, default=WORK, help="where the sweep's folder goes")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    if not (args.data_dir / "manifest.json").is_file():
        raise SystemExit(f"error: {args.data_dir / 'manifest.json'}: no such file; expected the output of "
                         "`pgt preprocess`")
    options = harness_options(args, DEFAULT_RESULTS, DEFAULT_RESULTS)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: torch sees no CUDA device on this machine (--device cpu runs the harness without)")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # time_breakdown reads each trial's reports from Tune's own result.json, which sweeps leave off by default
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "0"

    from pgt.recipes import recipe_settings
    from tune.config import SweepConfig
    from tune.sweep import run_sweep

    fraction = round(1.0 / args.concurrent, 4) if args.device == "cuda" else 0.0
    out = args.work / "tune" / f"sweep-gpu-{args.device}-{args.recipe}"
    shutil.rmtree(out, ignore_errors=True)
    spec = SweepConfig(data_dir=str(args.data_dir), out_dir=str(out), recipe=recipe_settings(args.recipe) | options,
                       recipe_name=args.recipe, trials=args.trials, epochs=args.epochs, max_concurrent=args.concurrent,
                       cpus_per_trial=args.cpus_per_trial, gpus_per_worker=fraction, time_budget_s=args.budget_s,
                       reuse_actors=args.reuse_actors,
                       search=args.search, seed=0, finalists=args.finalists, confirm_seeds=args.confirm_seeds)
    began = time.perf_counter()
    sweep = run_sweep(spec)
    wall = time.perf_counter() - began
    trials = sweep["trials"]
    result = {
        "benchmark": "sweep-gpu", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": gpu_machine(args.device), "data": shown_path(args.data_dir), "recipe": args.recipe, "options": options,
        "trials": len(trials), "finished": sum(r["status"] == "finished" for r in trials),
        "epochs_max": args.epochs, "concurrent": args.concurrent, "reuse_actors": args.reuse_actors,
        "wall_s": round(wall, 1),
        "search_wall_s": sweep["search_wall_s"],
        "trials_per_hour": round(len(trials) / sweep["search_wall_s"] * 3600, 1),
        "seeds_per_trial": 1,
        "finalists": len(sweep.get("confirmation", {}).get("finalists", [])),
        "confirmation": sweep.get("confirmation"),
        # the final run's figures; where its selection run lay is a path of the machine that ran it
        "final": {**sweep["final"], "refit": {k: v for k, v in (sweep["final"].get("refit") or {}).items()
                                              if k not in ("selection_dir", "selection_run_id")}},
        "gpus": {"count": torch.cuda.device_count() if args.device == "cuda" else 0, "per_trial": fraction},
        "best_trial": sweep["best_trial"], "best_validation_strict_acc@1": sweep["best_validation_strict_acc@1"],
        "best_config": sweep["best_config"], "search": args.search, "time_budget_reached": sweep.get("time_budget_reached"),
        "target": TARGET,
        "meets_target": {"trials_per_hour": len(trials) / sweep["search_wall_s"] * 3600 >= TARGET["trials_per_hour"],
                         "confirmed_sweep": len(trials) >= TARGET["trials"] and wall <= TARGET["wall_s"]},
        "cpu": cpu_trials_per_hour(),
        "time_breakdown": time_breakdown(out, args.concurrent, sweep["search_wall_s"]),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2, default=float) + "\n")
    print_table(result)
    print(f"wrote {args.results}")


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m, cpu = result["machine"], result["cpu"]
    table = Table(title="A Ray Tune sweep on one GPU (fractional GPUs) beside the CPU sweep")
    for col in ("sweep", "trials", "finished", "epochs (max)", "search s", "whole sweep s", "trials/hour", "finalists",
                "best val strict acc@1", "winner"):
        table.add_column(col, justify="left" if col in ("sweep", "winner") else "right")
    where = f"{m['gpu']}, {result['concurrent']} at once" if m.get("gpu") else f"CPU ({m['cores']} cores), dry run"
    confirmation = result.get("confirmation") or {}
    table.add_row(where, str(result["trials"]), str(result["finished"]), str(result["epochs_max"]),
                  f"{result['search_wall_s']:.0f}", f"{result['wall_s']:.0f}", f"{result['trials_per_hour']:.0f}",
                  str(result["finalists"]), f"{result['best_validation_strict_acc@1']:.2f}",
                  str(confirmation.get("winner", "-")))
    if cpu:
        table.add_row(f"[dim]CPU ({cpu['machine']['cores']} cores), sweep.json", f"[dim]{cpu['trials']}", "",
                      f"[dim]{cpu['epochs_max']}", f"[dim]{cpu['minutes'] * 60:.0f}", "", f"[dim]{cpu['trials_per_hour']:.0f}",
                      "", "", "")
    Console(width=160).print(table)
    if result.get("time_breakdown"):
        b = result["time_breakdown"]
        print(f"the search's {b['slot_s']:.0f} slot-seconds: training loops {b['train_loop_s']:.0f} s "
              f"({b['epochs']} epochs, {b['train_loop_s_mean']:.3f} s each), the rest of the trials' own time "
              f"{b['in_trial_other_s']:.0f} s (first report after {b['first_report_s_mean']:.1f} s a trial, "
              f"later epochs {b['later_epoch_s_mean']} s), after the last report {b['after_last_report_s']:.0f} s, "
              f"outside any trial {b['outside_trials_s']:.0f} s")


if __name__ == "__main__":
    main()

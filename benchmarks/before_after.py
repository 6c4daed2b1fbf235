"""Benchmark: a change's speed, before and after, on the same machine side by side.

Checks out `--before` and `--after` (commits; after: HEAD) in git worktrees and runs, in each checkout with its
own benchmark scripts and code (PYTHONPATH), alternating before / after for each round so that drift of the machine falls on both:

- `pgt preprocess` of the full GeoLife Parquet (benchmarks/preprocess.py, --repeat 1): wall seconds and peak RSS;
- CPU training of the tuned recipe on the published sequences (benchmarks/train.py, one seed, --epochs epochs):
  training samples per second (median over epochs) and the run's wall seconds;
- the served model (benchmarks/predict.py, the tuned recipe trained one epoch): one-user request latency, median
  and p90 ms, and `pgt predict` on 30 days of every user's GPS.

Writes JSON (default benchmarks/results/before_after.json) and prints a table; "no slower" holds when after is
within `--tolerance` of before on each figure.

    python benchmarks/before_after.py --before COMMIT [--rounds 2] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT.parent / "shared" / "data" / "geolife" / "geolife_positionfixes.parquet"
DEFAULT_SEQUENCES = ROOT / ".state" / "benchmarks" / "geolife-published"
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "before_after.json"
# figure -> (where in a benchmark's JSON, whether higher is better)
FIGURES = {
    "preprocess_wall_s": (("preprocess", "wall_s"), False),
    "preprocess_peak_gib": (("preprocess", "peak_rss_gib"), False),
    "train_samples_per_second": (("train", "train_samples_per_second_median"), True),
    "train_wall_s": (("train", "wall_s"), False),
    "served_median_ms": (("predict", "median_ms"), False),
    "served_p90_ms": (("predict", "p90_ms"), False),
    "predict_30_days_s": (("predict", "predict_s"), False),
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def machine() -> dict:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
            "os": platform.platform()}


def run_benchmark(checkout: Path, script: str, args: list[str], results: Path) -> dict:
    """benchmarks/<script> of `checkout`, its own code first on the path; its JSON."""
    # this interpreter's environment for both (the scripts' servers too): only the project's code differs
    env = {**os.environ, "PYTHONPATH": str(checkout), "PGT_VENV_BIN": str(Path(sys.executable).parent)}
    done = subprocess.run([sys.executable, str(checkout / "benchmarks" / script), *args, "--results", str(results)],
                          cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {checkout.name}: benchmarks/{script} failed:\n{done.stderr[-3000:]}")
    return json.loads(results.read_text())


def measure(checkout: Path, args: argparse.Namespace, tmp: Path, label: str, round_: int) -> dict:
    """The figures of one checkout, one round."""
    recipe = args.recipe_before if label == "before" and args.recipe_before else args.recipe
    out = tmp / f"{label}-{round_}"
    out.mkdir()
    pre = run_benchmark(checkout, "preprocess.py", ["--input", str(args.input), "--repeat", "1"], out / "preprocess.json")
    train = run_benchmark(checkout, "train.py", ["--input", str(args.input), "--variants", "published", "--data-dir",
                                                 str(args.sequences), "--models", f"pgt:{recipe}", "--seeds", "0",
                                                 "--epochs", str(args.epochs), "--work", str(out / "work")],
                          out / "train.json")
    predict = run_benchmark(checkout, "predict.py", ["--input", str(args.input), "--recipe", recipe, "--epochs", "1",
                                                     "--requests", str(args.requests)], out / "predict.json")
    row = next(r for r in train["variants"]["published"]["runs"] if r["model"].startswith("pgt"))
    found = {"preprocess": pre["runs"][-1],
             "train": row, "predict": {**predict["served"], "predict_s": predict["predict"]["wall_s"]}}
    return {name: round(float(found[part][key]), 3) for name, ((part, key), _) in FIGURES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--after", default="HEAD", help="the commit after it")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--sequences", type=Path, default=DEFAULT_SEQUENCES,
                        help="the published GeoLife sequences (`pgt preprocess` with benchmarks/configs/published.yaml)")
    parser.add_argument("--recipe", default="tuned", help="the recipe trained and served")
    parser.add_argument("--recipe-before", default=None,
                        help="the same settings' name in the before commit, where it differs (e.g. tuned, renamed since)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--tolerance", type=float, default=0.05, help="after may be this fraction slower: noise")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    for path, what in ((args.input, "GeoLife Parquet"), (args.sequences / "manifest.json", "published sequences")):
        if not path.exists():
            raise SystemExit(f"error: {path}: no such file ({what})")
    before = git("rev-parse", args.before)
    after = git("rev-parse", args.after)
    with tempfile.TemporaryDirectory(prefix="pgt-before-after-") as tmp:
        tmp = Path(tmp)
        checkouts = {"before": tmp / f"before-{before[:8]}", "after": tmp / f"after-{after[:8]}"}
        for label, commit in (("before", before), ("after", after)):
            git("worktree", "add", "--detach", str(checkouts[label]), commit)
        try:
            rows: dict[str, list[dict]] = {"before": [], "after": []}
            for round_ in range(args.rounds):
                for label, checkout in checkouts.items():
                    rows[label].append(measure(checkout, args, tmp, label, round_))
                    print(f"round {round_ + 1}/{args.rounds} {label}: {rows[label][-1]}", file=sys.stderr, flush=True)
        finally:
            for checkout in checkouts.values():
                git("worktree", "remove", "--force", str(checkout))
                shutil.rmtree(checkout, ignore_errors=True)
    table = {}
    for name, (_, higher_better) in FIGURES.items():
        b = statistics.median(r[name] for r in rows["before"])
        a = statistics.median(r[name] for r in rows["after"])
        change = (a - b) / b if b else 0.0
        slower = -change if higher_better else change
        table[name] = {"before": b, "after": a, "change": round(change, 4), "no_slower": slower <= args.tolerance}
    result = {"benchmark": "before_after", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "before": before, "after": after, "rounds": args.rounds, "epochs": args.epochs,
              "recipe": {"before": args.recipe_before or args.recipe, "after": args.recipe},
              "tolerance": args.tolerance, "figures": table, "runs": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'figure':<28}{'before':>12}{'after':>12}{'change':>10}  no slower")
    for name, row in table.items():
        print(f"{name:<28}{row['before']:>12.3f}{row['after']:>12.3f}{row['change']:>+10.1%}  {row['no_slower']}")


if __name__ == "__main__":
    main()

"""Benchmark: whether an ensemble gains from members each trained on a bootstrap sample of train (bagging), chosen on
validation only.

For each seed, a copy of the data folder whose train.parquet holds as many samples as train, drawn with replacement
from it by that seed (about 63% of them, some more than once; validation and test as they are), and one `tuned`
network trained on it (benchmarks/ensemble_size.py's train_member: evaluate_test off). The bagged networks, and
beside them the same seeds' networks trained on the whole train split (ensemble_size.py's --work), are scored on the
validation split alone and as ensembles of --members (the mean of their probabilities, as `ensemble` serves), with
the protocol's inputs and as deployed. Test is never scored.

Writes JSON (default benchmarks/results/bagging.json) and prints a table.

    python benchmarks/bagging.py [--seeds 0 1000 2000 3000 1 1001] [--members 5] [--data-dir DIR]
                                 [--plain .state/benchmarks/ensemble-size] [--work .state/benchmarks/bagging]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ensemble_size import (  # noqa: E402 - after sys.path gains the benchmarks
    SELECTION,
    WORK,
    network_arguments,
    scored,
    shown,
    train_member,
    trained_networks,
    validation_split,
)
from preprocess import machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "bagging.json"


def bootstrap_folder(data_dir: Path, out: Path, seed: int) -> dict:
    """`out`: a copy of `data_dir` whose train.parquet is a bootstrap sample of its train split (as many rows, drawn
    with replacement by `seed`, in the drawn order). Kept where it is already there. Its sample and distinct counts."""
    import pyarrow.parquet as pq

    train = pq.read_table(data_dir / "train.parquet")
    drawn = np.random.default_rng(seed).integers(0, train.num_rows, train.num_rows)
    if not (out / "train.parquet").is_file():
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(data_dir, partial, ignore=shutil.ignore_patterns("train.parquet"))
        pq.write_table(train.take(drawn), partial / "train.parquet")
        partial.rename(out)
    return {"seed": seed, "samples": int(train.num_rows), "distinct": int(len(np.unique(drawn)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    network_arguments(parser, DEFAULT_RESULTS, networks="--plain")  # the same seeds on the whole train split
    parser.add_argument("--members", type=int, default=5, help="the ensemble's size K, besides each network alone")
    parser.add_argument("--work", type=Path, default=WORK / "bagging", help="where the bagged networks are trained")
    args = parser.parse_args()
    plain = trained_networks(parser, args.plain, args.seeds)

    from rich.console import Console
    from rich.table import Table

    from pgt.network.checkpoint import load_checkpoint

    args.work.mkdir(parents=True, exist_ok=True)
    samples = [bootstrap_folder(args.data_dir, args.work / f"data_{seed}", seed) for seed in args.seeds]
    bagged = [args.work / f"seed_{seed}" for seed in args.seeds]
    began = time.perf_counter()
    # spawned, not forked: a fork after this process's polars reads copies its busy thread pool (ensemble_size.py)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        trained = list(pool.map(train_member, args.seeds, [str(args.work / f"data_{seed}") for seed in args.seeds],
                                map(str, bagged)))
    train_s = time.perf_counter() - began

    cfg = load_checkpoint(plain[0] / "best.pt")[1]
    validation = validation_split(args.data_dir, cfg)
    rows = [{"members_trained_on": name, **scored(runs, args.members, validation, cfg)}
            for name, runs in (("whole train split", plain), ("bootstrap sample", bagged))]
    result = {"benchmark": "bagging", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(args.data_dir), "recipe": "tuned", "selection": SELECTION,
              "seeds": args.seeds, "members": args.members, "bootstrap_samples": samples, "bagged_trained": trained,
              "train_wall_s": round(train_s, 1), "rows": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"`tuned` networks on the whole train split and on bootstrap samples, alone and {args.members} "
                        "together (validation split; mean ± std over networks / combinations)")
    for column in ("trained on", "one: strict Acc@1", f"{args.members}: strict Acc@1", f"{args.members}: as deployed",
                   f"{args.members}: strict MRR", f"{args.members}: Acc@1"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["members_trained_on"], *(shown(r[f"{key}_validation_{figure}"]) for key, figure in (
            ("one_protocol", "strict_acc@1"), ("ensemble_protocol", "strict_acc@1"),
            ("ensemble_deployment", "strict_acc@1"), ("ensemble_protocol", "strict_mrr"), ("ensemble_protocol", "acc@1"))))
    Console().print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

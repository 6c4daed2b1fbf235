"""Benchmark: the mean of an ensemble's probabilities with each member's distribution tempered first (p^(1/T),
renormalised), chosen on validation only.

One network's ranking does not change with T; a mixture's does, since a flatter member weighs less in it. Scores, on
the validation split, every ensemble of --members of the networks benchmarks/ensemble_size.py trained (its --work),
for each T of --temperatures (1 is `ensemble`'s own mean): strict Acc@1 with the protocol's inputs and as deployed,
strict MRR, the protocol's Acc@1 and how often the top answer is "a new place". Test is never scored.

Writes JSON (default benchmarks/results/ensemble_temperature.json) and prints a table.

    python benchmarks/ensemble_temperature.py [--work .state/benchmarks/ensemble-size] [--seeds 0 1000 2000 3000 1 1001]
                                              [--members 5] [--temperatures 0.5 0.75 1 1.5 2 3] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ensemble_size import (  # noqa: E402 - after sys.path gains the benchmarks
    SELECTION,
    ensemble_metrics,
    input_splits,
    network_arguments,
    shown,
    split_log_probs,
    trained_networks,
    validation_split,
)
from preprocess import machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import mean_std  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "ensemble_temperature.json"


def tempered_mean(temperature: float):
    """(K, B, V + S) log-probabilities -> (B, V + S): the mean of the members' probabilities, each tempered by T."""
    import torch

    from pgt.network.model import mean_probability

    def combine(log_probs):
        return mean_probability(torch.log_softmax(log_probs / temperature, dim=-1))

    return combine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    network_arguments(parser, DEFAULT_RESULTS)
    parser.add_argument("--members", type=int, default=5, help="the ensemble's size K")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.5, 0.75, 1.0, 1.5, 2.0, 3.0])
    args = parser.parse_args()
    runs = trained_networks(parser, args.work, args.seeds)
    if not 2 <= args.members <= len(runs):
        parser.error(f"--members {args.members}: expected 2 to {len(runs)}, the seeds given")
    if min(args.temperatures) <= 0:
        parser.error(f"--temperatures {args.temperatures}: expected each above 0")

    from rich.console import Console
    from rich.table import Table

    from pgt.network.checkpoint import load_checkpoint

    cfg = load_checkpoint(runs[0] / "best.pt")[1]
    validation = validation_split(args.data_dir, cfg)
    combos = list(itertools.combinations(range(len(runs)), args.members))
    rows = [{"temperature": t, "combinations": len(combos)} for t in args.temperatures]
    splits = input_splits(validation)
    cached = split_log_probs(runs, splits)
    for name, split in splits.items():
        for row in rows:
            scored = [ensemble_metrics(cached[name], combo, split, cfg, tempered_mean(row["temperature"]))
                      for combo in combos]
            row[f"{name}_validation_strict_acc@1"] = mean_std([m["strict"]["acc@1"] for m in scored])
            if name == "protocol":
                row["protocol_validation_strict_mrr"] = mean_std([m["strict"]["mrr"] for m in scored])
                row["protocol_validation_acc@1"] = mean_std([m["acc@1"] for m in scored])
                row["protocol_validation_new_place_answers"] = mean_std([m["new_place"]["predicted"] for m in scored])
    result = {"benchmark": "ensemble_temperature", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(args.data_dir), "members_from": shown_path(args.work),
              "seeds": args.seeds, "members": args.members, "selection": SELECTION, "rows": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"{args.members} networks, each tempered by T before the mean, validation split (mean ± std over "
                        "combinations of seeds)")
    for column in ("T", "strict Acc@1", "strict Acc@1, as deployed", "strict MRR", "Acc@1 (protocol)",
                   "top answers 'a new place'"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(f"{r['temperature']:g}", *(shown(r[key]) for key in (
            "protocol_validation_strict_acc@1", "deployment_validation_strict_acc@1", "protocol_validation_strict_mrr",
            "protocol_validation_acc@1", "protocol_validation_new_place_answers")))
    Console().print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

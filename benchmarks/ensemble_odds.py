"""Benchmark: an ensemble's protocol figures as the odds of a new place vary, on validation only.

`ensemble` is the mean of its members' probabilities, and its protocol's view adds `new_place_log_odds` to a new
place's log-probability of that mean (pgt.data.scoring.Scores.from_log_probs) as one network's view does; the value
was chosen on one network's validation figures (benchmarks/new_place_odds.py). A mean of networks that disagree is
less sure of every answer than each of them, a new place's too, so the ensemble's best odds may differ. Scores every
ensemble of --members of the networks benchmarks/ensemble_size.py trained (its --work) on the validation split at each
log-odds of --log-odds: the protocol's Acc@1 and MRR, its Acc@1 of the targets whose id is not among the history's
(where only an answer from outside the history, id 1 among them, can be right), and strict Acc@1, which no log-odds
changes. Test is never scored.

Writes JSON (default benchmarks/results/ensemble_odds.json) and prints a table.

    python benchmarks/ensemble_odds.py [--work .state/benchmarks/ensemble-size] [--seeds 0 1000 2000 3000 1 1001]
                                       [--members 3] [--log-odds 2 2.5 3] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
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
    member_log_probs,
    network_arguments,
    shown,
    trained_networks,
    validation_split,
)
from preprocess import machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import mean_std  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "ensemble_odds.json"
LOG_ODDS = (2.0, 2.25, 2.5, 2.75, 3.0)
# each figure of a row: its name in the JSON and how it is read from pgt.data.metrics.compute_all's metrics
FIGURES = (("strict_acc@1", lambda m: m["strict"]["acc@1"]), ("acc@1", lambda m: m["acc@1"]), ("mrr", lambda m: m["mrr"]),
           ("outside_history_acc@1", lambda m: m["outside_history"]["acc@1"]))


def odds_rows(cached: list, combos: list[tuple[int, ...]], validation, cfg, log_odds: list[float]) -> list[dict]:
    """For each of `log_odds`, the FIGURES of every ensemble of `combos` (members' indices into `cached`,
    ensemble_size.member_log_probs of the validation split) with that many log-odds, mean ± std over the ensembles."""
    rows = []
    for odds in log_odds:
        view = dataclasses.replace(cfg, new_place_log_odds=odds)
        scored = [ensemble_metrics(cached, combo, validation, view) for combo in combos]
        rows.append({"log_odds": odds, "combinations": len(combos),
                     **{key: mean_std([pick(m) for m in scored]) for key, pick in FIGURES}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    network_arguments(parser, DEFAULT_RESULTS)
    parser.add_argument("--members", type=int, default=3, help="the ensemble's size K (`ensemble`'s: 3)")
    parser.add_argument("--log-odds", type=float, nargs="+", default=list(LOG_ODDS),
                        help="a new place's log-odds in the protocol's view, each at least 0")
    args = parser.parse_args()
    runs = trained_networks(parser, args.work, args.seeds)
    if not 1 <= args.members <= len(runs):
        parser.error(f"--members {args.members}: expected 1 to {len(runs)}, the seeds given")
    if min(args.log_odds) < 0:
        parser.error(f"--log-odds {args.log_odds}: expected each at least 0")

    from rich.console import Console
    from rich.table import Table

    from pgt.network.checkpoint import load_checkpoint

    cfg = load_checkpoint(runs[0] / "best.pt")[1]
    validation = validation_split(args.data_dir, cfg)
    combos = list(itertools.combinations(range(len(runs)), args.members))
    rows = odds_rows(member_log_probs(runs, validation), combos, validation, cfg, args.log_odds)
    result = {"benchmark": "ensemble_odds", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(args.data_dir), "members_from": shown_path(args.work),
              "seeds": args.seeds, "members": args.members, "members_own_log_odds": cfg.new_place_log_odds,
              "selection": SELECTION, "rows": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"Ensembles of {args.members} networks at a new place's log-odds, validation split (mean ± std "
                        "over combinations of seeds)")
    for column in ("log-odds", "strict Acc@1", "Acc@1 (protocol)", "MRR (protocol)", "Acc@1 outside the history"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(f"{r['log_odds']:g}", *(shown(r[key]) for key, _ in FIGURES))
    Console().print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

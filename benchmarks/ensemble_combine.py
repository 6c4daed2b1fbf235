"""Benchmark: ways to combine an ensemble's networks that cost no more training, chosen on validation only.

Scores, on the validation split, the networks benchmarks/ensemble_size.py trained (its --work folder: one
seed_<SEED> folder a network, with best.pt and its last epoch checkpoints), every ensemble of K of them combined
three ways:

- mean: the mean of the members' probabilities, what `--recipe ensemble` serves (pgt.network.model.mean_probability);
- geometric: the mean of their log-probabilities, renormalised (a product of the members, not a mixture);
- last epochs: each member's kept epoch checkpoints (its last two by default, each its own weights, whichever
  epoch validation picked) all in the mean of probabilities, a snapshot ensemble inside each run.

Strict Acc@1 and MRR with the protocol's inputs, and strict Acc@1 as deployed (a live prediction's inputs, scored as
serving scores them); mean ± std over the combinations of seeds, for K = 1 and --members. Test is never scored.

Writes JSON (default benchmarks/results/ensemble_combine.json) and prints a table.

    python benchmarks/ensemble_combine.py [--work .state/benchmarks/ensemble-size] [--seeds 0 1000 2000 3000 1 1001]
                                          [--members 5] [--data-dir DIR] [--results FILE]
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
    network_log_probs,
    trained_networks,
    validation_split,
)
from preprocess import machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import mean_std  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "ensemble_combine.json"
WAYS = ("mean", "geometric", "last epochs")


def epoch_checkpoints(run: Path, snapshots: int) -> list[Path]:
    """The run's last `snapshots` kept epoch checkpoints, oldest first; ValueError where it kept fewer."""
    kept = sorted((run / "checkpoints").glob("epoch_*/checkpoint.pt"))
    if len(kept) < snapshots:
        raise ValueError(f"{run / 'checkpoints'}: {len(kept)} epoch checkpoints kept, {snapshots} wanted")
    return kept[-snapshots:]


def geometric_mean(log_probs):
    """(K, B, V + S) log-probabilities -> (B, V + S): their mean, renormalised."""
    import torch

    return torch.log_softmax(log_probs.mean(0), dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    network_arguments(parser, DEFAULT_RESULTS)
    parser.add_argument("--members", type=int, default=5, help="the ensemble's size K, besides each network alone")
    parser.add_argument("--snapshots", type=int, default=2, help="the epoch checkpoints of each member in `last epochs`")
    args = parser.parse_args()
    runs = trained_networks(parser, args.work, args.seeds)
    if not 1 <= args.members <= len(runs):
        parser.error(f"--members {args.members}: expected 1 to {len(runs)}, the seeds given")
    if args.snapshots < 1:
        parser.error(f"--snapshots {args.snapshots}: expected at least 1")
    if not (args.data_dir / "manifest.json").is_file():
        parser.error(f"--data-dir {args.data_dir}: no manifest.json; expected the `pgt preprocess` folder the members "
                     "were trained on")
    try:
        snapshots = [epoch_checkpoints(run, args.snapshots) for run in runs]
    except ValueError as e:
        parser.error(str(e))

    from rich.console import Console
    from rich.table import Table

    from pgt.network.checkpoint import load_checkpoint

    best = [load_checkpoint(run / "best.pt") for run in runs]
    cfg = best[0][1]
    networks = [model for model, _ in best] + [load_checkpoint(path, epoch_weights=True)[0]
                                               for paths in snapshots for path in paths]
    each = len(runs)  # network i's snapshots are networks[each + i * args.snapshots ...]

    def picked(way: str, combo: tuple[int, ...]) -> tuple[int, ...]:
        if way != "last epochs":
            return combo
        return tuple(each + i * args.snapshots + j for i in combo for j in range(args.snapshots))

    validation = validation_split(args.data_dir, cfg)
    sizes = sorted({1, args.members})
    combos = {k: list(itertools.combinations(range(len(runs)), k)) for k in sizes}
    rows = {(k, way): {"members": k, "way": way, "combinations": len(combos[k])} for k in sizes for way in WAYS}
    for name, split in input_splits(validation).items():
        cached = network_log_probs(networks, split, live=name == "deployment")
        for (k, way), row in rows.items():
            scored = [ensemble_metrics(cached, picked(way, combo), split, cfg,
                                       geometric_mean if way == "geometric" else None) for combo in combos[k]]
            row[f"{name}_validation_strict_acc@1"] = mean_std([m["strict"]["acc@1"] for m in scored])
            if name == "protocol":
                row["protocol_validation_strict_mrr"] = mean_std([m["strict"]["mrr"] for m in scored])
    result = {"benchmark": "ensemble_combine", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(args.data_dir), "members_from": shown_path(args.work),
              "seeds": args.seeds, "snapshots": args.snapshots, "selection": SELECTION, "rows": list(rows.values())}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title="Combining K networks, validation split (mean ± std over combinations of seeds)")
    for column in ("members", "combined", "combinations", "strict Acc@1", "strict Acc@1, as deployed", "strict MRR"):
        table.add_column(column, justify="right")
    for r in rows.values():
        table.add_row(str(r["members"]), r["way"], str(r["combinations"]),
                      *(f"{r[key]['mean']:.2f} ± {r[key]['std']:.2f}" for key in (
                          "protocol_validation_strict_acc@1", "deployment_validation_strict_acc@1",
                          "protocol_validation_strict_mrr")))
    Console().print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

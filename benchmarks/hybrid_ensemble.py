"""Benchmark: ensembles of networks trained on the protocol's inputs and on a live prediction's, on validation only.

`tuned`'s networks read recency from the target's day, which a live prediction does not know: served, each is mixed
over the days the next visit may fall on (day_gaps). `tuned-deployed`'s networks are trained on the live inputs
themselves. An ensemble of K networks, J of them `tuned`'s and K - J `tuned-deployed`'s (the mean of their
probabilities), is scored on the validation split two ways:

- strict Acc@1 and MRR, each network given the inputs it was trained on (the protocol's for `tuned`'s, the live ones
  for `tuned-deployed`'s): the figure the protocol reports;
- as deployed: every network given the live inputs, scored as serving scores it.

Every such ensemble of the networks benchmarks/ensemble_size.py trained for each recipe (its --work folders, the same
seeds) is scored, mean ± std over the combinations; nothing is trained here and test is never scored. The question is
whether members of the live inputs lift the deployed figure of an ensemble, and at what cost to the protocol's.

Writes JSON (default benchmarks/results/hybrid_ensemble.json) and prints a table.

    python benchmarks/hybrid_ensemble.py [--work .state/benchmarks/ensemble-size-lr-4e-3]
                                         [--deployed-work .state/benchmarks/ensemble-size-deployed]
                                         [--seeds 0 1000 2000 3000 1 1001] [--sizes 1 5 6] [--data-dir DIR]
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
    WORK,
    ensemble_metrics,
    input_splits,
    member_config,
    member_log_probs,
    network_arguments,
    split_log_probs,
    trained_networks,
    validation_split,
)
from preprocess import machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import mean_std  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "hybrid_ensemble.json"
# each figure of an ensemble this benchmark reports: its name, the inputs it is scored on, and how it is read off
# pgt.data.metrics.compute_all's metrics
FIGURES = (("strict_acc@1", "own", lambda m: m["strict"]["acc@1"]), ("strict_mrr", "own", lambda m: m["strict"]["mrr"]),
           ("acc@1", "own", lambda m: m["acc@1"]),
           ("deployment_strict_acc@1", "live", lambda m: m["strict"]["acc@1"]),
           ("deployment_strict_mrr", "live", lambda m: m["strict"]["mrr"]))


def mixed_combinations(protocol: int, deployed: int, members: int, from_protocol: int) -> list[tuple[int, ...]]:
    """Every ensemble of `members` networks with `from_protocol` of the first `protocol` (the protocol-trained ones)
    and the rest of the next `deployed` (numbered from `protocol` on, as joined stacks them)."""
    if not 0 <= from_protocol <= min(members, protocol) or members - from_protocol > deployed:
        return []
    return [first + second for first in itertools.combinations(range(protocol), from_protocol)
            for second in itertools.combinations(range(protocol, protocol + deployed), members - from_protocol)]


def joined(first: list, second: list) -> list:
    """Two member_log_probs caches of the same split's samples, each batch's members stacked: first's, then second's.
    RuntimeError where their batches hold other samples (the splits differ in order or size: a bug upstream)."""
    import torch

    if len(first) != len(second):
        raise RuntimeError(f"the caches hold {len(first)} and {len(second)} batches")
    out = []
    for (indices, batch, log_probs), (other, _, more) in zip(first, second):
        if len(indices) != len(other) or (indices != other).any():
            raise RuntimeError("the caches' batches hold different samples")
        out.append((indices, batch, torch.cat([log_probs, more])))
    return out


def trained_anchor(run: Path) -> str:
    """The day a trained network's recency counts from (its run's TrainConfig.anchor, in metrics.json)."""
    return member_config(run)["anchor"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    network_arguments(parser, DEFAULT_RESULTS)
    parser.set_defaults(work=WORK / "ensemble-size-lr-4e-3")
    parser.add_argument("--deployed-work", type=Path, default=WORK / "ensemble-size-deployed",
                        help="benchmarks/ensemble_size.py --recipe tuned-deployed's --work: its networks")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 6], help="the ensembles' sizes K")
    args = parser.parse_args()
    protocol_runs = trained_networks(parser, args.work, args.seeds)
    deployed_runs = trained_networks(parser, args.deployed_work, args.seeds)
    for runs, anchor, option in ((protocol_runs, "target_day", "--work"), (deployed_runs, "last_visit", "--deployed-work")):
        other = [str(run) for run in runs if trained_anchor(run) != anchor]
        if other:
            parser.error(f"{option}: {', '.join(other)} not trained with anchor {anchor}, which {option} holds")
    bad = [k for k in args.sizes if not 1 <= k <= len(args.seeds)]
    if bad:
        parser.error(f"--sizes {' '.join(map(str, bad))}: expected 1 to {len(args.seeds)}, the seeds given")
    if not (args.data_dir / "manifest.json").is_file():
        parser.error(f"--data-dir {args.data_dir}: no manifest.json; expected the `pgt preprocess` folder the networks "
                     "were trained on")

    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    from pgt.network.checkpoint import load_checkpoint

    cfg = load_checkpoint(protocol_runs[0] / "best.pt")[1]
    splits = input_splits(validation_split(args.data_dir, cfg))
    protocol = split_log_probs(protocol_runs, splits)  # the protocol's inputs, and the live ones mixed over the days
    deployed = member_log_probs(deployed_runs, splits["deployment"], live=True)  # the live inputs: their own
    caches = {"own": joined(protocol["protocol"], deployed), "live": joined(protocol["deployment"], deployed)}
    scored_on = {"own": splits["protocol"], "live": splits["deployment"]}  # the same samples and targets
    n = len(args.seeds)
    kinds = [(k, j, mixed_combinations(n, n, k, j)) for k in sorted(set(args.sizes)) for j in range(k + 1)]
    kinds = [(k, j, combos) for k, j, combos in kinds if combos]
    scored = {(k, j): {inputs: [] for inputs in caches} for k, j, _ in kinds}
    work = [(k, j, combo, inputs) for k, j, combos in kinds for combo in combos for inputs in caches]
    for k, j, combo, inputs in track(work, description="ensembles scored", transient=True):
        scored[(k, j)][inputs].append(ensemble_metrics(caches[inputs], combo, scored_on[inputs], cfg))
    rows = []
    for k, j, combos in kinds:
        row = {"members": k, "protocol_members": j, "deployed_members": k - j, "combinations": len(combos)}
        for name, inputs, pick in FIGURES:
            row[name] = mean_std([pick(m) for m in scored[(k, j)][inputs]])
        rows.append(row)
    result = {"benchmark": "hybrid_ensemble", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(args.data_dir), "protocol_members_from": shown_path(args.work),
              "deployed_members_from": shown_path(args.deployed_work), "seeds": args.seeds, "selection": SELECTION,
              "rows": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title="K networks, J trained on the protocol's inputs and K - J on the live ones, validation split "
                        "(mean ± std over combinations)")
    for column in ("K", "J", "combinations", "strict Acc@1", "strict Acc@1, as deployed", "strict MRR",
                   "Acc@1 (protocol)"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r["members"]), str(r["protocol_members"]), str(r["combinations"]),
                      *(f"{r[key]['mean']:.2f} ± {r[key]['std']:.2f}" for key in (
                          "strict_acc@1", "deployment_strict_acc@1", "strict_mrr", "acc@1")))
    Console().print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

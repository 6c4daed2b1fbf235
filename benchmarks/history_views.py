"""Benchmark: whether a network scores better on the mean of its predictions from its history and from that history
cut shorter (a test-time view of the same sample; no training), chosen on validation only.

Scores, on the validation split, the networks benchmarks/ensemble_size.py trained (its --work folder: one
seed_<SEED> folder a network, with best.pt): each network on the whole history it was trained with (max_len), and on
the mean of its probabilities over that history and the same history keeping only its last L visits, for each L of
--views; then every ensemble of --members of them, each member combined the same way. Strict Acc@1 and MRR and the
protocol's Acc@1, with the protocol's inputs; mean ± std over the networks (and over the combinations of seeds).
Test is never scored.

Writes JSON (default benchmarks/results/history_views.json) and prints a table.

    python benchmarks/history_views.py [--work .state/benchmarks/ensemble-size] [--seeds 0 1000 2000 3000 1 1001]
                                       [--views 16 32 48] [--members 5] [--data-dir DIR] [--results FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ensemble_size import (  # noqa: E402 - after sys.path gains the benchmarks
    SELECTION,
    network_arguments,
    shown,
    trained_networks,
    validation_split,
)
from preprocess import machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import mean_std  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "history_views.json"


def sample_log_probs(model, dataset, num_locations: int, width: int, batch_size: int = 512):
    """(N, V + width) log-probabilities of `model` for every sample of `dataset`, in the dataset's own order; a batch's
    output is V + its most unseen slots wide, so the columns past it hold -inf (no such slot)."""
    import torch

    order = np.argsort(dataset.lengths.numpy(), kind="stable")
    out = torch.full((len(dataset), num_locations + width), float("-inf"))
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = dataset.__getitems__(idx.tolist())
            log_probs = model(*batch.inputs()).log_probs.float()
            out[torch.from_numpy(idx), :log_probs.shape[-1]] = log_probs
    return out


def slot_places(dataset) -> list[dict[int, int]]:
    """Per sample, {slot: dataset-wide place} of its unseen places (slots are numbered by first visit, so a history
    cut shorter numbers them anew)."""
    slots, places = dataset.slots.numpy(), dataset.places.numpy()
    return [{int(k): int(p) for k, p in zip(row_slots[row_slots > 0], row_places[row_slots > 0])}
            for row_slots, row_places in zip(slots, places)]


def aligned(log_probs, view_slots: list[dict[int, int]], full_slots: list[dict[int, int]], num_locations: int):
    """A view's (N, V + S) log-probabilities with each unseen slot moved to the column the whole history gives the
    same place; the whole history's slots the view does not see get -inf."""

    out = log_probs.clone()
    out[:, num_locations:] = float("-inf")
    for i, (view, full) in enumerate(zip(view_slots, full_slots)):
        slot_of = {place: slot for slot, place in full.items()}
        for slot, place in view.items():
            out[i, num_locations + slot_of[place] - 1] = log_probs[i, num_locations + slot - 1]
    return out


def metrics(log_probs, dataset, cfg) -> dict:
    """pgt.data.metrics.compute_all of (N, V + S) log-probabilities for `dataset`'s samples, ranked as
    pgt.data.scoring.score_dataset ranks a model's scores."""
    import torch

    from pgt.data.metrics import compute_all
    from pgt.data.scoring import Scores, ranks_and_top1, scored_samples

    found = torch.zeros(4, len(dataset), dtype=torch.int64)
    for start in range(0, len(dataset), 512):
        idx = list(range(start, min(start + 512, len(dataset))))
        batch = dataset.__getitems__(idx)
        found[:, start:start + len(idx)] = ranks_and_top1(Scores.from_log_probs(log_probs[idx], cfg), batch)
    return compute_all(scored_samples(found, dataset, np.arange(len(dataset))))


def mean_of(log_probs: list):
    """The mean of the probabilities of a list of (N, V + S) log-probabilities, as log-probabilities."""
    import torch

    from pgt.network.model import mean_probability

    return mean_probability(torch.stack(log_probs))


def picks(m: dict) -> dict:
    return {"strict_acc@1": m["strict"]["acc@1"], "strict_mrr": m["strict"]["mrr"], "acc@1": m["acc@1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    network_arguments(parser, DEFAULT_RESULTS)
    parser.add_argument("--views", type=int, nargs="+", default=[16, 32, 48],
                        help="the shorter histories (last L visits) averaged with the whole one")
    parser.add_argument("--members", type=int, default=5, help="the ensemble's size K, besides each network alone")
    args = parser.parse_args()
    runs = trained_networks(parser, args.work, args.seeds)

    from rich.console import Console
    from rich.table import Table

    from pgt.network.checkpoint import load_checkpoint

    loaded = [load_checkpoint(run / "best.pt") for run in runs]
    cfg = loaded[0][1]
    full = validation_split(args.data_dir, cfg)
    views = {length: validation_split(args.data_dir, cfg, length) for length in args.views}
    for length, view in views.items():  # the same samples, only their histories cut
        if not np.array_equal(view.targets.numpy(), full.targets.numpy()):
            raise SystemExit(f"the validation split with max_len {length} holds other samples than with {cfg.max_len}")
    full_slots = slot_places(full)
    view_slots = {length: slot_places(view) for length, view in views.items()}
    V = cfg.num_locations
    each = [{"whole": sample_log_probs(model, full, V, cfg.max_len),
             **{length: aligned(sample_log_probs(model, views[length], V, cfg.max_len), view_slots[length], full_slots, V)
                for length in views}}
            for model, _ in loaded]
    ways = {"whole history": lambda lp: lp["whole"],
            **{f"whole + last {length}": (lambda lp, length=length: mean_of([lp["whole"], lp[length]])) for length in views},
            "whole + " + " + ".join(f"last {length}" for length in views):
                lambda lp: mean_of([lp["whole"], *(lp[length] for length in views)])}
    rows = []
    combos = list(itertools.combinations(range(len(runs)), args.members))
    for name, way in ways.items():
        combined = [way(lp) for lp in each]
        alone = [picks(metrics(lp, full, cfg)) for lp in combined]
        together = [picks(metrics(mean_of([combined[i] for i in combo]), full, cfg)) for combo in combos]
        if name == "whole history":  # each network alone on its own history: the figure its training recorded
            recorded = [json.loads((run / "metrics.json").read_text())["validation"]["strict"]["acc@1"] for run in runs]
            if not np.allclose([m["strict_acc@1"] for m in alone], recorded):
                raise SystemExit(f"the networks score {[m['strict_acc@1'] for m in alone]} on validation here, their "
                                 f"runs recorded {recorded}: this scoring is not the training's")
        rows.append({"view": name, "per_network_strict_acc@1": [m["strict_acc@1"] for m in alone],
                     **{f"one_{key}": mean_std([m[key] for m in alone]) for key in alone[0]},
                     **{f"ensemble_{key}": mean_std([m[key] for m in together]) for key in together[0]}})
    result = {"benchmark": "history_views", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(args.data_dir), "selection": SELECTION, "seeds": args.seeds,
              "max_len": cfg.max_len, "members": args.members, "combinations": len(combos), "rows": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"One network and {args.members} together, each on the mean over views of its history "
                        "(validation split; mean ± std over networks / combinations)")
    for column in ("view", "one: strict Acc@1", "one: strict MRR", "one: Acc@1", f"{args.members}: strict Acc@1",
                   f"{args.members}: strict MRR", f"{args.members}: Acc@1"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["view"], *(shown(r[f"{who}_{key}"]) for who in ("one", "ensemble")
                                   for key in ("strict_acc@1", "strict_mrr", "acc@1")))
    Console().print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

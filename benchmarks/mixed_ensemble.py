"""Benchmark: ensembles that mix networks of different settings, against ensembles of `tuned` networks alone, chosen
on validation only.

Reads the networks benchmarks/recipe_search.py trained (its records under .state/benchmarks/recipe_search/<variant>:
`tuned`'s selection run and the variations of it, each on train only, seeds 0-5) and scores on the validation split
the mean of K networks' probabilities (as `members` does), every way of picking them with K distinct seeds:

    tuned x K                  what `ensemble` is (its members trained apart here)
    tuned x K/2 + other x K/2  networks of one other setting in half the places: the long-term memory
                               (tuned-mem8-joint), the relations to the last two places, a third layer, ...
    one of each                K networks each of another setting (tuned and the variations), distinct seeds

A network that reads the memory has the remembered places in front of its history, so its slots (the unseen places,
told apart) number those places first: every network's probabilities are put in the columns of the memory's
layout (each unseen place found by its dataset-wide place id) before the mean, and each network's own figures are
checked against its record first. Strict Acc@1 (the exact place) and the protocol's, with the protocol's inputs.
Test is never scored.

Writes JSON (default benchmarks/results/mixed_ensemble.json) and prints a table.

    python benchmarks/mixed_ensemble.py [--variant published] [--members 4]
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
from preprocess import DEFAULT_INPUT, machine  # noqa: E402 - after sys.path gains the benchmarks
from recipe_search import CONFIGS, RECORDS  # noqa: E402 - likewise
from train import VARIANTS, mean_std, sequences  # noqa: E402 - likewise

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "mixed_ensemble.json"
BASE = "tuned-selection"
MEMORY = "tuned-mem8-joint"
OTHERS = (MEMORY, "tuned-rel2", "tuned-l3", "tuned-ls0", "tuned-wa99", "tuned-distance-head-02")
SELECTION = "Validation only: recipe_search.py's networks never scored test, and neither does this benchmark."


def probabilities(run: Path, plain, remembered, width: int):
    """A network's (N, width) probabilities over the validation split, in the memory layout's columns: the V known
    ids, then the memory layout's slots."""
    import torch

    from pgt.network.checkpoint import load_checkpoint

    model, cfg = load_checkpoint(run / "best.pt")
    mine = remembered if cfg.memory_size else plain
    V, N = cfg.num_locations, len(mine)
    out = torch.zeros(N, width)
    with torch.inference_mode():
        for start in range(0, N, 512):
            idx = list(range(start, min(start + 512, N)))
            batch = mine.__getitems__(idx)
            probs = model(*batch.inputs()).log_probs.float().exp()  # (B, V + S)
            out[start:start + len(idx), :V] = probs[:, :V]
            if probs.shape[1] == V:
                continue
            own = mine.slots[idx, :batch.locations.shape[1]]  # (B, T) this network's slots
            places = mine.places[idx, :batch.locations.shape[1]]
            shared = remembered.slots[idx]  # (B, Tm) the memory layout's
            shared_places = remembered.places[idx]
            # each visit's slot in the memory layout: the slot there of a visit to the same unseen place
            same = (places.unsqueeze(2) == shared_places.unsqueeze(1)) & (own > 0).unsqueeze(2) & (shared > 0).unsqueeze(1)
            there = (same * shared.unsqueeze(1)).amax(dim=2)  # (B, T)
            if bool(((own > 0) & (there == 0)).any()):
                raise RuntimeError(f"{run}: an unseen place of the window is not in the memory layout's slots")
            rows, cols = torch.nonzero(own > 0, as_tuple=True)
            out[start + rows, V + there[rows, cols] - 1] = probs[rows, V + own[rows, cols] - 1]
    return out


def ensemble_metrics(picked, remembered, full, cfg) -> dict:
    """pgt.data.metrics.compute_all of the mean of the picked networks' probabilities; `full` is the whole split as
    one batch of the memory layout (remembered.__getitems__ of every index, built once by the caller)."""
    import torch

    from pgt.data.metrics import compute_all
    from pgt.data.scoring import Scores, ranks_and_top1, scored_samples

    mean = torch.stack(picked).mean(dim=0)
    found = ranks_and_top1(Scores.from_log_probs(torch.log(mean + 1e-10), cfg), full)
    return compute_all(scored_samples(found, remembered, np.arange(len(remembered))))


def summary(scored: list[dict]) -> dict:
    row = {"combinations": len(scored)}
    for key, pick in (("strict_acc@1", lambda m: m["strict"]["acc@1"]), ("acc@1", lambda m: m["acc@1"]),
                      ("strict_mrr", lambda m: m["strict"]["mrr"])):
        row[f"validation_{key}"] = mean_std([pick(m) for m in scored])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--variant", choices=list(VARIANTS), default="published")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--members", type=int, default=4, help="networks per ensemble (even)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    if args.members < 2 or args.members % 2:
        raise SystemExit("error: --members must be an even number of at least 2")

    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    from pgt.data.dataset import MemoryLayout, Vocab, load_splits
    from pgt.network.checkpoint import load_checkpoint

    data_dir = sequences(args.input, VARIANTS[args.variant])
    folder = RECORDS / args.variant
    names = (BASE, *OTHERS)
    runs = {(name, seed): folder / f"{name}-s{seed}" for name in names for seed in args.seeds}
    missing = [f"{name}-s{seed}" for (name, seed), run in runs.items() if not (run / "best.pt").is_file()]
    if missing:
        raise SystemExit(f"error: no network for {', '.join(missing)} in {folder}; train them with "
                         f"benchmarks/recipe_search.py --only {' '.join(sorted({m.rsplit('-s', 1)[0] for m in missing}))}"
                         f" --seeds {' '.join(map(str, args.seeds))}")
    vocab = Vocab.from_manifest(data_dir)
    base_cfg = load_checkpoint(runs[(BASE, args.seeds[0])] / "best.pt")[1]
    memory_cfg = load_checkpoint(runs[(MEMORY, args.seeds[0])] / "best.pt")[1]
    plain = load_splits(data_dir, base_cfg.max_len, vocab, names=("validation",))["validation"]
    remembered = load_splits(data_dir, memory_cfg.max_len, vocab, names=("validation",),
                             memory=MemoryLayout.of(memory_cfg))["validation"]
    width = base_cfg.num_locations + int(remembered.slots.amax())
    full = remembered.__getitems__(list(range(len(remembered))))  # every ensemble is ranked against this one batch
    probs, checks = {}, []
    for key in track(list(runs), description="scoring each network on validation"):
        probs[key] = probabilities(runs[key], plain, remembered, width)
        strict = ensemble_metrics([probs[key]], remembered, full, base_cfg)["strict"]["acc@1"]
        recorded = json.loads(runs[key].with_suffix(".json").read_text())["validation"]["strict_acc@1"]
        checks.append({"network": f"{key[0]}-s{key[1]}", "strict_acc@1": round(strict, 2), "recorded": recorded})
        if abs(strict - recorded) > 0.01:
            raise RuntimeError(f"{key}: scored {strict:.2f} here against {recorded:.2f} in its record")

    half = args.members // 2
    rows = []
    for other in (BASE, *OTHERS):
        scored = []
        for seeds in itertools.combinations(args.seeds, args.members):
            if other == BASE:
                scored.append(ensemble_metrics([probs[(BASE, s)] for s in seeds], remembered, full, base_cfg))
                continue
            for first in itertools.combinations(seeds, half):  # the tuned half's seeds; the other half the rest
                picked = [probs[(BASE, s)] for s in first] + [probs[(other, s)] for s in seeds if s not in first]
                scored.append(ensemble_metrics(picked, remembered, full, base_cfg))
        rows.append({"ensemble": f"{BASE} x {args.members}" if other == BASE else f"{BASE} x {half} + {other} x {half}",
                     **summary(scored)})
    kinds = (BASE, *OTHERS)[:args.members]
    scored = []
    for seeds in itertools.combinations(args.seeds, args.members):
        for order in itertools.permutations(seeds):
            scored.append(ensemble_metrics([probs[(kind, s)] for kind, s in zip(kinds, order)], remembered,
                                           full, base_cfg))
    rows.append({"ensemble": "one of each: " + ", ".join(kinds), **summary(scored)})
    result = {"benchmark": "mixed_ensemble", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "variant": args.variant, "selection": SELECTION, "seeds": args.seeds,
              "members": args.members, "settings": {name: CONFIGS[name][1] for name in names},
              "networks": checks, "ensembles": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title=f"Ensembles of {args.members} networks, validation split, mean ± std over seed combinations")
    for column in ("ensemble", "combinations", "strict Acc@1", "Acc@1 (protocol)", "strict MRR"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["ensemble"], str(r["combinations"]),
                      *(f"{r[k]['mean']:.2f} ± {r[k]['std']:.2f}" for k in ("validation_strict_acc@1", "validation_acc@1",
                                                                          "validation_strict_mrr")))
    Console().print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

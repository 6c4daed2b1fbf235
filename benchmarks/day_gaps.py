"""Benchmark: over how many days a protocol-trained `tuned` network should mix its live predictions (`day_gaps`,
pgt/network/daygap.py), chosen on validation only.

A live prediction counts recency from the last visit's day; the protocol's inputs count it from the target's day,
which tells the model the day of the next visit. For K = 1 .. 4, each network of a selection run of `tuned`
(benchmarks/recipe_search.py's `tuned-arrival-1` by default, where the number was chosen; `--networks
tuned-lr4e3-npw005` for `tuned` with the new-place weight: train only, the records under
.state/benchmarks/recipe_search) gets the prior of K days fitted on the train split it learned from, and is scored on
the validation split with the live inputs (daygap.live_log_probs; K = 1 is the network as it is). The choice is the
fewest days within 0.1 of the best mean strict Acc@1 over the choosing seeds (default 0-5); the other seeds (6-8)
confirm it, and ensembles of five of the choosing seeds' networks show what it does for `ensemble`. The protocol's
figure, with the target's day, is beside them. Test is never scored.

Writes JSON (default benchmarks/results/day_gaps.json) and prints a table.

    python benchmarks/day_gaps.py [--variant published] [--seeds 0 1 2 3 4 5] [--confirm 6 7 8] [--networks NAME]
"""

from __future__ import annotations

import argparse
import dataclasses
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

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "day_gaps.json"
NETWORKS = "tuned-arrival-1"  # the selection run of `tuned` the number of days was chosen on
DAYS = (1, 2, 3, 4)
MEMBERS = 5  # ensemble's size (pgt.recipes.ENSEMBLE_MEMBERS)
WITHIN = 0.1  # the fewest days whose mean strict Acc@1 is this close to the best
SELECTION = "Validation only: the networks were trained on train with evaluate_test=False; test is never scored."


def with_day_gaps(model, cfg, prior):
    """The network with `prior` (None: as it is), the (END_HOURS, K) table training fits on its train split."""
    from pgt.network.model import build_model, set_day_gap_prior

    if prior is None:
        return model.eval()
    mixed = build_model(dataclasses.replace(cfg, day_gaps=prior.shape[1]))
    missing, unexpected = mixed.load_state_dict(model.state_dict(), strict=False)
    if missing != ["day_gap_prior"] or unexpected:
        raise RuntimeError(f"expected only the prior to be new, got missing {missing}, unexpected {unexpected}")
    set_day_gap_prior(mixed, prior)
    return mixed.eval()


def probabilities(model, dataset, live: bool):
    """(N, width) probabilities of every sample; the widest batch's slots set the width."""
    import torch

    from pgt.network.daygap import live_log_probs

    out = []
    with torch.inference_mode():
        for start in range(0, len(dataset), 1024):
            batch = dataset.__getitems__(list(range(start, min(start + 1024, len(dataset)))))
            log_probs = live_log_probs(model, *batch.inputs()) if live else model(*batch.inputs()).log_probs.float()
            out.append(log_probs.exp())
    width = max(p.shape[1] for p in out)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in out])


def strict_acc1(probs, dataset, full, cfg) -> float:
    import torch

    from pgt.data.metrics import compute_all
    from pgt.data.scoring import Scores, ranks_and_top1, scored_samples

    found = ranks_and_top1(Scores.from_log_probs(torch.log(probs + 1e-10), cfg), full)
    return compute_all(scored_samples(found, dataset, np.arange(len(dataset))))["strict"]["acc@1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--variant", choices=list(VARIANTS), default="published")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5], help="the seeds that choose")
    parser.add_argument("--confirm", nargs="*", type=int, default=[6, 7, 8], help="the seeds that confirm")
    parser.add_argument("--networks", choices=list(CONFIGS), default=NETWORKS,
                        help="the recipe_search configuration whose networks are scored")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()

    import torch
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    from pgt.data.dataset import Vocab, load_splits
    from pgt.network.checkpoint import load_checkpoint
    from pgt.network.daygap import days_after_last_visit, fit_day_gap_prior, last_visit_end_hours

    data_dir = sequences(args.input, VARIANTS[args.variant])
    folder = RECORDS / args.variant
    seeds = [*args.seeds, *args.confirm]
    runs = {seed: folder / f"{args.networks}-s{seed}" for seed in seeds}
    missing = [str(run) for run in runs.values() if not (run / "best.pt").is_file()]
    if missing:
        raise SystemExit(f"error: no network in {', '.join(missing)}; train them with benchmarks/recipe_search.py "
                         f"--only {args.networks} --seeds {' '.join(map(str, seeds))}")
    vocab = Vocab.from_manifest(data_dir)
    cfg = load_checkpoint(runs[seeds[0]] / "best.pt")[1]
    splits = load_splits(data_dir, cfg.max_len, vocab, names=("train", "validation"))
    train, validation = splits["train"], splits["validation"]
    live_inputs = validation.anchored_at_last_visit()
    full = validation.__getitems__(list(range(len(validation))))  # the targets every figure is ranked against
    # each number of days' prior, as training counts it on the train split (the same for every network)
    priors = {days: fit_day_gap_prior(train.locations, train.times, train.durations, train.recency, days,
                                      cfg.time_slots, cfg.duration_buckets) if days > 1 else None for days in DAYS}
    probs, networks = {}, []
    for seed in track(seeds, description="scoring each network on validation"):
        model, _ = load_checkpoint(runs[seed] / "best.pt")
        recorded = json.loads(runs[seed].with_suffix(".json").read_text())["validation"]["strict_acc@1"]
        probs[(seed, "protocol")] = probabilities(model.eval(), validation, live=False)
        protocol = strict_acc1(probs[(seed, "protocol")], validation, full, cfg)
        if abs(protocol - recorded) > 0.01:
            raise RuntimeError(f"{runs[seed]}: scored {protocol:.2f} here against {recorded:.2f} in its record")
        row = {"seed": seed, "protocol": round(protocol, 2)}
        for days in DAYS:
            probs[(seed, days)] = probabilities(with_day_gaps(model, cfg, priors[days]), live_inputs, live=True)
            row[f"live_{days}"] = round(strict_acc1(probs[(seed, days)], validation, full, cfg), 2)
        networks.append(row)

    # how well the prior alone tells the next visit's day on validation (the protocol's recency of the last visit)
    days_after = days_after_last_visit(validation.locations, validation.recency).numpy()
    hours = last_visit_end_hours(validation.locations, validation.times, validation.durations, cfg.time_slots,
                                 cfg.duration_buckets)
    prior = priors[max(DAYS)][hours].numpy()
    next_day = {"share_by_days_after": {str(d): round(float((days_after == d).mean() * 100), 2) for d in range(max(DAYS))},
                "share_later": round(float((days_after >= max(DAYS)).mean() * 100), 2),
                "prior_most_likely_right": round(float((prior.argmax(axis=1) == days_after).mean() * 100), 2)}

    def mean_over(which: list[int], key: str) -> dict:
        return mean_std([r[key] for r in networks if r["seed"] in which])

    choosing = {days: mean_over(args.seeds, f"live_{days}") for days in DAYS}
    best = max(v["mean"] for v in choosing.values())
    chosen = min(days for days, v in choosing.items() if v["mean"] >= best - WITHIN)
    ensembles = {}  # the mean of separately trained networks' probabilities, as benchmarks/ensemble_size.py's
    for days in (*DAYS, "protocol"):
        scored = []
        for picked in itertools.combinations(args.seeds, MEMBERS):
            mean = torch.stack([probs[(seed, days)] for seed in picked]).mean(dim=0)
            scored.append(strict_acc1(mean, validation, full, cfg))
        ensembles[days] = {"combinations": len(scored), **mean_std(scored)}
    result = {
        "benchmark": "day_gaps", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "variant": args.variant, "selection": SELECTION, "networks_of": args.networks,
        "settings": CONFIGS[args.networks][1],
        "seeds": args.seeds, "confirm": args.confirm, "rule": f"the fewest days within {WITHIN} of the best mean "
                                                               "strict Acc@1 over the choosing seeds",
        "chosen": chosen,
        "protocol": {"choosing": mean_over(args.seeds, "protocol"), "confirming": mean_over(args.confirm, "protocol"),
                     f"ensemble_of_{MEMBERS}": ensembles["protocol"]},
        "live": {str(days): {"choosing": choosing[days], "confirming": mean_over(args.confirm, f"live_{days}"),
                             f"ensemble_of_{MEMBERS}": ensembles[days]} for days in DAYS},
        "next_visit_day": next_day,
        "networks": networks,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    table = Table(title="Validation strict Acc@1, live inputs (recency from the last visit's day), mean ± std")
    for column in ("days mixed", f"seeds {','.join(map(str, args.seeds))}", f"seeds {','.join(map(str, args.confirm))}",
                   f"ensembles of {MEMBERS}"):
        table.add_column(column, justify="right")
    columns = ("choosing", "confirming", f"ensemble_of_{MEMBERS}")
    for days in DAYS:
        row = result["live"][str(days)]
        table.add_row(f"{days}{' (chosen)' if days == chosen else ''}",
                      *(f"{row[k]['mean']:.2f} ± {row[k]['std']:.2f}" for k in columns))
    p = result["protocol"]
    table.add_row("protocol's inputs", *(f"{p[k]['mean']:.2f} ± {p[k]['std']:.2f}" for k in columns))
    Console().print(table)
    print(f"validation targets by days after the last visit's day: {next_day['share_by_days_after']} (% ; later: "
          f"{next_day['share_later']}); the prior's most likely day is right for {next_day['prior_most_likely_right']}%")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

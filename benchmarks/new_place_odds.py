"""Benchmark: the protocol's figures as the odds of a new place vary, on validation only.

`tuned` weighs new-place targets at NEW_PLACE_WEIGHT (0.05) of the others' weight in its loss, which strict Acc@1
gains from and the protocol's Acc@1 loses by: a loss that weighs a class by w lowers that class's optimal logit by
log(1 / w) and leaves the others' alone (Menon et al. 2021, logit adjustment), so the network all but stops answering
"a new place", which is the protocol's id 1 for 18% of validation targets. ModelConfig.new_place_log_odds adds to a
new place's log-probability in the protocol's view (pgt.network.vocabulary.restore_new_place_odds) and nowhere else;
strict ranks read the network's own scores. This benchmark scores the same networks at each of a grid of log-odds
(`--log-odds`; 0 is the network's own, log(1 / w) the weight's undoing, added to the grid): each seed trains tuned's
selection run (the recipe search's `tuned-npw005-vd01`, or another configuration of it with `--config`; its record
reused where the search made it), and its best
checkpoint's validation log-probabilities, computed once, are scored at each as ensemble_size scores an ensemble (of
one). Beside the protocol's Acc@1 and MRR, the calibration of the answer "a new place": its mean forecast (the
protocol's id 1, slots merged) against how often it is right, and the binary log-loss of that forecast. The test
split is never scored. Writes JSON (default benchmarks/results/new_place_odds.json) and prints a table.

    python benchmarks/new_place_odds.py [--config tuned-npw005-vd01] [--seeds 0 1 2 3 4 5] [--log-odds 0 1.5 2 2.5 3]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ensemble_size import ensemble_metrics, member_log_probs, validation_split  # noqa: E402 - after sys.path gains the benchmarks
from preprocess import DEFAULT_INPUT, machine  # noqa: E402 - after sys.path gains the benchmarks
from recipe_search import CONFIGS, RECORDS, run_missing  # noqa: E402 - after sys.path gains the benchmarks
from train import VARIANTS, mean_std, sequences  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "new_place_odds.json"
CONFIG = "tuned-npw005-vd01"  # tuned's selection run in the recipe search
# the recipe search's configurations that weigh new-place targets, whose networks the odds apply to
WEIGHTED = [name for name, (_, settings) in CONFIGS.items() if settings.get("new_place_weight", 1.0) < 1.0]
LOG_ODDS = (0.0, 1.5, 2.0, 2.25, 2.5, 2.75, 3.25, 3.5, 4.0)  # the grid; log(1 / the configuration's weight) joins it
FIGURES = ("strict_acc@1", "acc@1", "mrr", "forecast", "log_loss")
DIGITS = {"log_loss": 4}  # decimals of a figure that is not a percentage (the others: 2)


def validation_curve(run: Path, data_dir: Path, log_odds: list[float]) -> dict:
    """A run's best checkpoint on the validation split at each of `log_odds`: {"rate": how often the protocol's
    target is id 1 (%), "curve": [{log_odds, strict_acc@1, acc@1, mrr (%), forecast (mean probability of id 1, %),
    log_loss (of that forecast against the target being id 1)}]}, the network's pass made once
    (ensemble_size.member_log_probs) and scored as one network's ensemble at each."""
    import dataclasses

    import numpy as np
    import torch

    from pgt.data.scoring import Scores
    from pgt.network.checkpoint import load_checkpoint
    from preprocessing.sequences import UNSEEN

    cfg = load_checkpoint(run / "best.pt")[1]
    validation = validation_split(data_dir, cfg)
    cached = member_log_probs([run], validation)
    is_new = torch.cat([batch.targets == UNSEEN for _, batch, _ in cached]).numpy()
    curve = []
    for odds in log_odds:
        view_cfg = dataclasses.replace(cfg, new_place_log_odds=odds)
        metrics = ensemble_metrics(cached, (0,), validation, view_cfg)
        p = torch.cat([Scores.from_log_probs(each[0], view_cfg).protocol[:, UNSEEN].exp() for _, _, each in cached])
        p = np.clip(p.double().numpy(), 1e-12, 1 - 1e-12)
        curve.append({"log_odds": round(odds, 4), "strict_acc@1": round(metrics["strict"]["acc@1"], 2),
                      "acc@1": round(metrics["acc@1"], 2), "mrr": round(metrics["mrr"], 2),
                      "forecast": round(100 * float(p.mean()), 2),
                      "log_loss": round(float(-np.mean(np.where(is_new, np.log(p), np.log1p(-p)))), 4)})
    return {"rate": round(100 * float((validation.targets == UNSEEN).float().mean()), 2), "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--config", choices=WEIGHTED, default=CONFIG,
                        help="the recipe search's configuration whose networks are scored")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--log-odds", nargs="+", type=float, default=list(LOG_ODDS),
                        help="the grid of a new place's log-odds (log(1 / the weight) always joins it)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    if not args.input.exists():
        raise SystemExit(f"error: {args.input}: no such file (the full GeoLife Parquet lives in ../shared/data)")
    if any(odds < 0 for odds in args.log_odds):
        raise SystemExit(f"error: --log-odds must be at least 0, got {args.log_odds}")
    data_dir = sequences(args.input, VARIANTS["published"])
    folder = RECORDS / "published"
    folder.mkdir(parents=True, exist_ok=True)
    run_missing([args.config], args.seeds, data_dir, folder, args.parallel)
    import torch

    torch.set_num_threads(2)
    settings = CONFIGS[args.config][1]
    weight_undone = math.log(1 / settings["new_place_weight"])
    log_odds = sorted({*args.log_odds, weight_undone})
    runs = [{"seed": s, **validation_curve(folder / f"{args.config}-s{s}", data_dir, log_odds)} for s in args.seeds]
    curve = [{"log_odds": round(odds, 4), **{key: mean_std([r["curve"][i][key] for r in runs], DIGITS.get(key, 2))
                                              for key in FIGURES}}
             for i, odds in enumerate(log_odds)]
    best = max(curve, key=lambda row: row["acc@1"]["mean"])

    result = {"benchmark": "new_place_odds", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "configuration": args.config, "settings": settings, "seeds": args.seeds,
              "selection": "Validation only; the test split is never scored.",
              "weight_undone": round(weight_undone, 4),
              "best_acc@1": best["log_odds"], "rate": mean_std([r["rate"] for r in runs]),
              "curve": curve, "runs": runs}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {args.results}")


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['configuration']}'s networks on GeoLife validation, mean ± std over seeds {result['seeds']}; "
                        f"id 1 is the target for {result['rate']['mean']:.2f}%")
    table.add_column("a new place's log-odds")
    for key in FIGURES:
        table.add_column(key, justify="right")
    for row in result["curve"]:
        odds = row["log_odds"]
        label = f"{odds:.2f}" + (" (the weight undone)" if odds == result["weight_undone"] else "") + (
            " (the network's own)" if odds == 0 else "")
        digits = [DIGITS.get(key, 2) for key in FIGURES]
        table.add_row(label, *(f"{row[key]['mean']:.{d}f} ± {row[key]['std']:.{d}f}" for key, d in zip(FIGURES, digits)))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()

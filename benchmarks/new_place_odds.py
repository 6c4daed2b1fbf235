"""Benchmark: the protocol's figures with a new place's odds restored, on validation only.

`tuned` weighs new-place targets at NEW_PLACE_WEIGHT (0.05) of the others' weight in its loss, which strict Acc@1
gains from and the protocol's Acc@1 loses by: a loss that weighs a class by w lowers that class's optimal logit by
log(1 / w) and leaves the others' alone (Menon et al. 2021, logit adjustment), so the network all but stops answering
"a new place", which is the protocol's id 1 for 19% of test targets. ModelConfig.new_place_log_odds gives that
log(1 / w) back in the protocol's view (pgt.network.vocabulary.restore_new_place_odds) and nowhere else; strict ranks
read the network's own scores. The odds are derived from the weight, not chosen; this benchmark scores the same
networks both ways to show what the view changes: each seed trains tuned's selection run (the recipe search's
`tuned-npw005-vd01`, its record reused where the search made it) and its best checkpoint scores the validation split
with and without the restored odds. The test split is never scored. Writes JSON (default
benchmarks/results/new_place_odds.json) and prints a table.

    python benchmarks/new_place_odds.py [--seeds 0 1 2 3 4 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from preprocess import DEFAULT_INPUT, machine  # noqa: E402 - after sys.path gains the benchmarks
from recipe_search import CONFIGS, RECORDS, run_missing  # noqa: E402 - after sys.path gains the benchmarks
from train import VARIANTS, mean_std, sequences  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "new_place_odds.json"
CONFIG = "tuned-npw005-vd01"  # tuned's selection run in the recipe search
VIEWS = ("network's own odds", "odds restored")
FIGURES = (("strict_acc@1", lambda m: m["strict"]["acc@1"]), ("acc@1", lambda m: m["acc@1"]),
           ("mrr", lambda m: m["mrr"]), ("acc@5", lambda m: m["acc@5"]))


def validation_figures(run: Path, data_dir: Path) -> dict[str, dict[str, float]]:
    """{view: {figure: value}} of a run's best checkpoint on the validation split, in both views."""
    import torch

    from pgt.data.dataset import MemoryLayout, SequenceDataset
    from pgt.data.metrics import compute_all
    from pgt.data.scoring import Scores, score_dataset
    from pgt.network.checkpoint import load_checkpoint

    model, cfg = load_checkpoint(run / "best.pt")
    model.eval()
    validation = SequenceDataset.from_parquet(data_dir / "validation.parquet", cfg.max_len, memory=MemoryLayout.of(cfg))
    own = dataclasses.replace(cfg, new_place_log_odds=0.0)
    out = {}
    for view, view_cfg in zip(VIEWS, (own, cfg)):
        def score(batch, view_cfg=view_cfg):
            return Scores.from_log_probs(model(*batch.inputs()).log_probs.float(), view_cfg)
        scored, _ = score_dataset(score, validation, 1024, torch.device("cpu"))
        metrics = compute_all(scored)
        out[view] = {key: round(pick(metrics), 2) for key, pick in FIGURES}
    out["new_place_log_odds"] = round(cfg.new_place_log_odds, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one thread each)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    if not args.input.exists():
        raise SystemExit(f"error: {args.input}: no such file (the full GeoLife Parquet lives in ../shared/data)")
    data_dir = sequences(args.input, VARIANTS["published"])
    folder = RECORDS / "published"
    folder.mkdir(parents=True, exist_ok=True)
    run_missing([CONFIG], args.seeds, data_dir, folder, args.parallel)
    import torch

    torch.set_num_threads(2)
    runs = [{"seed": s, **validation_figures(folder / f"{CONFIG}-s{s}", data_dir)} for s in args.seeds]

    result = {"benchmark": "new_place_odds", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "configuration": CONFIG, "settings": CONFIGS[CONFIG][1], "seeds": args.seeds,
              "selection": "Validation only; the test split is never scored. The odds are log(1 / new_place_weight), "
                           "not chosen on any split.",
              "views": {view: {key: mean_std([r[view][key] for r in runs]) for key, _ in FIGURES} for view in VIEWS},
              "runs": runs}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {args.results}")


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"tuned's selection networks on GeoLife validation, mean ± std over seeds {result['seeds']}")
    table.add_column("protocol's view")
    for key, _ in FIGURES:
        table.add_column(key, justify="right")
    for view, figures in result["views"].items():
        table.add_row(view, *(f"{f['mean']:.2f} ± {f['std']:.2f}" for f in figures.values()))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()

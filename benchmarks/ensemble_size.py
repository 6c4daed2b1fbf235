"""Benchmark: how many members an ensemble of the `tuned` recipe should have, chosen on validation only.

Trains the `tuned` recipe alone with N seeds (validation only, evaluate_test=False; two runs at a time, one thread
each), then scores on the validation split every ensemble of K of those networks (the mean of their probabilities),
for K = 1 .. N: strict Acc@1 (the exact place) and MRR, with the protocol's inputs and as deployed (recency from the
last history visit's day, what a live prediction has, scored as serving scores it: mixed over the next visit's day
where the recipe sets day_gaps). Each K is summarised as mean ± std over its combinations of
seeds. An ensemble trained side by side (`--members K`, pgt/network/model.py Ensemble) differs from these only in picking
one best epoch for all its members. Test is never scored here.

Writes JSON (default benchmarks/results/ensemble_size.json) and prints a table.

    python benchmarks/ensemble_size.py [--seeds 0 1000 2000 3000 1 1001] [--data-dir DIR] [--recipe tuned]
                                       [--set KEY=VALUE ...] [--results FILE] [--work DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from preprocess import DEFAULT_INPUT, machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks
from train import mean_std  # noqa: E402 - likewise

from infra.errors import SettingsError  # noqa: E402 - with the imports above

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "ensemble_size.json"
WORK = ROOT / ".state" / "benchmarks"
PUBLISHED = ROOT / "benchmarks" / "configs" / "published.yaml"
SELECTION = ("Validation only: the members are trained with evaluate_test=False and the ensembles are scored on the "
             "validation split; test is not scored by this benchmark.")


def kept_member(out: Path) -> bool:
    """Whether `out` holds a finished member, which train_member keeps instead of training it again."""
    return (out / "metrics.json").is_file() and (out / "best.pt").is_file()


def train_member(seed: int, data_dir: str, out: str, recipe: str = "tuned", settings: dict | None = None) -> dict:
    """One network of `recipe` (with `settings` over it) on validation only (resumes a finished run: its best.pt and
    metrics.json are kept)."""
    import torch

    from pgt.config import TrainConfig
    from pgt.training.train import train_loop_per_worker

    kept = kept_member(Path(out))
    if kept:
        result = json.loads((Path(out) / "metrics.json").read_text())
    else:
        torch.set_num_threads(1)
        cfg = TrainConfig.from_recipe(recipe, **(settings or {}), data_dir=data_dir, out_dir=out, seed=seed,
                                      resume=False, threads=1, evaluate_test=False)
        result = train_loop_per_worker(cfg.to_dict())
    # kept: trained by an earlier run of this benchmark, so train_wall_s does not count it
    return {"seed": seed, "kept": kept, "best_epoch": result["best_epoch"], "epochs_run": result["epochs_run"],
            "validation_strict_acc@1": result["validation"]["strict"]["acc@1"],
            "deployment_validation_strict_acc@1": result["deployment"]["validation"]["strict"]["acc@1"]}


def member_log_probs(runs: list[Path], dataset, batch_size: int = 512, live: bool = False) -> list:
    """Per batch of the split (in score_dataset's order), every member's (M, B, V + S) log-probabilities; `live`: the
    split has a live prediction's inputs, scored as serving scores them (pgt.network.daygap.live_log_probs)."""
    from pgt.network.checkpoint import load_checkpoint

    return network_log_probs([load_checkpoint(run / "best.pt")[0] for run in runs], dataset, batch_size, live)


def network_log_probs(models: list, dataset, batch_size: int = 512, live: bool = False) -> list:
    """member_log_probs of networks already loaded: (indices, batch, (M, B, V + S) log-probabilities) per batch."""
    import torch

    from pgt.network.daygap import live_log_probs

    order = np.argsort(dataset.lengths.numpy(), kind="stable")
    cached = []
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = dataset.__getitems__(order[start:start + batch_size].tolist())
            cached.append((order[start:start + batch_size], batch,
                           torch.stack([live_log_probs(m, *batch.inputs()) if live else m(*batch.inputs()).log_probs.float()
                                        for m in models])))
    return cached


def ensemble_metrics(cached: list, combo: tuple[int, ...], dataset, cfg, combine=None) -> dict:
    """The metrics (pgt.data.metrics.compute_all) of the ensemble of the members in `combo` on the cached split, ranked
    as pgt.data.scoring.score_dataset ranks a model's scores; `combine` turns the members' (K, B, V + S)
    log-probabilities into the ensemble's (B, V + S), by default the mean of their probabilities, as `ensemble` serves."""
    import torch

    from pgt.data.metrics import compute_all
    from pgt.data.scoring import Scores, ranks_and_top1, scored_samples
    from pgt.network.model import mean_probability

    combine = combine or mean_probability
    found = torch.zeros(4, len(dataset), dtype=torch.int64)
    pick = torch.tensor(combo)
    for indices, batch, each in cached:
        scores = Scores.from_log_probs(combine(each[pick]), cfg)
        found[:, torch.from_numpy(indices)] = ranks_and_top1(scores, batch)
    return compute_all(scored_samples(found, dataset, np.arange(len(dataset))))


def validation_split(data_dir: Path, cfg, max_len: int | None = None):
    """The validation split of `data_dir` as networks of `cfg` read it (its memory layout), histories cut to `max_len`
    visits (default: the networks' own max_len)."""
    from pgt.data.dataset import MemoryLayout, Vocab, load_splits

    return load_splits(data_dir, max_len or cfg.max_len, Vocab.from_manifest(data_dir), names=("validation",),
                       memory=MemoryLayout.of(cfg))["validation"]


SEEDS = [0, 1000, 2000, 3000, 1, 1001]  # the seeds of the networks this benchmark trains by default


def network_arguments(parser: argparse.ArgumentParser, results: Path, networks: str = "--work") -> None:
    """The arguments of a benchmark over the networks this one trained: `networks` (this benchmark's --work, where
    they are), --seeds, --data-dir (the folder they were trained on) and --results (default `results`)."""
    parser.add_argument(networks, type=Path, default=WORK / "ensemble-size",
                        help="benchmarks/ensemble_size.py's --work: where its networks were trained")
    parser.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    parser.add_argument("--data-dir", type=Path, default=WORK / "geolife-published",
                        help="the `pgt preprocess` folder of the published dataset the networks were trained on")
    parser.add_argument("--results", type=Path, default=results)


def trained_networks(parser: argparse.ArgumentParser, work: Path, seeds: list[int]) -> list[Path]:
    """The runs of `seeds` in `work`; parser.error, naming them and the command that trains them, where one holds no
    trained network (kept_member)."""
    runs = [work / f"seed_{seed}" for seed in seeds]
    missing = [str(run) for run in runs if not kept_member(run)]
    if missing:
        parser.error(f"no trained network in {', '.join(missing)}: train them with benchmarks/ensemble_size.py --work "
                     f"{work} --seeds {' '.join(map(str, seeds))}")
    return runs


def shown(value: dict) -> str:
    """A summary as a table shows it: mean ± std."""
    return f"{value['mean']:.2f} ± {value['std']:.2f}"


# each figure of an ensemble's metrics (pgt.data.metrics.compute_all) that the benchmarks over these networks report
FIGURES = (("strict_acc@1", lambda m: m["strict"]["acc@1"]), ("strict_mrr", lambda m: m["strict"]["mrr"]),
           ("acc@1", lambda m: m["acc@1"]))


def input_splits(validation) -> dict[str, object]:
    """The validation split with the protocol's inputs and as deployed (recency from the last visit's day)."""
    return {"protocol": validation, "deployment": validation.anchored_at_last_visit()}


def split_log_probs(runs: list[Path], splits: dict[str, object]) -> dict[str, list]:
    """member_log_probs of the networks in `runs` on each of `splits` (input_splits), the deployed one scored as
    serving scores it: one forward pass of each network over each, which every ensemble of them reuses."""
    return {name: member_log_probs(runs, split, live=name == "deployment") for name, split in splits.items()}


def size_figures(runs: list[Path], sizes: list[int], validation, cfg,
                 cached: dict[str, list] | None = None) -> dict[int, dict]:
    """For each K in `sizes`, the number of ensembles of K of the networks in `runs` and their FIGURES on the
    validation split, mean ± std over those ensembles: `{inputs}_validation_{figure}`, with the protocol's inputs and
    as deployed (the live inputs, scored as serving scores them); `cached`: the networks' split_log_probs, where the
    caller has them already."""
    figures = {k: {"combinations": math.comb(len(runs), k)} for k in sizes}
    splits = input_splits(validation)  # the deployed split built once, for the passes and the scores
    cached = cached or split_log_probs(runs, splits)
    for name, split in splits.items():
        for k in sizes:
            metrics = [ensemble_metrics(cached[name], combo, split, cfg)
                       for combo in itertools.combinations(range(len(runs)), k)]
            for key, pick in FIGURES:
                figures[k][f"{name}_validation_{key}"] = mean_std([pick(m) for m in metrics])
    return figures


def scored(runs: list[Path], members: int, validation, cfg,
           cached: dict[str, list] | None = None) -> dict:
    """size_figures of the networks in `runs` each alone ("one_"), every ensemble of `members` of them ("ensemble_")
    and all of them ("all_")."""
    figures = size_figures(runs, sorted({1, members, len(runs)}), validation, cfg, cached)
    return {f"{label}_{key}": value for k, label in ((1, "one"), (members, "ensemble"), (len(runs), "all"))
            for key, value in figures[k].items() if key != "combinations"}


# the size chosen: the fewest members whose ensembles' mean strict validation Acc@1 is within this of the best mean; a
# member costs a whole network's training, and differences this small are under the seed noise (0.13-0.36 here)
WITHIN = 0.1
RULE = f"the fewest members whose mean strict validation Acc@1 is within {WITHIN} of the best mean"


def chosen_members(sizes: list[dict]) -> int:
    """The ensemble size RULE picks from the sizes' rows."""
    best = max(r["protocol_validation_strict_acc@1"]["mean"] for r in sizes)
    return min(r["members"] for r in sizes if r["protocol_validation_strict_acc@1"]["mean"] >= best - WITHIN - 1e-9)


def member_settings(recipe: str, pairs: list[str], data_dir: Path, work: Path) -> dict:
    """`--set KEY=VALUE ...` as TrainConfig settings over `recipe`, each value read as YAML; SettingsError, before any
    member trains, for a pair without "=", an unknown recipe or setting, or a value out of its bounds."""
    import yaml

    from pgt.config import TrainConfig

    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SettingsError(f"--set takes KEY=VALUE, got {pair!r}")
        try:
            settings[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise SettingsError(f"--set {key}: {value!r} is not a YAML value ({e.problem})") from None
    TrainConfig.from_recipe(recipe, **settings, data_dir=str(data_dir), out_dir=str(work))
    return settings


def members_anchor(recipe: str, settings: dict) -> str:
    """Where the members' recency counts from (TrainConfig.anchor): the target's day, or the last visit's for a
    recipe trained on the inputs a live prediction has (tuned-deployed)."""
    from pgt.config import TrainConfig

    return TrainConfig.from_recipe(recipe, **settings, data_dir=".", out_dir=".").anchor


def member_config(run: Path) -> dict:
    """The TrainConfig (as a dict) a kept member was trained with, from its metrics.json."""
    return json.loads((run / "metrics.json").read_text())["config"]


def check_kept_members(runs: list[Path], seeds: list[int], recipe: str, settings: dict) -> None:
    """SettingsError where a member this run would keep (train_member) was trained with another seed, recipe or
    settings: its figures would stand in for networks never trained."""
    from pgt.recipes import recipe_settings

    wanted = {**recipe_settings(recipe), **settings}
    for run, seed in zip(runs, seeds):
        if not kept_member(run):
            continue
        kept = member_config(run)
        differ = sorted(key for key, value in {**wanted, "seed": seed}.items() if kept.get(key) != value)
        if differ:
            raise SettingsError(f"{run} holds a member trained with other settings ({', '.join(differ)}); give "
                                "another --work, or remove it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="A `pgt preprocess` folder of the published dataset; default: preprocessed from --input")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--work", type=Path, default=WORK / "ensemble-size", help="where the members are trained")
    parser.add_argument("--recipe", default="tuned", help="the named recipe of the members (pgt.recipes.RECIPES)")
    parser.add_argument("--set", dest="settings", nargs="+", default=[], metavar="KEY=VALUE",
                        help="TrainConfig settings over the recipe's, each value read as YAML (e.g. dropout=0.35)")
    args = parser.parse_args()
    runs = [args.work / f"seed_{seed}" for seed in args.seeds]
    try:  # before any preprocessing or training
        settings = member_settings(args.recipe, args.settings, args.data_dir or WORK, args.work)
        check_kept_members(runs, args.seeds, args.recipe, settings)
    except SettingsError as e:
        parser.error(str(e))

    from rich.console import Console
    from rich.table import Table

    data_dir = args.data_dir
    if data_dir is None:
        from preprocessing.config import load_config
        from preprocessing.pipeline import preprocess

        data_dir = WORK / "geolife-published"
        preprocess(args.input, "positionfixes", data_dir, load_config(PUBLISHED), progress=True)
    began = time.perf_counter()
    # spawned, not forked: a fork after this process's own preprocessing copies polars' busy thread pool, and the
    # members' first parquet read then waits forever
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        members = list(pool.map(train_member, args.seeds, [str(data_dir)] * len(runs), map(str, runs),
                                [args.recipe] * len(runs), [settings] * len(runs)))
    train_s = time.perf_counter() - began

    from pgt.network.checkpoint import load_checkpoint

    cfg = load_checkpoint(runs[0] / "best.pt")[1]
    validation = validation_split(data_dir, cfg)
    if members_anchor(args.recipe, settings) == "last_visit":
        # networks trained on a live prediction's inputs only ever read those: both columns score them on their own
        validation = validation.anchored_at_last_visit()
    sizes = [{"members": k, **figures} for k, figures in size_figures(
        runs, list(range(1, len(runs) + 1)), validation, cfg).items()]
    result = {"benchmark": "ensemble_size", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "data": shown_path(data_dir), "recipe": args.recipe, "settings": settings,
              "selection": SELECTION,
              "seeds": args.seeds, "members_trained": members, "train_wall_s": round(train_s, 1), "sizes": sizes,
              "rule": RULE, "chosen_members": chosen_members(sizes)}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")

    over = "".join(f", {key} {value}" for key, value in settings.items())
    table = Table(title=f"Ensembles of K `{args.recipe}`{over} networks, validation split (mean ± std over combinations "
                        "of seeds)")
    for column in ("members", "combinations", "strict Acc@1", "strict Acc@1, as deployed", "strict MRR", "Acc@1 (protocol)"):
        table.add_column(column, justify="right")
    for r in sizes:
        table.add_row(str(r["members"]), str(r["combinations"]), shown(r["protocol_validation_strict_acc@1"]),
                      shown(r["deployment_validation_strict_acc@1"]), shown(r["protocol_validation_strict_mrr"]),
                      shown(r["protocol_validation_acc@1"]))
    Console().print(table)
    print(f"chosen: {result['chosen_members']} members ({RULE}); wrote {args.results}")


if __name__ == "__main__":
    main()

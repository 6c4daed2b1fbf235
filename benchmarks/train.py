"""Benchmark: every model on the GeoLife sequences with several seeds, protocol and strict metrics.

Two data variants (`--variants`): `default`, the 20 m DBSCAN rule as written (lat, lon), and `published`,
the dataset the published numbers were built on (`location_axis_order: lon_lat`, benchmarks/configs/
published.yaml). Each is preprocessed once (reused afterwards). Every neural model is trained with each
seed (baselines are deterministic: one run), and the test metrics are reported as mean ± std: strict
first (a target counts only where its exact place was ranked), then the protocol's (id 1 for id 1 is a
hit), plus the new-place detection, training samples/s (median over epochs) and test forward samples/s,
beside the published and reference figures.

Selection: every recipe was chosen on validation metrics only (pgt.recipes.RECIPES); early stopping and the
best epoch follow the recipe's validation score. Test is evaluated once per reported run, here.

A model is trained with the paper's recipe; `MODEL:RECIPE` picks another, e.g. `pgt:tuned`, or a recipe file
(`pgt:benchmarks/results/sweep_best.yaml`, a sweep's winner). Writes JSON
(default benchmarks/results/train.json) and prints a table per variant.

`--gpu` trains the same recipes on the machine's one CUDA GPU (bfloat16 autocast, TrainConfig.amp) from
sequences preprocessed elsewhere (`--data-dir`, since the raw input need not be there), and writes
benchmarks/results/train_gpu.json: epoch seconds, samples/s and the metrics beside the CPU rows of
train.json for the same model and variant. Each configuration (`--engine in-process` or `ray-train`, one Ray
Train worker; `--resident-data`, `--static-width`) is an entry of its `configurations` in a fixed form (engine,
epoch_s, samples_per_s, strict and protocol metrics, machine with GPU, CUDA, torch and Ray versions); a run
adds or replaces its own entries and keeps the others. `--device cpu` runs the same harness without a GPU
into a `--results` file of its own (CI checks the harness that way).

    python benchmarks/train.py [--variants default published] [--models pgt pgt:tuned mhsa ...] [--seeds 0 1 2]
    python benchmarks/train.py --gpu --variants published --data-dir DIR --models pgt:tuned
    python benchmarks/train.py --gpu --variants published --data-dir DIR --models pgt:tuned --engine ray-train \
        --resident-data --static-width 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from preprocess import DEFAULT_INPUT, machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "train.json"
GPU_RESULTS = ROOT / "benchmarks" / "results" / "train_gpu.json"
WORK = ROOT / ".state" / "benchmarks"
VARIANTS = {"default": None, "published": ROOT / "benchmarks" / "configs" / "published.yaml"}
METRICS = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1")
STRICT = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10")
NEW_PLACE = ("rate", "predicted", "precision", "recall")
PUBLISHED = {  # the published protocol figures (strict: recomputed from the run's released per-sample results)
    "Pointer Generator Transformer (best published run)": {
        "acc@1": 53.97, "acc@5": 81.10, "acc@10": 84.38, "mrr": 65.82, "ndcg@10": 70.23,
        "strict": {"acc@1": 42.23, "acc@5": 61.88}},
    "MHSA (best run)": {"acc@1": 33.18, "acc@5": 55.11, "acc@10": 59.02, "mrr": 43.02, "ndcg@10": 46.65},
    "first-order Markov": {"acc@1": 24.18, "acc@5": 37.87, "mrr": 30.34, "ndcg@10": 32.38},
    "LLM-Mob (GPT-3.5)": {"acc@1": 45.13, "strict": {"acc@1": 37.87}},
}
REFERENCE_RUN = {  # the reference code (next_loc_clean_v2) run on a 2-core, 24 GiB machine
    "PGT (reference code, this machine)": {"acc@1": 52.97, "acc@5": 81.89, "acc@10": 84.74, "mrr": 65.73, "ndcg@10": 70.31,
                                           "samples_per_second": 725.0},
    "MHSA (reference code, this machine)": {"acc@1": 28.63, "acc@5": 55.46, "acc@10": 60.80, "mrr": 40.50, "ndcg@10": 45.18,
                                            "samples_per_second": 600.0},
}
# issue 11's targets: on the published variant, mean of 3 seeds, configuration chosen on validation
TARGET = {"variant": "published", "strict_acc@1_mean": 48.0, "deployment_strict_acc@1_mean": 47.0, "acc@1_mean": 58.0,
          "mrr_mean": 70.0, "training_samples_per_second": 1500.0}
SELECTION = ("Every configuration reported here was chosen on validation metrics only (the recipes in "
             "pgt.recipes.RECIPES; early stopping and the best epoch follow the recipe's select_on). The test split "
             "is evaluated once per reported run, by this benchmark.")


def sequences(input_path: Path, config_path: Path | None) -> Path:
    from preprocessing.config import load_config
    from preprocessing.pipeline import preprocess

    out = WORK / ("geolife" if config_path is None else f"geolife-{config_path.stem}")
    preprocess(input_path, "positionfixes", out, load_config(config_path), progress=True)
    return out


def forward_speed(run_dir: Path, data_dir: Path, device: str = "cpu") -> float:
    """Test samples per second of the best model's forward pass (evaluation) on `device`."""
    import torch

    from pgt.data.dataset import MemoryLayout, SequenceDataset
    from pgt.data.scoring import model_scores, score_dataset
    from pgt.network.checkpoint import load_checkpoint

    model, cfg = load_checkpoint(run_dir / "best.pt")
    model.to(device)
    test = SequenceDataset.from_parquet(data_dir / "test.parquet", cfg.max_len, memory=MemoryLayout.of(cfg))
    score = model_scores(model)
    score_dataset(score, test, 1024, torch.device(device))  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    score_dataset(score, test, 1024, torch.device(device))
    if device == "cuda":
        torch.cuda.synchronize()
    return len(test) / (time.perf_counter() - began)


def label(model: str, recipe: str) -> str:
    """A model's row name: the model, and the recipe's name (a recipe file's stem) unless it is the paper's."""
    return model if recipe == "paper" else f"{model} ({Path(recipe).stem if is_recipe_file(recipe) else recipe})"


def is_recipe_file(recipe: str) -> bool:
    """Whether MODEL:RECIPE names a recipe file (YAML, as `pgt tune` writes its winner) instead of a named recipe."""
    return recipe.endswith((".yaml", ".yml"))


def configuration(model: str, recipe: str, engine: str, options: dict | None) -> str:
    """A configuration's name in train_gpu.json: the model and recipe, the engine, the settings over the recipe."""
    return ", ".join([label(model, recipe), engine, *(f"{k}={v}" for k, v in sorted((options or {}).items()))])


def run_one(model: str, recipe: str, seed: int, data_dir: Path, epochs: int | None, device: str = "cpu",
            engine: str = "in-process", options: dict | None = None, work: Path = WORK) -> dict:
    """One run: in this process (on the CPU, or on the one CUDA GPU where `device` is "cuda":
    train_loop_per_worker takes the GPU wherever torch sees one), or with `engine` "ray-train" as one Ray Train
    worker (a local Ray, the GPU where `device` is "cuda"). `options`: TrainConfig settings over the recipe's."""
    from pgt.config import BASELINES, LaunchConfig, TrainConfig
    from pgt.training.baselines import evaluate_baseline
    from pgt.training.run import run_training

    folder = "train" if device == "cpu" and engine == "in-process" and not options else f"train-{device}-{engine}"
    out = (work / folder / data_dir.name / (model if recipe == "paper" else f"{model}-{Path(recipe).stem}")
           / "-".join(f"{k}{v}" for k, v in sorted((options or {}).items())) / f"seed{seed}")
    fields = {"data_dir": str(data_dir), "out_dir": str(out), "model": model, "seed": seed, "resume": False,
              **(options or {})}
    if is_recipe_file(recipe):
        from pgt.config import load_recipe_file

        settings = load_recipe_file(Path(recipe))
    else:
        settings = recipe
    config = TrainConfig.from_recipe(settings, **fields, **({"epochs": epochs} if epochs else {}))
    cfg = config.to_dict()
    began = time.perf_counter()
    if model in BASELINES:
        result = evaluate_baseline(cfg)
    elif engine == "ray-train":
        result = run_training(config, LaunchConfig(workers=1, gpu=device == "cuda")).to_dict()
    else:  # in this process, as `pgt train` without --workers (a refit recipe's two runs included)
        result = run_training(config, LaunchConfig(workers=0)).to_dict()
    wall = time.perf_counter() - began
    row = {"model": label(model, recipe), "recipe": recipe, "seed": seed, "wall_s": round(wall, 1),
           "engine": engine, "options": options or {}, "configuration": configuration(model, recipe, engine, options),
           "select_on": cfg["select_on"], "test": result["test"], "validation": result["validation"],
           "deployment": result.get("deployment"),
           "best_epoch": result["best_epoch"], "epochs_run": result["epochs_run"], "parameters": result["parameters"]}
    if model not in BASELINES:
        speeds = [h["samples_per_second"] for h in result["history"]]
        row["train_samples_per_second_median"] = round(float(np.median(speeds)), 1)
        row["train_samples_per_second_epochs"] = [round(s, 1) for s in speeds]
        row["epoch_seconds_median"] = round(float(np.median([h["seconds"] for h in result["history"]])), 3)
        row |= epoch_times(result, out)
        row["test_forward_samples_per_second"] = round(forward_speed(out, data_dir, device), 1)
    return row


def epoch_times(result: dict, out: Path) -> dict:
    """A run's epoch seconds: the selection run's median after its first epoch (which pays for warm-up, compiling
    and capture) and its first, and with a refit the refit run's median after its first."""
    selection_file = out / "selection" / "metrics.json"
    refit = "refit" in result and selection_file.is_file()
    selection = json.loads(selection_file.read_text())["history"] if refit else result["history"]

    def after_first(history: list[dict]) -> float | None:
        seconds = [h["seconds"] for h in history[1:]] or [h["seconds"] for h in history]
        return round(float(np.median(seconds)), 4) if seconds else None

    return {"selection_epoch_s": after_first(selection), "first_epoch_s": round(selection[0]["seconds"], 4),
            "refit_epoch_s": after_first(result["history"]) if refit else None}


def run_models(models: list[str], seeds: list[int], data_dir: Path, epochs: int | None, tag: str,
               device: str = "cpu", engine: str = "in-process", options: dict | None = None,
               work: Path = WORK, on_row=None) -> list[dict]:
    """Every `MODEL[:RECIPE]` with every seed (a count-based baseline once: it is deterministic), a line each
    on stderr; the runs' rows. `on_row(rows)`, if given, is called with the rows so far after each run."""
    from pgt.config import BASELINES

    rows = []
    for name in models:
        model, _, recipe = name.partition(":")
        for seed in (seeds if model not in BASELINES else seeds[:1]):
            row = run_one(model, recipe or "paper", seed, data_dir, epochs, device, engine, options, work)
            rows.append(row)
            if on_row is not None:
                on_row(rows)
            t = row["test"]
            epoch = f", epoch {row['epoch_seconds_median']:.2f} s" if "epoch_seconds_median" in row else ""
            print(f"{tag} {name} seed {seed}: test strict acc@1 {t['strict']['acc@1']:.2f}, acc@1 {t['acc@1']:.2f}, "
                  f"mrr {t['mrr']:.2f}{epoch} ({row['wall_s']} s)", file=sys.stderr)
    return rows


def mean_std(values: list[float], digits: int = 2) -> dict:
    """Mean and sample std (0.0 for a single value), to `digits` decimals."""
    values = np.asarray(values, dtype=float)
    return {"mean": round(float(values.mean()), digits),
            "std": round(float(values.std(ddof=1)) if len(values) > 1 else 0.0, digits)}


def summarise(rows: list[dict], key: str = "model") -> dict:
    out = {}
    for model in dict.fromkeys(r[key] for r in rows):
        runs = [r for r in rows if r[key] == model]
        summary = {"runs": len(runs), "seeds": [r["seed"] for r in runs]}
        summary |= {name: mean_std([r["test"][name] for r in runs]) for name in METRICS}
        summary["strict"] = {name: mean_std([r["test"]["strict"][name] for r in runs]) for name in STRICT}
        summary["new_place"] = {name: mean_std([r["test"]["new_place"][name] for r in runs]) for name in NEW_PLACE}
        summary["validation"] = {"acc@1": mean_std([r["validation"]["acc@1"] for r in runs]),
                                 "strict_acc@1": mean_std([r["validation"]["strict"]["acc@1"] for r in runs])}
        if all(r.get("deployment") for r in runs):  # test with recency from the last visit's day, as served
            live = [r["deployment"]["test"] for r in runs]
            summary["deployment"] = {"strict": {name: mean_std([m["strict"][name] for m in live]) for name in STRICT},
                                     **{name: mean_std([m[name] for m in live]) for name in METRICS}}
        if all(r["test"].get("by_target_kind") for r in runs):  # window, return, new: the memory's breakdown
            summary["by_target_kind"] = by_target_kind(runs)
        for name in ("train_samples_per_second_median", "epoch_seconds_median", "test_forward_samples_per_second",
                     "epochs_run", "best_epoch", "parameters", "selection_epoch_s", "refit_epoch_s", "first_epoch_s"):
            if name in runs[0] and all(r.get(name) is not None for r in runs):
                summary[name] = round(float(np.mean([r[name] for r in runs])), 4 if "epoch" in name and "_s" in name
                                      or name == "epoch_seconds_median" else 1)
        out[model] = summary
    return out


def by_target_kind(runs: list[dict]) -> dict:
    """Test metrics by what the target is to the person (a place of the 7-day window, a return to an earlier place
    beyond it, a place never visited), mean ± std over the runs: strict and the protocol's, and strict as deployed."""
    out = {}
    for kind in runs[0]["test"]["by_target_kind"]:
        each = [r["test"]["by_target_kind"][kind] for r in runs]
        out[kind] = {"samples": each[0]["strict"]["n"],
                     "strict": {name: mean_std([m["strict"][name] for m in each]) for name in STRICT},
                     "protocol": {name: mean_std([m["protocol"][name] for m in each]) for name in STRICT}}
        if all(r.get("deployment") and r["deployment"]["test"].get("by_target_kind") for r in runs):
            live = [r["deployment"]["test"]["by_target_kind"][kind] for r in runs]
            out[kind]["deployment_strict"] = {name: mean_std([m["strict"][name] for m in live]) for name in STRICT}
    return out


SPEED_ROW = "pgt (tuned)"  # the training speed target is one network's: an ensemble trains several per sample


def verdict(summary: dict, target_row: str | None) -> dict | None:
    if target_row is None:
        return None
    row = summary[target_row]
    speed = summary.get(SPEED_ROW, row)
    return {"strict_acc@1": row["strict"]["acc@1"]["mean"] >= TARGET["strict_acc@1_mean"],
            "deployment_strict_acc@1": row["deployment"]["strict"]["acc@1"]["mean"]
            >= TARGET["deployment_strict_acc@1_mean"],
            "acc@1": row["acc@1"]["mean"] >= TARGET["acc@1_mean"], "mrr": row["mrr"]["mean"] >= TARGET["mrr_mean"],
            "training_samples_per_second": speed["train_samples_per_second_median"] >= TARGET["training_samples_per_second"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--models", nargs="+",
                        default=["pgt:tuned", "pgt", "mhsa", "pointer", "lstm-pg", "markov", "most-frequent"],
                        help="MODEL[:RECIPE], RECIPE a name in pgt.recipes.RECIPES or a recipe file (.yaml)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=None, help="at most this many epochs (default: the recipe's)")
    parser.add_argument("--target-row", default="pgt (tuned)", help="the summary row the targets apply to")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--keep-others", action="store_true",
                        help="keep the rows of models and variants not run now from the results file (same machine)")
    parser.add_argument("--gpu", action="store_true",
                        help="train on the one CUDA GPU with mixed precision; writes benchmarks/results/train_gpu.json "
                             "(unless --results) beside train.json's CPU rows")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="with --gpu: cpu runs the same harness without a GPU (a dry run; needs --results)")
    parser.add_argument("--engine", choices=["in-process", "ray-train"], default="in-process",
                        help="with --gpu: train in this process, or as one Ray Train worker (TorchTrainer)")
    parser.add_argument("--resident-data", action="store_true", help="with --gpu: TrainConfig.resident_data")
    parser.add_argument("--static-width", type=int, default=0, help="with --gpu: TrainConfig.static_width")
    parser.add_argument("--compile-model", action="store_true", help="with --gpu: TrainConfig.compile_model")
    parser.add_argument("--capture-step", action="store_true", help="with --gpu: TrainConfig.capture_step")
    parser.add_argument("--work", type=Path, default=WORK, help="where the runs' folders go")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="sequences already preprocessed for the one variant in --variants (skips preprocessing)")
    args = parser.parse_args()
    if args.data_dir is not None:
        if len(args.variants) != 1:
            raise SystemExit("error: --data-dir holds one variant's sequences: name that one in --variants")
        if not (args.data_dir / "manifest.json").is_file():
            raise SystemExit(f"error: {args.data_dir / 'manifest.json'}: no such file; expected the output of "
                             "`pgt preprocess` (train/validation/test.parquet and manifest.json)")
    if args.data_dir is None and not args.input.exists():
        raise SystemExit(f"error: {args.input}: no such file (the full GeoLife Parquet lives in ../shared/data)")
    if args.gpu:
        gpu_main(args)
        return

    previous = json.loads(args.results.read_text()) if args.keep_others and args.results.is_file() else {}
    variants = dict(previous.get("variants", {})) if "variants" in previous else {}
    for variant in args.variants:
        data_dir = args.data_dir or sequences(args.input, VARIANTS[variant])
        rows = run_models(args.models, args.seeds, data_dir, args.epochs, variant)
        if variant in variants:
            ran = {r["model"] for r in rows}
            rows = [r for r in variants[variant]["runs"] if r["model"] not in ran] + rows
        manifest = json.loads((data_dir / "manifest.json").read_text())
        summary = summarise(rows)
        target_row = args.target_row if args.target_row in summary else None
        variants[variant] = {
            "data": {"input": shown_path(args.input), "config": manifest["config"], "counts": manifest["counts"],
                     "vocab": manifest["vocab"]},
            "summary": summary, "target_row": target_row,
            "meets_target": verdict(summary, target_row) if variant == TARGET["variant"] else None,
            "runs": rows,
        }
    result = {
        "benchmark": "train",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "gpu": "benchmarks/results/train_gpu.json (the same recipes on one GPU, where a session had one)",
        "selection": SELECTION,
        "published": PUBLISHED,
        "reference_run": REFERENCE_RUN,
        "target": TARGET,
        "variants": variants,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    for variant in variants:
        print_table(result, variant)
    print(f"wrote {args.results}")


def gpu_machine(device: str = "cuda") -> dict:
    """The machine, with its GPU, CUDA, torch and Ray versions (device "cpu": a dry run, no GPU named)."""
    import importlib.metadata

    import torch

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    # triton and a C compiler are what torch.compile needs on a GPU (--compile-model)
    from pgt.training.compilation import c_compiler

    base = machine() | {"torch": torch.__version__, "ray": version("ray"), "triton": version("triton"),
                        "c_compiler": c_compiler()}
    if device == "cpu":
        return base | {"gpu": None, "cuda": None, "autocast_dtype": None}
    props = torch.cuda.get_device_properties(0)
    return base | {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                   "cuda": torch.version.cuda,
                   "autocast_dtype": "bfloat16" if torch.cuda.is_bf16_supported() else "float16"}


def harness_options(args: argparse.Namespace, default_results: Path, gpu_results: Path) -> dict:
    """The TrainConfig settings a GPU harness run sets (--resident-data, --static-width, --compile-model), after
    refusing what it cannot run: --static-width without --resident-data, --compile-model without --static-width,
    and a --device cpu dry run that would write the GPU file (`gpu_results`, where --results is left at
    `default_results`)."""
    if args.device == "cpu" and args.results == default_results:
        raise SystemExit("error: --device cpu is a dry run of the GPU harness: name its --results file (it never "
                         f"writes {gpu_results.relative_to(ROOT)})")
    if args.static_width and not args.resident_data:
        raise SystemExit("error: --static-width pads the batches of --resident-data: give both")
    compile_model = getattr(args, "compile_model", False)
    if compile_model and not args.static_width:
        raise SystemExit("error: --compile-model compiles one graph per batch shape: give --static-width (and "
                         "--resident-data) too")
    capture_step = getattr(args, "capture_step", False)
    if capture_step and not args.static_width:
        raise SystemExit("error: --capture-step captures one graph per batch shape: give --static-width (and "
                         "--resident-data) too")
    return {k: v for k, v in (("resident_data", args.resident_data), ("static_width", args.static_width),
                              ("compile_model", compile_model), ("capture_step", capture_step)) if v}


def configuration_entry(summary: dict, runs: list[dict], when: str, machine_info: dict) -> dict:
    """train_gpu.json's fixed form of one configuration: engine, epoch_s, samples_per_s, strict and protocol
    test metrics (mean ± std over its seeds), validation strict Acc@1, and where and when it ran."""
    first = runs[0]
    return {
        "model": first["model"], "engine": first["engine"], "options": first["options"], "runs": summary["runs"],
        "seeds": summary["seeds"],
        # the selection run's median epoch after the first, and the refit's (none without a refit)
        "epoch_s": summary.get("selection_epoch_s"), "refit_epoch_s": summary.get("refit_epoch_s"),
        "first_epoch_s": summary.get("first_epoch_s"),
        "samples_per_s": summary.get("train_samples_per_second_median"),
        "test_forward_samples_per_s": summary.get("test_forward_samples_per_second"),
        "epochs_run": summary.get("epochs_run"),
        "strict": {name: summary["strict"][name] for name in ("acc@1", "acc@5", "mrr")},
        "protocol": {name: summary[name] for name in ("acc@1", "acc@5", "mrr")},
        "validation_strict_acc@1": summary["validation"]["strict_acc@1"],
        "when": when, "machine": machine_info,
    }


CPU_BESIDE = ("train_samples_per_second_median", "test_forward_samples_per_second", "epochs_run", "best_epoch")


def cpu_beside(summary: dict, cpu_results: Path, variant: str) -> dict:
    """train.json's CPU figures for the models run on the GPU (epoch seconds from the per-epoch samples/s,
    every epoch seeing the whole train split)."""
    if not cpu_results.is_file():
        return {}
    cpu = json.loads(cpu_results.read_text())
    v = cpu.get("variants", {}).get(variant)
    if v is None:
        return {}
    train_samples = v["data"]["counts"]["samples"]["train"]
    out = {}
    for model in summary:
        if model not in v["summary"]:
            continue
        s, runs = v["summary"][model], [r for r in v["runs"] if r["model"] == model]
        seconds = [train_samples / sps for r in runs for sps in r.get("train_samples_per_second_epochs", [])]
        out[model] = {"machine": cpu["machine"], "when": cpu["when"], "runs": s["runs"],
                      "strict_acc@1": s["strict"]["acc@1"], "acc@1": s["acc@1"], "mrr": s["mrr"],
                      "validation_strict_acc@1": s["validation"]["strict_acc@1"],
                      "epoch_seconds_median": round(float(np.median(seconds)), 3) if seconds else None,
                      **{name: s[name] for name in CPU_BESIDE if name in s}}
    return out


def gpu_main(args: argparse.Namespace) -> None:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --gpu: torch sees no CUDA device on this machine")
    options = harness_options(args, DEFAULT_RESULTS, GPU_RESULTS)
    from pgt.config import BASELINES

    baselines = [name for name in args.models if name.partition(":")[0] in BASELINES]
    if baselines:
        raise SystemExit(f"error: --gpu: {baselines[0]} is a count-based baseline; it has nothing to train on a GPU")
    variant = args.variants[0]
    data_dir = args.data_dir or sequences(args.input, VARIANTS[variant])
    results = args.results if args.results != DEFAULT_RESULTS else GPU_RESULTS
    previous = json.loads(results.read_text()) if results.is_file() else {}
    manifest = json.loads((data_dir / "manifest.json").read_text())
    machine_info = gpu_machine(args.device)

    def write(rows: list[dict]) -> dict:
        """The results file with the runs so far (after each run: a run cut short by a time limit keeps them)."""
        summary = summarise(rows)
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        # every configuration run so far, by name (a rerun replaces its own): the fixed form the README reads
        configurations = dict(previous.get("configurations", {}))
        for name, s in summarise(rows, key="configuration").items():
            configurations[name] = configuration_entry(s, [r for r in rows if r["configuration"] == name], when,
                                                       machine_info)
        result = {
            "benchmark": "train-gpu",
            "when": when,
            "machine": machine_info,
            "configurations": configurations,
            "selection": SELECTION + " The recipes are the CPU's, unchanged (batch size, epochs, early stopping).",
            "variant": variant,
            "data": {"config": manifest["config"], "counts": manifest["counts"], "vocab": manifest["vocab"]},
            "summary": summary,
            "cpu": cpu_beside(summary, DEFAULT_RESULTS, variant),
            "runs": rows,
        }
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps(result, indent=2) + "\n")
        return result

    rows = run_models(args.models, args.seeds, data_dir, args.epochs, f"{args.device} {args.engine} {variant}",
                      device=args.device, engine=args.engine, options=options, work=args.work, on_row=write)
    result = write(rows)
    print_gpu_table(result)
    print(f"wrote {results}")


def plus_minus(x: dict) -> str:
    """"mean ± std" of a metric, or the mean alone where no spread was recorded (an entry from one run's log)."""
    return f"{x['mean']:.2f}" if x.get("std") is None else f"{x['mean']:.2f} ± {x['std']:.2f}"


def print_gpu_table(result: dict) -> None:
    """Every configuration of train_gpu.json (its fixed form), and the CPU rows of train.json beside its models."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"GeoLife ({result['variant']}): test metrics mean ± std over seeds, per configuration")
    for col in ("configuration", "device", "runs", "epoch s", "train samples/s", "test forward samples/s", "epochs",
                "validation strict acc@1", "strict acc@1", "acc@1", "mrr"):
        table.add_column(col, justify="left" if col in ("configuration", "device") else "right")

    def num(x, fmt: str) -> str:
        return "" if x is None else format(x, fmt)

    for name, c in result["configurations"].items():
        m = c["machine"]
        table.add_row(name, m.get("gpu") or f"CPU ({m['cores']} cores)", str(c["runs"]), num(c["epoch_s"], ".2f"),
                      num(c["samples_per_s"], ",.0f"), num(c["test_forward_samples_per_s"], ",.0f"),
                      num(c["epochs_run"], ".0f"), plus_minus(c["validation_strict_acc@1"]), plus_minus(c["strict"]["acc@1"]),
                      plus_minus(c["protocol"]["acc@1"]), plus_minus(c["protocol"]["mrr"]))
    for model, c in result["cpu"].items():
        table.add_row(f"[dim]{model}, train.json", f"[dim]CPU ({c['machine']['cores']} cores)", f"[dim]{c['runs']}",
                      f"[dim]{num(c['epoch_seconds_median'], '.2f')}",
                      f"[dim]{c['train_samples_per_second_median']:,.0f}",
                      f"[dim]{c['test_forward_samples_per_second']:,.0f}", f"[dim]{c['epochs_run']:.0f}",
                      f"[dim]{plus_minus(c['validation_strict_acc@1'])}", f"[dim]{plus_minus(c['strict_acc@1'])}",
                      f"[dim]{plus_minus(c['acc@1'])}", f"[dim]{plus_minus(c['mrr'])}")
    Console(width=220).print(table)


def print_table(result: dict, variant: str) -> None:
    from rich.console import Console
    from rich.table import Table

    v = result["variants"][variant]
    c = v["data"]["counts"]["samples"]
    table = Table(title=f"GeoLife ({variant}) test metrics, mean ± std over seeds "
                        f"(train {c['train']:,} / test {c['test']:,} samples): strict first, then the protocol's")
    columns = ([f"strict {m}" for m in STRICT] + list(METRICS) + ["deployment strict acc@1", "new place P/R",
                                                                 "train samples/s", "epochs"])
    table.add_column("model")
    for col in columns:
        table.add_column(col, justify="right")
    for model, s in v["summary"].items():
        strict = (f"{s['strict'][m]['mean']:.2f} ± {s['strict'][m]['std']:.2f}" for m in STRICT)
        table.add_row(f"{model} (n={s['runs']})", *strict,
                      *(f"{s[m]['mean']:.2f} ± {s[m]['std']:.2f}" for m in METRICS),
                      (f"{s['deployment']['strict']['acc@1']['mean']:.2f} ± {s['deployment']['strict']['acc@1']['std']:.2f}"
                       if "deployment" in s else "-"),
                      f"{s['new_place']['precision']['mean']:.0f}/{s['new_place']['recall']['mean']:.0f}",
                      f"{s.get('train_samples_per_second_median', 0):.0f}", f"{s.get('epochs_run', 0):.0f}")
    for name, m in {**result["published"], **result["reference_run"]}.items():
        strict = m.get("strict", {})
        table.add_row(f"[dim]{name}", *(f"[dim]{strict[k]:.2f}" if k in strict else "[dim]-" for k in STRICT),
                      *(f"[dim]{m[k]:.2f}" if k in m else "[dim]-" for k in METRICS), "[dim]-", "[dim]-",
                      f"[dim]{m.get('samples_per_second', '-')}", "[dim]-")
    Console(width=260).print(table)
    kinds = {model: s["by_target_kind"] for model, s in v["summary"].items() if "by_target_kind" in s}
    if kinds:
        by_kind = Table(title=f"GeoLife ({variant}) test Acc@1 by what the target is to the person: strict, as deployed, "
                              "the protocol's")
        by_kind.add_column("model")
        first = next(iter(kinds.values()))
        for kind, k in first.items():
            by_kind.add_column(f"{kind} ({k['samples']:,}): strict / deployed / protocol", justify="right")
        for model, k in kinds.items():
            by_kind.add_row(model, *(f"{x['strict']['acc@1']['mean']:.2f} / "
                                     f"{x.get('deployment_strict', x['strict'])['acc@1']['mean']:.2f} / "
                                     f"{x['protocol']['acc@1']['mean']:.2f}" for x in k.values()))
        Console(width=200).print(by_kind)


if __name__ == "__main__":
    main()

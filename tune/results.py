"""A sweep's results: the table of its trials, the finalists' evidence and the winner, the winner's recipe file,
the headline metrics, and the plot of the trials."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import yaml

from infra.storage import Storage, open_storage
from pgt.config import selection_score
from pgt.data.fetch import local_data
from pgt.recipes import RECIPE_FREE
from pgt.tracking.registry import Evidence, data_digest
from tune.config import TRIAL_FIXED, SweepConfig
from tune.records import BASE, WINNER, read_trial_events
from tune.space import SearchSpace


def sweep_evidence(spec: SweepConfig, result: dict) -> dict:
    """What the sweep's model is registered on (pgt.tracking.registry.Evidence as a dict): the confirmed winner's validation
    strict Acc@1 on its fresh seeds, or without a confirmation the final run's on the sweep's seed."""
    confirmed = result.get("confirmation", {})
    if confirmed.get("winner"):
        winner = confirmed["finalists"][0]
        seeds, scores = winner["seeds"], winner["validation_strict_acc@1"]
    else:
        seeds, scores = [spec.seed], [result["final"]["validation"]["strict"]["acc@1"]]
    return dataclasses.asdict(Evidence(seeds, scores, data_digest(local_data(spec.data_dir))))


def finalist_candidates(spec: SweepConfig, trials: list[dict]) -> list[dict]:
    """The base recipe, then the best finished trials' configurations (distinct, and other than the base), at most
    spec.finalists of them: each {"name", "trial_id", "config", "search_score"}."""
    base = spec.base_hyper()
    chosen = [{"name": BASE, "trial_id": None, "config": base, "search_score": None}]
    seen = [base]
    for row in trials:  # best first
        if len(chosen) > spec.finalists:
            break
        if row["status"] != "finished" or row["config"] in seen:
            continue
        seen.append(row["config"])
        chosen.append({"name": f"trial-{row['trial_id']}", "trial_id": row["trial_id"], "config": row["config"],
                       "search_score": row["best_validation_score"]})
    return chosen


def seeds_of(metrics: dict) -> list[dict]:
    """A confirmation run's per-seed results ({"seed", "best_epoch", "validation"}): a fused run's `seeds`, or the
    run itself (one seed)."""
    if "seeds" in metrics:
        return metrics["seeds"]
    return [{"seed": metrics["config"]["seed"], "best_epoch": metrics["best_epoch"], "validation": metrics["validation"]}]


def summarise(spec: SweepConfig, grid, nodes: dict[str, str], out_of_time: bool = False) -> dict:
    """tune.json: a row per trial (config, status, epochs, the best validation score of the objective, its
    strict and protocol validation Acc@1; test metrics only where the trial's run scored test, which a trial of
    run_trial never does), the best finished trial by the objective and its config."""
    rows, never_started = [], 0
    stopped = "stopped (ASHA or time budget)" if out_of_time else "stopped (ASHA)"
    out = open_storage(spec.out_dir)
    for result in grid:
        if not result.config:  # the time budget ended the sweep before this trial drew its settings
            never_started += 1
            continue
        metrics = result.metrics or {}
        trial_id = result.path.rstrip("/").rpartition("/")[2].removeprefix("trial_")
        trial_dir = out.child("trials", trial_id)
        hyper = spec.space.resolve(result.config)
        node = trial_dir.read_json("node.json") or {}
        done = trial_dir.read_json("metrics.json")
        events = read_trial_events(trial_dir)
        row = {
            "trial_id": trial_id, "config": hyper,
            "status": "error" if result.error else ("finished" if done else stopped),
            "epochs": done["epochs_run"] if done else metrics.get("training_iteration", 0),
            "best_validation_score": (selection_score(done["validation"], spec.objective) if done
                                      else best_seen(events)),
            "best_validation_acc@1": done["validation"]["acc@1"] if done else None,
            "best_validation_strict_acc@1": done["validation"]["strict"]["acc@1"] if done else None,
            "best_validation": done["validation"] if done else None,
            "test": headline_metrics(done["test"]) if done and done["test"] else None,  # a trial's own: none
            "node_id": node.get("node_id"), "node_address": nodes.get(node.get("node_id", ""), None),
            "started_at": node.get("started_at"), "last_report_at": metrics.get("timestamp"),
            "mlflow_run_id": trial_run_id(trial_dir),
            "restarts": sum(e["event"] == "restarted" for e in events),
        }
        if done:
            row["train_loss_last"] = done["history"][-1]["train_loss"] if done["history"] else None
        rows.append(row)
    finished = [r for r in rows if r["status"] == "finished"]
    if not finished:
        raise RuntimeError(f"{spec.out_dir}: no trial finished ({len(rows)} trials: "
                           f"{', '.join(sorted({r['status'] for r in rows}))})")
    best = max(finished, key=lambda r: r["best_validation_score"])
    rows.sort(key=lambda r: -(r["best_validation_score"] if r["best_validation_score"] is not None else -math.inf))
    return {"best_trial": best["trial_id"], "best_config": best["config"], "objective": spec.objective,
            "best_validation_score": best["best_validation_score"], "best_validation_acc@1": best["best_validation_acc@1"],
            "best_validation_strict_acc@1": best["best_validation_strict_acc@1"],
            "best_validation": best["best_validation"], "best_test": best["test"],
            "best_checkpoint": out.uri_of("trials", best["trial_id"], "best.pt"),
            "time_budget_reached": out_of_time, "trials_never_started": never_started, "trials": rows,
            "sweep": spec.to_dict()}


RUN_SETTINGS = (*RECIPE_FREE, "threads")  # where and whether a run goes: never part of a recipe


def winner_recipe(spec: SweepConfig, best_config: dict) -> dict:
    """The best trial's whole training configuration (the recipe with the drawn settings), as a recipe's settings:
    `pgt train --recipe-file` of it trains that configuration again."""
    settings = spec.train_config(best_config, Path(spec.out_dir)).to_dict()
    settings |= {name: spec.recipe[name] for name in TRIAL_FIXED if name in spec.recipe}  # e.g. the winner refits
    return {name: value for name, value in settings.items() if name not in RUN_SETTINGS}


def winner_recipe_text(spec: SweepConfig, result: dict) -> str:
    """best_recipe.yaml: the winner's recipe, with a header that says where it comes from."""
    confirmed = result.get("confirmation", {})
    if confirmed.get("winner"):
        winner = confirmed["finalists"][0]
        header = (f"# pgt tune: the confirmed winner of {len(confirmed['finalists'])} finalists of {len(result['trials'])} "
                  f"trials ({winner['name']}), mean validation {spec.objective} {winner['mean']:.2f} over seeds "
                  f"{', '.join(map(str, winner['seeds']))}, searched around the recipe {spec.recipe_name}.\n")
    else:
        header = (f"# pgt tune: the best of {len(result['trials'])} trials (trial {result['best_trial']}), validation "
                  f"{spec.objective} {result['best_validation_score']:.2f}, searched around the recipe "
                  f"{spec.recipe_name}.\n")
    header += f"# Train it with: pgt train --recipe-file {WINNER} --data DIR --out DIR\n"
    return header + yaml.safe_dump(winner_recipe(spec, result["best_config"]), sort_keys=False)


def headline_metrics(metrics: dict) -> dict:
    """A split's overall metrics, protocol and strict, without the in/outside-history breakdowns."""
    strict = {k: v for k, v in metrics["strict"].items() if not isinstance(v, dict)}
    return {k: v for k, v in metrics.items() if not isinstance(v, dict)} | {"strict": strict,
                                                                           "new_place": metrics["new_place"]}


def best_seen(events: list[dict]) -> float | None:
    """The best objective a trial reported at its checkpoints (its events, read_trial_events'), None where it
    reported none."""
    scores = [e["score"] for e in events if e.get("score") is not None]
    return max(scores) if scores else None


def trial_run_id(trial_dir: Storage) -> str | None:
    record = trial_dir.read_json("mlflow_run.json")
    return record["run_id"] if record else None


def plot_trials(rows: list[dict], path: Path, space: SearchSpace, objective: str = "strict_acc@1") -> Path:
    """The best validation score (objective) of every trial against each searched parameter (finished trials filled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = space.names
    columns = 4 if len(names) > 6 else 3
    rows_of_plots = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(rows_of_plots, columns, figsize=(4.4 * columns, 3.8 * rows_of_plots), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        for finished, marker in ((True, "o"), (False, "x")):
            pts = [(r["config"][name], r["best_validation_score"]) for r in rows
                   if (r["status"] == "finished") == finished and r["best_validation_score"] is not None]
            if pts:
                x, y = zip(*pts)
                ax.scatter(x, y, marker=marker, alpha=0.8, label="finished" if finished else "stopped early")
        if space.dimension(name).kind == "log":
            ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel(f"best validation {objective} (%)")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{len(rows)} trials: validation {objective} against each searched parameter")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

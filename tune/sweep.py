"""`pgt tune`: a Ray Tune sweep over the PGT's hyper-parameters, on a local Ray or a Ray cluster.

Each trial runs the same training (`pgt.training.distributed.run_training`): in the trial's process when it has
one worker, or as a TorchTrainer inside the trial with W > 1 workers, reporting to Tune through
`TuneReportCallback` (the pattern Ray Train V2 documents for Train with Tune). ASHA stops bad trials
early; Optuna's TPE proposes configurations (random search on request). MLflow gets a parent run per
sweep and a child run per trial; the best trial's checkpoint is evaluated on test, logged to the parent
run and registered under the champion rule. `DIR/tune.json` holds the best config and a row per trial.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

import yaml

from infra.errors import SettingsError
from infra.output import output_lock, write_file_atomically, write_json_atomically
from infra.process import interruptible, uninterrupted
from infra.ray_session import prepare_ray_env, ray_session
from pgt.config import RECIPE_FREE, LaunchConfig, TrackingConfig, TrainConfig, load_recipe_file, selection_score
from pgt.network.checkpoint import read_checkpoint
from pgt.tracking.registry import Evidence, data_digest, register_model
from pgt.tracking.runs import (
    end_run,
    log_datasets,
    log_pytorch_model,
    metrics_of,
    mlflow_client,
    reopen_run,
    source_tags,
    start_run,
    system_metrics,
    terminate_run,
    use_tracking_uri,
)
from pgt.training.distributed import check_splits, flat_metrics, run_training
from tune.config import TRIAL_FIXED, SweepConfig
from tune.space import SearchSpace

EXPERIMENT_NAME = "sweep"  # the Tune experiment's folder under DIR/ray
CONFIRMATION = "confirmation"  # the finalists' Tune experiment under DIR/ray, and their runs under DIR/finalists
FINALISTS = "finalists"
FINAL = "final"  # the winner's recipe trained as `pgt train --recipe-file best_recipe.yaml` would: DIR/final, and its
# Tune experiment under DIR/ray; its best.pt is the sweep's model
BASE = "base"  # the finalist that is the base recipe itself
WINNER = "best_recipe.yaml"  # the winning configuration as a recipe file
# what a sweep writes
OUTPUTS = ("sweep.json", "tune.json", WINNER, "trials", FINALISTS, FINAL, "trials.png", "ray", ".*.tmp-*", ".*.lock")


# ---------------------------------------------------------------------------------------------
# one trial (runs in a Ray Tune trial actor)


def run_trial(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable: one training run with the drawn hyper-parameters."""
    import ray
    import ray.tune

    spec = SweepConfig.from_dict(sweep)
    context = ray.tune.get_context()
    trial_id = context.get_trial_id()
    out_dir = Path(spec.out_dir) / "trials" / trial_id
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomically(out_dir / "node.json", {"node_id": ray.get_runtime_context().get_node_id(),
                                                  "hostname": os.uname().nodename, "pid": os.getpid(),
                                                  "started_at": time.time()})
    # a trial is chosen on validation: test is read once, by the winner's final run
    cfg = dataclasses.replace(spec.train_config(spec.space.resolve(config), out_dir), evaluate_test=False)
    train_in_trial(spec, cfg, out_dir, tracking, f"trial-{trial_id}")


def run_finalist(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable of the confirmation: one finalist's configuration on a group of the seeds the
    search did not use (several side by side: fused_seeds), scored on validation."""
    spec = SweepConfig.from_dict(sweep)
    finalist, seeds = config["finalist"], config["finalist"]["seeds"]
    out_dir = finalist_dir(Path(spec.out_dir), finalist["name"], seeds)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_in_trial(spec, spec.confirmation_config(finalist["config"], out_dir, seeds), out_dir, tracking,
                   f"finalist-{finalist['name']}-seeds-{'-'.join(map(str, seeds))}")


def finalist_dir(out: Path, name: str, seeds: list[int]) -> Path:
    """A finalist's run on a group of seeds: --out/finalists/<name>/seeds-<first>[-<next>...]."""
    return out / FINALISTS / name / f"seeds-{'-'.join(map(str, seeds))}"


def run_final(config: dict, sweep: dict, tracking: dict | None) -> None:
    """Tune's function trainable of the final run: the winner's recipe file trained on the sweep's seed, refit and
    test included, as `pgt train --recipe-file best_recipe.yaml` trains it (resumed from its own checkpoints)."""
    import ray.tune

    spec = SweepConfig.from_dict(sweep)
    out_dir = Path(spec.out_dir) / FINAL
    cfg = final_config(spec, Path(config["recipe_file"]), out_dir)
    launch = LaunchConfig(workers=0) if spec.workers_per_trial == 1 else trial_workers(spec)
    result = run_training(cfg, launch, child_tracking(tracking, "final"))
    ray.tune.report({"validation_strict_acc@1": result["validation"]["strict"]["acc@1"]})


def final_config(spec: SweepConfig, recipe_file: Path, out_dir: Path):
    """The final run's TrainConfig: the recipe file's settings on the sweep's data and seed, nothing else."""
    threads = max(1, int(spec.cpus_per_trial)) if spec.workers_per_trial == 1 else 0
    return TrainConfig.from_recipe(load_recipe_file(recipe_file), data_dir=spec.data_dir, out_dir=str(out_dir),
                                   seed=spec.seed, threads=threads)


def stage_tuner(name: str, trainable, spec: SweepConfig, tracking, resume: bool, param_space: dict):
    """The Tune experiment of a stage after the search (DIR/ray/<name>): its trials with the search's resources and
    failure policy, as many at once as the search's, restored where an interrupted sweep resumes."""
    from ray import tune

    experiment = Path(spec.out_dir) / "ray" / name
    trainable = tune.with_resources(tune.with_parameters(trainable, sweep=spec.to_dict(),
                                                         tracking=tracking.to_dict() if tracking else None),
                                    _trial_resources(spec))
    if resume and tune.Tuner.can_restore(str(experiment)):
        return tune.Tuner.restore(str(experiment), trainable, resume_unfinished=True, resume_errored=True)
    return tune.Tuner(trainable, param_space=param_space,
                      tune_config=tune.TuneConfig(max_concurrent_trials=spec.max_concurrent,
                                                  reuse_actors=spec.reuse_actors),
                      run_config=tune.RunConfig(name=name, storage_path=str(experiment.parent), verbose=1,
                                                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                                                checkpoint_config=tune.CheckpointConfig(num_to_keep=1)))


def train_final(spec: SweepConfig, recipe_file: Path, tracking, resume: bool) -> dict:
    """The final run as a Tune experiment of one trial (the search's resources; resumable). Returns its
    metrics.json; RuntimeError when it did not finish."""

    out = Path(spec.out_dir)
    grid = stage_tuner(FINAL, run_final, spec, tracking, resume, {"recipe_file": str(recipe_file)}).fit()
    done = out / FINAL / "metrics.json"
    if not done.is_file():
        errors = [str(r.error).splitlines()[0] for r in grid if r.error]
        raise RuntimeError(f"{out / FINAL}: the winner's final run did not finish"
                           + (f" ({errors[0]})" if errors else f"; resume it with `pgt tune --resume {out}`"))
    return json.loads(done.read_text())


def child_tracking(tracking: dict | None, run_name: str):
    """A trial's MLflow run, a child of the sweep's (no model logged or registered there); None untracked."""
    if not tracking:
        return None
    parent = TrackingConfig.from_dict(tracking)
    return dataclasses.replace(parent, run_id=None, parent_run_id=parent.run_id, log_model=False, register=None,
                               run_name=run_name)


def trial_workers(spec: SweepConfig) -> LaunchConfig:
    """The TorchTrainer of spec.workers_per_trial workers a trial runs inside itself."""
    return LaunchConfig(workers=spec.workers_per_trial, cpus_per_worker=spec.cpus_per_worker,
                        gpu=spec.gpus_per_worker > 0, gpus_per_worker=spec.gpus_per_worker or 1.0,
                        max_failures=spec.max_failures)


def train_in_trial(spec: SweepConfig, cfg, out_dir: Path, tracking: dict | None, run_name: str) -> None:
    """Train cfg inside a Tune trial, reporting every epoch (with its checkpoint) to Tune, resumed from the
    checkpoint Tune restores; an MLflow child run of the sweep's when tracked."""
    import ray.tune

    child = child_tracking(tracking, run_name)
    if spec.workers_per_trial == 1:
        restored = restore_trial_checkpoint(ray.tune.get_checkpoint(), out_dir)
        if restored is not None and finished_before(cfg, out_dir, restored):
            return  # Tune's state predates the trial's end (the driver was killed): its result is on disk already

        def report(row: dict, checkpoint_dir: Path | None) -> None:
            checkpoint = ray.tune.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
            ray.tune.report(flat_metrics(row), checkpoint=checkpoint)

        run_training(cfg, LaunchConfig(workers=0), child, on_epoch=report)
    else:  # the TorchTrainer restarts its own workers; Tune restarts the trial's driver
        from ray.tune.integration.ray_train import TuneReportCallback

        run_training(cfg, trial_workers(spec), child, callbacks=[TuneReportCallback()])


def finished_before(cfg, out_dir: Path, checkpoint: Path) -> bool:
    """Whether out_dir holds the finished result (metrics.json) of this very configuration, ending at the epoch of
    the checkpoint Tune restored (its folder epoch_NNN, as restore_trial_checkpoint put it): then nothing is trained,
    scored or logged again."""
    try:
        done = json.loads((out_dir / "metrics.json").read_text())
        epoch = int(checkpoint.parent.name.removeprefix("epoch_"))
    except (OSError, ValueError):
        return False
    same = {k: v for k, v in done.get("config", {}).items() if k != "resume"} == \
        {k: v for k, v in cfg.to_dict().items() if k != "resume"}
    return same and done.get("epochs_run") == epoch + 1


def restore_trial_checkpoint(checkpoint, out_dir: Path) -> Path | None:
    """Put the checkpoint Tune hands a restarted trial back under out_dir/checkpoints/epoch_NNN (unless it is
    there already) and drop later epochs written after Tune's last registered report, so that training resumes
    exactly where Tune's iteration count does. Returns its path, None without one."""
    if checkpoint is None:
        return None

    with checkpoint.as_directory() as folder:
        source = Path(folder) / "checkpoint.pt"
        epoch = int(read_checkpoint(source, "cpu", ("epoch",))["epoch"])
        target = out_dir / "checkpoints" / f"epoch_{epoch:03d}" / "checkpoint.pt"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    for later in (out_dir / "checkpoints").glob("epoch_*"):
        if later.name > target.parent.name:
            shutil.rmtree(later, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------------
# the sweep (the driver)


def run_sweep(spec: SweepConfig, tracking=None, address: str | None = None, resume: bool = False,
              register: str | None = None) -> dict:
    """Run (or resume) a sweep and return tune.json's content. `tracking` is a TrackingConfig or None. One sweep
    writes a folder at a time: a second one is refused, naming the first's process."""
    if register and not spec.final:
        raise SettingsError(f"--register {register} registers the sweep's final run, and --no-final skips it: drop "
                            "one of them")
    out = Path(spec.out_dir).resolve()
    spec = dataclasses.replace(spec, out_dir=str(out), data_dir=str(Path(spec.data_dir).resolve()))
    # before any run, folder or Ray starts: an empty split would fail every trial max_failures + 1 times
    check_splits(Path(spec.data_dir))
    with interruptible(), output_lock(out, command="pgt tune"):  # SIGTERM as run_training takes it
        return _run_sweep(spec, tracking, address, resume, register)


def _run_sweep(spec: SweepConfig, tracking, address: str | None, resume: bool, register: str | None) -> dict:
    prepare_ray_env(address)  # before the first import of ray
    import ray
    from ray import tune

    from tune.scheduler import FinishingASHA

    out = Path(spec.out_dir)
    experiment = out / "ray" / EXPERIMENT_NAME
    if not resume:
        if (out / "sweep.json").exists():
            raise SettingsError(f"{out} holds a sweep already; resume it with --resume {out}, or choose another --out")
        out.mkdir(parents=True, exist_ok=True)
    tracking = _parent_run(spec, tracking, out, resume)
    write_json_atomically(out / "sweep.json", {"sweep": spec.to_dict(), "tracking": tracking.to_dict() if tracking else None,
                                               "register": register}, indent=2)
    status = "FAILED"
    try:  # the parent run samples the driver's machine (CPU, memory, GPU) like every training run
        with system_metrics(tracking), ray_session(address):
            trainable = tune.with_parameters(run_trial, sweep=spec.to_dict(),
                                             tracking=tracking.to_dict() if tracking else None)
            trainable = tune.with_resources(trainable, _trial_resources(spec))
            if resume and tune.Tuner.can_restore(str(experiment)):
                tuner = tune.Tuner.restore(str(experiment), trainable, resume_unfinished=True, resume_errored=True)
            else:
                scheduler = FinishingASHA(time_attr="training_iteration", max_t=spec.epochs,
                                          grace_period=max(1, min(spec.grace_period, spec.epochs - 1)),
                                          reduction_factor=spec.reduction_factor)
                tuner = tune.Tuner(
                    trainable,
                    param_space={} if spec.search == "optuna" else spec.space.random_space(),
                    tune_config=tune.TuneConfig(metric=spec.metric, mode="max", scheduler=scheduler,
                                                search_alg=_searcher(spec), num_samples=spec.trials,
                                                max_concurrent_trials=spec.max_concurrent,
                                                reuse_actors=spec.reuse_actors,
                                                time_budget_s=spec.time_budget_s, trial_dirname_creator=trial_dirname),
                    run_config=tune.RunConfig(name=EXPERIMENT_NAME, storage_path=str(out / "ray"), verbose=1,
                                              failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                                              checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                                              callbacks=[make_trial_events(out)]),
                )
            began = time.monotonic()
            grid = tuner.fit()
            nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
            out_of_time = spec.time_budget_s is not None and time.monotonic() - began >= 0.95 * spec.time_budget_s
            unfinished = [t for t in grid._experiment_analysis.trials if not _ended(out, t)]
            if not out_of_time and (unfinished or len(grid) < spec.trials):
                status = "KILLED"
                raise SweepInterrupted(f"{out}: sweep interrupted with {len(grid) - len(unfinished)} of {spec.trials} "
                                       f"trials done; resume it with `pgt tune --resume {out}`")
            result = summarise(spec, grid, nodes, out_of_time)
            result["search_wall_s"] = round(time.monotonic() - began, 1)
            if spec.finalists:
                began = time.monotonic()
                result["confirmation"] = confirm_finalists(spec, result, tracking, resume)
                result["confirmation"]["wall_s"] = round(time.monotonic() - began, 1)
                if result["confirmation"]["unfinished"]:
                    status = "KILLED"
                    raise SweepInterrupted(f"{out}: confirmation interrupted with finalists "
                                           f"{', '.join(result['confirmation']['unfinished'])} not done; resume it "
                                           f"with `pgt tune --resume {out}`")
            result["best_recipe"] = str(write_winner_recipe(spec, result))
            final = None
            if spec.final:
                began = time.monotonic()
                final = train_final(spec, Path(result["best_recipe"]), tracking, resume)
                result["final"] = {"wall_s": round(time.monotonic() - began, 1), "seed": spec.seed,
                                   "validation": headline_metrics(final["validation"]),
                                   "test": headline_metrics(final["test"]), "refit": final.get("refit"),
                                   "epochs_run": final["epochs_run"]}
                result["best_checkpoint"] = str(out / FINAL / "best.pt")
                result["best_test"] = headline_metrics(final["test"])
                result["evidence"] = sweep_evidence(spec, result)
            else:  # the search's winner is a recipe file only: no model, and test stays unread
                result["final"] = result["best_checkpoint"] = result["best_test"] = None
        if tracking:
            result["mlflow"] = _log_sweep(spec, tracking, result, register, final["test"] if final else None)
        write_json_atomically(out / "tune.json", result, indent=2, default=float)
        status = "FINISHED"
        return result
    finally:
        if tracking:
            _close_trial_runs(tracking, out)

            end_run(tracking, status)


TRIAL_EVENTS = "tune_events.jsonl"  # trials/<id>/: what the sweep's driver recorded of the trial (TrialEvents)


def make_trial_events(out: Path):
    """A Tune callback (built here so that ray is imported late) that appends to trials/<id>/tune_events.jsonl,
    in the driver, once Tune itself has acted: `checkpoint` after Tune registered a reported checkpoint (the one a
    restart restores), `restarted` when a failed trial is scheduled again (with the epoch it will resume after),
    `failed` when it errors for good, `completed` when it ended (finished, or stopped by ASHA). One JSON object per
    line: event, time, epoch (0-based, or null), training_iteration."""
    from ray.tune import Callback

    class TrialEvents(Callback):
        def on_trial_save(self, iteration, trials, trial, **info):
            _append_event(out, trial, "checkpoint")

        def on_trial_recover(self, iteration, trials, trial, **info):
            _append_event(out, trial, "restarted")

        def on_trial_error(self, iteration, trials, trial, **info):
            _append_event(out, trial, "failed")

        def on_trial_complete(self, iteration, trials, trial, **info):
            _append_event(out, trial, "completed")

    return TrialEvents()


def _append_event(out: Path, trial, event: str) -> None:
    registered = trial.latest_checkpoint_result  # what Tune restores the trial from
    metrics = registered.metrics if registered is not None else {}
    record = {"event": event, "time": time.time(), "epoch": metrics.get("epoch"),
              "training_iteration": metrics.get("training_iteration")}
    folder = out / "trials" / trial.trial_id
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / TRIAL_EVENTS, "a") as fh:  # the driver is its one writer; one whole line per event
        fh.write(json.dumps(record) + "\n")
        fh.flush()


def _ended(out: Path, trial) -> bool:
    """Whether Tune ended the trial itself (finished, stopped by ASHA, or failed for good): its driver recorded that
    event. Its status alone does not say: on Ctrl+C Tune marks the trials it cleans up, pending ones included,
    TERMINATED without ending them."""
    return any(e["event"] in ("completed", "failed") for e in read_trial_events(out / "trials" / trial.trial_id))


def read_trial_events(trial_dir: Path) -> list[dict]:
    """The events the driver recorded of a trial (make_trial_events), oldest first; [] when none."""
    path = Path(trial_dir) / TRIAL_EVENTS
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # a line being written is left out


class SweepInterrupted(RuntimeError):
    """The sweep stopped (Ctrl+C, SIGINT) before every trial ended; its state is saved for --resume."""


def trial_dirname(trial) -> str:
    """Tune's folder of a trial: trial_<id>, the id also naming our trials/<id> folder."""
    return f"trial_{trial.trial_id}"


def sweep_evidence(spec: SweepConfig, result: dict) -> dict:
    """What the sweep's model is registered on (pgt.tracking.registry.Evidence as a dict): the confirmed winner's validation
    strict Acc@1 on its fresh seeds, or without a confirmation the final run's on the sweep's seed."""
    confirmed = result.get("confirmation", {})
    if confirmed.get("winner"):
        winner = confirmed["finalists"][0]
        seeds, scores = winner["seeds"], winner["validation_strict_acc@1"]
    else:
        seeds, scores = [spec.seed], [result["final"]["validation"]["strict"]["acc@1"]]
    return dataclasses.asdict(Evidence(seeds, scores, data_digest(spec.data_dir)))


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


def confirm_finalists(spec: SweepConfig, result: dict, tracking, resume: bool) -> dict:
    """The finalists (finalist_candidates) trained on seeds the search did not use, as a Tune experiment of their
    own (resumable, each finalist a trial with the search's resources); the winner is the best mean validation
    objective over those seeds. Sets result's best_config to the winner's. Returns tune.json's "confirmation"."""
    from ray import tune

    out = Path(spec.out_dir)
    candidates = finalist_candidates(spec, result["trials"])
    groups = spec.confirmation_seeds()
    runs = [{**candidate, "seeds": seeds} for candidate in candidates for seeds in groups]
    stage_tuner(CONFIRMATION, run_finalist, spec, tracking, resume, {"finalist": tune.grid_search(runs)}).fit()
    rows, unfinished = [], []
    for candidate in candidates:
        done = [finalist_dir(out, candidate["name"], seeds) / "metrics.json" for seeds in groups]
        if not all(path.is_file() for path in done):
            unfinished.append(candidate["name"])
            continue
        each = [seed for path in done for seed in seeds_of(json.loads(path.read_text()))]
        scores = [selection_score(seed["validation"], spec.objective) for seed in each]
        strict = [seed["validation"]["strict"]["acc@1"] for seed in each]
        rows.append({**candidate, "seeds": [seed["seed"] for seed in each], "validation_scores": scores,
                     "validation_strict_acc@1": strict, "mean_validation_strict_acc@1": sum(strict) / len(strict),
                     "mean": sum(scores) / len(scores),
                     "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                     "best_epochs": [seed["best_epoch"] for seed in each],
                     "train_seconds": sum(json.loads(path.read_text())["train_seconds"] for path in done)})
    # best first; the base recipe wins ties: a configuration must beat where the sweep started, not equal it
    rows.sort(key=lambda r: (r["mean"], r["name"] == BASE), reverse=True)
    confirmation = {"objective": spec.objective, "seeds_per_finalist": spec.confirm_seeds,
                    "finalists": rows, "unfinished": unfinished}
    if rows and not unfinished:
        confirmation["winner"] = rows[0]["name"]
        result["best_config"] = rows[0]["config"]
    return confirmation


def seeds_of(metrics: dict) -> list[dict]:
    """A confirmation run's per-seed results ({"seed", "best_epoch", "validation"}): a fused run's `seeds`, or the
    run itself (one seed)."""
    if "seeds" in metrics:
        return metrics["seeds"]
    return [{"seed": metrics["config"]["seed"], "best_epoch": metrics["best_epoch"], "validation": metrics["validation"]}]


def _trial_resources(spec: SweepConfig) -> dict:
    if spec.workers_per_trial == 1:
        return {"CPU": spec.cpus_per_trial} | ({"GPU": spec.gpus_per_worker} if spec.gpus_per_worker else {})
    return {"CPU": 0.5}  # the trial's driver; its workers reserve their own CPUs (and GPUs)


def _searcher(spec: SweepConfig):
    if spec.search == "random":
        return None
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    searcher = OptunaSearch(space=spec.space.optuna_space(), metric=spec.metric, mode="max", seed=spec.seed)
    return ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)


def summarise(spec: SweepConfig, grid, nodes: dict[str, str], out_of_time: bool = False) -> dict:
    """tune.json: a row per trial (config, status, epochs, the best validation score of the objective, its
    strict and protocol validation Acc@1; test metrics only where the trial's run scored test, which a trial of
    run_trial never does), the best finished trial by the objective and its config."""
    rows, never_started = [], 0
    stopped = "stopped (ASHA or time budget)" if out_of_time else "stopped (ASHA)"
    for result in grid:
        if not result.config:  # the time budget ended the sweep before this trial drew its settings
            never_started += 1
            continue
        metrics = result.metrics or {}
        trial_id = Path(result.path).name.removeprefix("trial_")
        trial_dir = Path(spec.out_dir) / "trials" / trial_id
        hyper = spec.space.resolve(result.config)
        node = json.loads((trial_dir / "node.json").read_text()) if (trial_dir / "node.json").is_file() else {}
        done = json.loads((trial_dir / "metrics.json").read_text()) if (trial_dir / "metrics.json").is_file() else None
        row = {
            "trial_id": trial_id, "config": hyper,
            "status": "error" if result.error else ("finished" if done else stopped),
            "epochs": done["epochs_run"] if done else metrics.get("training_iteration", 0),
            "best_validation_score": (selection_score(done["validation"], spec.objective) if done
                                      else _best_seen(result, spec.metric)),
            "best_validation_acc@1": done["validation"]["acc@1"] if done else None,
            "best_validation_strict_acc@1": done["validation"]["strict"]["acc@1"] if done else None,
            "best_validation": done["validation"] if done else None,
            "test": headline_metrics(done["test"]) if done and done["test"] else None,  # a trial's own: none
            "node_id": node.get("node_id"), "node_address": nodes.get(node.get("node_id", ""), None),
            "started_at": node.get("started_at"), "last_report_at": metrics.get("timestamp"),
            "mlflow_run_id": _trial_run_id(trial_dir),
            "restarts": sum(e["event"] == "restarted" for e in read_trial_events(trial_dir)),
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
            "best_checkpoint": str(Path(spec.out_dir) / "trials" / best["trial_id"] / "best.pt"),
            "time_budget_reached": out_of_time, "trials_never_started": never_started, "trials": rows,
            "sweep": spec.to_dict()}


RUN_SETTINGS = (*RECIPE_FREE, "threads")  # where and whether a run goes: never part of a recipe


def winner_recipe(spec: SweepConfig, best_config: dict) -> dict:
    """The best trial's whole training configuration (the recipe with the drawn settings), as a recipe's settings:
    `pgt train --recipe-file` of it trains that configuration again."""
    settings = spec.train_config(best_config, Path(spec.out_dir)).to_dict()
    settings |= {name: spec.recipe[name] for name in TRIAL_FIXED if name in spec.recipe}  # e.g. the winner refits
    return {name: value for name, value in settings.items() if name not in RUN_SETTINGS}


def write_winner_recipe(spec: SweepConfig, result: dict) -> Path:
    """--out/best_recipe.yaml (atomically), with a header that says where it comes from."""
    path = Path(spec.out_dir) / WINNER
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
    header += f"# Train it with: pgt train --recipe-file {path.name} --data DIR --out DIR\n"
    body = yaml.safe_dump(winner_recipe(spec, result["best_config"]), sort_keys=False)
    return write_file_atomically(path, lambda tmp: Path(tmp).write_text(header + body, encoding="utf-8"))


def headline_metrics(metrics: dict) -> dict:
    """A split's overall metrics, protocol and strict, without the in/outside-history breakdowns."""
    strict = {k: v for k, v in metrics["strict"].items() if not isinstance(v, dict)}
    return {k: v for k, v in metrics.items() if not isinstance(v, dict)} | {"strict": strict,
                                                                           "new_place": metrics["new_place"]}


def _best_seen(result, metric: str) -> float | None:
    frame = result.metrics_dataframe
    if frame is None or metric not in frame:
        return None
    return float(frame[metric].max())


def _trial_run_id(trial_dir: Path) -> str | None:
    record = trial_dir / "mlflow_run.json"
    return json.loads(record.read_text())["run_id"] if record.is_file() else None


# ---------------------------------------------------------------------------------------------
# MLflow: the parent run, the plot, the best model


def _parent_run(spec: SweepConfig, tracking, out: Path, resume: bool):
    if tracking is None:
        return None

    saved = out / "sweep.json"
    if resume and saved.is_file():
        previous = json.loads(saved.read_text()).get("tracking")
        if previous and previous["tracking_uri"] == tracking.tracking_uri and reopen_run(tracking.tracking_uri,
                                                                                        previous["run_id"]):
            return dataclasses.replace(tracking, run_id=previous["run_id"])
    params = {k: v for k, v in spec.to_dict().items() if k != "space"} | {"space": spec.space.to_dict()}
    run_id = start_run(tracking, params, run_name=f"sweep-{out.name}",
                       tags={"pgt.kind": "sweep", **source_tags(tracking.source), **tracking.tags})
    log_datasets(tracking.tracking_uri, run_id, Path(spec.data_dir))
    return dataclasses.replace(tracking, run_id=run_id)


def _log_sweep(spec: SweepConfig, tracking, result: dict, register: str | None, test: dict | None) -> dict:
    """Parent run: best config, the final run's test metrics (`test`, as that run scored its best checkpoint: test
    is not scored again), the trials plot, tune.json, the final run's best checkpoint as a model; registered under
    the champion rule when asked. Without a final run (`test` None): no test metrics and no model."""

    import mlflow
    from mlflow.entities import Metric, Param

    client = mlflow_client(tracking.tracking_uri)
    now = int(time.time() * 1000)
    metrics = (metrics_of("best_test", test) if test else {}) | {"best_validation_acc_at_1": result["best_validation_acc@1"],
                                               "best_validation_strict_acc_at_1": result["best_validation_strict_acc@1"],
                                               "trials_finished": sum(r["status"] == "finished" for r in result["trials"]),
                                               "trials": len(result["trials"])}
    with uninterrupted():
        client.log_batch(tracking.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                         params=[Param(f"best.{k}", str(v)) for k, v in result["best_config"].items()])
    out = Path(spec.out_dir)
    plot = plot_trials(result["trials"], out / "trials.png", spec.space, spec.objective)
    client.log_artifact(tracking.run_id, str(plot))
    write_json_atomically(out / "tune.json", result, indent=2, default=float)
    client.log_artifact(tracking.run_id, str(out / "tune.json"))
    client.log_artifact(tracking.run_id, result["best_recipe"])
    logged = {"tracking_uri": tracking.tracking_uri, "run_id": tracking.run_id}
    if test is None:
        return logged
    use_tracking_uri(tracking.tracking_uri)
    with mlflow.start_run(run_id=tracking.run_id):
        info = log_pytorch_model(Path(result["best_checkpoint"]), Path(spec.data_dir))
    logged["model_uri"] = info.model_uri
    if register:  # on the evidence: the confirmed winner's mean over fresh seeds, else the final run's validation
        logged["registered"] = register_model(tracking.tracking_uri, register, info.model_uri, tracking.run_id,
                                              Evidence(**result["evidence"]))
    return logged


def _close_trial_runs(tracking, out: Path) -> None:
    """Child runs of trials that ASHA stopped (or that died) stay RUNNING in MLflow: mark them KILLED."""
    client = mlflow_client(tracking.tracking_uri)
    for record in (out / "trials").glob("*/mlflow_run.json"):
        run_id = json.loads(record.read_text())["run_id"]
        if client.get_run(run_id).info.status == "RUNNING":
            terminate_run(tracking.tracking_uri, run_id, "KILLED")


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

"""`pgt tune`: a Ray Tune sweep over the PGT's hyper-parameters, on a local Ray or a Ray cluster.

Each trial runs the same training (`pgt.training.run.run_training`): in the trial's process when it has
one worker, or as a TorchTrainer inside the trial with W > 1 workers, reporting to Tune through
`TuneReportCallback` (the pattern Ray Train V2 documents for Train with Tune). ASHA stops bad trials
early; Optuna's TPE proposes configurations (random search on request). MLflow gets a parent run per
sweep and a child run per trial; the winner's final run (a child run too) scores test once and logs its model,
which the run layer registers under the champion rule on the sweep's evidence. `DIR/tune.json` holds the best
config and a row per trial.

This module is the driver; what runs inside a trial is tune/trial.py, the sweep's folder and its record of each
trial tune/records.py, and the table, finalists and winner tune/results.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from infra.errors import SettingsError
from infra.output import output_lock, write_json_atomically
from infra.process import interruptible, uninterrupted
from infra.ray_session import cluster_nodes, prepare_ray_env, ray_session
from infra.storage import Storage, is_uri, open_storage
from pgt.config import selection_score
from pgt.data.fetch import local_data
from pgt.tracking.lineage import source_tags, split_digests
from pgt.tracking.registry import Evidence
from pgt.tracking.runs import OUT_DIR_TAG, end_run, metrics_of, open_run, system_metrics, terminate_run
from pgt.tracking.store import check_tracking_reaches, mlflow_client
from pgt.training.ray_train import RESULT_KEY
from pgt.training.run import TrackedRun, open_data, register
from tune.config import SweepConfig
from tune.records import (
    BASE,
    CONFIRMATION,
    EXPERIMENT_NAME,
    FINAL,
    WINNER,
    make_trial_events,
    trial_dirname,
    trial_ended,
)
from tune.results import (
    finalist_candidates,
    headline_metrics,
    plot_trials,
    seeds_of,
    summarise,
    sweep_evidence,
    winner_recipe,
    winner_recipe_text,
)
from tune.trial import finalist_folder, run_final, run_finalist, run_trial


def stage_tuner(name: str, trainable, spec: SweepConfig, tracking, resume: bool, param_space: dict):
    """The Tune experiment of a stage after the search (DIR/ray/<name>): its trials with the search's resources and
    failure policy, as many at once as the search's, restored where an interrupted sweep resumes."""
    from ray import tune

    trainable = tune.with_resources(tune.with_parameters(trainable, sweep=spec.to_dict(),
                                                         tracking=tracking.to_dict() if tracking else None),
                                    _trial_resources(spec))
    restored = restored_tuner(spec, name, trainable, resume)
    if restored is not None:
        return restored
    return tune.Tuner(trainable, param_space=param_space,
                      tune_config=tune.TuneConfig(max_concurrent_trials=spec.max_concurrent,
                                                  reuse_actors=spec.reuse_actors),
                      run_config=tune.RunConfig(name=name, verbose=1, **experiment_storage(spec),
                                                failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                                                checkpoint_config=tune.CheckpointConfig(num_to_keep=1)))


def experiment_storage(spec: SweepConfig) -> dict:
    """RunConfig's storage_path and storage_filesystem: the sweep's ray/ folder, local or on object storage (where
    every trial's checkpoints go from its own node)."""
    out = open_storage(spec.out_dir)
    return {"storage_path": out.join("ray"), "storage_filesystem": None if out.local is not None else out.filesystem}


def restored_tuner(spec: SweepConfig, name: str, trainable, resume: bool):
    """The Tune experiment `name` of an interrupted sweep, restored from its storage (any machine may resume it);
    None when it is not resuming or the experiment never started."""
    from ray import tune

    storage = experiment_storage(spec)
    experiment = f"{storage['storage_path']}/{name}"
    if not resume or not tune.Tuner.can_restore(experiment, storage_filesystem=storage["storage_filesystem"]):
        return None
    return tune.Tuner.restore(experiment, trainable, resume_unfinished=True, resume_errored=True,
                              storage_filesystem=storage["storage_filesystem"])


def train_final(spec: SweepConfig, recipe: dict, tracking, resume: bool) -> dict:
    """The final run of the winner's recipe (its settings, as best_recipe.yaml holds them) as a Tune experiment of
    one trial (the search's resources; resumable). Returns its result (metrics.json's content, with its MLflow run),
    as its trial reported it; RuntimeError when it did not finish."""

    out = open_storage(spec.out_dir)
    grid = stage_tuner(FINAL, run_final, spec, tracking, resume, {"recipe": recipe}).fit()
    done = [r.metrics[RESULT_KEY] for r in grid if r.error is None and r.metrics and RESULT_KEY in r.metrics]
    if not done:
        errors = [str(r.error).splitlines()[0] for r in grid if r.error]
        raise RuntimeError(f"{out.uri_of(FINAL)}: the winner's final run did not finish"
                           + (f" ({errors[0]})" if errors else f"; resume it with `pgt tune --resume {out.uri}`"))
    return json.loads(done[0])


# ---------------------------------------------------------------------------------------------
# the sweep (the driver)


def run_sweep(spec: SweepConfig, tracking=None, address: str | None = None, resume: bool = False,
              register: str | None = None) -> dict:
    """Run (or resume) a sweep and return tune.json's content. `tracking` is a TrackingConfig or None. One sweep
    writes a folder at a time: a second one is refused, naming the first's process."""
    if register and not spec.final:
        raise SettingsError(f"--register {register} registers the sweep's final run, and --no-final skips it: drop "
                            "one of them")
    out = open_storage(spec.out_dir)
    if out.local is None:  # it answers, and these credentials may list it, before any run or folder
        out.check()
    # before any run, folder or Ray starts: an empty split would fail every trial max_failures + 1 times
    data = open_data(spec.data_dir)
    spec = dataclasses.replace(spec, out_dir=out.uri, data_dir=data.source)
    # SIGTERM as run_training takes it; one writer of a local folder (object storage has no lock: one sweep per URI
    # is the user's to keep)
    with interruptible(), output_lock(out.local, command="pgt tune") if out.local else contextlib.nullcontext():
        return _run_sweep(spec, tracking, address, resume, register)


def _run_sweep(spec: SweepConfig, tracking, address: str | None, resume: bool, register: str | None) -> dict:
    prepare_ray_env(address)  # before the first import of ray
    # Tune's own per-trial logs (result.json, progress.csv, params, TensorBoard events) are read by nothing here
    # (each trial's records and MLflow are the sweep's), yet Tune uploads every one of them again at each snapshot
    # of the experiment, which one checkpoint kept per trial forces at every reported checkpoint: on object storage
    # most of a sweep's requests. $TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=0 brings them back.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import ray
    from ray import tune

    # before the sweep's run or folder: every trial on the cluster must reach its folder, data and tracking
    nodes = cluster_nodes(address, out=spec.out_dir, data=spec.data_dir)
    if tracking:
        check_tracking_reaches(tracking.tracking_uri, nodes)

    from tune.scheduler import FinishingASHA

    out = open_storage(spec.out_dir)
    if not resume and out.exists("sweep.json"):
        raise SettingsError(f"{out.uri} holds a sweep already; resume it with --resume {out.uri}, or choose another "
                            "--out")
    tracking = _parent_run(spec, tracking, out, resume)
    out.write_json({"sweep": spec.to_dict(), "tracking": tracking.to_dict() if tracking else None,
                    "register": register}, "sweep.json", indent=2)
    status = "FAILED"
    try:  # the parent run samples the driver's machine (CPU, memory, GPU) like every training run
        with system_metrics(tracking), ray_session(address):
            trainable = tune.with_parameters(run_trial, sweep=spec.to_dict(),
                                             tracking=tracking.to_dict() if tracking else None)
            trainable = tune.with_resources(trainable, _trial_resources(spec))
            tuner = restored_tuner(spec, EXPERIMENT_NAME, trainable, resume)
            if tuner is None:
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
                    run_config=tune.RunConfig(name=EXPERIMENT_NAME, verbose=1, **experiment_storage(spec),
                                              failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                                              checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                                              callbacks=[make_trial_events(out, spec.metric)]),
                )
            began = time.monotonic()
            grid = tuner.fit()
            nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
            out_of_time = spec.time_budget_s is not None and time.monotonic() - began >= 0.95 * spec.time_budget_s
            unfinished = [t for t in grid._experiment_analysis.trials if not trial_ended(out, t)]
            if not out_of_time and (unfinished or len(grid) < spec.trials):
                status = "KILLED"
                raise SweepInterrupted(f"{out.uri}: sweep interrupted with {len(grid) - len(unfinished)} of "
                                       f"{spec.trials} trials done; resume it with `pgt tune --resume {out.uri}`")
            result = summarise(spec, grid, nodes, out_of_time)
            result["search_wall_s"] = round(time.monotonic() - began, 1)
            if spec.finalists:
                began = time.monotonic()
                result["confirmation"] = confirm_finalists(spec, result, tracking, resume)
                result["confirmation"]["wall_s"] = round(time.monotonic() - began, 1)
                if result["confirmation"]["unfinished"]:
                    status = "KILLED"
                    raise SweepInterrupted(f"{out.uri}: confirmation interrupted with finalists "
                                           f"{', '.join(result['confirmation']['unfinished'])} not done; resume it "
                                           f"with `pgt tune --resume {out.uri}`")
            out.write_bytes(winner_recipe_text(spec, result).encode(), WINNER)
            result["best_recipe"] = out.uri_of(WINNER)
            final = None
            if spec.final:
                began = time.monotonic()
                final = train_final(spec, winner_recipe(spec, result["best_config"]), tracking, resume)
                result["final"] = {"wall_s": round(time.monotonic() - began, 1), "seed": spec.seed,
                                   "validation": headline_metrics(final["validation"]),
                                   "test": headline_metrics(final["test"]), "refit": final.get("refit"),
                                   "epochs_run": final["epochs_run"], "mlflow": final.get("mlflow")}
                result["best_checkpoint"] = out.uri_of(FINAL, "best.pt")
                result["best_test"] = headline_metrics(final["test"])
                result["evidence"] = sweep_evidence(spec, result)
            else:  # the search's winner is a recipe file only: no model, and test stays unread
                result["final"] = result["best_checkpoint"] = result["best_test"] = None
        if tracking:
            result["mlflow"] = _log_sweep(spec, tracking, result, register, final)
        out.write_json(result, "tune.json", indent=2, default=float)
        status = "FINISHED"
        return result
    finally:
        if tracking:
            _close_trial_runs(tracking, out)

            end_run(tracking, status)


class SweepInterrupted(RuntimeError):
    """The sweep stopped (Ctrl+C, SIGINT) before every trial ended; its state is saved for --resume."""


def confirm_finalists(spec: SweepConfig, result: dict, tracking, resume: bool) -> dict:
    """The finalists (finalist_candidates) trained on seeds the search did not use, as a Tune experiment of their
    own (resumable, each finalist a trial with the search's resources); the winner is the best mean validation
    objective over those seeds. Sets result's best_config to the winner's. Returns tune.json's "confirmation"."""
    from ray import tune

    out = open_storage(spec.out_dir)
    candidates = finalist_candidates(spec, result["trials"])
    groups = spec.confirmation_seeds()
    runs = [{**candidate, "seeds": seeds} for candidate in candidates for seeds in groups]
    stage_tuner(CONFIRMATION, run_finalist, spec, tracking, resume, {"finalist": tune.grid_search(runs)}).fit()
    rows, unfinished = [], []
    for candidate in candidates:
        done = [finalist_folder(out, candidate["name"], seeds).read_json("metrics.json") for seeds in groups]
        if not all(done):
            unfinished.append(candidate["name"])
            continue
        each = [seed for metrics in done for seed in seeds_of(metrics)]
        scores = [selection_score(seed["validation"], spec.objective) for seed in each]
        strict = [seed["validation"]["strict"]["acc@1"] for seed in each]
        rows.append({**candidate, "seeds": [seed["seed"] for seed in each], "validation_scores": scores,
                     "validation_strict_acc@1": strict, "mean_validation_strict_acc@1": sum(strict) / len(strict),
                     "mean": sum(scores) / len(scores),
                     "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                     "best_epochs": [seed["best_epoch"] for seed in each],
                     "train_seconds": sum(metrics["train_seconds"] for metrics in done)})
    # best first; the base recipe wins ties: a configuration must beat where the sweep started, not equal it
    rows.sort(key=lambda r: (r["mean"], r["name"] == BASE), reverse=True)
    confirmation = {"objective": spec.objective, "seeds_per_finalist": spec.confirm_seeds,
                    "finalists": rows, "unfinished": unfinished}
    if rows and not unfinished:
        confirmation["winner"] = rows[0]["name"]
        result["best_config"] = rows[0]["config"]
    return confirmation


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


# ---------------------------------------------------------------------------------------------
# MLflow: the parent run, the best model


def _parent_run(spec: SweepConfig, tracking, out: Storage, resume: bool):
    """The sweep's MLflow run: the one sweep.json records when resuming (reopened), else a new one."""
    if tracking is None:
        return None
    previous = (out.read_json("sweep.json") or {}).get("tracking") if resume else None
    params = {k: v for k, v in spec.to_dict().items() if k != "space"} | {"space": spec.space.to_dict()}
    name = out.path.rstrip("/").rpartition("/")[2]
    data = local_data(spec.data_dir)
    tracking = dataclasses.replace(tracking, split_digests=split_digests(data))  # hashed here once for every trial
    return open_run(tracking, previous, resume, params, f"sweep-{name}",
                    {"pgt.kind": "sweep", OUT_DIR_TAG: out.uri, **source_tags(tracking.source), **tracking.tags},
                    data, spec.data_dir if is_uri(spec.data_dir) else None)


def _log_sweep(spec: SweepConfig, tracking, result: dict, name: str | None, final: dict | None) -> dict:
    """Parent run: best config, the final run's test metrics (as that run scored its best checkpoint: test is not
    scored again), the trials plot, tune.json and the winner's recipe. The model is the final run's, logged to its own
    child run; registered under the champion rule when asked (`name`), on the sweep's evidence. Without a final run:
    no test metrics and no model."""
    from mlflow.entities import Metric, Param

    test = final["test"] if final else None

    client = mlflow_client(tracking.tracking_uri)
    now = int(time.time() * 1000)
    metrics = (metrics_of("best_test", test) if test else {}) | {"best_validation_acc_at_1": result["best_validation_acc@1"],
                                               "best_validation_strict_acc_at_1": result["best_validation_strict_acc@1"],
                                               "trials_finished": sum(r["status"] == "finished" for r in result["trials"]),
                                               "trials": len(result["trials"])}
    with uninterrupted():
        client.log_batch(tracking.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                         params=[Param(f"best.{k}", str(v)) for k, v in result["best_config"].items()])
    out = open_storage(spec.out_dir)
    with tempfile.TemporaryDirectory(prefix="pgt-sweep-") as scratch:  # the files, local for MLflow's client
        folder = out.local or Path(scratch)
        plot = plot_trials(result["trials"], folder / "trials.png", spec.space, spec.objective)
        record = write_json_atomically(Path(scratch) / "tune.json", result, indent=2, default=float)  # the sweep's
        if out.local is None:  # own tune.json is written once, by the driver, with this run's block added
            (folder / WINNER).write_bytes(out.read_bytes(WINNER))
            out.upload(plot, "trials.png")
        for artifact in (plot, record, folder / WINNER):
            client.log_artifact(tracking.run_id, str(artifact))
    logged = {"tracking_uri": tracking.tracking_uri, "run_id": tracking.run_id}
    if final is None:
        return logged
    model = TrackedRun(**final["mlflow"])  # the final run's
    logged["model_uri"] = model.model_uri
    if name:  # on the evidence: the confirmed winner's mean over fresh seeds, else the final run's validation
        logged["registered"] = register(model, name, Evidence(**result["evidence"]))
    return logged


def _close_trial_runs(tracking, out: Storage) -> None:
    """Child runs of trials that ASHA stopped (or that died) stay RUNNING in MLflow: mark them KILLED."""
    client = mlflow_client(tracking.tracking_uri)
    for record in out.files("trials"):
        if record.endswith("/mlflow_run.json"):
            run_id = (out.read_json(*record.split("/")) or {})["run_id"]
            if client.get_run(run_id).info.status == "RUNNING":
                terminate_run(tracking.tracking_uri, run_id, "KILLED")

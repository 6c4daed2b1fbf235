"""The Prefect flow `preprocess-and-train`: GPS points or staypoints -> sequences -> Ray Train or Ray Tune
-> MLflow -> the Model Registry. The flow only wires tasks; every step is a function of the packages.

    prefect deployment run preprocess-and-train/demo      (see prefect.yaml)
"""

from __future__ import annotations

from pathlib import Path  # noqa: F401 - Prefect resolves the flow's string annotations at run time

from prefect import flow, get_run_logger

from flows import tasks
from flows.settings import FlowSettings, InputFormat, Recipe
from preprocessing.config import SynthConfig


@flow(name="preprocess-and-train", log_prints=True)
def preprocess_and_train(
    *,
    input_path: str | None = None,
    input_format: InputFormat = "positionfixes",
    config_file: str | None = None,
    workers: int = 2,
    gpu: bool | None = None,
    tune: bool = False,
    trials: int | None = None,
    epochs: int | None = None,
    tracking_uri: str | None = None,
    ray_address: str | None = None,
    model_name: str = "pgt",
    state_dir: str | None = None,
    synthetic_users: int = SynthConfig.users,
    synthetic_days: int = SynthConfig.days,
    recipe: Recipe = "paper",
    recipe_file: str | None = None,
) -> dict:
    """Preprocess (reusing cached stages), train or tune, evaluate the logged model, register it.

    input_path None uses the synthetic default (synthetic_users people over synthetic_days days). workers 0 trains
    in the flow's process; N >= 1 under Ray Train. recipe is the training recipe: paper (SPEC §3.8) or tuned (ours
    for GeoLife); recipe_file, a YAML file of training settings (a sweep's winner), replaces it, and sets any
    training setting. tune runs a sweep of `trials` instead of one training run, each trial the recipe with the
    searched settings replaced. epochs and trials left empty take the defaults of TrainConfig (or SweepConfig).
    model_name is the registered model; the alias champion moves to the new version only when its strict
    validation Acc@1 is better. The state folder holds every output."""
    s = FlowSettings.resolve(locals())  # first: the parameters, as the signature defines them
    log = get_run_logger()
    source = s.input_path or tasks.synthetic_input(s.synthetic_file, s.synthetic_users, s.synthetic_days, s.synthetic_seed)
    hashed = tasks.hash_input(source, s.input_format)
    manifest = tasks.cached_sequences(s.sequences_dir, hashed, s.input_format, s.config_file)
    if manifest is None:  # the table of stages `pgt preprocess` runs (preprocessing.pipeline.STEPS)
        key, stage = s.stage_key(hashed), hashed
        for step in tasks.cached_steps():
            stage = tasks.preprocess_stage.with_options(name=step)(step, stage, source, s.input_format, s.config_file,
                                                                   s.engine_config(), s.work_dir, key)
        manifest = tasks.sequences(stage, source, s.input_format, s.config_file, s.engine_config(), s.sequences_dir)
    else:
        log.info(f"sequences reused from {s.sequences_dir} (same input, config and code)")
    if s.tune:
        result = tasks.tune(s.sweep_config(), s.tracking_config(), s.ray_address)
        validation = result["best_validation"]
    else:
        result = tasks.train(s.train_config(), s.launch_config(), s.tracking_config())
        validation = result["validation"]
    logged = result["mlflow"]
    evaluated = tasks.evaluate(logged["model_uri"], s.sequences_dir, s.tracking_uri)
    registered = tasks.register(s.tracking_uri, s.model_name, logged["model_uri"], logged["run_id"],
                                validation["strict"]["acc@1"])
    tasks.publish(s.report(evaluated, validation, logged, registered))
    return {"sequences": str(s.sequences_dir), "manifest_counts": manifest["counts"], "test": evaluated,
            "mlflow": logged, "registered": registered}


if __name__ == "__main__":
    preprocess_and_train()

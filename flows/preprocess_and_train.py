"""The Prefect flow `preprocess-and-train`: GPS points or staypoints -> sequences -> Ray Train or Ray Tune
-> MLflow -> the Model Registry. The flow only wires tasks; every step is a function of the packages.

    prefect deployment run preprocess-and-train/demo      (see prefect.yaml)
"""

from __future__ import annotations

from pathlib import Path  # noqa: F401 - Prefect resolves the flow's string annotations at run time

from prefect import flow, get_run_logger

from flows import tasks
from flows.settings import FlowSettings, InputFormat, Recipe, described, from_setting
from pgt.config import LaunchConfig, TrackingConfig, TrainConfig
from preprocessing.config import SynthConfig
from tune.config import SweepConfig


@flow(name="preprocess-and-train", log_prints=True)
def preprocess_and_train(
    *,
    input_path: str | None = described(None, "GPS points or staypoints: a GeoLife folder, or a Parquet or CSV file. "
                                              "Empty: the synthetic default city."),
    input_format: InputFormat = described("positionfixes", "What input_path holds."),
    config_file: str | None = described(None, "A YAML, JSON or TOML file of PreprocessConfig settings. Empty: the "
                                              "reference protocol."),
    workers: int = from_setting(LaunchConfig, "workers", 2),
    gpu: bool | None = from_setting(LaunchConfig, "gpu"),
    tune: bool = described(False, "A Ray Tune sweep of `trials` trials instead of one training run."),
    trials: int | None = from_setting(SweepConfig, "trials", None, "Empty: the sweep config's default."),
    epochs: int | None = from_setting(TrainConfig, "epochs", None, "Empty: the recipe's, or the sweep's."),
    tracking_uri: str | None = from_setting(TrackingConfig, "tracking_uri"),
    address: str | None = from_setting(LaunchConfig, "address"),
    model_name: str = described("pgt", "The registered model; its alias champion moves to the new version only "
                                       "when its strict validation Acc@1 is better."),
    state_dir: str | None = described(None, "The folder every output goes to. Empty: $PGT_STATE_DIR, else .state."),
    synthetic_users: int = from_setting(SynthConfig, "users"),
    synthetic_days: int = from_setting(SynthConfig, "days"),
    recipe: Recipe = described("paper", "The training recipe: paper (the published settings), tuned (ours for GeoLife) or "
                                        "ensemble (tuned, several networks side by side)."),
    recipe_file: str | None = described(None, "A YAML file of training settings (a sweep's winner) instead of "
                                              "recipe; it sets any training setting."),
) -> dict:
    """Preprocess (reusing cached stages), train or tune, evaluate the logged model, register it.

    Each parameter's description says what it does (the Prefect UI shows it beside the field); those that are
    settings of a config take its help and bounds from there. A sweep's trials each train the recipe with only
    the searched settings replaced."""
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
    if s.tune:  # the sweep's model is its winner's recipe trained, registered on the winner's evidence
        result = tasks.tune(s.sweep_config(), s.tracking_config(), s.address)
        validation = result["final"]["validation"]
    else:
        result = tasks.train(s.train_config(), s.launch_config(), s.tracking_config())
        validation = result["validation"]
    logged = result["mlflow"]
    evaluated = tasks.evaluate(logged["model_uri"], s.sequences_dir, s.tracking_uri)
    registered = tasks.register(s.tracking_uri, s.model_name, logged["model_uri"], logged["run_id"], result["evidence"])
    tasks.publish(s.report(evaluated, validation, logged, registered))
    return {"sequences": str(s.sequences_dir), "manifest_counts": manifest["counts"], "test": evaluated,
            "mlflow": logged, "registered": registered}


if __name__ == "__main__":
    preprocess_and_train()

"""The Prefect flow `preprocess-and-train`: GPS points or staypoints -> sequences -> Ray Train or Ray Tune
-> MLflow -> the Model Registry. The flow only wires tasks; every step is a function of the packages.

    prefect deployment run preprocess-and-train/demo      (see prefect.yaml)
"""

from __future__ import annotations

from prefect import get_run_logger

from flows import tasks
from flows.settings import FlowSettings, PreprocessAndTrainParameters, parameters_flow


@parameters_flow(PreprocessAndTrainParameters, name="preprocess-and-train", log_prints=True)
def preprocess_and_train(parameters: PreprocessAndTrainParameters) -> dict:
    """Preprocess (reusing cached stages), train or tune, evaluate the logged model, register it.

    Each parameter's description says what it does (the Prefect UI shows it beside the field); those that are
    settings of a config take its help and bounds from there. A sweep's trials each train the recipe with only
    the searched settings replaced."""
    s = FlowSettings.resolve(parameters)  # first: every parameter checked before anything runs
    log = get_run_logger()
    if s.input_uri:  # the stages read local files: a copy of what is on object storage
        source = tasks.fetch_input(s.input_uri, s.input_format, s.inputs_dir)
    else:
        source = s.input_path or tasks.synthetic_input(s.synthetic_file, s.synthetic_users, s.synthetic_days,
                                                       s.synthetic_seed)
    hashed = tasks.hash_input(source, s.input_format)
    manifest = tasks.cached_sequences(s.sequences_dir, hashed, s.input_format, s.config_file)
    if manifest is None:  # the table of stages `pgt preprocess` runs (preprocessing.pipeline.STEPS)
        key, stage = s.stage_key(hashed), hashed
        for step in tasks.cached_steps():
            stage = tasks.preprocess_stage.with_options(name=step)(step, stage, source, s.input_format, s.config_file,
                                                                   s.engine_config, s.work_dir, key, s.input_uri)
        manifest = tasks.sequences(stage, source, s.input_format, s.config_file, s.engine_config, s.sequences_dir,
                                   s.input_uri)
    else:
        log.info(f"sequences reused from {s.sequences_dir} (same input, config and code)")
    if s.cluster:  # a Ray Job there, reading the sequences from storage and keeping its run there
        tasks.publish_sequences(s.sequences_dir, s.kept_sequences)
        result = tasks.ray_job(s.cluster, s.cluster_job)
    elif s.tune:
        result = tasks.tune(s.sweep_config, s.tracking_config, s.address)
    else:
        result = tasks.train(s.train_config, s.launch_config, s.tracking_config)
    if s.tune:  # the sweep's model is its winner's recipe trained, registered on the winner's evidence
        validation, model = result["final"]["validation"], result["final"]["mlflow"]  # the final run's model
    else:
        validation, model = result["validation"], result["mlflow"]
    logged = result["mlflow"]
    evaluated = tasks.evaluate(model["model_uri"], s.sequences_dir, s.tracking_uri)
    registered = tasks.register(s.tracking_uri, s.model_name, model["model_uri"], model["run_id"], result["evidence"])
    tasks.publish(s.report(evaluated, validation, logged, registered))
    return {"sequences": str(s.sequences_dir), "manifest_counts": manifest["counts"], "test": evaluated,
            "mlflow": logged, "registered": registered}


if __name__ == "__main__":
    preprocess_and_train()

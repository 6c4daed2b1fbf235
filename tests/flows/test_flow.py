"""The flow under Prefect's test harness (a temporary Prefect server), on the synthetic default."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prefect.testing.utilities import prefect_test_harness

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def harness():
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    from flows.preprocess_and_train import preprocess_and_train

    state = tmp_path_factory.mktemp("flow_state")
    params = dict(workers=0, epochs=2, state_dir=str(state), synthetic_users=8, synthetic_days=70, model_name="flowtest",
                  tracking_uri=f"sqlite:///{state / 'mlflow.db'}")
    return state, params, preprocess_and_train(**params)


def test_flow_trains_evaluates_registers_and_publishes(first_run):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client

    state, params, result = first_run
    assert result["manifest_counts"]["samples"]["train"] > 100
    assert result["test"]["n"] == result["manifest_counts"]["samples"]["test"]
    # the model loaded back from MLflow scores the test split exactly as the training run logged it
    client = MlflowClient(params["tracking_uri"])
    logged = client.get_run(result["mlflow"]["run_id"]).data.metrics
    assert logged["test_acc_at_1"] == pytest.approx(result["test"]["acc@1"])
    assert result["registered"]["version"] == 1 and result["registered"]["promoted"]  # the first version is champion
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as prefect:  # this run's metrics table, whatever other tests published since
        published = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["pgt-metrics"])))
    mine = [a for a in published if result["mlflow"]["run_id"] in a.data]
    assert len(mine) == 1
    artifact = mine[0]
    # strict first, then the protocol's, and the new-place detection
    assert artifact.data.index("| test, strict |") < artifact.data.index("| test, protocol |")
    assert f"| test, strict | {result['test']['strict']['acc@1']:.2f} |" in artifact.data
    assert "new places:" in artifact.data
    assert logged["test_strict_acc_at_1"] == pytest.approx(result["test"]["strict"]["acc@1"])


def test_rerun_reuses_the_cached_sequences(first_run):
    from mlflow.tracking import MlflowClient

    from flows.preprocess_and_train import preprocess_and_train

    state, params, first = first_run
    manifest = state / "sequences" / "synthetic" / "manifest.json"
    before = manifest.stat().st_mtime_ns
    second = preprocess_and_train(**params, recipe="tuned")
    assert manifest.stat().st_mtime_ns == before  # not rewritten
    assert second["manifest_counts"] == first["manifest_counts"]
    assert second["registered"]["version"] == 2  # a new version; champion only if it beats the champion beyond seed noise
    logged = MlflowClient(params["tracking_uri"]).get_run(second["mlflow"]["run_id"]).data.params
    assert (logged["unseen_slots"], logged["simulate_unseen"], logged["select_on"]) == ("True", "True", "strict_acc@1")


def test_bad_config_fails_the_flow_with_its_message(tmp_path):
    """The run ends Failed with the error's one line as its state's message and its log's, no traceback of where it
    was found; a caller in Python gets the project's error raised."""
    from flows.preprocess_and_train import preprocess_and_train
    from infra.errors import InputError

    bad = tmp_path / "bad.yaml"
    bad.write_text("location_epsilon_m: -5\n")
    given = dict(workers=0, epochs=1, state_dir=str(tmp_path / "state"), synthetic_users=3, synthetic_days=20,
                 config_file=str(bad))
    records: list[logging.LogRecord] = []
    flow_log = logging.getLogger("prefect.flow_runs")  # the flow's own lines (Prefect's loggers do not propagate)
    catch = logging.Handler(logging.ERROR)
    catch.emit = records.append
    flow_log.addHandler(catch)
    try:
        state = preprocess_and_train(**given, return_state=True)
    finally:
        flow_log.removeHandler(catch)
    assert state.is_failed()
    error = state.result(raise_on_failure=False)
    assert isinstance(error, InputError) and state.message == str(error)
    assert str(bad) in state.message and "location_epsilon_m must be in (0.0, inf), got -5" in state.message
    assert [r.getMessage() for r in records] == [f"error: {error}"] and not any(r.exc_info for r in records)
    with pytest.raises(InputError, match="location_epsilon_m must be in"):
        preprocess_and_train(**given)
    assert not list((tmp_path / "state").glob("stages/*/stage.json"))  # it failed before any stage ran


def test_rerun_continues_from_the_finished_stages_of_an_input_on_object_storage(tmp_path, s3_server, monkeypatch):
    """input_path on object storage (a real S3-compatible server): the flow copies it to its state folder once per
    content and names the URI in the manifest. With the final output gone (a failure while writing it leaves none:
    it is written atomically), a rerun recomputes only the sequences: staypoints (read, validated by partition) and
    locations come from their cached stage folders, and the input's copy is the same one."""
    import json
    import shutil

    import polars as pl

    from flows.preprocess_and_train import preprocess_and_train
    from infra.storage import open_storage
    from preprocessing.config import SynthConfig
    from preprocessing.synthetic import generate_positionfixes
    from tests.infra.test_storage import bucket

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    points = tmp_path / "points.parquet"
    generate_positionfixes(SynthConfig(users=6, days=70, seed=5)).write_parquet(points)
    stored = open_storage(bucket(s3_server, "flow-input"))
    stored.upload(points, "points.parquet")
    params = dict(input_path=stored.uri_of("points.parquet"), workers=0, epochs=1, state_dir=str(tmp_path / "state"),
                  model_name="rerun", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    first = preprocess_and_train(**params)
    stages = sorted((tmp_path / "state" / "stages").glob("*/stage.json"))
    assert [p.parent.name.split("-")[0] for p in stages] == ["locations", "staypoints"]
    stamps = [p.stat().st_mtime_ns for p in stages]
    sequences = tmp_path / "state" / "sequences" / "points"
    assert json.loads((sequences / "manifest.json").read_text())["input"] == "s3://flow-input/run/points.parquet"
    copies = sorted((tmp_path / "state" / "inputs").iterdir())
    assert [(c / "points.parquet").read_bytes() == points.read_bytes() for c in copies] == [True]
    shutil.rmtree(sequences)
    second = preprocess_and_train(**params)
    assert [p.stat().st_mtime_ns for p in stages] == stamps  # not recomputed
    assert second["manifest_counts"] == first["manifest_counts"]
    assert (sequences / "manifest.json").is_file() and pl.read_parquet(sequences / "train.parquet").height > 0
    assert sorted((tmp_path / "state" / "inputs").iterdir()) == copies  # the same content: the same copy


def test_flow_preprocesses_on_the_ray_cluster_at_address(first_run, tmp_path, monkeypatch):
    """address set: the flow's preprocessing runs as Ray tasks on that cluster (a head and a worker node
    on loopback), and writes the sequences of the local engine, byte for byte."""
    import hashlib
    import json

    from flows.preprocess_and_train import preprocess_and_train
    from tests.conftest import ray_cluster

    state, params, _ = first_run
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)  # a local Ray's switch, from earlier tests
    with ray_cluster('{"node_a": 1}', '{"node_b": 1}') as (address, _env):
        preprocess_and_train(**{**params, "state_dir": str(tmp_path / "state"), "model_name": "flowray",
                                "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "epochs": 1,
                                "address": address})
    local, remote = state / "sequences" / "synthetic", tmp_path / "state" / "sequences" / "synthetic"
    assert json.loads((remote / "manifest.json").read_text())["engine"]["engine"] == "ray"
    for name in ("train.parquet", "validation.parquet", "test.parquet", "locations.parquet", "staypoints.parquet"):
        assert hashlib.sha256((local / name).read_bytes()).digest() == hashlib.sha256((remote / name).read_bytes()).digest()


def test_flow_and_command_run_the_same_stages_and_log_them_all(first_run, tmp_path):
    """The flow runs the table of stages `pgt preprocess` runs (preprocessing.pipeline.STEPS): the same
    sequences, and a manifest whose stage log is complete on both paths (the flow's listed only "write")."""
    import hashlib
    import json

    from preprocessing.pipeline import STEPS, preprocess

    state, params, result = first_run
    flow_out = state / "sequences" / "synthetic"
    source = next((state / "data").glob("synthetic-*.parquet"))
    preprocess(source, "positionfixes", tmp_path / "cli", progress=False)
    names = {}
    for label, folder in (("flow", flow_out), ("cli", tmp_path / "cli")):
        manifest = json.loads((folder / "manifest.json").read_text())
        names[label] = [stage["name"].split(" (")[0] for stage in manifest["stages"]]
        assert manifest["counts"] == result["manifest_counts"]
    assert names["flow"] == names["cli"] == ["hash input", "read, validate, staypoints", "user filter", "locations",
                                             "merge", "split and samples", "write"]
    assert [step.name for step in STEPS] == ["staypoints", "locations", "sequences"]
    for name in ("train.parquet", "test.parquet", "places.parquet"):
        digests = {hashlib.sha256((folder / name).read_bytes()).hexdigest() for folder in (flow_out, tmp_path / "cli")}
        assert len(digests) == 1, name


def test_the_flow_and_pgt_train_leave_the_same_record(first_run, tmp_path):
    """`pgt train` with the settings the flow trained (as a recipe file, with its seed and threads) on the flow's
    sequences, registered: the same params, datasets, metrics, artifacts and model in MLflow, and a version with the
    same evidence tags on the same data."""
    import json

    import yaml
    from mlflow.tracking import MlflowClient

    from pgt.recipes import RECIPE_FREE
    from tests.in_process import pgt_here
    from tests.records import run_record, version_record

    state, params, result = first_run
    client = MlflowClient(params["tracking_uri"])
    flow_run = client.get_run(result["mlflow"]["run_id"])
    config = json.loads((Path(flow_run.data.tags["pgt.out_dir"]) / "metrics.json").read_text())["config"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({k: v for k, v in config.items() if k not in (*RECIPE_FREE, "seed", "threads")}))
    experiment = client.get_experiment(flow_run.info.experiment_id).name
    trained = pgt_here("train", "--data", config["data_dir"], "--out", tmp_path / "trained", "--recipe-file", recipe,
                       "--seed", config["seed"], "--threads", config["threads"], "--tracking-uri", params["tracking_uri"],
                       "--experiment", experiment, "--register", "trained")
    assert trained.returncode == 0, trained.stderr[-3000:]
    train_run = json.loads((tmp_path / "trained" / "metrics.json").read_text())["mlflow"]["run_id"]
    record = run_record(client, flow_run.info.run_id)
    assert record["model"] is not None and "metrics.json" in record["artifacts"] and record["epochs"] == 2
    assert any(path.startswith("plots/") for path in record["artifacts"]) and len(record["datasets"]) == 3
    assert run_record(client, train_run) == record
    assert version_record(client, "trained", "1") == version_record(client, params["model_name"], "1")


def test_the_sweep_branch_tunes_registers_its_best_trial_and_a_rerun_resumes_it(tmp_path):
    """preprocess_and_train(tune=True): a 2-trial sweep around the recipe, its best trial evaluated and registered
    with the recipe and the sweep's run as tags; run again, the flow resumes that sweep (its out folder holds
    sweep.json) instead of training the trials again, and registers a second version."""
    import json

    from mlflow.tracking import MlflowClient

    from flows.preprocess_and_train import preprocess_and_train

    state = tmp_path / "state"
    params = dict(tune=True, trials=2, epochs=2, finalists=1, confirm_seeds=2, state_dir=str(state), synthetic_users=8,
                  synthetic_days=70, model_name="sweepflow", tracking_uri=f"sqlite:///{state / 'mlflow.db'}")
    first = preprocess_and_train(**params)
    sweep = state / "sweeps" / "synthetic"
    trials = json.loads((sweep / "tune.json").read_text())["trials"]
    assert len(trials) == 2 and all({"d_model", "nhead", "dropout"} <= set(t["config"]) for t in trials)
    assert (sweep / "best_recipe.yaml").is_file()
    assert first["registered"]["version"] == 1 and first["registered"]["promoted"]
    assert first["test"]["n"] == first["manifest_counts"]["samples"]["test"]
    client = MlflowClient(params["tracking_uri"])
    version = client.get_model_version("sweepflow", "1")
    assert version.tags["recipe"] == "paper" and version.tags["sweep_run_id"] == first["mlflow"]["run_id"]
    # the same registry door as `pgt train --register`: the confirmed winner's evidence on its fresh seeds
    result = json.loads((sweep / "tune.json").read_text())
    assert json.loads(version.tags["pgt.evidence_seeds"]) == result["evidence"]["seeds"] == [1, 2]
    assert [f["name"] == "base" for f in result["confirmation"]["finalists"]].count(False) <= 1  # finalists=1
    assert json.loads(version.tags["pgt.evidence_scores"]) == pytest.approx(result["evidence"]["scores"], abs=1e-4)
    assert version.tags["champion_decision"] == "promoted" and version.tags["pgt.data_digest"] != "unknown"
    trained = {p.relative_to(sweep): p.stat().st_mtime_ns
               for p in [*(sweep / "trials").glob("*/metrics.json"), *(sweep / "finalists").glob("*/*/metrics.json"),
                         sweep / "final" / "metrics.json"]}
    assert len(trained) >= 3

    second = preprocess_and_train(**params)
    again = json.loads((sweep / "tune.json").read_text())["trials"]
    assert {t["trial_id"] for t in again} == {t["trial_id"] for t in trials}  # the same sweep, resumed
    for path, mtime in trained.items():  # no trial, finalist or final run trained again
        assert (sweep / path).stat().st_mtime_ns == mtime, path
    # the same model on the same evidence: registered, but the champion stays (a tie never promotes)
    assert second["registered"]["version"] == 2 and not second["registered"]["promoted"]

"""MLflow tracking against a real tracking server: what a run logs, the champion rule, evaluate and predict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgt.tracking.lineage import model_version
from pgt.tracking.registry import Evidence, data_digest, register_model
from pgt.tracking.runs import RIVAL_TAG, SCORE_TAG
from tests.in_process import pgt_here

PGT = [sys.executable, "-m", "pgt.cli"]

pytestmark = pytest.mark.slow


def run(*args, **kwargs):
    return subprocess.run([*PGT, *map(str, args)], capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture
def no_pickle(monkeypatch) -> None:
    """Loading a model must not need pickle: MLflow's switch off for the commands the test runs in its own process
    (pgt_here; MLflow reads it at each load)."""
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")


def test_train_says_what_it_registered_and_where_its_runs_are(registered_model, mlflow_server):
    """The run's shared model is `pgt train --register shared` against the server (tests/pgt/conftest.py)."""
    assert "registered shared version 1" in registered_model.stdout and "now champion" in registered_model.stdout
    assert f"{mlflow_server}/#/experiments/" in registered_model.stdout  # the UI's runs
    assert "?workflowType=machine_learning" in registered_model.stdout


def test_run_logs_config_epochs_test_metrics_artifacts_and_model(registered_model, mlflow_server):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    run_id = registered_model.metrics["mlflow"]["run_id"]
    data = client.get_run(run_id).data
    assert data.params["d_model"] == "64" and data.params["model"] == "pgt" and data.params["label_smoothing"] == "0.03"
    assert data.metrics["test_acc_at_1"] == pytest.approx(registered_model.metrics["test"]["acc@1"])
    assert data.metrics["test_in_history_mrr"] == pytest.approx(registered_model.metrics["test"]["in_history"]["mrr"])
    assert data.metrics["test_strict_acc_at_1"] == pytest.approx(registered_model.metrics["test"]["strict"]["acc@1"])
    assert data.metrics["test_new_place_recall"] == pytest.approx(registered_model.metrics["test"]["new_place"]["recall"])
    assert data.params["unseen_slots"] == "True"
    losses = client.get_metric_history(run_id, "train_loss")
    assert [m.step for m in sorted(losses, key=lambda m: m.step)] == [0, 1, 2]
    names = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "plots")}
    assert {"metrics.json", "data", "plots/gate.png", "plots/pointer_attention.png", "plots/position_bias.png",
            "plots/attention_entropy.png"} <= names
    version = client.get_model_version_by_alias("shared", "champion")
    assert version.tags[SCORE_TAG] == repr(registered_model.metrics["validation"]["strict"]["acc@1"])
    assert version.tags[RIVAL_TAG] == "none"


def test_the_run_carries_its_lineage(registered_model, mlflow_server):
    """Datasets (digest, path, rows, preprocessing), the command and commit it ran from, system metrics, and
    the registered version's recipe and commit: what made the model, seen in the MLflow UI."""
    import hashlib

    from mlflow.tracking import MlflowClient

    from pgt.tracking.lineage import git_commit
    from pgt.tracking.store import EXPERIMENT_KIND

    client = MlflowClient(mlflow_server)
    run = client.get_run(registered_model.metrics["mlflow"]["run_id"])
    inputs = {i.tags[0].value: i.dataset for i in run.inputs.dataset_inputs}
    assert sorted(inputs) == ["test", "training", "validation"]
    train = inputs["training"]
    assert train.digest == hashlib.sha256((registered_model.data / "train.parquet").read_bytes()).hexdigest()[:16]
    assert json.loads(train.source)["uri"] == (registered_model.data / "train.parquet").resolve().as_uri()
    profile = json.loads(train.profile)
    manifest = json.loads((registered_model.data / "manifest.json").read_text())
    assert profile["preprocessing"] == manifest["config"] and profile["num_rows"] == manifest["counts"]["samples"]["train"]
    tags = run.data.tags
    assert tags["mlflow.source.name"] == "pgt train" and tags["pgt.recipe"] == "paper"
    assert tags.get("mlflow.source.git.commit") == git_commit()
    assert any(key.startswith("system/cpu_utilization") for key in run.data.metrics)
    assert any(key.startswith("system/system_memory_usage") for key in run.data.metrics)
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND[0]] == EXPERIMENT_KIND[1]  # the UI opens on the runs
    version = client.get_model_version("shared", registered_model.metrics["mlflow"]["registered"]["version"])
    assert version.tags["recipe"] == "paper" and version.tags.get("git_commit") == git_commit()


def test_the_logged_model_holds_no_pickle(registered_model, mlflow_server, tmp_path):
    """models-from-code: the code file, a state_dict read with weights_only=True and the config as JSON."""
    import mlflow
    import torch
    import yaml

    mlflow.set_tracking_uri(mlflow_server)
    local = mlflow.artifacts.download_artifacts(registered_model.metrics["mlflow"]["model_uri"], dst_path=str(tmp_path))
    files = {p.relative_to(local).as_posix() for p in Path(local).rglob("*") if p.is_file()}
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".pth"))], files
    mlmodel = yaml.safe_load((Path(local) / "MLmodel").read_text())
    assert set(mlmodel["flavors"]) == {"python_function"} and "model_code_path" in mlmodel["flavors"]["python_function"]
    assert mlmodel["metadata"]["model_config"]["unseen_slots"] is True
    weights = next(Path(local).rglob("weights.pt"))
    state = torch.load(weights, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())


def test_the_logged_model_is_self_contained(registered_model, mlflow_server):
    """The model carries the training data's location and user tables and its manifest, loaded without pickle."""
    import mlflow.pyfunc
    import polars as pl

    os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "false"
    try:
        mlflow.set_tracking_uri(mlflow_server)
        wrapper = mlflow.pyfunc.load_model("models:/shared@champion").unwrap_python_model()
    finally:
        os.environ.pop("MLFLOW_ALLOW_PICKLE_DESERIALIZATION")
    manifest = json.loads((registered_model.data / "manifest.json").read_text())
    assert wrapper.manifest["config"] == manifest["config"] and wrapper.manifest["vocab"] == manifest["vocab"]
    locations = pl.from_arrow(wrapper.locations)
    assert locations.equals(pl.read_parquet(registered_model.data / "locations.parquet"))
    assert locations.height + 2 == wrapper.packed.cfg.num_locations  # ids 0 and 1 are not places
    assert {"location", "source_location_id", "latitude", "longitude"} <= set(locations.columns)
    assert pl.from_arrow(wrapper.users).height + 1 == wrapper.packed.cfg.num_users


def test_evaluate_champion_equals_logged_test_metrics(registered_model, mlflow_server, no_pickle):
    r = pgt_here("evaluate", "--model", "models:/shared@champion", "--data", registered_model.data, "--tracking-uri",
                 mlflow_server)
    assert r.returncode == 0, r.stderr[-3000:]
    printed = json.loads(r.stdout)
    logged = registered_model.metrics["test"]
    for key in ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1", "n"):
        assert printed[key] == pytest.approx(logged[key], abs=1e-9), key
        assert key == "f1" or printed["strict"][key] == pytest.approx(logged["strict"][key], abs=1e-9), key
    assert printed["new_place"] == pytest.approx(logged["new_place"], abs=1e-9)
    assert printed["in_history"]["n"] + printed["outside_history"]["n"] == printed["n"]


def test_predict_writes_top_k(registered_model, mlflow_server, tmp_path, no_pickle):
    import numpy as np
    import polars as pl

    out = tmp_path / "pred.parquet"
    r = pgt_here("predict", "--model", "models:/shared@champion", "--input", registered_model.data / "test.parquet",
                 "--out", out, "--top-k", "4", "--tracking-uri", mlflow_server)
    assert r.returncode == 0, r.stderr[-3000:]
    # the version that answered, not only the alias: said, and kept in the file's metadata
    assert "models:/shared@champion is models:/shared/1" in r.stdout
    import pyarrow.parquet as pq

    assert pq.read_schema(out).metadata[b"pgt.model_uri"] == b"models:/shared/1"
    pred = pl.read_parquet(out)
    assert pred.height == registered_model.metrics["test"]["n"] and pred.columns == [
        "row", "user", "top_locations", "top_places", "top_probabilities", "new_place_probability", "target",
        "target_place"]
    top = np.stack(pred["top_locations"].to_list())
    probs = np.stack(pred["top_probabilities"].to_list())
    assert top.shape[1] == 4 and (top != 0).all()  # never the padding id
    assert (np.diff(probs, axis=1) <= 1e-7).all() and (probs.sum(axis=1) <= 1 + 1e-5).all() and (probs > 0).all()
    # the exact place first: a known id, or a slot's place (top_places) for a place unseen in train
    target, target_place = pred["target"].to_numpy(), pred["target_place"].to_numpy()
    first_place = pred["top_places"].list.first().fill_null(-1).to_numpy()
    exact = ((top[:, 0] == target) & (target > 1)) | (first_place == target_place)
    assert 100 * exact.mean() == pytest.approx(registered_model.metrics["test"]["strict"]["acc@1"], abs=100 / pred.height + 1e-9)
    assert ((first_place >= 0) <= (top[:, 0] == 1)).all()  # a place is named only for an unseen prediction
    assert pred["new_place_probability"].is_between(0, 1).all()


def test_predict_rejects_a_file_without_history_columns(registered_model, mlflow_server, tmp_path):
    import polars as pl

    bad = tmp_path / "bad.parquet"
    pl.DataFrame({"user": [1], "locations": [[2, 3]]}).write_parquet(bad)
    r = pgt_here("predict", "--model", "models:/shared@champion", "--input", bad, "--out", tmp_path / "o.parquet",
                 "--tracking-uri", mlflow_server)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert str(bad) in r.stderr and "missing column(s) time_slots, weekdays, recency, durations" in r.stderr


def test_the_champion_moves_only_on_evidence_that_beats_seed_noise(registered_model, mlflow_server):
    """The first version is promoted; a tie and a one-seed gain of 0.8 points stay within seed noise (kept); a much
    higher score measured on other data is not compared (kept); three seeds 3 points better are promoted. Every
    version carries its evidence and the decision as tags, as the MLflow UI's version page shows them."""
    import json

    from mlflow.tracking import MlflowClient

    uri, run_id = registered_model.metrics["mlflow"]["model_uri"], registered_model.metrics["mlflow"]["run_id"]
    digest = data_digest(registered_model.data)
    before = os.environ.get("MLFLOW_TRACKING_URI")
    first = register_model(mlflow_server, "rule", uri, run_id, Evidence([0], [50.0], digest))
    # this process's later defaults are not changed: MLflow's set_tracking_uri would write $MLFLOW_TRACKING_URI
    assert os.environ.get("MLFLOW_TRACKING_URI") == before
    tie = register_model(mlflow_server, "rule", uri, run_id, Evidence([1], [50.0], digest))
    lucky = register_model(mlflow_server, "rule", uri, run_id, Evidence([2], [50.8], digest))
    elsewhere = register_model(mlflow_server, "rule", uri, run_id, Evidence([3], [70.0], "0123456789abcdef"))
    better = register_model(mlflow_server, "rule", uri, run_id, Evidence([4, 5, 6], [53.0, 53.2, 52.9], digest))
    assert [r["promoted"] for r in (first, tie, lucky, elsewhere, better)] == [True, False, False, False, True]
    assert [r["decision"] for r in (tie, lucky, elsewhere)] == ["kept", "kept", "not compared"]
    client = MlflowClient(mlflow_server)
    assert client.get_model_version_by_alias("rule", "champion").version == str(better["version"])
    kept = client.get_model_version("rule", str(lucky["version"]))
    assert json.loads(kept.tags["pgt.evidence_seeds"]) == [2] and json.loads(kept.tags["pgt.evidence_scores"]) == [50.8]
    assert kept.tags["pgt.data_digest"] == digest and kept.tags["champion_decision"] == "kept"
    assert "within seed noise" in kept.tags["champion_reason"] and kept.tags[RIVAL_TAG] == "50.0"
    assert "other data" in client.get_model_version("rule", str(elsewhere["version"])).tags["champion_reason"]
    promoted = client.get_model_version("rule", str(better["version"]))
    assert promoted.tags["champion_decision"] == "promoted" and json.loads(promoted.tags["pgt.evidence_seeds"]) == [4, 5, 6]
    assert float(promoted.tags[SCORE_TAG]) == pytest.approx(53.0333, abs=1e-3)


def test_a_model_uri_names_the_registered_version_behind_it(registered_model, mlflow_server):
    """An alias resolves to the version it names now; a version URI names itself; a run's model is no version."""
    by_alias = model_version(mlflow_server, "models:/shared@champion")
    assert by_alias == {"name": "shared", "version": 1, "version_uri": "models:/shared/1"}
    assert model_version(mlflow_server, "models:/shared/1") == by_alias
    assert model_version(mlflow_server, registered_model.metrics["mlflow"]["model_uri"]) is None


def test_an_ensemble_is_logged_served_stacked_and_evaluated_as_trained(synthetic_sequences, mlflow_server, tmp_path,
                                                                       no_pickle):
    """`pgt train --members 2`: the logged model holds both members, loads as one stacked pass, and `pgt evaluate`
    gives the test metrics training logged (the same ranks, up to float rounding of near ties)."""
    import mlflow.pyfunc

    from pgt.network.stacked import StackedTransformer

    out = tmp_path / "pair"
    r = pgt_here("train", "--data", synthetic_sequences, "--out", out, "--epochs", "2", "--members", "2",
                 "--unseen-slots", "--visit-relations", "--relation-inputs", "--tracking-uri", mlflow_server,
                 "--experiment", "tracking-test", "--register", "synth-pair")
    assert r.returncode == 0, r.stderr[-3000:]
    logged = json.loads((out / "metrics.json").read_text())
    assert logged["model_config"]["members"] == 2
    mlflow.set_tracking_uri(mlflow_server)
    wrapper = mlflow.pyfunc.load_model("models:/synth-pair@champion").unwrap_python_model()
    assert isinstance(wrapper.packed.model, StackedTransformer) and wrapper.packed.cfg.members == 2
    r = pgt_here("evaluate", "--model", "models:/synth-pair@champion", "--data", synthetic_sequences, "--tracking-uri",
                 mlflow_server)
    assert r.returncode == 0, r.stderr[-3000:]
    printed = json.loads(r.stdout)
    for key in ("acc@1", "acc@5", "mrr"):
        assert printed[key] == pytest.approx(logged["test"][key], abs=0.2), key
        assert printed["strict"][key] == pytest.approx(logged["test"]["strict"][key], abs=0.2), key


def test_a_refit_is_registered_on_its_held_out_validation(synthetic_sequences, tmp_path, mlflow_server):
    """`pgt train --recipe tuned` refits: a selection run on train (nested in MLflow, no test scored), then the
    model trained on train + validation for the selected epochs, registered on the selection's validation score."""
    from mlflow.tracking import MlflowClient

    out = tmp_path / "refit"
    r = run("train", "--data", synthetic_sequences, "--out", out, "--recipe", "tuned", "--refit-epochs", "scaled",
            "--epochs", "3",
            "--d-model", "16", "--dim-feedforward", "32", "--nhead", "2",
            "--tracking-uri", mlflow_server, "--experiment", "refit-test", "--register", "refit")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refit on train + validation (validation columns" in r.stdout  # where the refit's epochs begin
    assert "refit on train + validation for" in " ".join(r.stdout.split())  # the final table's title
    result = json.loads((out / "metrics.json").read_text())
    selection = json.loads((out / "selection" / "metrics.json").read_text())
    assert selection["test"] is None and (out / "selection" / "best.pt").is_file()
    samples = json.loads((synthetic_sequences / "manifest.json").read_text())["counts"]["samples"]
    # --refit-epochs scaled: the selected epochs times (train + validation) / train samples, at most 3
    scaled = min(3, round(selection["best_epoch"] * (samples["train"] + samples["validation"]) / samples["train"]))
    assert result["refit"]["epochs"] == scaled == result["epochs_run"] == result["best_epoch"]
    assert result["refit"]["selected_epoch"] == selection["best_epoch"] and result["refit"]["epochs_rule"] == "scaled"
    assert result["validation"] == selection["validation"]  # held out: the selection run's
    assert result["deployment"]["validation"] == selection["deployment"]["validation"]
    assert result["test"]["n"] > 0 and result["refit"]["trained_on"] == "train+validation"
    assert result["history"][0]["samples"] == samples["train"] + samples["validation"]
    client = MlflowClient(mlflow_server)
    run_id = result["mlflow"]["run_id"]
    child = client.get_run(result["refit"]["selection_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == run_id and "test_acc_at_1" not in child.data.metrics
    metrics = client.get_run(run_id).data.metrics
    assert metrics["best_validation_strict_acc_at_1"] == pytest.approx(selection["validation"]["strict"]["acc@1"])
    assert "validation_learned_from_acc_at_1" in metrics and "validation_acc_at_1" not in metrics
    version = client.get_model_version("refit", result["mlflow"]["registered"]["version"])
    assert version.tags[SCORE_TAG] == repr(selection["validation"]["strict"]["acc@1"])

    # the same command again passes the resumption's door (a refit's own runs differ from it only where the refit
    # sets them); with another setting it is refused there: no MLflow run made, the finished one left FINISHED
    from pgt.cli import train_config
    from pgt.training.run import check_resume_settings, run_folder
    from tests.in_process import pgt_here
    from tests.pgt.test_options import parse

    args = ["--data", str(synthetic_sequences), "--out", str(out), "--recipe", "tuned", "--refit-epochs", "scaled",
            "--epochs", "3", "--d-model", "16", "--dim-feedforward", "32", "--nhead", "2"]
    check_resume_settings(train_config(parse("train", *args)), run_folder(out))
    record = (out / "mlflow_run.json").read_text()
    runs_before = len(client.search_runs([child.info.experiment_id]))
    changed = [a if a != "16" else "32" for a in args]
    r = pgt_here("train", *changed, "--tracking-uri", mlflow_server, "--experiment", "refit-test", "--register", "refit")
    assert r.returncode == 2 and "was trained with other settings (d_model=16)" in r.stderr, r.stderr[-2000:]
    assert len(client.search_runs([child.info.experiment_id])) == runs_before
    assert client.get_run(run_id).info.status == "FINISHED" and (out / "mlflow_run.json").read_text() == record

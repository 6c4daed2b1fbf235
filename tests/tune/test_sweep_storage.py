"""A sweep kept on object storage (--data and --out s3://..., a real S3-compatible server): every record is in the
bucket, none on a local disk, and an interrupted sweep resumes from the bucket alone (--resume URI, from another
folder). Real Ray (the test process's shared one), MLflow and moto's server; `pgt tune` in a subprocess."""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest

from infra.storage import open_storage
from tests.infra.test_storage import bucket
from tests.tune.commands import PGT, tune_cli
from tune.records import read_trial_events

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("on_shared_ray")]


@pytest.fixture
def s3_env(monkeypatch):
    """What a user sets for an S3-compatible store (moto takes any key), for this process and `pgt tune`."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


@pytest.mark.usefixtures("s3_env")
def test_a_sweep_on_object_storage_keeps_every_record_there_and_resumes_from_the_bucket(training_sequences, tmp_path,
                                                                                       s3_server, mlflow_server,
                                                                                       monkeypatch):
    """SIGTERM once Tune has ended the first trial; `--resume URI` from another working folder runs the rest without
    training the finished trial again, confirms a finalist, trains the winner's recipe and registers it. tune.json,
    the recipe, every trial's records and checkpoints are in the bucket; nothing is written to a local folder
    named after the URI; every MLflow run is closed, each tagged with its folder in the bucket."""
    from mlflow.tracking import MlflowClient

    uri = bucket(s3_server, "pgt-sweep")
    out = open_storage(uri)
    data = out.uri_of("..", "sequences").replace("/run/../", "/")
    open_storage(data).upload(training_sequences)
    first_cwd, second_cwd = tmp_path / "laptop", tmp_path / "elsewhere"
    first_cwd.mkdir()
    second_cwd.mkdir()
    proc = subprocess.Popen([*PGT, "tune", "--data", data, "--out", uri, "--trials", "2", "--epochs", "2",
                             "--max-concurrent", "1", "--grace-period", "2", "--finalists", "1", "--confirm-seeds", "1",
                             "--tracking-uri", mlflow_server, "--experiment", "sweep-on-s3", "--register", "s3-swept"],
                            cwd=first_cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    # the driver's record, in the bucket, that Tune has ended the first trial
    while not any(e["event"] == "completed" for name in out.entries() if name == "trials"
                  for trial in out.child("trials").entries() for e in read_trial_events(out.child("trials", trial))):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no trial completed within 300 s"
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, output[-3000:]
    assert f"resume it with `pgt tune --resume {uri}`" in output
    done_before = {name.split("/")[1]: out.read_bytes(*name.split("/")) for name in out.files("trials")
                   if name.endswith("/metrics.json")}
    assert len(done_before) == 1 and out.exists("sweep.json") and not out.exists("tune.json")

    r = tune_cli("--resume", uri, cwd=second_cwd)
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"wrote {out.uri_of('tune.json')}" in r.stdout
    result = out.read_json("tune.json")
    assert len(result["trials"]) == 2 and {row["status"] for row in result["trials"]} <= {"finished", "stopped (ASHA)"}
    for trial_id, metrics in done_before.items():  # the finished trial was not trained again
        assert out.read_bytes("trials", trial_id, "metrics.json") == metrics
    files = set(out.files())
    assert {"sweep.json", "tune.json", "best_recipe.yaml", "trials.png", "final/best.pt", "final/metrics.json"} <= files
    assert result["best_recipe"] == out.uri_of("best_recipe.yaml") and result["best_checkpoint"] == out.uri_of("final", "best.pt")
    for row in result["trials"]:
        assert {"node.json", "mlflow_run.json", "tune_events.jsonl"} <= set(out.child("trials", row["trial_id"]).entries())
        assert any(f.startswith(f"ray/sweep/trial_{row['trial_id']}/checkpoint_") for f in files)
    winner = result["confirmation"]["finalists"][0]
    assert out.child("finalists", winner["name"], "seeds-1").read_json("metrics.json")["test"] is None
    assert result["mlflow"]["registered"]["name"] == "s3-swept"
    assert not [p for cwd in (first_cwd, second_cwd) for p in cwd.iterdir()]  # no local folder named after the URI

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("sweep-on-s3").experiment_id])
    assert runs and all(run.info.status in ("FINISHED", "KILLED") for run in runs)
    kept = {run.info.run_name: run.data.tags["pgt.out_dir"] for run in runs}
    assert kept[f"sweep-{out.path.rpartition('/')[2]}"] == uri and kept["final"] == out.uri_of("final")
    assert {kept[f"trial-{row['trial_id']}"] for row in result["trials"]} == \
        {out.uri_of("trials", row["trial_id"]) for row in result["trials"]}


@pytest.mark.usefixtures("s3_env")
def test_a_sweep_refuses_storage_it_cannot_use_in_one_line_before_any_trial(training_sequences, s3_server, tmp_path):
    """A bucket that does not exist, an endpoint that does not answer, a folder of someone else's files, and data
    inside the sweep's folder: each one line, in seconds, with nothing written to the bucket."""
    uri = bucket(s3_server, "pgt-sweep-refused")
    out = open_storage(uri)
    out.write_bytes(b"theirs", "notes.txt")
    endpoint = s3_server.removeprefix("http://")
    cases = [(uri.replace("pgt-sweep-refused", "pgt-never"), "no such bucket"),
             (uri.replace(endpoint, "127.0.0.1:9"), "the storage does not answer"),
             (uri, r"did not write \(notes.txt\)")]
    for target, said in cases:
        began = time.monotonic()
        r = tune_cli("--data", training_sequences, "--out", target, "--trials", "1", "--epochs", "1", cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
        assert re.search(said, r.stderr), r.stderr
        assert time.monotonic() - began < 30
    r = tune_cli("--data", out.uri_of("data"), "--out", out.uri_of("data", "sweep"), "--trials", "1", cwd=tmp_path)
    assert r.returncode == 2 and "lies inside --data" in r.stderr, r.stderr[-3000:]
    assert out.files() == ["notes.txt"] and not list(tmp_path.iterdir())

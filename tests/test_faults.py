"""Faults beyond bad input, as an operator meets them: a second run into the same --out, SIGTERM, a tracking server
that dies mid-run, full and read-only disks, settings files that are not what they seem, a damaged sweep record.
Each runs the real command in a subprocess, but for the refusals of a settings file or a sweep record (in this
process, tests/in_process.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, free_port
from tests.in_process import pgt_here

PGT = [sys.executable, "-m", "pgt.cli"]
LONG = ("--epochs", "80", "--patience", "80")  # a run that lasts until it is stopped


def pgt(*args, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*PGT, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kwargs)


def start(*args, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*PGT, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def wait_for(condition, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}")
        time.sleep(0.2)


def checkpoints(out: Path) -> list[Path]:
    return sorted((out / "checkpoints").glob("epoch_*/checkpoint.pt"))


def run_of(out: Path, uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    return client, run_id, client.get_run(run_id)


def logged_epochs(client, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "train_loss"))


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def test_one_writer_sigterm_and_resume(training_sequences, tmp_path):
    """Two runs at once on a new SQLite store both start; a second `pgt train` into a running one's --out is
    refused naming its PID; SIGTERM stops the first as Ctrl+C would (exit 143, checkpoint readable, run KILLED,
    no lock or temporary left); --resume continues the same run with every epoch logged once; a later --resume of
    the finished folder starts a new run and leaves the finished one as it was."""
    from pgt.network.checkpoint import read_checkpoint

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"  # a store that does not exist yet
    out, other = tmp_path / "run", tmp_path / "other"
    first = start("train", "--data", training_sequences, "--out", out, "--tracking-uri", uri, *LONG)
    second = pgt("train", "--data", training_sequences, "--out", other, "--tracking-uri", uri, "--epochs", 1)
    assert second.returncode == 0, second.stderr[-3000:]
    wait_for(lambda: len(checkpoints(out)) >= 2 or first.poll() is not None, "two checkpoints")
    assert first.poll() is None, first.communicate()[1][-3000:]

    refused = pgt("train", "--data", training_sequences, "--out", out, "--tracking-uri", uri, "--epochs", 1,
                  timeout=120)
    assert refused.returncode == 2
    assert f"pid {first.pid}" in one_line(refused.stderr) and "another `pgt train`" in refused.stderr

    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 143, stderr[-3000:]
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    client, run_id, run = run_of(out, uri)
    assert run.info.status == "KILLED"
    done = len(checkpoints(out)) and read_checkpoint(checkpoints(out)[-1])["epoch"] + 1
    assert done >= 2
    assert not list(tmp_path.glob(".run.lock")) and not list(out.rglob("*tmp*"))

    resumed = pgt("train", "--data", training_sequences, "--out", out, "--tracking-uri", uri, "--resume",
                  "--epochs", done + 2, "--patience", 80)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    client, again, run = run_of(out, uri)
    assert again == run_id and run.info.status == "FINISHED"
    assert logged_epochs(client, run_id) == list(range(done + 2))  # each epoch once, none missing
    finished_at = run.info.end_time

    rerun = pgt("train", "--data", training_sequences, "--out", out, "--tracking-uri", uri, "--resume",
                "--epochs", done + 2, "--patience", 80)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    client, new_id, new = run_of(out, uri)
    assert new_id != run_id and new.info.status == "FINISHED"
    old = client.get_run(run_id)
    assert old.info.status == "FINISHED" and old.info.end_time == finished_at  # never reopened
    assert logged_epochs(client, run_id) == list(range(done + 2))


def test_sigterm_to_the_process_group_of_a_ray_run_closes_it_before_ray_is_down(training_sequences, tmp_path):
    """SIGTERM to the whole process group of `pgt train --workers 1` (systemd's stop, `kill -- -PGID`, Prefect's
    cancel: the local Ray's head gets it too): exit 143 within seconds, the lock released and the MLflow run KILLED
    while Ray is still being shut down, nothing of the group left. Ray Train's own Ctrl+C handler would wait on the
    dead head until Ray ended the process after 60 s, run left RUNNING."""
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    proc = subprocess.Popen([*PGT, "train", "--data", str(training_sequences), "--out", str(out), "--workers", "1",
                             "--tracking-uri", uri, *LONG], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lock = tmp_path / ".run.lock"
    try:
        wait_for(lambda: len(list((out / "ray" / "train").glob("epoch_*"))) >= 1 or proc.poll() is not None,
                 "Ray's first checkpoint")
        assert proc.poll() is None and lock.exists(), proc.stdout.read()[-3000:]
        os.killpg(proc.pid, signal.SIGTERM)
        signalled = time.monotonic()
        wait_for(lambda: not lock.exists() or proc.poll() is not None, "the lock's release", timeout_s=60)
        released_in = time.monotonic() - signalled
        alive_then = proc.poll() is None
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Ray's own actors may log their errors as the head goes (prefixed "(ActorName pid=...)"); none of pgt's
    assert proc.returncode == 143 and output.splitlines()[-1] == "stopped by SIGTERM", output[-3000:]
    assert not [line for line in output.splitlines() if line.startswith("Traceback")], output[-3000:]
    assert alive_then and released_in < 20 and not lock.exists()  # released first, then Ray shut down
    assert run_of(out, uri)[2].info.status == "KILLED"
    wait_for(lambda: not _group_alive(proc.pid), "the process group's end", timeout_s=30)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_tracking_server_that_dies_fails_the_run_in_seconds_and_a_rerun_completes_it(training_sequences, tmp_path):
    """The server stops mid-run: the run ends within seconds in one line naming the server, its checkpoints kept;
    with the server back, --resume closes the run FINISHED with every epoch logged once."""
    env = {**os.environ, "PGT_STATE_DIR": str(tmp_path / "state"), "MLFLOW_PORT": str(free_port())}
    scripts = PROJECT_ROOT / "scripts"

    def server(action: str) -> None:
        done = subprocess.run([scripts / f"{action}-mlflow.sh"], env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr

    uri, out = f"http://127.0.0.1:{env['MLFLOW_PORT']}", tmp_path / "run"
    server("start")
    try:
        run = start("train", "--data", training_sequences, "--out", out, "--tracking-uri", uri, *LONG)
        wait_for(lambda: len(checkpoints(out)) >= 2 or run.poll() is not None, "two checkpoints")
        assert run.poll() is None, run.communicate()[1][-3000:]
        server("stop")
        stopped = time.monotonic()
        _, stderr = run.communicate(timeout=120)
        assert time.monotonic() - stopped < 45, "MLflow's retries held the run"
        assert run.returncode == 2
        line = one_line(stderr)
        assert uri in line and "stopped answering" in line and "--resume" in line and len(line) < 600
        kept = checkpoints(out)
        assert kept

        server("start")
        last = int(kept[-1].parent.name.removeprefix("epoch_"))  # 0-based: two epochs are left to train after it
        resumed = pgt("train", "--data", training_sequences, "--out", out, "--tracking-uri", uri, "--resume",
                      "--epochs", last + 3, "--patience", 80)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        from pgt.network.checkpoint import read_checkpoint

        epochs = read_checkpoint(checkpoints(out)[-1])["epoch"] + 1
        assert epochs == last + 3  # it went on from the last checkpoint kept to the end
        client, run_id, finished = run_of(out, uri)
        assert finished.info.status == "FINISHED"
        assert logged_epochs(client, run_id) == list(range(epochs))
    finally:
        subprocess.run([scripts / "stop-mlflow.sh"], env=env, capture_output=True, timeout=120)


def test_a_tracking_server_that_refuses_its_api_is_one_line_naming_the_status_and_the_fix(training_sequences, tmp_path):
    """A server told to allow other Host headers (MLFLOW_ALLOWED_HOSTS, MLflow's --allowed-hosts) answers /health
    but refuses every API call with HTTP 403: train and tune stop at their door in one line naming the server, the
    status, MLflow's words and the fix, before their folder exists."""
    env = {**os.environ, "PGT_STATE_DIR": str(tmp_path / "state"), "MLFLOW_PORT": str(free_port()),
           "MLFLOW_ALLOWED_HOSTS": "mlflow.example:5000"}
    scripts, uri = PROJECT_ROOT / "scripts", f"http://127.0.0.1:{env['MLFLOW_PORT']}"
    started = subprocess.run([scripts / "start-mlflow.sh"], env=env, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        for command in ("train", "tune"):
            r = pgt_here(command, "--data", training_sequences, "--out", tmp_path / command, "--tracking-uri", uri)
            line = one_line(r.stderr)
            assert r.returncode == 2 and not (tmp_path / command).exists(), r.stderr[-2000:]
            assert uri in line and "HTTP 403" in line and "Invalid Host header" in line, line
            assert f"allowing 127.0.0.1:{env['MLFLOW_PORT']}" in line and "MLFLOW_ALLOWED_HOSTS" in line, line
    finally:
        subprocess.run([scripts / "stop-mlflow.sh"], env=env, capture_output=True, timeout=120)


def test_a_tracking_server_with_basic_auth_refuses_in_one_line_until_given_credentials_and_a_failing_one_too(
        training_sequences, tmp_path, monkeypatch):
    """MLflow's basic-auth app (scripts/start-mlflow.sh, MLFLOW_AUTH=basic): without credentials, and with a wrong
    password, train stops at its door with HTTP 401 in one line saying what to set or check; with the admin's it
    trains and logs. A server whose store breaks (its database overwritten) answers /health but refuses its API,
    400 with the database's error or, before its first API call, 500 with an HTML page: one line naming the status,
    the error or the page's title, and where to look."""
    env = {**os.environ, "PGT_STATE_DIR": str(tmp_path / "state"), "MLFLOW_PORT": str(free_port()),
           "MLFLOW_AUTH": "basic", "MLFLOW_AUTH_ADMIN_PASSWORD": "not-the-default-9"}
    scripts, uri = PROJECT_ROOT / "scripts", f"http://127.0.0.1:{env['MLFLOW_PORT']}"
    refused = subprocess.run([scripts / "start-mlflow.sh"], env={**env, "MLFLOW_AUTH_ADMIN_PASSWORD": ""},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "MLFLOW_AUTH_ADMIN_PASSWORD" in refused.stderr, refused.stderr
    started = subprocess.run([scripts / "start-mlflow.sh"], env=env, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        for user, password, fix in ((None, None, "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"),
                                    ("admin", "wrong", "refused the credentials given")):
            for name, value in (("MLFLOW_TRACKING_USERNAME", user), ("MLFLOW_TRACKING_PASSWORD", password)):
                monkeypatch.setenv(name, value) if value else monkeypatch.delenv(name, raising=False)
            r = pgt_here("train", "--data", training_sequences, "--out", tmp_path / "refused", "--tracking-uri", uri)
            line = one_line(r.stderr)
            assert r.returncode == 2 and not (tmp_path / "refused").exists(), r.stderr[-2000:]
            assert uri in line and "HTTP 401" in line and "not authenticated" in line and fix in line, line
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-default-9")
        r = pgt_here("train", "--data", training_sequences, "--out", tmp_path / "run", "--epochs", "1",
                     "--tracking-uri", uri)
        assert r.returncode == 0, r.stderr[-3000:]
        client, run_id, run = run_of(tmp_path / "run", uri)
        assert run.info.status == "FINISHED" and logged_epochs(client, run_id) == [0]

        # the store overwritten under the server: MLflow answers its API 400 with the database's error
        (tmp_path / "state" / "mlflow" / "mlflow.db").write_bytes(b"not a database " * 100)
        r = pgt_here("train", "--data", training_sequences, "--out", tmp_path / "broken", "--tracking-uri", uri)
        line = one_line(r.stderr)
        assert r.returncode == 2 and not (tmp_path / "broken").exists(), r.stderr[-2000:]
        assert uri in line and "HTTP 400: (sqlite3.DatabaseError) file is not a database" in line, line
        assert "its log says why" in line and len(line) < 500, line
    finally:
        subprocess.run([scripts / "stop-mlflow.sh"], env=env, capture_output=True, timeout=120)

    # a server whose store is broken before its first API call (its worker opens the store then): HTTP 500, whose
    # page is said by its title
    env = {**os.environ, "PGT_STATE_DIR": str(tmp_path / "failing"), "MLFLOW_PORT": str(free_port())}
    uri = f"http://127.0.0.1:{env['MLFLOW_PORT']}"
    started = subprocess.run([scripts / "start-mlflow.sh"], env=env, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        (tmp_path / "failing" / "mlflow" / "mlflow.db").write_bytes(b"not a database " * 100)
        r = pgt_here("train", "--data", training_sequences, "--out", tmp_path / "failed", "--tracking-uri", uri)
        line = one_line(r.stderr)
        assert r.returncode == 2 and not (tmp_path / "failed").exists(), r.stderr[-2000:]
        assert uri in line and "HTTP 500: 500 Internal Server Error" in line and "its log says why" in line, line
        assert "<" not in line, line
    finally:
        subprocess.run([scripts / "stop-mlflow.sh"], env=env, capture_output=True, timeout=120)


def fill(disk: Path) -> None:
    """Fill `disk` with disk/filler but for what is left under a page."""
    filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(filler, b"\0" * 4096):
            pass
    except OSError:
        pass
    os.close(filler)


@pytest.fixture
def small_disks(tmp_path):
    """(full, read_only): a 200 KiB tmpfs and a read-only one, mounted for the test; skipped where mounting is not
    allowed (not root, or a container without CAP_SYS_ADMIN)."""
    full, read_only = tmp_path / "full", tmp_path / "read-only"
    full.mkdir()
    read_only.mkdir()
    mounted = []
    for path, options in ((full, "size=200k"), (read_only, "size=200k,ro")):
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            for m in mounted:
                subprocess.run(["umount", str(m)], capture_output=True)
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or done.returncode})")
        mounted.append(path)
    yield full, read_only
    for m in mounted:
        subprocess.run(["umount", str(m)], capture_output=True)


def test_full_and_read_only_disks_are_one_line_naming_the_path(training_sequences, small_disks, tmp_path):
    full, read_only = small_disks
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    trained = pgt("train", "--data", training_sequences, "--out", full / "run", "--tracking-uri", uri, "--epochs", 2)
    assert trained.returncode == 1
    line = one_line(trained.stderr)
    assert "no space left" in line and str(full / "run") in line
    assert not [p for p in full.rglob("*") if p.is_file() and p.name != "mlflow_run.json"]  # no half-written checkpoint

    points = tmp_path / "points.parquet"
    assert pgt("synth", "--out", points, "--users", 4, "--days", 80).returncode == 0
    fill(full)
    preprocessed = pgt("preprocess", "--input", points, "--format", "positionfixes", "--out", full / "sequences")
    assert preprocessed.returncode == 1 and "no space left" in one_line(preprocessed.stderr)
    assert not list(full.glob("*sequences*"))  # the temporary folder is gone
    # room for some of the tables (about 160 KiB in all): the disk fills while the splits are written, which
    # polars' own writer reported as "Invalid thrift: transport error"
    os.truncate(full / "filler", max(0, (full / "filler").stat().st_size - 100 * 1024))
    preprocessed = pgt("preprocess", "--input", points, "--format", "positionfixes", "--out", full / "sequences")
    line = one_line(preprocessed.stderr)
    assert preprocessed.returncode == 1 and "no space left" in line and str(full / "sequences") in line, line
    assert not list(full.glob("*sequences*"))  # nothing half written is left as if complete
    (full / "filler").unlink()

    refused = pgt("train", "--data", training_sequences, "--out", read_only / "run", "--tracking-uri", uri)
    assert refused.returncode == 1 and "read-only file system" in one_line(refused.stderr)

    # a full disk under pgt predict is the output's problem, not the model's
    trained = pgt("train", "--data", training_sequences, "--out",
                  tmp_path / "model-run", "--tracking-uri", uri, "--epochs", 1, "--register", "faults")
    assert trained.returncode == 0, trained.stderr[-2000:]
    fill(full)
    predicted = pgt("predict", "--model", "models:/faults@champion", "--input", training_sequences / "test.parquet",
                    "--out", full / "predictions.parquet", "--tracking-uri", uri)
    assert predicted.returncode == 1
    line = one_line(predicted.stderr)
    assert "no space left" in line and "predictions.parquet" in line and "models:/" not in line


def test_settings_files_are_read_bounded_and_only_when_regular(training_sequences, tmp_path):
    """A YAML alias bomb, /dev/zero, a FIFO, a null `train:` block and odd keys: each one line, in seconds."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n'
                    "c: [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    null_train, odd = tmp_path / "null.yaml", tmp_path / "odd.yaml"
    null_train.write_text("train:\n")
    odd.write_text("1: 2\n")
    expected = {bomb: "aliases", Path("/dev/zero"): "not a regular file", fifo: "not a regular file",
                null_train: "`train:` maps", odd: "keys are TrainConfig field names"}
    for path, problem in expected.items():
        r = pgt_here("train", "--data", training_sequences, "--out", tmp_path / "run", "--recipe-file", path)
        assert r.returncode == 2, (path, r.stderr[-2000:])
        line = one_line(r.stderr)
        assert str(path) in line and problem in line and len(line) < 400, line
    assert not (tmp_path / "run").exists()


def test_a_sweep_resume_refuses_new_settings_and_names_a_damaged_record(tmp_path):
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text('{"sweep": {"data_dir": 3')
    damaged = pgt_here("tune", "--resume", folder)
    assert damaged.returncode == 2
    assert str(folder / "sweep.json") in one_line(damaged.stderr) and "damaged sweep record" in damaged.stderr
    (folder / "sweep.json").write_text('{"sweep": [1, 2]}')
    assert "damaged sweep record" in one_line(pgt_here("tune", "--resume", folder).stderr)

    typed = pgt_here("tune", "--resume", folder, "--trials", 50, "--epochs", 3)
    assert typed.returncode == 2
    line = one_line(typed.stderr)
    assert "--trials" in line and "--epochs" in line and "cannot change a started sweep" in line

    for flag in ("--out", "--resume"):  # a URI of storage the project cannot open: never a local folder "ftp:"
        uri = pgt_here("tune", *(("--data", folder) if flag == "--out" else ()), flag, "ftp://team/sweep")
        assert uri.returncode == 2 and "storage URIs are s3:// or gs://" in one_line(uri.stderr)
    assert not (Path.cwd() / "ftp:").exists()


def test_a_tracking_server_for_a_cluster_binds_the_address_store_and_artifact_destination_given(tmp_path, s3_server,
                                                                                                  monkeypatch):
    """start-mlflow.sh with MLFLOW_HOST (a loopback address other than 127.0.0.1: the tests' rule), the backend store
    and the artifact destination given (object storage, as a team's server keeps them): it answers there, its API
    takes that address as Host, and a run's artifact, proxied through the server, lands in the bucket."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from infra.storage import open_storage
    from tests.infra.test_storage import bucket

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    bucket(s3_server, "pgt-mlflow")
    port = free_port()
    env = {**os.environ, "PGT_STATE_DIR": str(tmp_path / "state"), "MLFLOW_PORT": str(port), "MLFLOW_HOST": "127.0.0.3",
           "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'team.db'}",
           "MLFLOW_ARTIFACTS_DESTINATION": "s3://pgt-mlflow/artifacts", "MLFLOW_S3_ENDPOINT_URL": s3_server}
    scripts = PROJECT_ROOT / "scripts"
    started = subprocess.run([scripts / "start-mlflow.sh"], env=env, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stderr
        uri = f"http://127.0.0.3:{port}"
        assert uri in started.stdout and (tmp_path / "team.db").is_file()
        client = MlflowClient(uri)
        run = client.create_run(client.create_experiment("team"))
        (tmp_path / "note.txt").write_text("kept by the team's server")
        client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
        kept = open_storage(f"s3://pgt-mlflow/artifacts?endpoint_override={s3_server.removeprefix('http://')}"
                            "&scheme=http&region=us-east-1")
        assert [f for f in kept.files() if f.endswith("note.txt")], kept.files()
        assert mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="note.txt",
                                                   tracking_uri=uri, dst_path=str(tmp_path / "back")).endswith("note.txt")
    finally:
        subprocess.run([scripts / "stop-mlflow.sh"], env=env, capture_output=True, timeout=120)


@pytest.fixture
def locked_bucket(tmp_path, monkeypatch):
    """An S3-compatible server that checks credentials, as a cloud's does: moto's server with its IAM
    authentication on after the first four requests, which make a user, its key, its policy (s3:*) and the bucket
    `locked`. Started and stopped by the project's scripts; yields (endpoint URL, the user's key, its secret)."""
    import boto3

    from tests.conftest import start_run_server

    state = tmp_path / "locked-s3"
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "4")  # read by the server at its start
    url = start_run_server("start-s3.sh", "S3_PORT", state, timeout_s=60)
    monkeypatch.delenv("INITIAL_NO_AUTH_ACTION_COUNT")
    try:
        anyone = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="x")
        iam = boto3.client("iam", **anyone)
        iam.create_user(UserName="team")
        key = iam.create_access_key(UserName="team")["AccessKey"]
        iam.put_user_policy(UserName="team", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        boto3.client("s3", **anyone).create_bucket(Bucket="locked")
        yield url, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        subprocess.run([PROJECT_ROOT / "scripts" / "stop-s3.sh"], env={**os.environ, "PGT_STATE_DIR": str(state)},
                       capture_output=True, timeout=30)


def test_wrong_storage_credentials_are_one_line_in_seconds_and_write_nothing(locked_bucket, training_sequences,
                                                                             tmp_path, monkeypatch):
    """Against storage that checks keys: a key it does not know, or the right key with a wrong secret, is refused in
    one line naming the fix, within seconds, by preprocess (input and output), train (data and output) and tune,
    before any work; nothing is left in the bucket. The right key then writes there."""
    from infra.storage import open_storage
    from preprocessing.config import SynthConfig
    from preprocessing.synthetic import generate_positionfixes

    url, key, secret = locked_bucket
    fixes = tmp_path / "fixes.parquet"
    generate_positionfixes(SynthConfig(users=3, days=20, seed=1)).write_parquet(fixes)
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    commands = [("preprocess", "--input", fixes, "--format", "positionfixes", "--out", "s3://locked/seq"),
                ("preprocess", "--input", "s3://locked/raw/fixes.parquet", "--format", "positionfixes", "--out",
                 tmp_path / "seq"),
                ("train", "--data", training_sequences, "--out", "s3://locked/run", "--workers", "1"),
                ("train", "--data", "s3://locked/seq", "--out", tmp_path / "run", "--workers", "0"),
                ("tune", "--data", training_sequences, "--out", "s3://locked/sweep", "--trials", "1")]
    for wrong_key, wrong_secret in (("AKIAWRONGKEY0000000", secret), (key, "not-the-secret")):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", wrong_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
        for command in commands:
            began = time.monotonic()
            refused = pgt_here(*command)
            line = one_line(refused.stderr)
            assert refused.returncode == 2, (command, refused.stderr[-2000:])
            assert "s3://locked/" in line and "refused the credentials" in line and "AWS_ACCESS_KEY_ID" in line, line
            assert time.monotonic() - began < 15, (command, time.monotonic() - began)
    assert not (tmp_path / "seq").exists() and not (tmp_path / "run").exists()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    assert open_storage("s3://locked").entries() == []  # nothing of the refused commands
    written = pgt_here("preprocess", "--input", fixes, "--format", "positionfixes", "--out", "s3://locked/seq",
                       "--no-progress")
    assert written.returncode == 0, written.stderr[-2000:]
    assert "manifest.json" in open_storage("s3://locked/seq").entries()

"""MLflow tracking and the Model Registry's champion rule.

A run logs the whole training config as params, per-epoch train loss and validation metrics, the
test metrics, the dataset manifest, the `pgt explain` PNGs and the best checkpoint as a pickle-free
models-from-code pyfunc (`pgt/tracking/mlflow_model.py` around `pgt.network.model.PackedModel`: one (B, 7, T) int64
tensor in, (B, V + S) log-probabilities out). The driver creates the run; rank 0 of the training logs into it.

Lineage: every run logs its train, validation and test Parquet as MLflow dataset inputs (a digest of the
file, its path, its rows and the preprocessing settings: the UI's Datasets column), carries the command and
the git commit it ran from (the Source column), and samples system metrics (CPU, memory, GPU where present)
while it trains. A registered version carries its run's recipe, sweep and commit as tags. Experiments are
marked as model development, so the UI opens on their training runs.

MLflow names allow no "@", so metric keys read `validation_acc_at_1`, `test_ndcg_at_10`.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from importlib import metadata
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import torch

import infra
import pgt
import preprocessing
from infra.errors import InputError, ServiceError
from infra.process import shorten, uninterrupted
from infra.state import state_dir
from pgt.config import TOP_K, TrackingConfig
from pgt.network.checkpoint import load_checkpoint

# A tracking server that stops answering fails a run in seconds, not after MLflow's default of 7 retries with
# exponential backoff and 120 s a request (minutes): the run's checkpoints stay and a rerun resumes. Set at import,
# so that Ray's workers, which import this module before they log, get the same; the user's own values win.
for _name, _value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                      ("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")):
    os.environ.setdefault(_name, _value)

CHAMPION = "champion"
SCORE_TAG = "validation_strict_acc_at_1"  # the registered version's own strict validation Acc@1
RIVAL_TAG = "champion_validation_strict_acc_at_1"  # the champion's, when the version was compared
RECIPE_TAG = "pgt.recipe"  # a run's recipe: its name, or the recipe file it trained
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # model development, not a GenAI app
UI_VIEW = "workflowType=machine_learning"  # links open MLflow 3's UI on runs, datasets and models, not its GenAI view
SPLIT_CONTEXT = {"train": "training", "validation": "validation", "test": "test"}  # dataset input contexts
# a registered version's tags, copied from its run's: what made it
VERSION_TAGS = {RECIPE_TAG: "recipe", "mlflow.parentRunId": "sweep_run_id", "mlflow.source.git.commit": "git_commit"}


def use_tracking_uri(uri: str) -> None:
    """mlflow.set_tracking_uri for this process's MLflow calls, without what it also does: write $MLFLOW_TRACKING_URI,
    which every later default of the process (resolve_tracking_uri: a flow worker's next run, a test's) would then
    take for the user's own setting."""
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


def default_tracking_uri(state: Path | None = None) -> str:
    """A local SQLite store under the state folder (artifacts beside it)."""
    folder = (state or state_dir()) / "mlflow"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None, state: Path | None = None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else the local SQLite default (under `state`, by default the
    project's state folder). A sqlite or file path is made absolute, since Ray workers run in other directories."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(state)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{Path(uri.removeprefix('sqlite:///')).resolve()}"
    elif not urllib.parse.urlparse(uri).scheme:  # a path; `file:/abs` is a URI already
        uri = Path(uri).resolve().as_uri()
    return uri


def check_tracking_server(tracking_uri: str, timeout_s: float = 3.0) -> None:
    """ServiceError, within `timeout_s`, unless an http(s) tracking URI answers its /health: a stopped server would
    otherwise keep MLflow retrying for minutes. A local file store (a path, or file:) is refused too, in one line,
    unless MLFLOW_ALLOW_FILE_STORE is true: MLflow 3 raises deep inside the run for it. A SQLite store passes."""
    if tracking_uri.startswith("file:") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        raise InputError(tracking_uri, "a file store, which MLflow 3 keeps in maintenance mode and refuses; use a "
                                       "SQLite store (sqlite:///PATH/mlflow.db; with no URI runs go to one under .state/mlflow), "
                                       "or set MLFLOW_ALLOW_FILE_STORE=true")
    if tracking_uri.startswith(("sqlite:", "file:")):
        return
    if not tracking_uri.startswith(("http://", "https://")):
        check_tracking_store(tracking_uri, 3 * timeout_s)
        return
    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=timeout_s) as response:
            if response.status == 200:
                check_tracking_api(tracking_uri, timeout_s)
                return
            problem = f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        problem = f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        problem = getattr(reason, "strerror", None) or str(reason) or type(exc).__name__
    raise ServiceError(f"MLflow tracking server {tracking_uri} is not reachable ({problem}); start it with "
                       "scripts/start-mlflow.sh (or `make demo`), or choose another --tracking-uri / "
                       "MLFLOW_TRACKING_URI (unset, runs go to a local SQLite store)")


# the likely fix of each refusal of a tracking server's API (its /health answers without any of these checks)
API_REFUSALS = {
    400: "it cannot answer a plain experiment search (a broken store, or a proxy that rewrites requests): its log "
         "says why",
    401: "it wants credentials: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)",
    403: "the credentials it was given lack the permission: ask its administrator for it, or use another user",
}
HOST_REFUSAL = ("it accepts only the Host headers of its --allowed-hosts: reach it by one of them, or restart it "
                "allowing {host} (scripts/start-mlflow.sh: MLFLOW_ALLOWED_HOSTS)")  # MLflow's DNS-rebinding guard


def check_tracking_api(tracking_uri: str, timeout_s: float = 3.0) -> None:
    """ServiceError, within `timeout_s`, when a tracking server whose /health answers refuses its API (401, 403, 5xx:
    MLflow's host check and auth exempt /health): one line naming the server, the status, its words and the likely
    fix, instead of MLflow's traceback from the first call of a run (and minutes of its retries for a 5xx)."""
    base = tracking_uri.rstrip("/")
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search?max_results=1")
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}")
    elif os.environ.get("MLFLOW_TRACKING_USERNAME"):
        pair = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            said = refusal_words(exc.read(2000).decode("utf-8", "replace"))
        except OSError:
            said = ""
    except (urllib.error.URLError, OSError):
        return  # it answered /health a moment ago: the run's own calls say what went wrong, if anything
    if status < 500 and status not in API_REFUSALS:
        return  # a client error of this probe alone (an old server's API, a proxy's path rule): the run's calls decide
    fix = API_REFUSALS.get(status, "the server failed: its log says why; rerun once it answers again (--resume "
                                   "continues a run)")
    if status == 401 and request.has_header("Authorization"):
        fix = ("it refused the credentials given (MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME "
               f"{os.environ.get('MLFLOW_TRACKING_USERNAME', '')!r} and MLFLOW_TRACKING_PASSWORD): check them")
    if status == 403 and "host header" in said.lower():
        fix = HOST_REFUSAL
    words = f": {shorten(said, 100)}" if said else ""
    raise ServiceError(f"MLflow tracking server {tracking_uri} refused its API (HTTP {status}{words}); "
                       f"{fix.format(host=urllib.parse.urlsplit(base).netloc)}")


def refusal_words(body: str) -> str:
    """What a refusal's body says, in one line: an MLflow error's message, an HTML page's title, else the text."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    if isinstance(message, str):
        return " ".join(message.split())
    title = re.search(r"<title>(.*?)</title>", body, re.IGNORECASE | re.DOTALL)
    return " ".join((title.group(1) if title else body).split())


def open_sqlite_store(tracking_uri: str) -> None:
    """Open a SQLite store once under a lock beside its database: MLflow creates the schema of a new one with
    migrations that two processes running at once break (two runs started together on a fresh store). Opening
    it here costs nothing more: the process keeps the store it opened."""
    database = Path(tracking_uri.removeprefix("sqlite:///"))
    if str(database) in ("", ":memory:"):
        return
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
        lock = (database.parent / f".{database.name}.lock").open("a")
    except OSError as exc:
        raise ServiceError(f"MLflow tracking store {tracking_uri} cannot be created ({exc.strerror}: {database.parent}); "
                           "choose another --tracking-uri / MLFLOW_TRACKING_URI") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            mlflow_client(tracking_uri).search_experiments(max_results=1)
        except Exception as exc:  # noqa: BLE001 - said in one line
            problem = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise ServiceError(f"MLflow tracking store {tracking_uri} cannot be opened ({type(exc).__name__}: "
                               f"{problem}); choose another --tracking-uri / MLFLOW_TRACKING_URI") from None


def check_tracking_store(tracking_uri: str, timeout_s: float) -> None:
    """ServiceError, within `timeout_s`, unless MLflow opens the store of a database (or other) tracking URI and
    lists an experiment: an unknown scheme, a missing driver or a database that does not answer is one line here,
    not a traceback in the middle of a run."""
    outcome: list[BaseException | None] = []

    def open_store() -> None:
        try:
            mlflow_client(tracking_uri).search_experiments(max_results=1)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which says it in one line
            outcome.append(exc)

    opener = threading.Thread(target=open_store, daemon=True)  # daemon: a store that hangs does not hold the exit
    opener.start()
    opener.join(timeout_s)
    if not outcome:
        raise ServiceError(f"MLflow tracking store {tracking_uri} did not answer within {timeout_s:.0f} s; choose another "
                           "--tracking-uri / MLFLOW_TRACKING_URI (unset, runs go to a local SQLite store)")
    exc = outcome[0]
    if exc is not None:
        problem = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ServiceError(f"MLflow tracking store {tracking_uri} cannot be opened ({type(exc).__name__}: {problem}); "
                           "choose another --tracking-uri / MLFLOW_TRACKING_URI (unset, runs go to a local SQLite "
                           "store)")


def mlflow_client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def experiment_id(tracking_uri: str, name: str) -> str:
    """The experiment's id, created on first use. A local store gets an absolute artifact folder beside
    its database (MLflow's Default experiment would write a cwd-relative ./mlruns); a server keeps its own."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.tags.get(EXPERIMENT_KIND[0]) is None:
            client.set_experiment_tag(found.experiment_id, *EXPERIMENT_KIND)
        return found.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        location = (Path(tracking_uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    try:
        return client.create_experiment(name, artifact_location=location, tags=dict([EXPERIMENT_KIND]))
    except MlflowException:  # created meanwhile by another process
        return client.get_experiment_by_name(name).experiment_id


def git_commit(folder: Path = Path(pgt.__file__).resolve().parent.parent) -> str | None:
    """The commit the project's checkout is at (with "-dirty" when it has uncommitted changes), or None outside
    a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def source_tags(command: str) -> dict[str, str]:
    """What the UI's Source column shows: the command that made the run, and the commit it ran from."""
    tags = {"mlflow.source.name": command, "mlflow.source.type": "LOCAL"}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def split_datasets(data_dir: Path) -> list:
    """MLflow dataset inputs for the splits of a `pgt preprocess` folder: name, a digest of the file, its path,
    and as profile its rows and the preprocessing (input digest and settings) that made it."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    inputs = []
    for split, context in SPLIT_CONTEXT.items():
        path = (Path(data_dir) / f"{split}.parquet").resolve()
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
        profile = {"num_rows": pq.read_metadata(path).num_rows, "input_sha256": manifest.get("input_sha256"),
                   "input": manifest.get("input"), "preprocessing": manifest.get("config")}
        dataset = Dataset(name=f"{path.parent.name}/{split}", digest=digest.hexdigest()[:16], source_type="local",
                          source=json.dumps({"uri": path.as_uri()}), profile=json.dumps(profile, default=str))
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)]))
    return inputs


def log_datasets(tracking_uri: str, run_id: str, data_dir: Path) -> None:
    """The splits a run trained and was scored on, as the run's dataset inputs (split_datasets). Two runs that log
    the same new dataset at once race in MLflow's store (a unique key on the dataset): the loser tries again, and
    then finds the dataset the winner created."""
    from mlflow.exceptions import MlflowException

    datasets = split_datasets(data_dir)
    for attempt in range(3):
        try:
            mlflow_client(tracking_uri).log_inputs(run_id, datasets=datasets)
            return
        except MlflowException as exc:
            if "UNIQUE constraint" not in str(exc) or attempt == 2:
                raise
            time.sleep(0.2 * (attempt + 1))


class SystemMetrics:
    """MLflow's system metrics (CPU, memory, disk, network, GPU where present) sampled into a run while a
    process trains: `with SystemMetrics(tracking_uri, run_id): ...`."""

    def __init__(self, tracking_uri: str, run_id: str, interval_s: float):
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.run_id = run_id
        self.monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True,
                                            tracking_uri=tracking_uri)

    def __enter__(self) -> SystemMetrics:
        self.monitor.start()
        return self

    def __exit__(self, kind, error, traceback) -> None:
        from mlflow.exceptions import MlflowException

        self.monitor.finish()
        last = self.monitor.aggregate_metrics()  # the samples of the last, shorter window (or of a short run)
        if not last:
            return
        try:
            with uninterrupted():
                self.monitor.publish_metrics(last)
                self.monitor.mlflow_logger.flush()
        except MlflowException as exc:
            if kind is None:
                raise
            # what stopped the training is the news (a signal, a server gone): the last samples are said lost
            warnings.warn(f"the last system metrics of run {self.run_id} were not logged: "
                          f"{shorten(' '.join(str(exc).split()), 200)}", stacklevel=2)


def system_metrics(tracking: TrackingConfig | None):
    """SystemMetrics into the tracked run (at tracking.system_metrics_interval_s), or nothing untracked."""
    if tracking is None or tracking.run_id is None or not tracking.system_metrics_interval_s:
        return contextlib.nullcontext()
    return SystemMetrics(tracking.tracking_uri, tracking.run_id, tracking.system_metrics_interval_s)


def start_run(tracking: TrackingConfig, params: dict, run_name: str | None = None, tags: dict | None = None,
              parent_run_id: str | None = None) -> str:
    """Create a run, log `params` (flattened, every value as text), and return its id."""
    from mlflow.entities import Param, RunTag

    check_tracking_server(tracking.tracking_uri)
    if tracking.tracking_uri.startswith("sqlite:///"):
        open_sqlite_store(tracking.tracking_uri)  # a new store's schema, made once when runs start together
    client = mlflow_client(tracking.tracking_uri)
    all_tags = dict(tags or {})
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(experiment_id(tracking.tracking_uri, tracking.experiment), run_name=run_name,
                            tags=all_tags)
    flat = _flatten(params)
    items = [Param(k, str(v)[:6000]) for k, v in flat.items()]
    for start in range(0, len(items), 100):
        client.log_batch(run.info.run_id, params=items[start:start + 100], tags=[RunTag("pgt.kind", "train")]
                         if start == 0 and "pgt.kind" not in all_tags else [])
    return run.info.run_id


def run_status(tracking_uri: str, run_id: str) -> str | None:
    """The run's status (RUNNING, FINISHED, FAILED, KILLED), None if it is gone or deleted."""
    from mlflow.exceptions import MlflowException

    try:
        run = mlflow_client(tracking_uri).get_run(run_id)
    except MlflowException:
        return None
    return None if run.info.lifecycle_stage == "deleted" else run.info.status


def reopen_run(tracking_uri: str, run_id: str) -> bool:
    """Mark an earlier run RUNNING again (a resumed training or sweep logs into it); False if it is gone, or
    finished: a finished run is never reopened or changed by a later command."""
    from mlflow.exceptions import MlflowException

    if run_status(tracking_uri, run_id) in (None, "FINISHED"):
        return False
    try:
        mlflow_client(tracking_uri).update_run(run_id, status="RUNNING")
    except MlflowException:
        return False
    return True


def close_abandoned_run(tracking_uri: str, run_id: str) -> bool:
    """A run left RUNNING by a process that died (SIGKILL, a tracking server that went away mid-run) and that a
    new run replaces: marked FAILED. True if it was closed."""
    if run_status(tracking_uri, run_id) != "RUNNING":
        return False
    terminate_run(tracking_uri, run_id, "FAILED")
    return True


def end_run(tracking: TrackingConfig, status: str = "FINISHED") -> None:
    terminate_run(tracking.tracking_uri, tracking.run_id, status)


def terminate_run(tracking_uri: str, run_id: str, status: str) -> None:
    """The run closed with `status` (FINISHED, FAILED, KILLED), a signal meanwhile taking effect after the write."""
    with uninterrupted():
        mlflow_client(tracking_uri).set_terminated(run_id, status=status)


def server_answers(tracking_uri: str, timeout_s: float = 3.0) -> bool:
    """Whether the tracking URI answers now (always True for a local store)."""
    try:
        check_tracking_server(tracking_uri, timeout_s)
    except ValueError:
        return False
    return True


def metric_key(name: str) -> str:
    return name.replace("@", "_at_")


def metrics_of(prefix: str, metrics: dict) -> dict[str, float]:
    """`{prefix}_{metric}` for the numeric entries of a compute_all dict (n and the history splits included)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update(metrics_of(f"{prefix}_{key}", value))
        elif isinstance(value, (int, float)) and value == value:  # NaN (an empty split) is left out
            out[f"{prefix}_{metric_key(key)}"] = float(value)
    return out


class EpochLogger:
    """on_epoch callback for rank 0: train loss, learning rate, throughput and validation metrics, step = epoch."""

    def __init__(self, tracking: TrackingConfig):
        self.tracking = tracking
        self.client = mlflow_client(tracking.tracking_uri)
        # the epochs the run holds already: a resumed run sends only those it missed (logged while its tracking
        # server was away, or after the last checkpoint), so that every epoch has one value
        self.logged = {m.step for m in self.client.get_metric_history(tracking.run_id, "train_loss")}

    def backfill(self, history: list[dict]) -> None:
        """Log the epochs of a resumed run's history that the run misses."""
        for row in history:
            self(row)

    def __call__(self, row: dict, checkpoint_dir=None) -> None:
        from mlflow.entities import Metric

        if row["epoch"] in self.logged:
            return

        values = {"train_loss": row["train_loss"], "lr": row["lr"], "samples_per_second": row["samples_per_second"],
                  "epoch_seconds": row["seconds"]}
        # a refit's epochs learn from validation: their scores of it are logged apart from held-out ones
        prefix = "validation_learned_from" if row.get("learned_from_validation") else "validation"
        values |= {k: v for k, v in metrics_of(prefix, row["validation"]).items() if "history" not in k}
        now = int(time.time() * 1000)
        with uninterrupted():  # a signal takes effect once the epoch is logged and known to be
            self.client.log_batch(self.tracking.run_id,
                                  metrics=[Metric(k, float(v), now, row["epoch"]) for k, v in values.items()])
            self.logged.add(row["epoch"])


def log_result(tracking: TrackingConfig, result: dict, out_dir: Path, data_dir: Path) -> str | None:
    """After training (rank 0): test and final validation metrics, metrics.json, the manifest, the explain
    PNGs and the best checkpoint as an MLflow PyTorch model. Returns the model's URI (None if not logged)."""
    import mlflow

    client = mlflow_client(tracking.tracking_uri)
    run_id = tracking.run_id
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    # a selection run (evaluate_test off) has no test metrics; a refit's validation ones are its selection run's
    final = (metrics_of("test", result["test"]) if result["test"] is not None else {}) \
        | metrics_of("best_validation", result["validation"])
    for split, metrics in result.get("deployment", {}).items():  # inputs anchored at the last visit, as served
        final |= {k: v for k, v in metrics_of(f"deployment_{split}", metrics).items() if "history" not in k}
    final |= {"best_epoch": result["best_epoch"], "epochs_run": result["epochs_run"],
              "train_seconds": result["train_seconds"], "parameters": result["parameters"]}
    with uninterrupted():
        client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in final.items()])
    client.log_artifact(run_id, str(out_dir / "metrics.json"))
    client.log_artifact(run_id, str(Path(data_dir) / "manifest.json"), artifact_path="data")
    if not tracking.log_model or not (out_dir / "best.pt").is_file():
        return None
    from pgt.serving.explain import explain

    for png in explain(out_dir / "best.pt", data_dir, out_dir / "plots"):
        client.log_artifact(run_id, str(png), artifact_path="plots")
    use_tracking_uri(tracking.tracking_uri)
    with mlflow.start_run(run_id=run_id):
        info = log_pytorch_model(out_dir / "best.pt", data_dir)
    return info.model_uri


def log_pytorch_model(checkpoint: Path, data_dir: Path, name: str = "model"):
    """Log best.pt as a models-from-code pyfunc (`pgt/tracking/mlflow_model.py`): the weights as a state_dict, the
    model's configuration as JSON (and in the model's metadata), the training data's location and user
    tables and manifest (preprocessing config, feature sizes), the pgt package as code. Nothing is
    pickled, so it loads with MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false. With the places, the staypoints
    DBSCAN clustered and the preprocessing package, it applies the fitted preprocessing to raw GPS
    (mlflow_model.py lists the inputs it takes). The signature declares the table forms predict takes (GPS points,
    staypoints, sequences: mlflow_model.input_schema) and the `top_k` and `at` parameters; the input example is a
    known person's staypoints at the model's own places."""

    import mlflow.pyfunc
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec

    from pgt.tracking.mlflow_model import CONFIG, DATA_FILES, PLACES, USERS, VISITS, WEIGHTS, example_requests, input_schema

    model, cfg = load_checkpoint(checkpoint)
    data_dir = Path(data_dir)
    signature = ModelSignature(inputs=input_schema(pq.read_schema(data_dir / "train.parquet")), outputs=None,
                               params=ParamSchema([ParamSpec("top_k", "long", TOP_K), ParamSpec("at", "string", "")]))
    tables = [data_dir / DATA_FILES[key] for key in (PLACES, USERS)]
    examples = example_requests(*(pl.read_parquet(t) for t in tables)) if all(t.is_file() for t in tables) else []
    with tempfile.TemporaryDirectory() as tmp:
        weights, config = Path(tmp) / "weights.pt", Path(tmp) / "model_config.json"
        torch.save(model.state_dict(), weights)
        config.write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        # the visits only for a model that remembers them: the others' artifacts stay as small as they were
        data = {key: Path(data_dir) / name for key, name in DATA_FILES.items() if key != VISITS or cfg.memory_places}
        artifacts = {WEIGHTS: str(weights), CONFIG: str(config)} | {k: str(v) for k, v in data.items() if v.is_file()}
        with warnings.catch_warnings():  # a folder without places has no example to give
            warnings.filterwarnings("ignore", message=r"(?s).*An input example was not provided")
            return mlflow.pyfunc.log_model(
                name=name, python_model=str(Path(__file__).with_name("mlflow_model.py")), artifacts=artifacts,
                code_paths=[str(Path(package.__file__).parent) for package in (infra, pgt, preprocessing)],
                signature=signature, input_example=pd.DataFrame(examples[0]) if examples else None,
                metadata={"model_config": dataclasses.asdict(cfg)},
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}",
                                  *(f"{dist}=={metadata.version(dist)}" for dist in ("numpy", "pyarrow", "polars", "scikit-learn",
                                                                            "pyyaml", "pandas"))])


MODEL_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/", "file:/", "/")  # what `--model` may name


def check_model_uri(model_uri: str, tracking_uri: str | None = None) -> str:
    """The resolved tracking URI, once the model URI has a form MLflow loads (InputError naming it otherwise) and
    a tracking server it needs answers (check_tracking_server)."""
    uri = resolve_tracking_uri(tracking_uri)
    if not model_uri.startswith(MODEL_SCHEMES) and not Path(model_uri).is_dir():
        raise InputError(f"--model {model_uri}",
                         "expected an MLflow model URI (models:/NAME@ALIAS, models:/NAME/VERSION, "
                         "runs:/RUN_ID/model) or the folder of a logged model")
    if Path(model_uri).is_dir() and not (Path(model_uri) / "MLmodel").is_file():
        raise InputError(f"--model {model_uri}",
                         "a folder without an MLmodel file, so not a logged model; give the "
                         "folder that holds MLmodel (as `mlflow artifacts download` of a model writes it)")
    if model_uri.startswith(("models:/", "runs:/", "mlflow-artifacts:/")):
        check_tracking_server(uri)
        check_model_exists(model_uri, uri)
    return uri


def check_model_exists(model_uri: str, tracking_uri: str) -> None:
    """InputError in one line, saying which part is missing and how to fix it, unless the registered model and its
    alias or version, or the run and its model path, exist in the store."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    where = f"in {tracking_uri}"
    if model_uri.startswith("models:/"):
        ref = model_uri.removeprefix("models:/")
        if "@" not in ref and "/" not in ref:  # MLflow 3's models:/<model_id>: a logged model, registered or not
            try:
                client.get_logged_model(ref)
            except MlflowException:
                raise InputError(f"--model {model_uri}",
                                 f"no logged model {ref!r} {where}; choose another "
                                 "--tracking-uri, or name a registered model (models:/NAME@ALIAS)") from None
            return
        name, alias = ref.split("@", 1) if "@" in ref else (ref.rsplit("/", 1)[0], None)
        try:
            model = client.get_registered_model(name)
        except MlflowException:
            raise InputError(f"--model {model_uri}",
                             f"no registered model {name!r} {where}; `pgt train --register "
                             f"{name}` registers one, or choose another --tracking-uri") from None
        if alias is not None:
            if alias not in (model.aliases or {}):
                known = ", ".join(sorted(model.aliases or {})) or "none"
                raise InputError(f"--model {model_uri}",
                                 f"model {name!r} has no alias {alias!r} {where} (its aliases: "
                                 f"{known}); `pgt train --register {name}` sets champion on the first version")
            return
        version = ref.rsplit("/", 1)[1]
        if version.lower() == "latest":  # MLflow resolves it to the newest version, which exists if the model does
            return
        try:
            client.get_model_version(name, version)
        except MlflowException:
            raise InputError(f"--model {model_uri}", f"model {name!r} has no version {version!r} {where}") from None
    elif model_uri.startswith("runs:/"):
        run_id, _, path = model_uri.removeprefix("runs:/").partition("/")
        try:
            client.get_run(run_id)
        except MlflowException:
            raise InputError(f"--model {model_uri}", f"no run {run_id!r} {where}") from None
        if path and not client.list_artifacts(run_id, path):
            raise InputError(f"--model {model_uri}",
                             f"run {run_id} has no model at {path!r} (pgt logs it at "
                             f"runs:/{run_id}/model)")


def model_flavors(model_uri: str) -> dict:
    """A logged model's flavours, read from its MLmodel: a model folder works with any tracking store, or none
    (MLflow's get_model_info would look the folder's model id up in the current store)."""
    from mlflow.models import Model, get_model_info

    if Path(model_uri).is_dir():
        return Model.load(str(Path(model_uri) / "MLmodel")).flavors
    return get_model_info(model_uri).flavors


def load_pgt_model(model_uri: str, tracking_uri: str | None = None):
    """A logged pgt model's pyfunc wrapper (`pgt.tracking.mlflow_model.PGTModel`): `.packed` (the torch module),
    its training data's tables and `.fitted()` (the fitted preprocessing). Nothing is unpickled."""
    use_tracking_uri(check_model_uri(model_uri, tracking_uri))
    if "pytorch" in model_flavors(model_uri):
        raise InputError(model_uri, "logged before models carried their preprocessing (a pickled PyTorch model); "
                                    "train it again to score raw GPS")
    return _pyfunc_wrapper(model_uri)


def _pyfunc_wrapper(model_uri: str):
    import mlflow.pyfunc

    wrapper = mlflow.pyfunc.load_model(model_uri).unwrap_python_model()
    if getattr(wrapper, "packed", None) is None:
        raise InputError(model_uri, f"not a pgt model (its python model is {type(wrapper).__name__})")
    return wrapper


def load_model_and_manifest(model_uri: str, tracking_uri: str | None = None) -> tuple:
    """(a logged model's PackedModel, in eval mode on the CPU; the manifest.json of its training data, or None for
    a model logged before models carried it): what scoring and lineage checks need. Models logged by this
    version load without unpickling anything; those logged before it (the pickled PyTorch flavour) load only
    where MLflow allows pickle."""
    import mlflow
    use_tracking_uri(check_model_uri(model_uri, tracking_uri))
    if "pytorch" in model_flavors(model_uri):  # logged before models-from-code
        import mlflow.pytorch

        return mlflow.pytorch.load_model(model_uri, map_location="cpu").eval(), None
    wrapper = _pyfunc_wrapper(model_uri)
    return wrapper.packed, wrapper.manifest


def run_url(tracking_uri: str, run_id: str) -> str:
    """Where a person finds the run: the UI address for a server, the store URI otherwise."""
    if tracking_uri.startswith("http"):
        client = mlflow_client(tracking_uri)
        run = client.get_run(run_id)
        return f"{tracking_uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run_id}?{UI_VIEW}"
    return f"{tracking_uri} run {run_id}"


def _flatten(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else value
    return out


def model_version(tracking_uri: str, model_uri: str) -> dict | None:
    """The registered version a models:/NAME@ALIAS or models:/NAME/VERSION URI names now: {"name", "version",
    "version_uri" (models:/NAME/VERSION, which keeps naming it once the alias moves)}; None for another URI."""
    if not model_uri.startswith("models:/"):
        return None
    path = model_uri.removeprefix("models:/")
    client = mlflow_client(tracking_uri)
    if "@" in path:
        name, alias = path.split("@", 1)
        version = client.get_model_version_by_alias(name, alias).version
    else:
        name, _, version = path.partition("/")
        if not version.isdigit():
            return None
    return {"name": name, "version": int(version), "version_uri": f"models:/{name}/{version}"}


def input_dataset(path: Path, context: str = "prediction"):
    """An MLflow dataset input for a file a run read: its name, a digest of its bytes, its path and size."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    path = Path(path).resolve()
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    dataset = Dataset(name=path.name, digest=digest.hexdigest()[:16], source_type="local",
                      source=json.dumps({"uri": path.as_uri()}), profile=json.dumps({"bytes": path.stat().st_size}))
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])


def log_predictions(tracking_uri: str, model_uri: str, files: list[Path], params: dict, metrics: dict, source: str,
                    experiment: str = "pgt-predictions", input_path: Path | None = None,
                    version: dict | None = None) -> dict:
    """An MLflow run for one scoring of new data: the model URI, the registered version that answered (`version`,
    model_version's, resolved before the prediction; else resolved now) and the inputs as params, the input file
    as the run's dataset, the summary as metrics, the prediction table and map as artifacts; `source` (the flow or
    command that scored) is the run's Source, not the interpreter's entry file. Returns the run id,
    its UI address and, for a tracking server, the download address of each artifact (what a Prefect image or
    link artifact can show)."""
    import mlflow

    use_tracking_uri(tracking_uri)
    version = version or model_version(tracking_uri, model_uri)
    answered = {"model_name": version["name"], "model_version": version["version"],
                "model_version_uri": version["version_uri"]} if version else {}
    with mlflow.start_run(experiment_id=experiment_id(tracking_uri, experiment),
                          run_name=f"predict {version['version_uri'] if version else model_uri}",
                          tags=source_tags(source)) as run:
        mlflow.log_params({"model_uri": model_uri, **answered, **{k: str(v) for k, v in params.items()}})
        if version:
            mlflow.set_tag("pgt.model_version", version["version_uri"])
        if input_path is not None and Path(input_path).is_file():
            mlflow_client(tracking_uri).log_inputs(run.info.run_id, datasets=[input_dataset(input_path)])
        mlflow.log_metrics({metric_key(k): float(v) for k, v in metrics.items() if v is not None})
        for path in files:
            mlflow.log_artifact(str(path))
    run_id = run.info.run_id
    served = tracking_uri.startswith(("http://", "https://"))
    urls = {Path(p).name: f"{tracking_uri.rstrip('/')}/get-artifact?path={Path(p).name}&run_uuid={run_id}"
            for p in files} if served else {}
    return {"run_id": run_id, "run_url": run_url(tracking_uri, run_id), "artifact_urls": urls}

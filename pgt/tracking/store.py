"""Where runs are tracked: the tracking URI (a server, or SQLite in the state folder by default), and the checks
that the server, its API and its store answer before any work, each failure one line naming the fix."""

from __future__ import annotations

import base64
import fcntl
import ipaddress
import json
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from infra.errors import InputError, ServiceError, SettingsError
from infra.process import shorten
from infra.state import state_dir

# A tracking server that stops answering fails a run in seconds, not after MLflow's default of 7 retries with
# exponential backoff and 120 s a request (minutes): the run's checkpoints stay and a rerun resumes. Set at import,
# so that Ray's workers, which import this module before they log, get the same; the user's own values win.
for _name, _value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                      ("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")):
    os.environ.setdefault(_name, _value)

EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # model development, not a GenAI app


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


def check_tracking_reaches(tracking_uri: str, nodes: list[str]) -> None:
    """SettingsError, before any work, when the runs' processes on the cluster's `nodes` (their addresses) could not
    all log to `tracking_uri`: a store on one disk (SQLite, a folder) on a cluster of several nodes, or a tracking
    server on a loopback address while some node is another machine."""
    if len(nodes) <= 1:
        return
    parsed = urllib.parse.urlsplit(tracking_uri)
    fix = ("start a tracking server every node reaches (scripts/start-mlflow.sh with MLFLOW_HOST set to an address "
           "they reach, and a database and artifact store they share) and give --tracking-uri http://HOST:PORT")
    if parsed.scheme in ("", "file", "sqlite"):
        raise SettingsError(f"--tracking-uri {tracking_uri} is a store on this machine's disk, and the Ray cluster has "
                            f"{len(nodes)} nodes whose runs would each log to their own: {fix}")
    if _loopback(parsed.hostname or "") and not all(_loopback(node) for node in nodes):
        raise SettingsError(f"--tracking-uri {tracking_uri} is a loopback address, which on the Ray cluster's other "
                            f"machines ({', '.join(n for n in nodes if not _loopback(n))}) is the machine itself: {fix}")


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def server_answers(tracking_uri: str, timeout_s: float = 3.0) -> bool:
    """Whether the tracking URI answers now (always True for a local store)."""
    try:
        check_tracking_server(tracking_uri, timeout_s)
    except ValueError:
        return False
    return True

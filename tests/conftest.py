"""Shared fixtures: the real data in ../shared/data (skipped with a reason where absent, required under CI=true)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest

# Each test worker process (pytest-xdist) gets its share of the cores as its torch threads, before torch is first
# imported; its subprocesses inherit it. Two processes of two threads each on two cores leave each parallel op
# waiting for a descheduled thread: a CPU training step took 7 times as long (pgt.training.worker.default_threads).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0))
                                                     // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

# Every Ray a test starts (in this process, in the commands it runs, on the nodes of its clusters) runs its workers at
# the servers' and drivers' priority and starts them when a task needs one. Ray's defaults (workers at nice 15, as many
# started ahead as the node has CPUs) suit a machine that runs one job: on two cores shared by three test processes,
# their servers and commands, a training's workers would get CPU only when nothing else wanted it, and most workers
# started ahead would end unused (docs/benchmarks.md, The test suite on 2 cores).
TEST_RAY_ENV = {"RAY_worker_niceness": "0", "RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}
for _name, _value in TEST_RAY_ENV.items():
    os.environ.setdefault(_name, _value)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
GEOLIFE_PARQUET = SHARED_DATA / "geolife" / "geolife_positionfixes.parquet"
PLT_SAMPLE = SHARED_DATA / "geolife-plt-sample"
TRACKINTEL_STAYPOINTS = PLT_SAMPLE / "trackintel_staypoints.csv"


def _require(path: Path) -> Path:
    if path.exists():
        return path
    if os.environ.get("CI") == "true":
        pytest.fail(f"{path} is missing, but CI=true requires the shared real data")
    pytest.skip(f"real data not available: {path} is missing (it lives in ../shared/data beside the project)")


REAL_DATA_FIXTURES = {"geolife_parquet", "plt_sample", "trackintel_staypoints", "geolife_few_users", "geolife_sequences"}


# what makes a test heavy: a server, a Ray, or a process of its own (the fast tier, `make test-fast`, leaves them out)
HEAVY_FIXTURES = {"mlflow_server", "training_sequences", "shared_ray"}
HEAVY_SOURCE = re.compile(r"\bsubprocess\b|\bray_session\b|\bray\.init\b|\bray_cluster\b|\bmlflow_server\b|"
                          r"\bprefect\b|\bTorchTrainer\b|\bworkers=[2-9]|\bLaunchConfig\(workers=[1-9]|\buvicorn\b|"
                          r"\brun_sweep\b|\bdata_engine=\"ray\"|\bengine=\"ray\"")


def heavy_modules(items) -> set[Path]:
    """The test modules whose source starts a subprocess, a Ray, a server or a flow (by what it names)."""
    paths = {Path(str(item.fspath)) for item in items}
    return {path for path in paths if HEAVY_SOURCE.search(path.read_text())}


def pytest_collection_modifyitems(config, items):
    """Every test that takes a real-data fixture (directly or through another fixture) carries the real_data
    marker, so `-m real_data` / `-m "not real_data"` select by what a test needs, not by a hand-kept list. Every
    test that is slow, takes a heavy fixture or sits in a module that starts a subprocess, a Ray, a server or a flow
    carries the heavy marker: `-m "not heavy"` is the fast tier. The modules run longest first (`module_order`)."""
    heavy = heavy_modules(items)
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if REAL_DATA_FIXTURES & fixtures:
            item.add_marker(pytest.mark.real_data)
        if item.get_closest_marker("slow") or HEAVY_FIXTURES & fixtures or Path(str(item.fspath)) in heavy:
            item.add_marker(pytest.mark.heavy)
    items[:] = module_order(items, load_module_seconds(MODULE_SECONDS))


# Each test module's seconds in the last whole run (`make test-durations` writes it). `make test` hands whole modules
# to its workers in collection order (--dist loadfile --no-loadscope-reorder): the longest first, so that the last
# module given out is a short one and no worker waits minutes at the end for the other.
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")


def load_module_seconds(path: Path) -> dict[str, float]:
    import json

    return json.loads(path.read_text()) if path.is_file() else {}


def module_order(items: list, seconds: dict[str, float]) -> list:
    """The items, module by module, longest module first; a module not in `seconds` (new) counts as longest, so
    that a new slow module is never the one left for the end. Within a module the order stays as written."""
    modules = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    rank = {module: (-seconds.get(module, float("inf")), i) for i, module in enumerate(modules)}
    return sorted(items, key=lambda item: rank[item.nodeid.split("::")[0]])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """--module-seconds PATH: each module's seconds (setup, call and teardown of its tests) written as JSON."""
    target = config.getoption("module_seconds")
    if not target:
        return
    import json

    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                module = report.nodeid.split("::")[0]
                totals[module] = totals.get(module, 0.0) + report.duration
    ordered = dict(sorted(((m, round(t, 1)) for m, t in totals.items()), key=lambda kv: -kv[1]))
    Path(target).write_text(json.dumps(ordered, indent=1) + "\n")
    terminalreporter.write_line(f"module seconds of {len(ordered)} modules written to {target}")


def pytest_addoption(parser):
    parser.addoption("--module-seconds", metavar="PATH", default=None,
                     help="write each test module's seconds in this run as JSON (tests/module_seconds.json orders "
                          "the modules of later runs, longest first)")


def pytest_sessionfinish(session, exitstatus):
    """The run's servers stopped, then the safety net under every test's own cleanup: whatever this test run
    started and still runs (a subprocess of a test that was interrupted, its Ray, a flow run) is stopped, TERM then
    KILL: only processes below this one in the process tree, never another run's."""
    import signal

    stop_run_servers(session)
    left = descendant_processes(os.getpid())
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(running, left)):
        time.sleep(0.2)
    for pid in filter(running, left):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="session", autouse=True)
def isolated_state(tmp_path_factory) -> Iterator[Path]:
    """Runs tracked by tests go to a temporary state folder (MLflow's SQLite store), never to the project's .state.
    Every Ray the tests start (theirs, the Prefect worker's, the clusters') keeps its sessions in the run's own
    temp dir ($RAY_TMPDIR), apart from any other Ray on the machine."""
    state = tmp_path_factory.mktemp("state")
    ray_tmp = Path(tempfile.mkdtemp(prefix="pgt-ray-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    os.environ["PGT_STATE_DIR"] = str(state)
    os.environ["RAY_TMPDIR"] = str(ray_tmp)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    yield state
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def unchanged_tracking_uri() -> Iterator[None]:
    """A test that calls mlflow.set_tracking_uri itself (MLflow writes $MLFLOW_TRACKING_URI then) leaves no server
    behind for the next test in the same process, whose defaults read that variable."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="session")
def geolife_parquet() -> Path:
    return _require(GEOLIFE_PARQUET)


@pytest.fixture(scope="session")
def plt_sample() -> Path:
    return _require(PLT_SAMPLE)


@pytest.fixture(scope="session")
def trackintel_staypoints() -> Path:
    return _require(TRACKINTEL_STAYPOINTS)


@pytest.fixture(scope="session")
def geolife_few_users(geolife_parquet: Path, tmp_path_factory) -> Path:
    """Five real GeoLife users (ids 11, 12, 28, 71, 74) with months of tracking, as a Parquet file in the shared schema."""
    import polars as pl

    out = tmp_path_factory.mktemp("geolife") / "few_users.parquet"
    pl.scan_parquet(geolife_parquet).filter(pl.col("user_id").is_in([11, 12, 28, 71, 74])).collect().write_parquet(out)
    return out


@pytest.fixture(scope="session")
def geolife_sequences(geolife_parquet: Path, tmp_path_factory) -> Path:
    """Six real GeoLife users (3, 4, 17, 30, 85, 144) preprocessed by the reference protocol: about
    2,000 / 700 / 800 samples and 250 locations; enough for an epoch to take about a second."""
    import polars as pl

    from preprocessing.pipeline import preprocess

    root = tmp_path_factory.mktemp("geolife_six")
    points = root / "points.parquet"
    pl.scan_parquet(geolife_parquet).filter(pl.col("user_id").is_in([3, 4, 17, 30, 85, 144])).collect().write_parquet(points)
    preprocess(points, "positionfixes", root / "sequences", progress=False)
    return root / "sequences"


@pytest.fixture(scope="session")
def training_sequences(request, tmp_path_factory) -> Path:
    """What the DDP and Tune tests train on: the six GeoLife users of `geolife_sequences` where ../shared/data is
    (and always under CI=true), else the synthetic generator's 10 people over 80 days, with a warning that says so."""
    synthetic = os.environ.get("PGT_TEST_DATA") == "synthetic"  # to run the tests as they run without ../shared
    if not synthetic and (GEOLIFE_PARQUET.exists() or os.environ.get("CI") == "true"):
        return request.getfixturevalue("geolife_sequences")
    import warnings

    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes

    why = "not used (PGT_TEST_DATA=synthetic)" if synthetic else "is missing"
    warnings.warn(f"{GEOLIFE_PARQUET} {why}: the DDP and Tune tests train on synthetic sequences instead")
    root = tmp_path_factory.mktemp("synthetic_training")
    generate_positionfixes(SynthConfig(users=10, days=80, seed=7)).write_parquet(root / "points.parquet")
    preprocess(root / "points.parquet", "positionfixes", root / "sequences", progress=False)
    return root / "sequences"


# the ports a Ray node takes unless told otherwise (GCS, dashboard, Ray Client, dashboard agent): a port given to one of
# its components must not be one of these, or `ray start` refuses the clash ("is trying to use a port number 52365
# that is used by other components")
RAY_DEFAULT_PORTS = frozenset({6379, 8265, 10001, 52365})


# Ray's workers take ports 10002-19999 unless told otherwise (`ray start --min-worker-port`)
RAY_WORKER_PORTS = range(10002, 20000)
_handed_out: set[int] = set()  # the ports this process drew: a later draw never repeats one while the band lasts


def port_band() -> range:
    """The ports this test process draws from: below the kernel's ephemeral range (ip_local_port_range, where a bind
    to port 0 and every outgoing connection's own port come from) and above Ray's workers', so that nothing takes a
    drawn port before the server it is for binds it, which may be a minute later (`ray up` over SSH). Ray's dashboard
    agent binds 127.0.0.1 beside its node's own address, so a node on another loopback address still meets every
    connection of the machine there. pytest-xdist workers each get their own slice of the band."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    band = range(RAY_WORKER_PORTS.stop, low)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    share = len(band) // max(workers, 1)
    return range(band.start + worker * share, band.start + (worker + 1) * share)


def free_ports(count: int, taken: Collection[int] = ()) -> list[int]:
    """`count` different ports free on every address now, none of Ray's defaults, of `taken` (a node's ports drawn
    before) or of those this process drew before: from port_band where it has room, else any the kernel gives."""
    import random
    import socket

    band = port_band()
    if len(band) < 200:  # an ephemeral range that starts low leaves no band: the kernel's ports, raced as before
        return _kernel_ports(count, taken)
    ports: list[int] = []
    for port in random.sample(band, len(band)):
        if port in RAY_DEFAULT_PORTS or port in taken or port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            _handed_out.update(ports)
            return ports
    if not _handed_out:  # the band is busy with servers of other runs: the kernel's ports, raced as before
        return _kernel_ports(count, taken)
    _handed_out.clear()  # every port of the band was handed out once: those tests have long ended
    return free_ports(count, taken)


def _kernel_ports(count: int, taken: Collection[int]) -> list[int]:
    import socket

    with contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in RAY_DEFAULT_PORTS and port not in taken:
                ports.append(port)
        return ports


def free_port() -> int:
    return free_ports(1)[0]


def descendant_processes(pid: int) -> dict[int, str]:
    """{pid: command line} of every process below `pid` in the process tree (children, their children, ...):
    what a test started, and nothing of another run on the machine."""
    children: dict[int, list[tuple[int, str]]] = {}
    for child, parent, args in processes():
        children.setdefault(parent, []).append((child, args))
    found, todo = {}, [pid]
    while todo:
        for child, args in children.get(todo.pop(), []):
            found[child] = args
            todo.append(child)
    return found


def processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process on the machine, as `ps` lists them."""
    ps = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
    listed = []
    for line in ps.splitlines():
        fields = line.split(None, 2)
        if len(fields) >= 2:
            listed.append((int(fields[0]), int(fields[1]), fields[2] if len(fields) == 3 else ""))
    return listed


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the test process dies, even by SIGKILL (Linux PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


# the nodes of ray_cluster's clusters of more than one node (tests/cluster_rig.py's nodes take .2-.7)
MULTI_NODE_IP = "127.0.0.8"


@contextlib.contextmanager
def ray_cluster(*node_resources: str, timeout_s: float = 120, num_cpus: int = 1,
                dashboard: bool = False) -> Iterator[tuple[str, dict]]:
    """A Ray cluster on loopback: one `ray start --block` node per entry of `node_resources` (a JSON string of
    custom resources; `num_cpus` CPUs each), the first the head, with its dashboard (the State API that Ray Train
    polls) if `dashboard`. Yields (head address, environment to reach it). Every port the head listens on is a
    free one, so that two test processes' clusters never meet on a default port.

    A lone head runs in Ray's single-node mode on 127.0.0.1 (as prepare_ray_env sets it for a local Ray), which
    binds its ports to 127.0.0.1. Nodes that join a head need that mode off, and Ray then rewrites 127.0.0.1 (and
    localhost) into the machine's network address, which the nodes would advertise and reach each other by; so
    their nodes take MULTI_NODE_IP, a loopback address Ray keeps as given (its GCS and raylets then listen on every
    interface, as for any node not on 127.0.0.1, but nothing reaches them other than on loopback).

    The cluster has its own temp dir ($RAY_TMPDIR), so it never becomes the machine's "current cluster"
    that a bare ray.init() would join. Stopping it terminates its own `ray start` processes, whose Ray
    processes die with them: never `ray stop`, which stops every Ray on the machine, other runs' included.
    A killed test run leaves nothing behind either (the nodes die with this process)."""
    tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": str(tmp)}
    if len(node_resources) == 1:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        ip = "127.0.0.1"
    else:
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        ip = MULTI_NODE_IP
    port, client_port, dashboard_port, agent_port = free_ports(4)
    ray = str(Path(sys.executable).with_name("ray"))
    common = ["--block", "--num-cpus", str(num_cpus), "--disable-usage-stats", "--node-ip-address", ip]
    shown = (["--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port)] if dashboard
             else ["--include-dashboard", "false"])
    nodes: list[subprocess.Popen] = []
    try:
        for i, resources in enumerate(node_resources):
            head = ["--head", "--port", str(port), "--ray-client-server-port", str(client_port),
                    "--dashboard-agent-listen-port", str(agent_port), *shown]
            role = head if i == 0 else ["--address", f"{ip}:{port}"]
            log = tmp / f"node{i}.log"
            with log.open("w") as fh:
                nodes.append(subprocess.Popen([ray, "start", *role, "--resources", resources, *common], env=env, stdout=fh,
                                              stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))
            deadline = time.monotonic() + timeout_s
            while "block forever" not in log.read_text():  # printed once the node has joined
                if nodes[-1].poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"ray start of node {i} failed: {log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield f"{ip}:{port}", env
    finally:
        # every process of the nodes, as they are now: the raylet's agents rename themselves (ray::DashboardAgent),
        # so the temp dir no longer names them, and they outlive a raylet that died before them
        started = {pid: args for node in nodes for pid, args in descendant_processes(node.pid).items()}
        for node in reversed(nodes):
            node.terminate()
        deadline = time.monotonic() + 10  # a node that ran jobs took 30 s to stop its idle workers one by one
        for node in nodes:
            try:
                node.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
        kill_processes_naming(tmp)  # what the nodes started and left behind: each process names the cluster's dir
        kill_processes(started)
        shutil.rmtree(tmp, ignore_errors=True)


def kill_processes(started: dict[int, str]) -> None:
    """SIGKILL those of `started` ({pid: command line}) that still run with the same command line."""
    _kill_where(lambda pid, args: started.get(pid) == args)


def kill_processes_naming(folder: Path) -> None:
    """SIGKILL every process whose command line names `folder` (a Ray cluster's own temp dir: its raylet, GCS,
    dashboard and workers), nothing else."""
    _kill_where(lambda pid, args: str(folder) in args)


def _kill_where(chosen: Callable[[int, str], bool]) -> None:
    """SIGKILL every process but this one for which chosen(pid, command line) holds."""
    import signal

    for pid, _, args in processes():
        if chosen(pid, args) and pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[str]:
    """One Ray per test process, started the first time a test asks for it: a head node on 127.0.0.1 with 3 CPUs
    (two trials or two training workers, and one for Ray Data's reads) and its dashboard. Its address."""
    with ray_cluster("{}", num_cpus=3, dashboard=True) as (address, _env):
        yield address


@pytest.fixture
def on_shared_ray(shared_ray: str, monkeypatch) -> str:
    """$RAY_ADDRESS names the shared Ray for the test: the commands it starts in subprocesses join it instead of
    starting a Ray of their own (about 10 s each on 2 busy cores). For the tests that need "a Ray" in a command
    they run; those about starting or joining one start their own. A process joins a single-node head only with
    the same switch set before it imports ray (Ray reads it once, at import): so never this process, which may
    have imported ray already."""
    from infra.ray_session import PREEMPTION_WATCHER

    monkeypatch.setenv("RAY_ADDRESS", shared_ray)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv(PREEMPTION_WATCHER, "0")  # a local Ray's setting (prepare_ray_env): its one node is this machine
    return shared_ray


def run_folder(tmp_path_factory) -> Path:
    """The folder every test process of this run shares: pytest-xdist gives each worker a temp root inside its
    controller's (`<run>/popen-gw0`); without xdist, the one process's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(name: str, tmp_path_factory, make: Callable[[Path], dict]) -> dict:
    """What `make(folder)` returned (JSON), made in `<run folder>/name` by the first test process of the run that
    asks, under a lock the others wait on, and read back by them. A make that fails leaves nothing: the next test
    that asks tries again (and fails as visibly)."""
    import fcntl
    import json

    folder = run_folder(tmp_path_factory) / name
    with (run_folder(tmp_path_factory) / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = folder / "made.json"
        if made.is_file():
            return json.loads(made.read_text())
        shutil.rmtree(folder, ignore_errors=True)  # what a failed make left
        folder.mkdir()
        value = make(folder)
        made.write_text(json.dumps(value))
        return value


MLFLOW_SERVER = "mlflow_server"  # its run folder: the server's state folder
S3_SERVER = "s3_server"
RUN_SERVERS = {MLFLOW_SERVER: "stop-mlflow.sh", S3_SERVER: "stop-s3.sh"}  # run folder -> the script that stops it


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> str:
    """A real MLflow tracking server (SQLite, local artifacts, 127.0.0.1), one per test run: started by the project's
    script in the first test process that needs it, shared by the others, stopped by the project's script when
    the run ends (`stop_run_servers`). Tests keep apart by their own experiment and model names."""
    return made_once(MLFLOW_SERVER, tmp_path_factory, start_mlflow_server)["uri"]


def start_mlflow_server(state: Path) -> dict:
    return {"uri": start_run_server("start-mlflow.sh", "MLFLOW_PORT", state, timeout_s=180)}


def start_run_server(script: str, port_variable: str, state: Path, timeout_s: float) -> str:
    """scripts/<script> run with its state in `state` and a free port in `port_variable`; its address on 127.0.0.1."""
    env = {**os.environ, "PGT_STATE_DIR": str(state), port_variable: str(free_port())}
    started = subprocess.run([PROJECT_ROOT / "scripts" / script], env=env, capture_output=True, text=True,
                             timeout=timeout_s)
    assert started.returncode == 0, started.stderr
    return f"http://127.0.0.1:{env[port_variable]}"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> str:
    """A real S3-compatible object store (moto's server, 127.0.0.1), one per test run, started and stopped by the
    project's scripts as the MLflow server is; its address as http://HOST:PORT. Tests keep apart by bucket."""
    return made_once(S3_SERVER, tmp_path_factory, start_s3_server)["url"]


@pytest.fixture
def credentials(monkeypatch):
    """What a user sets for an S3-compatible store (moto takes any key)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def start_s3_server(state: Path) -> dict:
    return {"url": start_run_server("start-s3.sh", "S3_PORT", state, timeout_s=60)}


def stop_run_servers(session) -> None:
    """The run's servers that a test started, stopped by the project's scripts: in the process that started the
    workers (or the only one), after every worker is done with them. A server that does not stop fails the run."""
    if hasattr(session.config, "workerinput"):
        return
    for name, script in RUN_SERVERS.items():
        state = session.config._tmp_path_factory.getbasetemp() / name
        if not (state / "made.json").is_file():
            continue
        stopped = subprocess.run([PROJECT_ROOT / "scripts" / script], env={**os.environ, "PGT_STATE_DIR": str(state)},
                                 capture_output=True, text=True, timeout=120)
        if stopped.returncode != 0 or "stopped" not in stopped.stdout:
            sys.stderr.write(f"{script} did not stop the test run's server: {stopped.stdout}{stopped.stderr}\n")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def split_days(points, fraction: float = 0.8):
    """(early, late): each user's GPS points before and from `fraction` of the user's days (the 80/20 split of
    the fitted-pipeline tests). `points` is a polars frame with user_id and tracked_at."""
    import polars as pl

    day = (pl.col("tracked_at").dt.date() - pl.col("tracked_at").dt.date().min().over("user_id")).dt.total_days()
    cut = day.max().over("user_id") * fraction
    return points.filter(day < cut), points.filter(day >= cut)


def place_agreement(full_dir, fitted_dir, applied_dir) -> tuple[int, int]:
    """(agreeing, compared) for the later period's staypoints at places that a whole-data run and the
    fitted run share: the applied run's place, mapped to the whole-data run by the fitted period's
    staypoints, equals the whole-data run's place. Staypoints are matched by (user_id, started_at)."""
    import polars as pl

    key = ["user_id", "started_at"]
    full = pl.read_parquet(full_dir / "staypoints.parquet").select(*key, pl.col("location_id").alias("full_id"))
    early = pl.read_parquet(fitted_dir / "staypoints.parquet").select(*key, "location_id").join(full, on=key)
    mapping = early.group_by("location_id").agg(pl.col("full_id").mode().first().alias("mapped"))
    late = pl.read_parquet(applied_dir / "staypoints.parquet").select(*key, "location_id").join(full, on=key)
    shared = late.filter(pl.col("full_id").is_in(early["full_id"].implode()))
    joined = shared.join(mapping, on="location_id", how="left")
    return int((joined["mapped"] == joined["full_id"]).fill_null(False).sum()), joined.height

"""Two Ray nodes on one machine that share nothing but loopback, for tests/test_cluster.py and
benchmarks/cluster.py: each node is `ray start --block` in its own mount namespace (`unshare --mount`, which needs
root) with private tmpfs over /tmp and /dev/shm, a folder of the caller's bind-mounted at SHARED on each (the NFS
case); the head (127.0.0.2) runs no work and serves the Jobs API, the worker (127.0.0.3) has the CPUs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import PROJECT_ROOT, free_port

HEAD, WORKER, TRACKING_HOST = "127.0.0.2", "127.0.0.3", "127.0.0.4"
BIN = Path(sys.executable).parent
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def unshare_refused() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare command"
    tried = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    return None if tried.returncode == 0 else f"unshare --mount is refused here ({tried.stderr.strip()})"


SHARED = Path("/mnt")  # where each node mounts the folder they share (the NFS case), in its own namespace


def node_command(ray_args: list[str], shared: Path) -> list[str]:
    """`ray start --block` in a mount namespace of its own, with private /tmp and /dev/shm, and `shared` (a folder
    of the laptop's) bind-mounted at SHARED: a mount every node has at one path, as NFS would be."""
    script = (f'set -e; mount --bind "{shared}" {SHARED}; mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /dev/shm; '
              f'exec "{BIN / "ray"}" start --block --disable-usage-stats "$@"')
    return ["unshare", "--mount", "--propagation", "private", "bash", "-c", script, "node", *ray_args]


class Cluster:
    """Two isolated Ray nodes, started and stopped by the test; `submit` runs a command as a Ray Job."""

    def __init__(self, env: dict, shared: Path):
        self.env, self.shared = env, shared
        self.port, self.dashboard_port = free_port(), free_port()
        self.dashboard = f"http://{HEAD}:{self.dashboard_port}"
        self.nodes: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, ray_args: list[str]) -> None:
        log = open(self.env["PGT_TEST_LOGS"] + f"/{name}.log", "ab")
        self.nodes[name] = subprocess.Popen(node_command(ray_args, self.shared), env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def start_node(self, name: str, ray_args: list[str]) -> None:
        # every port a node listens on is a free one: another Ray of this machine (another test process's) holds
        # the defaults, and a dashboard agent without its port leaves the head with no agent to run jobs
        ports = ["--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
                 "--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port())]
        self._start(name, [*ray_args, *ports])

    def start(self, head_cpus: int = 0, worker: bool = True) -> None:
        """The head (no CPUs for work by default, as KubeRay advises) and the worker; `worker` False: the head
        alone, with `head_cpus` (one node)."""
        self.start_node("head", ["--head", "--node-ip-address", HEAD, "--port", str(self.port), "--num-cpus", str(head_cpus),
                                 "--include-dashboard", "true", "--dashboard-host", HEAD,
                                 "--dashboard-port", str(self.dashboard_port),
                                 "--ray-client-server-port", str(free_port())])
        self.wait_for_nodes(1)
        if worker:
            self.start_worker()
        else:
            self.wait_for_jobs()

    def start_worker(self) -> None:
        self.start_node("worker", ["--address", f"{HEAD}:{self.port}", "--node-ip-address", WORKER, "--num-cpus", "2"])
        self.wait_for_nodes(2)
        self.wait_for_jobs()

    def wait_for_jobs(self, timeout_s: float = 120) -> None:
        """Until the head's job agent runs a job (it starts after the node registers: a submission meanwhile is
        answered "No available agent")."""
        from ray.job_submission import JobSubmissionClient

        client, deadline = JobSubmissionClient(self.dashboard), time.monotonic() + timeout_s
        while True:
            try:
                job = client.submit_job(entrypoint="true")
                break
            except RuntimeError as exc:
                assert "No available agent" in str(exc) and time.monotonic() < deadline, str(exc)
                time.sleep(1)
        while not client.get_job_status(job).is_terminal():
            assert time.monotonic() < deadline, f"the probe job did not end within {timeout_s} s"
            time.sleep(0.5)

    def alive_nodes(self) -> list[dict]:
        from ray.util.state import list_nodes

        try:
            return [n for n in list_nodes(address=self.dashboard, raise_on_missing_output=False)
                    if n.state == "ALIVE"]
        except Exception:  # noqa: BLE001 - the dashboard is not up yet
            return []

    def wait_for_nodes(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.alive_nodes()) < count:
            for name, proc in self.nodes.items():
                assert proc.poll() is None, f"the {name} node ended: {self.log(name)[-3000:]}"
            assert time.monotonic() < deadline, f"{count} node(s) not alive within {timeout_s} s"
            time.sleep(1)

    def log(self, name: str) -> str:
        return Path(self.env["PGT_TEST_LOGS"], f"{name}.log").read_text(errors="replace")

    def submit(self, *command: str, env_vars: dict | None = None, timeout_s: float = 600) -> tuple[str, str]:
        """Run `command` as a Ray Job (`ray job submit`, which waits and streams its logs); its status and logs."""
        job = f"pgt-{time.monotonic_ns()}"
        runtime = {"env_vars": {**KEYS, **(env_vars or {})}}
        done = subprocess.run([BIN / "ray", "job", "submit", "--address", self.dashboard, "--submission-id", job,
                               "--runtime-env-json", json.dumps(runtime), "--", *command],
                              env=self.env, capture_output=True, text=True, timeout=timeout_s)
        return self.status(job), done.stdout + done.stderr

    def status(self, job: str) -> str:
        from ray.job_submission import JobSubmissionClient

        return str(JobSubmissionClient(self.dashboard).get_job_status(job).value)

    def actors_by_node(self, class_name: str) -> dict[str, int]:
        """Where the actors of a class ran (alive or not), as node address -> count, from Ray's State API."""
        from ray.util.state import list_actors, list_nodes

        address = {n.node_id: n.node_ip for n in list_nodes(address=self.dashboard, raise_on_missing_output=False)}
        counts: dict[str, int] = {}
        for actor in list_actors(address=self.dashboard, filters=[("class_name", "=", class_name)], detail=True,
                                 limit=1000, raise_on_missing_output=False):
            node = address.get(actor.node_id, "?")
            counts[node] = counts.get(node, 0) + 1
        return counts

    def stop(self) -> None:
        for proc in reversed(list(self.nodes.values())):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5  # `ray start --block` takes more than 10 s to end on SIGTERM; its node's
        for proc in self.nodes.values():  # files are on tmpfs mounts that go with its namespace
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)




def require_isolated_nodes() -> None:
    """For a script (a benchmark): SystemExit in one line where the nodes cannot be isolated; this process's Ray
    clients without token authentication, as the nodes (loopback addresses only)."""
    refused = unshare_refused()
    if refused:
        raise SystemExit(f"error: the isolated nodes need `unshare --mount` (root): {refused}")
    os.environ["RAY_AUTH_MODE"] = "disabled"


def cluster_env(logs: Path) -> dict:
    """The nodes' environment: this one's, with the storage keys and the virtualenv's commands, and none of this
    process's own Ray switches (prepare_ray_env's single-node mode refuses a second node), state folder or tracking
    store: the nodes are other machines."""
    env = {**os.environ, **KEYS, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PGT_TEST_LOGS": str(logs),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}  # loopback addresses only
    for name in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_enable_metrics_collection", "PGT_STATE_DIR",
                 "MLFLOW_TRACKING_URI", "VIRTUAL_ENV_PROMPT"):
        env.pop(name, None)
    return env


def start_tracking_server(state: Path) -> tuple[str, dict]:
    """scripts/start-mlflow.sh bound to TRACKING_HOST, artifacts proxied: (its URI, the environment that stops it
    with scripts/stop-mlflow.sh)."""
    env = {**os.environ, "PGT_STATE_DIR": str(state), "MLFLOW_PORT": str(free_port()), "MLFLOW_HOST": TRACKING_HOST}
    started = subprocess.run([PROJECT_ROOT / "scripts" / "start-mlflow.sh"], env=env, capture_output=True, text=True,
                             timeout=180)
    if started.returncode != 0:
        raise RuntimeError(f"start-mlflow.sh failed: {started.stdout + started.stderr}")
    return f"http://{TRACKING_HOST}:{env['MLFLOW_PORT']}", env


def stop_tracking_server(env: dict) -> None:
    subprocess.run([PROJECT_ROOT / "scripts" / "stop-mlflow.sh"], env=env, capture_output=True, timeout=120)

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

from infra.ray_session import PREEMPTION_WATCHER
from tests.conftest import PROJECT_ROOT, TEST_RAY_ENV, free_port, free_ports

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


def node_ray_log(pid: int, name: str, temp_dir: str = "/tmp") -> str:
    """Log `name` of the Ray session of the node whose namespace holds process `pid` (Ray's sessions under
    `temp_dir`, its RAY_TMPDIR): its /tmp is private, so read through the namespace's root (/proc/PID/root), where
    session_latest's absolute link is followed by hand."""
    root = Path(f"/proc/{pid}/root")
    session = os.readlink(root / Path(temp_dir).relative_to("/") / "ray" / "session_latest")
    return (root / Path(session).relative_to("/") / "logs" / name).read_text(errors="replace")


def alive_nodes(dashboard: str) -> list:
    """The cluster's live nodes, from Ray's State API at `dashboard` (none while it does not answer)."""
    from ray.util.state import list_nodes

    try:
        return [n for n in list_nodes(address=dashboard, raise_on_missing_output=False) if n.state == "ALIVE"]
    except Exception:  # noqa: BLE001 - the dashboard is not up (or no longer)
        return []


def actors_by_node(dashboard: str, class_name: str) -> dict[str, int]:
    """Where the actors of a class ran (alive or not), as node address -> count, from Ray's State API."""
    from ray.util.state import list_actors, list_nodes

    address = {n.node_id: n.node_ip for n in list_nodes(address=dashboard, raise_on_missing_output=False)}
    counts: dict[str, int] = {}
    for actor in list_actors(address=dashboard, filters=[("class_name", "=", class_name)], detail=True, limit=1000,
                             raise_on_missing_output=False):
        node = address.get(actor.node_id, "?")
        counts[node] = counts.get(node, 0) + 1
    return counts


# how many times the worker node is started before a test gives up on it, and the pause between two starts: Ray
# gives a node's raylet 30 s to register with the GCS, which a restart beside two other test processes' load has
# missed twice in a row (alone it takes about 3 s)
WORKER_STARTS, WORKER_START_PAUSE_S = 4, 10


class Cluster:
    """Two isolated Ray nodes, started and stopped by the test; `submit` runs a command as a Ray Job."""

    def __init__(self, env: dict, shared: Path):
        self.env, self.shared = env, shared
        self.port, self.dashboard_port, self.client_port = free_ports(3)
        self.dashboard = f"http://{HEAD}:{self.dashboard_port}"
        self.nodes: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, ray_args: list[str]) -> None:
        log = open(self.env["PGT_TEST_LOGS"] + f"/{name}.log", "ab")
        self.nodes[name] = subprocess.Popen(node_command(ray_args, self.shared), env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def start_node(self, name: str, ray_args: list[str], agent_port: int | None = None) -> None:
        # every port a node listens on is a free one: another Ray of this machine (another test process's) holds
        # the defaults, and a dashboard agent without its port leaves the head with no agent to run jobs
        agent, agent_grpc, metrics, runtime_env = free_ports(4, taken=(self.port, self.dashboard_port, self.client_port))
        agent = agent_port or agent
        ports = ["--dashboard-agent-listen-port", str(agent), "--dashboard-agent-grpc-port", str(agent_grpc),
                 "--metrics-export-port", str(metrics), "--runtime-env-agent-port", str(runtime_env)]
        self._start(name, [*ray_args, *ports])

    def start(self, head_cpus: int = 0, worker: bool = True) -> None:
        """The head (no CPUs for work by default, as KubeRay advises) and the worker; `worker` False: the head
        alone, with `head_cpus` (one node)."""
        self.start_head(head_cpus)
        self.wait_for_nodes(1)
        if worker:
            self.start_worker()
        else:
            self.wait_for_jobs()

    def start_head(self, cpus: int, agent_port: int | None = None) -> None:
        """The head node, serving the Jobs API on its dashboard; its dashboard agent on `agent_port` where given."""
        self.start_node("head", ["--head", "--node-ip-address", HEAD, "--port", str(self.port), "--num-cpus", str(cpus),
                                 "--include-dashboard", "true", "--dashboard-host", HEAD,
                                 "--dashboard-port", str(self.dashboard_port),
                                 "--ray-client-server-port", str(self.client_port)], agent_port)

    def ray_log(self, name: str, log: str) -> str:
        return node_ray_log(self.nodes[name].pid, log, self.env.get("RAY_TMPDIR", "/tmp"))

    def start_worker(self) -> None:
        """The worker node, joined to the head; started again (up to WORKER_STARTS times in all) if it ends before it
        registers, as an operator would restart it: Ray gives a node's raylet 30 s to register, and a worker
        restarted beside the other test processes' load has taken longer ("The current node timed out during
        startup"), which left the cluster without CPUs for every test after it. Waits for this start's own "Ray
        runtime started": right after a node is killed the GCS still counts it alive, so the number of alive nodes
        says nothing yet."""
        for attempt in range(1, WORKER_STARTS + 1):
            began = len(self.log("worker")) if "worker" in self.nodes else 0
            self.start_node("worker", ["--address", f"{HEAD}:{self.port}", "--node-ip-address", WORKER,
                                       "--num-cpus", "2"])
            if self.wait_started("worker", began):
                break
            assert attempt < WORKER_STARTS, (f"the worker node ended {WORKER_STARTS} times before it registered: "
                                             f"{self.log('worker')[-3000:]}")
            print(f"the worker node ended before it registered; starting it again:\n{self.log('worker')[began:][-2000:]}")
            time.sleep(WORKER_START_PAUSE_S)
        self.wait_for_nodes(2)
        self.wait_for_jobs()

    def wait_started(self, name: str, began: int, timeout_s: float = 120) -> bool:
        """True once node `name` says it started (its log past offset `began`), False if it ends first or says it
        timed out (its `ray start` may linger after saying so)."""
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in (since := self.log(name)[began:]):
            if self.nodes[name].poll() is not None or "timed out during startup" in since:
                self.kill_node(name)
                return False
            assert time.monotonic() < deadline, f"the {name} node did not start within {timeout_s} s"
            time.sleep(0.5)
        return True

    def tidy(self) -> None:
        """What a test leaves for the next one: every job it left running stopped (a failed test's job would hold
        the worker's CPUs for the rest of the module), and the worker node started again if it is gone."""
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(self.dashboard)
        running = [job.submission_id for job in client.list_jobs() if not job.status.is_terminal()]
        for job in running:
            client.stop_job(job)
        deadline = time.monotonic() + 60
        while running and time.monotonic() < deadline:
            running = [job for job in running if not client.get_job_status(job).is_terminal()]
            time.sleep(0.5)
        if self.nodes["worker"].poll() is not None or WORKER not in {n.node_ip for n in self.alive_nodes()}:
            self.kill_node("worker")
            self.start_worker()

    def kill_node(self, name: str) -> None:
        """SIGKILL to every process of node `name` (its raylet, workers and agents), as a lost machine; nothing if
        it has ended."""
        if self.nodes[name].poll() is None:
            os.killpg(self.nodes[name].pid, signal.SIGKILL)
            self.nodes[name].wait(timeout=30)

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

    def alive_nodes(self) -> list:
        return alive_nodes(self.dashboard)

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
        return actors_by_node(self.dashboard, class_name)

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




# other addresses than the `ray start` nodes': both may run; BARE: a machine without the project
RAY_UP_HEAD, RAY_UP_WORKER, RAY_UP_BARE = "127.0.0.5", "127.0.0.6", "127.0.0.7"


def ssh_refused() -> str | None:
    """Why `ray up` cannot reach nodes over SSH here (None: it can): it needs an sshd per node on port 22 of its
    address, and Ray's command runner calls ssh and rsync."""
    missing = [name for name in ("sshd", "ssh", "ssh-keygen", "rsync")
               if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if missing:
        return f"no {', '.join(missing)} (Debian's openssh-server and rsync: scripts/install-system-packages.sh)"
    taken = [a for a in (RAY_UP_HEAD, RAY_UP_WORKER, RAY_UP_BARE) if port_answers(a, 22)]
    if taken:
        return f"port 22 of {', '.join(taken)} is taken (an SSH server of this machine on every address?)"
    return unshare_refused()


# One machine of a team's, as `ray up` sees it: an sshd on its own address, in mount and PID namespaces of its own
# (so `ray stop`, which ends every Ray process it can see, ends only this node's), with private /tmp, /dev/shm and
# /run, and a home of its own in /tmp (root's entry in a private view of /etc/passwd) whose .bashrc puts the
# project's virtualenv on the PATH, as a node's image would.
SSH_NODE_SCRIPT = r"""set -e
address="$1" config="$2"
mount -t proc proc /proc
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -m 755 /run/sshd
mkdir -m 700 /run/node
cp "$config"/host_key "$config"/authorized_keys "$config"/sshd_config "$config"/bashrc /run/node/
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm
mkdir -m 700 /tmp/home
cp /run/node/bashrc /tmp/home/.bashrc
sed 's#^root:\([^:]*\):0:0:\([^:]*\):[^:]*:#root:\1:0:0:\2:/tmp/home:#' /etc/passwd > /run/node/passwd
mount --bind /run/node/passwd /etc/passwd
exec "$(command -v sshd || echo /usr/sbin/sshd)" -D -e -f /run/node/sshd_config -o ListenAddress="$address"
"""


class SshNodes:
    """Machines for `ray up`'s local provider: one sshd per address (port 22), logged into as root with a key of
    the test's; `key` is the private key `ray up` is given. `project_installed` False: the login shell's PATH lacks
    the project's virtualenv, as a machine where it was never installed."""

    def __init__(self, folder: Path, addresses: list[str], logs: Path, project_installed: bool = True):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.addresses, self.logs = folder, addresses, logs
        self.key = folder / "key"
        self.procs: list[subprocess.Popen] = []
        for name in ("key", "host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", folder / name], check=True)
        shutil.copy(folder / "key.pub", folder / "authorized_keys")
        (folder / "sshd_config").write_text(
            "Port 22\nHostKey /run/node/host_key\nAuthorizedKeysFile /run/node/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nPidFile none\n")
        path = f'"{BIN}:$PATH"' if project_installed else '"$PATH"'  # not installed: neither pgt nor ray is found
        ray_env = " ".join(f"{name}={value}" for name, value in TEST_RAY_ENV.items())
        (folder / "bashrc").write_text(f"export PATH={path} RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 {ray_env}\n")

    def start(self, timeout_s: float = 20) -> None:
        """Each node's sshd, answering on its address's port 22; an error first where something else answers there
        (an sshd of the machine's own, on every address), which `ray up` would reach instead."""
        for address in self.addresses:
            if port_answers(address, 22):
                raise RuntimeError(f"port 22 of {address} is taken (an SSH server of this machine on every address?)")
        for address in self.addresses:
            with open(self.logs / f"sshd-{address}.log", "ab") as log:
                self.procs.append(subprocess.Popen(
                    ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "bash", "-c",
                     SSH_NODE_SCRIPT, "node", address, str(self.folder)], stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))
        deadline = time.monotonic() + timeout_s
        for address, proc in zip(self.addresses, self.procs):
            while not port_answers(address, 22):
                assert proc.poll() is None, (self.logs / f"sshd-{address}.log").read_text()[-2000:]
                assert time.monotonic() < deadline, f"no sshd on {address}:22 within {timeout_s} s"
                time.sleep(0.2)

    def ray_log(self, address: str, name: str, tail_chars: int = 3000) -> str:
        """The end of log `name` of the Ray session on the node at `address` (its /tmp/ray, private to the node:
        read through its namespace's root), or why there is none."""
        try:
            return f"{address}'s {name}: {node_ray_log(self.procs[self.addresses.index(address)].pid, name)[-tail_chars:]}"
        except OSError as exc:
            return f"no {name} on {address}: {exc}"

    def stop(self) -> None:
        """Ends each node's namespace (its sshd is the namespace's first process: every Ray process of the node
        goes with it)."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)


def port_answers(address: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((address, port), timeout=1).close()
        return True
    except OSError:
        return False


def replaced(command: str, old: str, new: str) -> str:
    """`command` with `old` replaced by `new`; an error where `old` is not in it (deploy/ray-cluster.yaml changed
    under the test)."""
    if old not in command:
        raise AssertionError(f"deploy/ray-cluster.yaml's command no longer holds {old!r}: {command}")
    return command.replace(old, new)


def ray_up_config(template: dict, nodes: SshNodes, name: str) -> tuple[dict, str]:
    """deploy/ray-cluster.yaml for `nodes`: their addresses, the test's key and user, free ports and loopback
    addresses for everything Ray listens on (another Ray of this machine holds the defaults); the rest as the file
    has it. Also the head's dashboard address (the Jobs API)."""
    import getpass

    config = json.loads(json.dumps(template))
    head, *workers = nodes.addresses
    gcs, dashboard, client = free_ports(3)

    def ports() -> str:
        agent, agent_grpc, metrics, runtime_env = free_ports(4, taken=(gcs, dashboard, client))
        return (f" --dashboard-agent-listen-port={agent} --dashboard-agent-grpc-port={agent_grpc}"
                f" --metrics-export-port={metrics} --runtime-env-agent-port={runtime_env}")

    config["cluster_name"] = name
    config["provider"].update(head_ip=head, worker_ips=workers)
    config["auth"] = {"ssh_user": getpass.getuser(), "ssh_private_key": str(nodes.key)}
    start_head = config["head_start_ray_commands"][-1]
    for old, new in (("--port=6379", f"--port={gcs}"), ("--dashboard-host=0.0.0.0", f"--dashboard-host={head}"),
                     ("--dashboard-port=8265", f"--dashboard-port={dashboard}")):
        start_head = replaced(start_head, old, new)
    config["head_start_ray_commands"][-1] = (f"{start_head} --node-ip-address={head} "
                                             f"--ray-client-server-port={client}{ports()}")
    # a worker names the address the head reached it on (Ray would pick 127.0.0.1, loopback's own, for every node)
    config["worker_start_ray_commands"][-1] = (
        replaced(config["worker_start_ray_commands"][-1], "$RAY_HEAD_IP:6379", f"$RAY_HEAD_IP:{gcs}")
        + " --node-ip-address=$(echo $SSH_CONNECTION | cut -d' ' -f3)" + ports())
    return config, f"http://{head}:{dashboard}"


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
    for name in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_enable_metrics_collection", PREEMPTION_WATCHER,
                 "PGT_STATE_DIR", "MLFLOW_TRACKING_URI", "VIRTUAL_ENV_PROMPT"):
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

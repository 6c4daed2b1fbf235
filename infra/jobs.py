"""A `pgt` command run on a Ray cluster as a Ray Job, followed from the machine that submitted it: its logs reach
this terminal as they come, its status decides the exit code, and Ctrl+C (or SIGTERM, SIGHUP) stops the job, where
`ray job submit` would only stop following it.

The job runs `pgt ARGS` on the head node, with the project installed there; the driver joins the cluster through the
`RAY_ADDRESS` Ray gives it. The credentials and endpoints set here (FORWARDED) travel with the job as its runtime
environment's variables, so that the head and the workers reach the same storage and tracking server.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from dataclasses import dataclass

import requests

from infra.errors import ServiceError, SettingsError
from infra.process import shorten

# what a job needs of this machine's environment to reach the same storage and tracking server
FORWARDED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION",
             "AWS_REGION", "GOOGLE_APPLICATION_CREDENTIALS", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
             "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 130}
STOP_WAIT_S = 60  # how long a stopped job may take to end before the command gives up waiting
SUBMIT_WAIT_S = 60  # how long a head that has just started may take to accept jobs


@dataclass
class JobOutcome:
    job_id: str
    status: str  # Ray's final JobStatus: SUCCEEDED, FAILED or STOPPED

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.status, 1)


def job_environment(given: list[str]) -> dict[str, str]:
    """The job's variables: FORWARDED where set here, then each NAME=VALUE given (SettingsError for another form)."""
    env = {name: os.environ[name] for name in FORWARDED if os.environ.get(name)}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not name or not name.replace("_", "").isalnum():
            raise SettingsError(f"--env {item}: expected NAME=VALUE")
        env[name] = value
    return env


def connect(cluster: str, timeout_s: float = 5.0):
    """Ray's JobSubmissionClient for the dashboard at `cluster` (http://HEAD:8265); ServiceError in seconds when
    nothing answers there."""
    from ray.job_submission import JobSubmissionClient

    if not cluster.startswith(("http://", "https://")):
        raise SettingsError(f"--cluster {cluster}: expected the head's dashboard address, http://HEAD:8265")
    try:
        requests.get(f"{cluster.rstrip('/')}/api/version", timeout=timeout_s).raise_for_status()
    except requests.RequestException as exc:
        raise ServiceError(f"Ray cluster at {cluster}: its Jobs API does not answer ({type(exc).__name__}); start the "
                           "head with `ray start --head --include-dashboard true --dashboard-host ADDRESS`") from None
    return JobSubmissionClient(cluster)


def run_job(cluster: str, args: list[str], env: dict[str, str], write=print) -> JobOutcome:
    """Submit `pgt ARGS`, print its logs as they come, and return its final status. An interrupt (KeyboardInterrupt:
    Ctrl+C, or SIGTERM and SIGHUP as the pgt command takes them) stops the job and waits for Ray to say so."""
    client = connect(cluster)
    job_id = submit(client, cluster, shlex.join(["pgt", *args]), env)
    write(f"submitted {job_id} to {cluster}")
    try:
        asyncio.run(_follow(client, job_id, write))
    except KeyboardInterrupt:
        write(f"stopping {job_id}")
        client.stop_job(job_id)
        deadline = time.monotonic() + STOP_WAIT_S
        while not client.get_job_status(job_id).is_terminal() and time.monotonic() < deadline:
            time.sleep(0.5)
        raise
    return JobOutcome(job_id, str(client.get_job_status(job_id).value))


def submit(client, cluster: str, entrypoint: str, env: dict[str, str], wait_s: float = SUBMIT_WAIT_S) -> str:
    """The job's id once the cluster took it. A head whose job agent is still starting answers "No available agent"
    (HTTP 500): asked again for up to `wait_s`; any other refusal is a ServiceError in one line."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return client.submit_job(entrypoint=entrypoint, runtime_env={"env_vars": env} if env else None)
        except RuntimeError as exc:
            problem = " ".join(str(exc).split())
            if "No available agent" in problem:
                if time.monotonic() < deadline:
                    time.sleep(1)
                    continue
                # Ray's agent stays up without its HTTP server when the port is taken, so the head never takes a job
                raise ServiceError(
                    f"Ray cluster at {cluster} took no job within {wait_s:g} s: the head's dashboard agent is not "
                    "serving jobs; its dashboard_agent.log (in the head's Ray session logs) says why, most often its "
                    "--dashboard-agent-listen-port already taken on the head's address or on 127.0.0.1") from None
            raise ServiceError(f"Ray cluster at {cluster} did not take the job: {shorten(problem)}") from None


async def _follow(client, job_id: str, write) -> None:
    async for lines in client.tail_job_logs(job_id):
        write(lines.rstrip("\n"))

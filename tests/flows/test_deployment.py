"""End to end as users run it: a real Prefect server and process worker, a real MLflow server, the
deployments of prefect.yaml, `prefect deployment run preprocess-and-train/demo`, started and stopped by the
project's scripts on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, free_port

pytestmark = pytest.mark.slow
SCRIPTS = PROJECT_ROOT / "scripts"
SMALL = ["--param", "synthetic_users=8", "--param", "synthetic_days=70", "--param", "epochs=2"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("stack")
    env = {**os.environ, "PGT_STATE_DIR": str(state), "PREFECT_PORT": str(free_port()), "MLFLOW_PORT": str(free_port()),
           "PGT_VENV_BIN": str(Path(sys.executable).parent)}
    for key in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    env["PREFECT_WORKER_QUERY_SECONDS"] = "1"  # the worker takes each run within a second, not Prefect's 10
    started = subprocess.run([SCRIPTS / "start-stack.sh"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "preprocess-and-train/demo" in started.stdout and "preprocess-and-train/sweep" in started.stdout
        assert "predict-next-places/predict" in started.stdout
        env |= {"PREFECT_API_URL": f"http://127.0.0.1:{env['PREFECT_PORT']}/api", "PREFECT_HOME": str(state / "prefect")}
        yield state, env
    finally:
        stopped = subprocess.run([SCRIPTS / "stop-stack.sh"], env=env, capture_output=True, text=True, timeout=180)
        assert stopped.stdout.count("stopped") == 3, stopped.stdout + stopped.stderr
        for name in ("server.pid", "worker.pid"):
            assert not (state / "prefect" / name).exists()


def run_deployment(env, name: str, *params: str, timeout_s: int = 600) -> None:
    """`prefect deployment run NAME --watch`: the run must complete (prefect exits non-zero for a failed run)."""
    prefect = Path(env["PGT_VENV_BIN"]) / "prefect"
    r = subprocess.run([prefect, "deployment", "run", name, *params, "--watch", "--watch-interval", "1",
                        "--watch-timeout", str(timeout_s)],
                       env=env, capture_output=True, text=True, timeout=timeout_s + 100)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def run_demo(env, *params: str) -> subprocess.CompletedProcess:
    run_deployment(env, "preprocess-and-train/demo", *SMALL, *params)
    return subprocess.run([sys.executable, SCRIPTS / "show_run.py", "preprocess-and-train/demo"], env=env,
                          capture_output=True, text=True, timeout=120)


def expected_champion(client, name: str) -> tuple[int, str]:
    """(number of versions, the version that must hold the champion alias): each version in turn becomes champion
    only if its evidence beats the champion's so far by the registry's rule (pgt.tracking.registry.promotion_decision), as its
    champion_decision tag says."""
    from pgt.tracking.registry import Evidence, promotion_decision

    versions = sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))
    champion, evidence = None, None
    for v in versions:
        mine = Evidence.from_tags(v.tags)
        promoted, decision, _ = promotion_decision(mine, evidence)
        assert v.tags["champion_decision"] == decision, (v.version, v.tags)
        if promoted:
            champion, evidence = v.version, mine
    return len(versions), champion


def test_demo_deployment_completes_and_registers_a_champion(stack):
    """The demo in the worker's own process (workers=0): the run completes, show_run.py prints its metrics and UI
    address, and its version is registered with the champion where the registry's rule puts it. The demo under
    Ray Train, and a rerun that reuses the cached sequences, are the cancel test's (it runs both)."""
    from mlflow.tracking import MlflowClient

    _, env = stack
    client = MlflowClient(f"http://127.0.0.1:{env['MLFLOW_PORT']}")
    before = expected_champion(client, "pgt-demo")[0] if client.search_registered_models("name = 'pgt-demo'") else 0
    first = run_demo(env, "--param", "workers=0")
    assert first.returncode == 0, first.stdout + first.stderr
    assert ": Completed" in first.stdout and "test, strict" in first.stdout and "target id in history" in first.stdout
    assert f"http://127.0.0.1:{env['MLFLOW_PORT']}/#/experiments/" in first.stdout.replace("\n", "").replace(" ", "")
    count, champion = expected_champion(client, "pgt-demo")
    assert count == before + 1 and float(client.get_model_version(
        "pgt-demo", str(count)).tags["validation_strict_acc_at_1"]) > 0
    assert client.get_model_version_by_alias("pgt-demo", "champion").version == champion


def test_predict_deployment_publishes_next_places_as_a_table_and_a_map(stack):
    """`prefect deployment run predict-next-places/predict`: the champion scores the demo people's last 14 days."""
    import urllib.request

    from mlflow.tracking import MlflowClient

    state, env = stack
    client = MlflowClient(f"http://127.0.0.1:{env['MLFLOW_PORT']}")
    if not client.search_registered_models("name = 'pgt-demo'"):  # this test alone: train the demo first
        assert run_demo(env, "--param", "workers=0").returncode == 0
    run_deployment(env, "predict-next-places/predict", "--param", "synthetic_users=8", "--param", "synthetic_days=70",
                   timeout_s=400)
    code = """
import json
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
with get_client(sync_client=True) as client:
    found = {key: client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
             for key in ("pgt-predictions", "pgt-predictions-map", "pgt-predictions-summary")}
    print(json.dumps({key: a[0].data if a else None for key, a in found.items()}))
"""
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    artifacts = json.loads(r.stdout.strip().splitlines()[-1])
    rows = artifacts["pgt-predictions"]
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert rows and {"source_user_id", "rank", "latitude", "longitude", "probability"} <= set(rows[0])
    assert len({row["source_user_id"] for row in rows}) >= 5  # the demo's 8 people, those with a recent history
    url = artifacts["pgt-predictions-map"]
    assert url.startswith(f"http://127.0.0.1:{env['MLFLOW_PORT']}/get-artifact?path=map.png")
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.read(8) == b"\x89PNG\r\n\x1a\n"  # the map, served by the MLflow server
    assert "users scored" in artifacts["pgt-predictions-summary"]
    # the prediction run names the version that answered, not only the alias, and its input as a dataset
    run = client.search_runs([client.get_experiment_by_name("pgt-predictions").experiment_id],
                             order_by=["attributes.start_time DESC"], max_results=1)[0]
    champion = client.get_model_version_by_alias("pgt-demo", "champion").version
    assert run.data.params["model_uri"] == "models:/pgt-demo@champion" and run.data.params["model_version"] == champion
    assert run.data.tags["pgt.model_version"] == run.data.params["model_version_uri"] == f"models:/pgt-demo/{champion}"
    assert [i.tags[0].value for i in run.inputs.dataset_inputs] == ["prediction"]
    assert run.data.tags["mlflow.source.name"] == "predict-next-places flow"  # the UI's Source, not Prefect's engine
    shown = subprocess.run([sys.executable, SCRIPTS / "show_run.py", "predict-next-places/predict",
                            "pgt-predictions-summary"], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and ": Completed" in shown.stdout and "users scored" in shown.stdout, shown.stdout
    published = state / "predictions" / "pgt-demo-champion" / "predictions.parquet"
    # the deployment answers what `pgt predict` answers for the same model and input
    recent = next((state / "data").glob("synthetic-8u-70d-*-last14d.parquet"))
    by_hand = state / "by-hand.parquet"
    r = subprocess.run([sys.executable, "-m", "pgt.cli", "predict", "--model", "models:/pgt-demo@champion", "--input",
                        str(recent), "--format", "positionfixes", "--out", str(by_hand), "--tracking-uri",
                        f"http://127.0.0.1:{env['MLFLOW_PORT']}"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import polars as pl

    assert pl.read_parquet(by_hand).equals(pl.read_parquet(published))


def test_sweep_deployment_tunes_and_registers_the_best_trial(stack):
    """`prefect deployment run preprocess-and-train/sweep`: a one-trial sweep on the demo's data through the worker,
    its winner's final run registered as pgt-sweep (the sweep itself, its finalists and a resumed rerun are
    test_flow.py's, in process)."""
    from mlflow.tracking import MlflowClient

    state, env = stack
    run_deployment(env, "preprocess-and-train/sweep", *SMALL, "--param", "trials=1", "--param", "finalists=0")
    shown = subprocess.run([sys.executable, SCRIPTS / "show_run.py", "preprocess-and-train/sweep"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and ": Completed" in shown.stdout and "sweep" in shown.stdout, shown.stdout
    trials = json.loads((state / "sweeps" / "synthetic" / "tune.json").read_text())["trials"]
    assert len(trials) == 1
    client = MlflowClient(f"http://127.0.0.1:{env['MLFLOW_PORT']}")
    versions = client.search_model_versions("name = 'pgt-sweep'")
    assert versions and all(v.tags.get("sweep_run_id") for v in versions)
    assert client.get_model_version_by_alias("pgt-sweep", "champion").version == expected_champion(client, "pgt-sweep")[1]


def test_every_deployment_runs_one_at_a_time(stack):
    """prefect.yaml's concurrency_limit reached the server, and start-prefect.sh's limit of the work pool: runs
    that share the state folder queue up, whatever their deployment."""
    _, env = stack
    code = """
import asyncio
from prefect.client.orchestration import get_client

async def main():
    async with get_client() as client:
        for name in ("preprocess-and-train/demo", "preprocess-and-train/geolife", "preprocess-and-train/sweep",
                     "predict-next-places/predict"):
            d = await client.read_deployment_by_name(name)
            limit = d.global_concurrency_limit.limit if d.global_concurrency_limit else d.concurrency_limit
            print(name.split("/")[1], limit)
        print("pool", (await client.read_work_pool("pgt-process")).concurrency_limit)

asyncio.run(main())
"""
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["demo", "1", "geolife", "1", "sweep", "1", "predict", "1", "pool", "1"]


def test_a_parameter_outside_its_setting_s_bounds_is_refused_before_a_run_exists(stack):
    """`prefect deployment run ... --param epochs=-3`: the server checks the deployment's parameter schema, which
    carries each setting's bounds, and answers in one line naming the field and the bound; no flow run is created."""
    _, env = stack
    prefect = Path(env["PGT_VENV_BIN"]) / "prefect"

    def flow_runs() -> int:
        r = subprocess.run([sys.executable, "-c", RUN_COUNT], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return int(r.stdout)

    before = flow_runs()
    for param, words in (("epochs=-3", "-3 is less than the minimum of 1"),
                         ("synthetic_days=40000", "40000 is greater than the maximum of 36500")):
        r = subprocess.run([prefect, "deployment", "run", "preprocess-and-train/demo", "--param", param], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        said = " ".join((r.stdout + r.stderr).split())
        assert f"Validation failed for field '{param.split('=')[0]}'" in said and words in said, said
        assert "Traceback" not in said
    assert flow_runs() == before


RUN_COUNT = """
import asyncio
from prefect.client.orchestration import get_client

async def main():
    async with get_client() as client:
        print(await client.count_flow_runs())

asyncio.run(main())
"""


def test_cancelling_a_training_flow_run_stops_ray_closes_its_run_and_a_rerun_resumes(stack):
    """`prefect flow-run cancel` while the demo trains under Ray Train (the worker sends SIGTERM to the flow run's
    process group, Ray's head included): the run ends Cancelled, every Ray process it started is gone, its MLflow run
    is KILLED, its lock released and no version registered; the next run reuses the cached sequences, resumes from
    the last checkpoint, closes the same MLflow run and registers one version, the champion where the rule puts it."""
    import time

    from mlflow.tracking import MlflowClient

    from preprocessing.config import SynthConfig
    from preprocessing.synthetic import generate_positionfixes
    from tests.conftest import descendant_processes

    state, env = stack
    prefect = Path(env["PGT_VENV_BIN"]) / "prefect"
    points = state / "input" / "cancelled.parquet"  # its own input: its own sequences and run folder
    points.parent.mkdir()
    generate_positionfixes(SynthConfig(users=8, days=70, seed=5)).write_parquet(points)
    # the paper's recipe without early stopping: how many epochs the run reaches before the cancel depends on the
    # machine's speed, and the rerun must train exactly the epochs asked of it
    recipe = state / "input" / "no-early-stop.yaml"
    recipe.write_text("patience: 1000\n")
    given = ("--param", f"input_path={points}", "--param", f"recipe_file={recipe}")
    started = subprocess.run([prefect, "deployment", "run", "preprocess-and-train/demo", *given, "--param", "epochs=60"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr[-2000:]
    flow_run = started.stdout.split("UUID:")[1].split()[0]
    run_dir = state / "runs" / "cancelled-no-early-stop"  # the input's name, then the recipe file's
    worker = int((state / "prefect" / "worker.pid").read_text())
    deadline = time.monotonic() + 300
    while len(list((run_dir / "ray" / "train").glob("epoch_*"))) < 2:  # two checkpoints: it trains under Ray
        assert time.monotonic() < deadline, "the demo made no two checkpoints within 300 s"
        time.sleep(0.5)
    ray_pids = {pid for pid, args in descendant_processes(worker).items() if "ray" in args}
    assert ray_pids
    cancelled = subprocess.run([prefect, "flow-run", "cancel", flow_run], env=env, capture_output=True, text=True,
                               timeout=120)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    code = f"""
import time
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as client:
    for _ in range(240):
        state = client.read_flow_run("{flow_run}").state
        if state.is_final():
            break
        time.sleep(0.5)
    print(state.type.value)
"""
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert r.stdout.split()[-1:] == ["CANCELLED"], r.stdout + r.stderr[-2000:]
    lock = run_dir.parent / f".{run_dir.name}.lock"
    deadline = time.monotonic() + 60  # the flow's process unwinds (its MLflow run, its lock) after Ray's have gone

    def left() -> bool:
        return bool({pid for pid in ray_pids if Path(f"/proc/{pid}").exists()}) or lock.exists()

    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not {pid for pid in ray_pids if Path(f"/proc/{pid}").exists()}  # no Ray process of the run is left
    assert not lock.exists()
    client = MlflowClient(f"http://127.0.0.1:{env['MLFLOW_PORT']}")
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    assert client.get_run(run_id).info.status == "KILLED"
    kept = max(int(p.name.removeprefix("epoch_")) for p in (run_dir / "ray" / "train").glob("epoch_*"))
    versions = expected_champion(client, "pgt-demo")[0] if client.search_registered_models("name = 'pgt-demo'") else 0
    manifest = state / "sequences" / "cancelled" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns

    run_deployment(env, "preprocess-and-train/demo", *given, "--param", f"epochs={kept + 3}")
    assert manifest.stat().st_mtime_ns == stamp  # the rerun reused the cached sequences
    assert f"sequences reused from {manifest.parent}" in (state / "prefect" / "worker.log").read_text()
    count, champion = expected_champion(client, "pgt-demo")
    assert count == versions + 1 and client.get_model_version_by_alias("pgt-demo", "champion").version == champion
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # 1-based: right after the newest checkpoint kept, or the one before it if Ray had not registered the newest
    # when the signal stopped its controller
    assert len(metrics["resumed_at_epochs"]) == 1 and kept + 1 <= metrics["resumed_at_epochs"][0] <= kept + 2
    assert metrics["epochs_run"] == kept + 3
    assert json.loads((run_dir / "mlflow_run.json").read_text())["run_id"] == run_id
    assert client.get_run(run_id).info.status == "FINISHED"

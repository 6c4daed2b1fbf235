"""Benchmark: `pgt serve` under a flood of large requests, with its load caps and without them, side by side.

A small model is trained on synthetic GPS (`pgt synth`, `pgt preprocess`, `pgt train --register`, into a local
SQLite store), then served twice by `scripts/start-serve.sh` with a 16 MB request limit: once with the caps set out
of reach (`--max-in-flight 4096 --max-buffered-mb 65536`: every request is read and parsed at once, as the server
did before it had caps) and once with their defaults. Each time CLIENTS clients POST a GPS-points body of about
15 MB at once; meanwhile /ping is asked every 100 ms, and the server's resident memory (its process and children)
is sampled every 50 ms. Reported: the server's peak RSS over its idle RSS, /ping's median and worst latency (and
how many pings went unanswered within 10 s), the answers' status counts and the wall time until every client had
its answer. Writes JSON (default benchmarks/results/serve_load.json) and prints a table.

    python benchmarks/serve_load.py [--clients 100] [--body-mb 15]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.predict import free_port, run  # noqa: E402 - after sys.path gains the benchmarks
from benchmarks.preprocess import machine  # noqa: E402 - after sys.path gains the benchmarks

PGT = [sys.executable, "-m", "pgt.cli"]
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "serve_load.json"
UNCAPPED = {"SERVE_MAX_IN_FLIGHT": "4096", "SERVE_MAX_BUFFERED_MB": "65536"}


def body_of(points: pl.DataFrame, megabytes: float) -> bytes:
    """A GPS-points request of about `megabytes`: one person's points, repeated day after day as needed."""
    records = points.select("user_id", pl.col("tracked_at").dt.strftime("%Y-%m-%dT%H:%M:%S%z"), "latitude",
                            "longitude").to_dicts()
    per_record = len(json.dumps(records[0])) + 2
    wanted = int(megabytes * 2**20 / per_record)
    return json.dumps({"dataframe_records": (records * (wanted // len(records) + 1))[:wanted]}).encode()


def server_rss(pid: int) -> int:
    try:
        process = psutil.Process(pid)
        return process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True))
    except psutil.Error:
        return 0


def flood(url: str, pid: int, body: bytes, clients: int) -> dict:
    """CLIENTS posts of `body` at once, /ping every 100 ms and RSS every 50 ms while they run."""
    idle = server_rss(pid)
    done = threading.Event()
    rss, pings, missed = [idle], [], 0

    def sample() -> None:
        while not done.is_set():
            rss.append(server_rss(pid))
            time.sleep(0.05)

    def ping() -> None:
        nonlocal missed
        while not done.is_set():
            start = time.perf_counter()
            try:
                urllib.request.urlopen(url.replace("/invocations", "/ping"), timeout=10).read()
                pings.append(time.perf_counter() - start)
            except (urllib.error.URLError, OSError):
                missed += 1
            time.sleep(0.1)

    def post(_: int) -> int:
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()
                return response.status
        except urllib.error.HTTPError as exc:
            exc.read()
            return exc.code
        except (urllib.error.URLError, OSError):
            return -1  # no answer (connection reset or timed out)

    watchers = [threading.Thread(target=sample), threading.Thread(target=ping)]
    for w in watchers:
        w.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        statuses = list(pool.map(post, range(clients)))
    wall = time.perf_counter() - start
    done.set()
    for w in watchers:
        w.join()
    return {"idle_rss_mb": idle / 2**20, "peak_rss_mb": max(rss) / 2**20, "peak_over_idle_mb": (max(rss) - idle) / 2**20,
            "ping_median_ms": 1000 * statistics.median(pings) if pings else None,
            "ping_max_ms": 1000 * max(pings) if pings else None, "pings": len(pings), "pings_unanswered": missed,
            "statuses": dict(sorted(collections.Counter(map(str, statuses)).items())), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--body-mb", type=float, default=15.0)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pgt-bench-serve-load-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "PGT_STATE_DIR": str(tmp / "state"),
               "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
        run(*PGT, "synth", "--out", tmp / "points.parquet", "--users", 10, "--days", 80, "--seed", 7, env=env)
        run(*PGT, "preprocess", "--input", tmp / "points.parquet", "--format", "positionfixes", "--out", tmp / "seq",
            "--no-progress", env=env)
        run(*PGT, "train", "--data", tmp / "seq", "--out", tmp / "run", "--epochs", 2, "--register", "load", env=env)
        points = pl.read_parquet(tmp / "points.parquet")
        body = body_of(points.filter(pl.col("user_id") == points["user_id"].min()).sort("tracked_at"), args.body_mb)
        results = {}
        for name, caps in (("uncapped", UNCAPPED), ("capped (defaults)", {})):
            port = free_port()
            serve_env = {**env, "SERVE_PORT": str(port), "SERVE_MAX_REQUEST_MB": "16", **caps}
            run(ROOT / "scripts" / "start-serve.sh", "models:/load@champion", env=serve_env)
            pid = int((tmp / "state" / "serve" / "server.pid").read_text())
            try:
                results[name] = flood(f"http://127.0.0.1:{port}/invocations", pid, body, args.clients)
            finally:
                subprocess.run([ROOT / "scripts" / "stop-serve.sh"], env=serve_env, capture_output=True, timeout=120)
    report = {"benchmark": "serve_load", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "clients": args.clients, "body_mb": round(len(body) / 2**20, 2),
              "max_request_mb": 16, "runs": results}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{args.clients} clients x {report['body_mb']} MB at once")
    print(f"{'server':<18} {'peak RSS MB':>11} {'over idle':>9} {'ping med ms':>11} {'ping max ms':>11} "
          f"{'unanswered':>10} {'wall s':>7}  statuses")
    for name, r in results.items():
        print(f"{name:<18} {r['peak_rss_mb']:>11.0f} {r['peak_over_idle_mb']:>9.0f} {r['ping_median_ms'] or 0:>11.1f} "
              f"{r['ping_max_ms'] or 0:>11.1f} {r['pings_unanswered']:>10} {r['wall_s']:>7.1f}  {r['statuses']}")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

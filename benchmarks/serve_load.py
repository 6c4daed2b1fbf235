"""Benchmark: `pgt serve` against slow senders, bursts of large requests and a stream of small ones, side by side
with the server of another commit.

A small model is trained on synthetic GPS (`pgt synth`, `pgt preprocess`, `pgt train --register`, into a local
SQLite store) and served by this checkout's `pgt serve` and, with `--baseline-ref REF`, by the same command of
commit REF (a git worktree): each with a 16 MB request limit and its default admission settings, but for a body
deadline of BODY_TIMEOUT_S where the server has one. Scenarios, each server in turn (the other idle) but the first:

- slow senders: SLOW connections send the headers and half the body of a small request, then wait. Meanwhile
  /ping and a whole small request are timed ten times each; then the half-sent ones' answers are awaited (up to
  the body deadline and 30 s more; those without an answer then are counted as such and closed);
- bursts: CLIENTS clients (20, then 100) POST a GPS-points body of about 15 MB at once, while /ping is asked every
  100 ms (by a process of its own, so that the clients' threads do not delay it) and the server's resident memory
  (its process and children) is sampled every 50 ms: the statuses (a 503
  counted with and without Retry-After), peak RSS over idle, /ping's median and worst, the wall time;
- small requests, first, on servers fresh from their start: one person's staypoints (a few KB) POSTed SMALL_ROUNDS
  times to each server (both running), in turns whose order alternates (A B, B A, ...) so that the machine's drift
  falls on both alike: their medians side by side.

Writes JSON (default benchmarks/results/serve_load.json) and prints a table.

    python benchmarks/serve_load.py [--baseline-ref REF] [--slow 500] [--bursts 20 100] [--body-mb 15]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import selectors
import socket
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
BODY_TIMEOUT_S = 5.0  # the body deadline the benchmark sets, where the server has one (its default is longer)
SMALL_ROUNDS = 600


def body_of(points: pl.DataFrame, megabytes: float) -> bytes:
    """A GPS-points request of about `megabytes`: one person's points, repeated day after day as needed."""
    records = points.select("user_id", pl.col("tracked_at").dt.strftime("%Y-%m-%dT%H:%M:%S%z"), "latitude",
                            "longitude").to_dicts()
    per_record = len(json.dumps(records[0])) + 2
    wanted = int(megabytes * 2**20 / per_record)
    return json.dumps({"dataframe_records": (records * (wanted // len(records) + 1))[:wanted]}).encode()


def small_body(points: pl.DataFrame) -> bytes:
    """One person's staypoints of their last week, as a client sends them (a few KB)."""
    from preprocessing.staypoints import generate_staypoints

    stays = generate_staypoints(points, 200, 30, 1440).sort("started_at").tail(30)
    stays = stays.select("user_id", *(pl.col(c).dt.strftime("%Y-%m-%dT%H:%M:%S%z") for c in ("started_at", "finished_at")),
                         "latitude", "longitude")
    return json.dumps({"dataframe_records": stays.to_dicts()}).encode()


def server_rss(pid: int) -> int:
    try:
        process = psutil.Process(pid)
        return process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True))
    except psutil.Error:
        return 0


def post(url: str, body: bytes, timeout: float = 600) -> tuple[int, str | None]:
    """(HTTP status, Retry-After) of one POST; -1 where no answer came (reset or timed out)."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status, None
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code, exc.headers.get("Retry-After")
    except (urllib.error.URLError, OSError):
        return -1, None


def timed(function, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def ping(url: str) -> int:
    try:
        with urllib.request.urlopen(url.replace("/invocations", "/ping"), timeout=10) as response:
            response.read()
            return response.status
    except (urllib.error.URLError, OSError):
        return -1


def slow_senders(url: str, body: bytes, count: int, deadline_s: float) -> dict:
    """COUNT connections that send headers and half of `body`, then wait; /ping and a whole request timed meanwhile;
    then every half-sent one's answer awaited (up to `deadline_s` after they were sent)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    head = (f"POST /invocations HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sockets = []
    for _ in range(count):
        client = socket.create_connection((host, int(port)), timeout=10)
        client.sendall(head + body[:len(body) // 2])
        client.setblocking(False)
        sockets.append(client)
    sent = time.perf_counter()
    time.sleep(0.5)  # the server has read their headers and begun their bodies
    pings = [timed(ping, url) for _ in range(10)]
    requests = [timed(post, url, body, 30) for _ in range(10)]
    answers: dict[socket.socket, tuple[float, int]] = {}
    selector = selectors.DefaultSelector()
    for client in sockets:
        selector.register(client, selectors.EVENT_READ)
    while len(answers) < count and time.perf_counter() - sent < deadline_s:
        for key, _ in selector.select(timeout=0.5):
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            status_line = data.split(b"\r\n", 1)[0].split()
            status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else -1
            answers[key.fileobj] = (time.perf_counter() - sent, status)
            selector.unregister(key.fileobj)
    for client in sockets:
        client.close()
    times = [t for t, _ in answers.values()]
    return {"connections": count, "ping_statuses": dict(collections.Counter(str(s) for _, s in pings)),
            "ping_max_ms": 1000 * max(t for t, _ in pings),
            "request_statuses": dict(collections.Counter(str(s) for _, (s, _) in requests)),
            "request_max_ms": 1000 * max(t for t, _ in requests),
            "half_sent_statuses": dict(sorted(collections.Counter(str(s) for _, s in answers.values()).items())),
            "half_sent_unanswered": count - len(answers),
            "half_sent_answered_after_s": [round(min(times), 2), round(max(times), 2)] if times else None}


def pinger(url: str, done, latencies) -> None:
    """/ping every 100 ms until `done` is set, each answer's seconds (or -1 for no 200) put on `latencies`. Run in a
    process of its own: in the flooding process it would wait for the GIL behind a hundred sending threads, and
    time the client rather than the server."""
    while not done.is_set():
        seconds, status = timed(ping, url)
        latencies.put(seconds if status == 200 else -1.0)
        time.sleep(0.1)
    latencies.put(None)  # the last


def flood(url: str, pid: int, body: bytes, clients: int) -> dict:
    """CLIENTS posts of `body` at once, /ping every 100 ms (from another process) and RSS every 50 ms while they run."""
    idle = server_rss(pid)
    done = threading.Event()
    rss = [idle]

    def sample() -> None:
        while not done.is_set():
            rss.append(server_rss(pid))
            time.sleep(0.05)

    spawn = multiprocessing.get_context("spawn")
    pinged, latencies = spawn.Event(), spawn.Queue()
    pinging = spawn.Process(target=pinger, args=(url, pinged, latencies))
    pinging.start()
    watcher = threading.Thread(target=sample)
    watcher.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda _: post(url, body), range(clients)))
    wall = time.perf_counter() - start
    done.set()
    pinged.set()
    watcher.join()
    answered = list(iter(lambda: latencies.get(timeout=30), None))
    pinging.join(timeout=30)
    pings, missed = [t for t in answered if t >= 0], sum(1 for t in answered if t < 0)
    statuses = collections.Counter("503 with Retry-After" if status == 503 and retry else str(status)
                                   for status, retry in answers)
    return {"clients": clients, "idle_rss_mb": idle / 2**20, "peak_rss_mb": max(rss) / 2**20,
            "peak_over_idle_mb": (max(rss) - idle) / 2**20,
            "ping_median_ms": 1000 * statistics.median(pings) if pings else None,
            "ping_max_ms": 1000 * max(pings) if pings else None, "pings": len(pings), "pings_unanswered": missed,
            "statuses": dict(sorted(statuses.items())), "wall_s": wall}


def own_code(checkout: Path, env: dict) -> dict:
    """The environment that runs `pgt` of the checkout: its own packages first on the path."""
    return {**env, "PYTHONPATH": str(checkout), "POLARS_MAX_THREADS": "1"}


def start_server(checkout: Path, model: str, port: int, env: dict, log: Path, admission: bool) -> subprocess.Popen:
    """`pgt serve` of the checkout (its own packages first on the path) serving `model`, once /ping answers 200."""
    extra = ["--body-timeout-s", str(BODY_TIMEOUT_S)] if admission else []
    process = subprocess.Popen([*PGT, "serve", "--model", f"models:/{model}@champion", "--host", "127.0.0.1", "--port",
                                str(port), "--max-request-mb", "16", *extra], cwd=checkout,
                               env=own_code(checkout, env), stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while ping(f"http://127.0.0.1:{port}/invocations") != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the server of {checkout} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-ref", help="a commit whose server runs beside this checkout's")
    parser.add_argument("--slow", type=int, default=500, help="slow senders held open at once")
    parser.add_argument("--bursts", type=int, nargs="+", default=[20, 100], help="clients of each burst")
    parser.add_argument("--body-mb", type=float, default=15.0)
    parser.add_argument("--small-only", action="store_true", help="only the small requests, side by side")
    parser.add_argument("--baseline-first", action="store_true",
                        help="start the baseline's server first (the server started first answers a few percent "
                             "slower on a 2-core machine: measure both orders)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pgt-bench-serve-load-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "PGT_STATE_DIR": str(tmp / "state"),
               "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
        run(*PGT, "synth", "--out", tmp / "points.parquet", "--users", 10, "--days", 80, "--seed", 7, env=env)
        run(*PGT, "preprocess", "--input", tmp / "points.parquet", "--format", "positionfixes", "--out", tmp / "seq",
            "--no-progress", env=env)
        points = pl.read_parquet(tmp / "points.parquet")
        person = points.filter(pl.col("user_id") == points["user_id"].min()).sort("tracked_at")
        large, small = body_of(person, args.body_mb), small_body(person)
        checkouts = {"this checkout": (ROOT, True)}
        if args.baseline_ref:
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tmp / "baseline", args.baseline_ref],
                           check=True, capture_output=True)
            baseline = {f"baseline {args.baseline_ref}": (tmp / "baseline", False)}
            checkouts = {**baseline, **checkouts} if args.baseline_first else {**checkouts, **baseline}
        servers, results = {}, {}
        try:
            for i, (name, (checkout, admission)) in enumerate(checkouts.items()):
                # each checkout logs the model it serves: a model's code imports the pgt of the process that loads it
                subprocess.run([*PGT, "train", "--data", tmp / "seq", "--out", tmp / f"run-{i}", "--epochs", "2",
                                "--seed", "0", "--register", f"load-{i}"], env=own_code(checkout, env), cwd=checkout,
                               check=True, capture_output=True)
                port = free_port()
                servers[name] = (start_server(checkout, f"load-{i}", port, env, tmp / f"{i}.log", admission),
                                 f"http://127.0.0.1:{port}/invocations")
            latencies = {name: [] for name in servers}
            names = list(servers)
            for turn in range(SMALL_ROUNDS):
                for name in names if turn % 2 == 0 else names[::-1]:
                    url = servers[name][1]
                    seconds, (status, _) = timed(post, url, small, 30)
                    if status == 200:
                        latencies[name].append(seconds)
            for name, seconds in latencies.items():
                results[name] = {"small_request": {"rounds": SMALL_ROUNDS, "answered_200": len(seconds),
                                                  "median_ms": 1000 * statistics.median(seconds),
                                                  "p90_ms": 1000 * statistics.quantiles(seconds, n=10)[-1]}}
            for name, (process, url) in servers.items() if not args.small_only else ():
                row = results[name]
                print(f"{name}: {args.slow} slow senders", flush=True)
                row["slow_senders"] = slow_senders(url, small, args.slow, BODY_TIMEOUT_S + 30)
                for clients in args.bursts:
                    print(f"{name}: {clients} clients x {args.body_mb:g} MB", flush=True)
                    row[f"burst_{clients}"] = flood(url, process.pid, large, clients)
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(timeout=60)
            if args.baseline_ref:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tmp / "baseline"],
                               capture_output=True)
    report = {"benchmark": "serve_load", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "body_mb": round(len(large) / 2**20, 2), "small_body_kb": round(len(small) / 1024, 1),
              "max_request_mb": 16, "body_timeout_s": BODY_TIMEOUT_S, "started_first": next(iter(results), None),
              "servers": results}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"wrote {args.results}")


def print_table(report: dict) -> None:
    print(f"{'server':<24} {'scenario':<22} {'statuses':<44} {'RSS +MB':>7} {'ping max ms':>11} {'wall s':>6}")
    for name, row in report["servers"].items():
        small = row["small_request"]
        print(f"{name:<24} {'small request':<22} median {small['median_ms']:.2f} ms, p90 {small['p90_ms']:.2f} ms")
        if "slow_senders" not in row:
            continue
        slow = row["slow_senders"]
        print(f"{'':<24} {'slow: real requests':<22} {str(slow['request_statuses']):<44} {'':>7} "
              f"{slow['ping_max_ms']:>11.0f} {'':>6}")
        print(f"{'':<24} {'slow: half-sent':<22} {str(slow['half_sent_statuses']):<44} {'':>7} {'':>11} "
              f"{(slow['half_sent_answered_after_s'] or [0, 0])[1]:>6.1f}")
        for key, burst in row.items():
            if key.startswith("burst_"):
                print(f"{'':<24} {key.replace('_', ' ') + ' x 15 MB':<22} {str(burst['statuses']):<44} "
                      f"{burst['peak_over_idle_mb']:>7.0f} {burst['ping_max_ms'] or 0:>11.0f} {burst['wall_s']:>6.1f}")


if __name__ == "__main__":
    main()

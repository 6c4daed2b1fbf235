"""Benchmark: a trained model on new raw GPS, from the command line and served over HTTP.

1. Fits on each GeoLife user's first 80% of days (`pgt preprocess`, then `pgt train --recipe ensemble --register`,
   a few epochs: speed does not depend on how long it trained) against a local SQLite MLflow store.
2. `pgt predict --format positionfixes` on the last 30 days of every one of the 182 users' GPS points, as a
   subprocess, end to end (model download, fitted preprocessing, scoring, writing). Target: under 30 s.
3. `scripts/start-serve.sh` (`pgt serve`), then, first of all, one request of a user's last 7 days of staypoints
   and one of a user's last day of GPS points (the first requests after start: target, as fast as the same requests
   sent again after as long an idle second; the client has made its own first HTTP call, to /ping, before),
   then one-user requests of each user's last 7 days of staypoints, one at a time, cycling over the users whose
   request returns places (a user without a recent history gets an empty answer, faster): latency median / p90 /
   p99. Target: median under 20 ms on 2 cores.
4. The logged model's size on disk (its artifacts as `mlflow artifacts download` writes them), by file.

Writes JSON (default benchmarks/results/predict.json) and prints a table.

    python benchmarks/predict.py [--input PATH] [--epochs N] [--requests N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.preprocess import machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_INPUT = ROOT.parent / "shared" / "data" / "geolife" / "geolife_positionfixes.parquet"
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "predict.json"
TARGET = {"predict_s": 30.0, "served_median_ms": 20.0}
PGT = [sys.executable, "-m", "pgt.cli"]
AGAIN, IDLE_S = 5, 1.0  # the first requests are compared with the same ones sent again this often, each after IDLE_S


def run(*args, env=None) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run([*map(str, args)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args[:4]))} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start, done


def model_size(tracking_uri: str, model_uri: str, folder: Path) -> dict:
    """The logged model's bytes on disk, in all and by file (the largest first), as downloaded from the store."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    local = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(folder)))
    files = {str(f.relative_to(local)): f.stat().st_size for f in local.rglob("*") if f.is_file()}
    largest = dict(sorted(files.items(), key=lambda item: -item[1])[:8])
    return {"bytes": sum(files.values()), "files": len(files), "largest_files_bytes": largest}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--recipe", default="ensemble", help="the training recipe of the served model (pgt.recipes.RECIPES)")
    parser.add_argument("--recipe-file", type=Path, default=None,
                        help="a recipe file instead of --recipe (benchmarks/configs/tuned-memory.yaml: tuned with the "
                             "long-term memory)")
    parser.add_argument("--memory-size", type=int, default=None,
                        help="the served model's memory_size, over the recipe's (0: no long-term memory)")
    parser.add_argument("--requests", type=int, default=300, help="served one-user requests (cycling over users)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    if not args.input.is_file():
        raise SystemExit(f"{args.input}: no such file (the GeoLife Parquet of ../shared/data)")
    from pgt.serving.predict import last_days
    from preprocessing.staypoints import generate_staypoints
    from tests.conftest import split_days

    with tempfile.TemporaryDirectory(prefix="pgt-bench-predict-") as tmp:
        tmp = Path(tmp)
        tracking = f"sqlite:///{tmp / 'mlflow.db'}"
        env = {**os.environ, "MLFLOW_TRACKING_URI": tracking, "PGT_STATE_DIR": str(tmp / "state"),
               "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
        points = pl.read_parquet(args.input)
        early, _ = split_days(points)
        early.write_parquet(tmp / "early.parquet")
        recent = last_days(points, 30)
        recent.write_parquet(tmp / "recent.parquet")
        del early
        fit_s, _ = run(*PGT, "preprocess", "--input", tmp / "early.parquet", "--format", "positionfixes", "--out",
                       tmp / "early", "--no-progress", env=env)
        memory = ["--memory-size", args.memory_size] if args.memory_size is not None else []
        recipe = ["--recipe-file", args.recipe_file] if args.recipe_file else ["--recipe", args.recipe]
        train_s, _ = run(*PGT, "train", "--data", tmp / "early", "--out", tmp / "run", *recipe, "--epochs",
                         args.epochs, *memory, "--register", "bench", env=env)
        artifact = model_size(tracking, "models:/bench@champion", tmp / "downloaded")
        predict_s, done = run(*PGT, "predict", "--model", "models:/bench@champion", "--input", tmp / "recent.parquet",
                              "--format", "positionfixes", "--out", tmp / "pred.parquet", env=env)
        pred = pl.read_parquet(tmp / "pred.parquet")
        users_scored = pred.filter(sample="latest")["source_user_id"].n_unique()

        # one-user requests: each user's staypoints of their last 7 days
        week = last_days(recent.with_columns(pl.col("latitude", "longitude").cast(pl.Float64)), 7).sort("user_id", "tracked_at")
        staypoints = generate_staypoints(week, 200, 30, 1440)
        bodies = []
        for (user,), rows in staypoints.group_by("user_id", maintain_order=True):
            records = rows.select("user_id", *(pl.col(c).dt.strftime("%Y-%m-%dT%H:%M:%S%z") for c in
                                               ("started_at", "finished_at")), "latitude", "longitude").to_dicts()
            bodies.append(json.dumps({"dataframe_records": records}).encode())
        # GPS requests: one user's last day of points each, the users with the most recent days of staypoints first
        day = last_days(week, 1).with_columns(pl.col("tracked_at").dt.strftime("%Y-%m-%dT%H:%M:%S%z"))
        gps_users = staypoints.group_by("user_id").len().sort("len", "user_id", descending=True)["user_id"].head(20)
        gps_bodies = [json.dumps({"dataframe_records": day.filter(pl.col("user_id") == user).select(
            "user_id", "tracked_at", "latitude", "longitude").to_dicts()}).encode() for user in gps_users]
        port = free_port()
        serve_env = {**env, "SERVE_PORT": str(port)}
        start_s, _ = run(ROOT / "scripts" / "start-serve.sh", "models:/bench@champion", env=serve_env)
        latencies, gps_latencies = [], []
        try:
            url = f"http://127.0.0.1:{port}/invocations"

            def ask(body: bytes) -> tuple[float, list]:
                request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                t = time.perf_counter()
                with urllib.request.urlopen(request, timeout=60) as response:
                    answer = json.loads(response.read())
                return (time.perf_counter() - t) * 1000, answer["predictions"]

            # the client's own first HTTP call (urllib's opener, its proxy lookup) costs it milliseconds: spent on /ping
            urllib.request.urlopen(url.replace("/invocations", "/ping"), timeout=10).read()
            # the first requests after start, one of each kind: the server warmed itself up before it answered /ping.
            # A server idle for a second answers its next request slower on this machine, whether first or not, and
            # the first request comes up to a second after the warm-up (start-serve.sh polls /ping each second): so
            # the same two requests again, each pair after a second of idleness, compare like with like
            first_ms = {"staypoints": ask(bodies[0])[0], "positionfixes": ask(gps_bodies[0])[0]}
            again = []
            for _ in range(AGAIN):
                time.sleep(IDLE_S)
                again.append((ask(bodies[0])[0], ask(gps_bodies[0])[0]))
            again_ms = {"staypoints": statistics.median(a for a, _ in again),
                        "positionfixes": statistics.median(b for _, b in again)}
            # only users with a recent history get places back: time those (the others answer an empty list faster)
            scored = [body for body in bodies if ask(body)[1]]
            for body in gps_bodies[1:]:
                gps_latencies.append(ask(body)[0])
            for i in range(args.requests):
                ms, places = ask(scored[i % len(scored)])
                if not places:
                    raise SystemExit("a request that had places got none")
                latencies.append(ms)
        finally:
            run(ROOT / "scripts" / "stop-serve.sh", env=serve_env)
    latencies.sort()
    result = {
        "benchmark": "predict", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "input": shown_path(args.input), "fit": {"preprocess_s": round(fit_s, 1), "train_s": round(train_s, 1),
                                          "epochs": args.epochs,
                                          "recipe": shown_path(args.recipe_file) if args.recipe_file else args.recipe,
                                          "memory_size": args.memory_size},
        "artifact": artifact,
        "predict": {"wall_s": round(predict_s, 2), "points": recent.height, "users_in_input": recent["user_id"].n_unique(),
                    "users_scored": users_scored,
                    "evaluation_samples": pred.filter(sample="evaluation")["sample_index"].n_unique(),
                    "stdout": done.stdout.strip()},
        "served": {"requests": len(latencies), "users_with_a_week_of_staypoints": len(bodies),
                   "users_answered_with_places": len(scored),
                   "staypoints_per_request_median": statistics.median(len(json.loads(b)["dataframe_records"]) for b in scored),
                   "start_s": round(start_s, 1), "first_request_ms": {k: round(v, 1) for k, v in first_ms.items()},
                   "first_requests_again_median_ms": {k: round(v, 1) for k, v in again_ms.items()},
                   "first_requests_again": {"times": AGAIN, "idle_s_before_each": IDLE_S},
                   "first_request_staypoints": len(json.loads(bodies[0])["dataframe_records"]),
                   "first_request_points": len(json.loads(gps_bodies[0])["dataframe_records"]),
                   "gps_requests": len(gps_latencies),
                   "gps_points_per_request_median": statistics.median(len(json.loads(b)["dataframe_records"])
                                                                       for b in gps_bodies[1:]),
                   "gps_median_ms": round(statistics.median(gps_latencies), 1),
                   "median_ms": round(statistics.median(latencies), 1),
                   "p90_ms": round(latencies[int(0.9 * len(latencies))], 1),
                   "p99_ms": round(latencies[int(0.99 * len(latencies))], 1)},
        "target": TARGET,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    from rich.console import Console
    from rich.table import Table

    table = Table(title="a trained model on new raw GPS (GeoLife)")
    for column in ("measure", "ours", "target"):
        table.add_column(column)
    p, s = result["predict"], result["served"]
    table.add_row(f"pgt predict, last 30 days of {p['users_in_input']} users ({p['points']:,} points)",
                  f"{p['wall_s']:.1f} s ({p['users_scored']} users scored)", "< 30 s")
    table.add_row(f"served one-user request ({s['staypoints_per_request_median']:g} staypoints), median",
                  f"{s['median_ms']:.1f} ms", "< 20 ms")
    table.add_row("served p90 / p99", f"{s['p90_ms']:.1f} / {s['p99_ms']:.1f} ms", "")
    first, again = s["first_request_ms"], s["first_requests_again_median_ms"]
    table.add_row(f"first requests after start: staypoints ({s['first_request_staypoints']}) / GPS "
                  f"({s['first_request_points']:,} points)",
                  f"{first['staypoints']:.1f} / {first['positionfixes']:.1f} ms", "as fast as the rest")
    table.add_row(f"the same two requests again, each pair after {IDLE_S:g} s idle, median of {AGAIN}",
                  f"{again['staypoints']:.1f} / {again['positionfixes']:.1f} ms", "")
    table.add_row(f"served one-user GPS request ({s['gps_points_per_request_median']:g} points, a day), median",
                  f"{s['gps_median_ms']:.1f} ms", "")
    table.add_row("logged model on disk", f"{result['artifact']['bytes'] / 1e6:.2f} MB", "")
    Console().print(table)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

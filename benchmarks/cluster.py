"""Benchmark: the same sweep on two Ray nodes that share no disk, kept on object storage, and on one node with a
local disk, side by side.

Both variants are submitted with `pgt submit` to nodes started by tests/cluster_rig.py (each `ray start --block` in
its own mount namespace with private /tmp and /dev/shm, which needs root for `unshare`), tracked on an MLflow server
on 127.0.0.4, on synthetic sequences:

- two nodes: a head with no CPUs for work and a worker with `--cpus` CPUs; --data and --out in a bucket of an
  S3-compatible server (moto's, scripts/start-s3.sh) on 127.0.0.1;
- two nodes again, --data and --out on a folder both mount at one path (the NFS case): what the storage costs
  apart from what the second node's own processes cost (on one machine, the nodes share its cores);
- one node: a head with the same CPUs; --data and --out on its local disk (a folder of this machine bind-mounted
  into its namespace).

Per variant: the wall time of `pgt submit` (submission to the job's end), the time from submission to the first
trial's first epoch (its first checkpoint that Tune registered, from the sweep's own record), and the bytes the sweep
wrote to its storage per trial. The target: the two-node sweep at most 15% slower. Writes JSON (default
benchmarks/results/cluster.json) and prints a table.

    python benchmarks/cluster.py [--trials 8] [--epochs 3] [--users 24] [--cpus 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from preprocess import machine  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "cluster.json"
TARGET = {"two_nodes_over_one_node_wall": 1.15}  # issue 54: at most 15% slower
# one node with the CPUs; two nodes (a head without CPUs for work, a worker with them) with the sweep on a folder both
# mount, then on object storage: the second pair tells what the storage costs apart from the second node's own
VARIANTS = ("one-node-local-disk", "two-nodes-shared-mount", "two-nodes-object-storage")


def sweep_args(trials: int, epochs: int) -> list[str]:
    """The sweep both variants run: the search alone (no finalists, no final run), two trials at once."""
    return ["--trials", str(trials), "--epochs", str(epochs), "--max-concurrent", "2", "--grace-period", "1",
            "--finalists", "0", "--no-final", "--seed", "0"]


def run_variant(name: str, rig, data: str, out: str, trials: int, epochs: int, tracking_uri: str) -> dict:
    """One `pgt submit -- tune` on `rig`; its wall time and outcome."""
    command = [str(Path(sys.executable).parent / "pgt"), "submit", "--cluster", rig.dashboard, "--", "tune",
               "--data", data, "--out", out, *sweep_args(trials, epochs), "--tracking-uri", tracking_uri,
               "--experiment", f"bench-{name}"]
    began = time.time()
    done = subprocess.run(command, env=rig.env, capture_output=True, text=True, timeout=3600)
    wall = time.time() - began
    if done.returncode != 0:
        raise SystemExit(f"error: the {name} sweep failed (exit {done.returncode}): {done.stdout[-2000:]}")
    return {"variant": name, "began": began, "wall_s": round(wall, 1)}


def sweep_figures(storage, began: float, trials: int) -> dict:
    """From the sweep's own records in its storage: the first trial's first registered epoch after submission, the
    trials' outcome, and the bytes written per trial."""
    from tune.records import read_trial_events

    result = storage.read_json("tune.json")
    first = min(e["time"] for trial in storage.child("trials").entries()
                for e in read_trial_events(storage.child("trials", trial)) if e["event"] == "checkpoint")
    sizes = [storage.filesystem.get_file_info(storage.join(*name.split("/"))).size for name in storage.files()]
    finished = [row for row in result["trials"] if row["status"] == "finished"]
    return {"submit_to_first_epoch_s": round(first - began, 1), "trials": len(result["trials"]),
            "trials_finished": len(finished), "epochs_run": sum(row["epochs"] for row in result["trials"]),
            "best_validation_strict_acc@1": result["best_validation_strict_acc@1"],
            "search_wall_s": result["search_wall_s"], "bytes_written": sum(sizes),
            "bytes_written_per_trial": round(sum(sizes) / trials)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3, help="at most, per trial (ASHA's max_t)")
    parser.add_argument("--users", type=int, default=24, help="synthetic people, 70 days each")
    parser.add_argument("--cpus", type=int, default=2, help="the CPUs of the node that trains")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant, alternating")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()

    from tests.cluster_rig import Cluster, cluster_env, require_isolated_nodes, start_tracking_server, stop_tracking_server

    require_isolated_nodes()
    import pyarrow.fs as pafs

    from infra.storage import open_storage
    from preprocessing.config import SynthConfig
    from preprocessing.pipeline import preprocess
    from preprocessing.synthetic import generate_positionfixes
    from tests.conftest import free_port

    work = Path(tempfile.mkdtemp(prefix="pgt-bench-cluster-"))
    shared = work / "shared"
    shared.mkdir()
    generate_positionfixes(SynthConfig(users=args.users, days=70, seed=3)).write_parquet(work / "fixes.parquet")
    preprocess(work / "fixes.parquet", "positionfixes", shared / "seq", progress=False)
    s3_env = {**os.environ, "PGT_STATE_DIR": str(work / "s3"), "S3_PORT": str(free_port())}
    subprocess.run([ROOT / "scripts" / "start-s3.sh"], env=s3_env, check=True, capture_output=True, timeout=60)
    tracking_uri, tracking_env = start_tracking_server(work / "mlflow")
    endpoint = f"127.0.0.1:{s3_env['S3_PORT']}"
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    os.environ.update(keys)
    pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir("bench")

    def uri(folder: str) -> str:
        return f"s3://bench/{folder}?endpoint_override={endpoint}&scheme=http&region=us-east-1"

    open_storage(uri("seq")).upload(shared / "seq")
    rows = []
    try:
        for repeat in range(args.repeats):
            for name in VARIANTS:
                logs = work / f"logs-{name}-{repeat}"
                logs.mkdir()
                rig = Cluster(cluster_env(logs), shared)
                two, bucket = name.startswith("two"), name.endswith("object-storage")
                folder = f"sweep-{name}-{repeat}"
                try:
                    rig.start(head_cpus=0 if two else args.cpus, worker=two)
                    data, out = (uri("seq"), uri(folder)) if bucket else ("/mnt/seq", f"/mnt/{folder}")
                    print(f"{name} (run {repeat + 1}): sweeping ...", file=sys.stderr)
                    row = run_variant(name, rig, data, out, args.trials, args.epochs, tracking_uri)
                finally:
                    rig.stop()
                storage = open_storage(out if bucket else shared / folder)
                row |= sweep_figures(storage, row.pop("began"), args.trials)
                print(f"  {row}", file=sys.stderr)
                rows.append(row)
    finally:
        stop_tracking_server(tracking_env)
        subprocess.run([ROOT / "scripts" / "stop-s3.sh"], env=s3_env, capture_output=True, timeout=60)

    def mean(variant: str, key: str) -> float:
        values = [row[key] for row in rows if row["variant"] == variant]
        return round(sum(values) / len(values), 1)

    ratio = mean("two-nodes-object-storage", "wall_s") / mean("one-node-local-disk", "wall_s")
    storage_ratio = mean("two-nodes-object-storage", "wall_s") / mean("two-nodes-shared-mount", "wall_s")
    report = {
        "what": "the same sweep on two Ray nodes sharing no disk (object storage) and on one node with a local disk",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "sweep": {"args": sweep_args(args.trials, args.epochs), "synthetic_users": args.users, "days": 70,
                  "training_cpus": args.cpus},
        "runs": rows,
        "two_nodes_over_one_node_wall": round(ratio, 3),
        "object_storage_over_shared_mount_wall": round(storage_ratio, 3), "target": TARGET,
        "meets_target": ratio <= TARGET["two_nodes_over_one_node_wall"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'variant':<28} {'wall s':>8} {'submit->1st epoch s':>20} {'MB/trial':>9} {'finished':>9}")
    for row in rows:
        print(f"{row['variant']:<28} {row['wall_s']:>8} {row['submit_to_first_epoch_s']:>20} "
              f"{row['bytes_written_per_trial'] / 1e6:>9.2f} {row['trials_finished']:>4}/{row['trials']}")
    print(f"two nodes / one node wall time: {ratio:.3f} (target <= {TARGET['two_nodes_over_one_node_wall']}); "
          f"object storage / shared mount, both on two nodes: {storage_ratio:.3f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Benchmark: GeoLife preprocessed with `--engine ray` on two Ray nodes that share no disk, reading its input from
a bucket and publishing its output there, against the default engine on this machine: the same splits, byte for
byte, and each one's wall time.

The two nodes are tests/cluster_rig.py's (each `ray start --block` in its own mount namespace with private /tmp,
which needs root for `unshare`; a head with no CPUs for work, a worker with `--cpus`); the bucket is on an
S3-compatible server (moto's, scripts/start-s3.sh) on 127.0.0.1. `pgt preprocess --input s3://... --out s3://...
--engine ray` is submitted as a Ray Job: its driver (on the head) copies the input to its own disk, the partitions'
tasks on the worker get their files through Ray's object store, and the output is published to the bucket. Writes
JSON (default benchmarks/results/cluster_preprocess.json) and prints a table.

    python benchmarks/cluster_preprocess.py [--input geolife_positionfixes.parquet] [--cpus 2] [--partitions 7]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from preprocess import DEFAULT_INPUT, machine, shown_path  # noqa: E402 - after sys.path gains the benchmarks

DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "cluster_preprocess.json"
CONFIG = ROOT / "benchmarks" / "configs" / "published.yaml"
COMPARED = ("train.parquet", "validation.parquet", "test.parquet", "places.parquet", "staypoints.parquet",
            "locations.parquet")


def digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in COMPARED
            if (folder / name).is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="GeoLife positionfixes as Parquet")
    parser.add_argument("--cpus", type=int, default=2, help="the worker node's CPUs")
    parser.add_argument("--partitions", type=int, default=0, help="0: one per ~4M input rows, as the default engine")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    if not args.input.is_file():
        raise SystemExit(f"error: {args.input}: no such file; give --input, GeoLife positionfixes as Parquet")

    from tests.cluster_rig import BIN, SHARED, Cluster, cluster_env, require_isolated_nodes

    require_isolated_nodes()
    import pyarrow.fs as pafs

    from infra.storage import open_storage
    from tests.conftest import free_port

    work = Path(tempfile.mkdtemp(prefix="pgt-bench-cluster-pp-"))
    shared = work / "shared"
    shared.mkdir()
    shutil.copyfile(CONFIG, shared / "config.yaml")
    pgt = str(Path(sys.executable).parent / "pgt")
    partitions = ["--partitions", str(args.partitions)] if args.partitions else []

    began = time.time()
    subprocess.run([pgt, "preprocess", "--input", str(args.input), "--format", "positionfixes", "--config", str(CONFIG),
                    "--out", str(work / "local"), "--no-progress", *partitions], check=True, capture_output=True)
    local_s = time.time() - began

    s3_env = {**os.environ, "PGT_STATE_DIR": str(work / "s3"), "S3_PORT": str(free_port())}
    subprocess.run([ROOT / "scripts" / "start-s3.sh"], env=s3_env, check=True, capture_output=True, timeout=60)
    endpoint = f"127.0.0.1:{s3_env['S3_PORT']}"
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir("bench")

    def uri(folder: str) -> str:
        return f"s3://bench/{folder}?endpoint_override={endpoint}&scheme=http&region=us-east-1"

    try:
        open_storage(uri("raw")).upload(args.input, "input.parquet")
        rig = Cluster(cluster_env(work), shared)
        try:
            rig.start()
            began = time.time()
            status, logs = rig.submit(str(BIN / "pgt"), "preprocess", "--input", open_storage(uri("raw")).uri_of(
                "input.parquet"), "--format", "positionfixes", "--config", str(SHARED / "config.yaml"), "--out", uri("ray"),
                "--engine", "ray", "--no-progress", *partitions, timeout_s=3600)
            ray_s = time.time() - began
        finally:
            rig.stop()
        if status != "SUCCEEDED":
            raise SystemExit(f"error: the Ray engine's job ended {status}: {logs[-3000:]}")
        kept = open_storage(uri("ray"))
        for name in (*COMPARED, "manifest.json"):
            if kept.exists(name):
                (shared / "ray").mkdir(exist_ok=True)
                (shared / "ray" / name).write_bytes(kept.read_bytes(name))
    finally:
        subprocess.run([ROOT / "scripts" / "stop-s3.sh"], env=s3_env, capture_output=True, timeout=60)
    local, ray = digests(work / "local"), digests(shared / "ray")
    manifest = json.loads((shared / "ray" / "manifest.json").read_text())
    report = {
        "what": "GeoLife preprocessed by the Ray engine on two nodes that share no disk, against the default engine",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "input": shown_path(args.input), "config": str(CONFIG.relative_to(ROOT)),
        "default_engine_wall_s": round(local_s, 1),
        "ray_engine_two_nodes_wall_s": round(ray_s, 1),  # submission to the job's end: the input's copy from the
        "storage": "input and output in a bucket (moto's S3 server)",  # bucket and the output's publishing included
        "ray_engine": manifest["engine"], "counts": manifest["counts"],
        "identical": local == ray and len(local) == len(COMPARED), "files_compared": sorted(local),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'engine':<28} {'wall s':>8}")
    print(f"{'default (this machine)':<28} {report['default_engine_wall_s']:>8}")
    print(f"{'ray (two isolated nodes)':<28} {report['ray_engine_two_nodes_wall_s']:>8}")
    print(f"identical splits: {report['identical']} ({', '.join(report['files_compared'])})")
    print(f"wrote {args.out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

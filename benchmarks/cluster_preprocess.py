"""Benchmark: GeoLife preprocessed with `--engine ray` on two Ray nodes that share no disk, against the default
engine on this machine: the same splits, byte for byte, and each one's wall time.

The two nodes are tests/cluster_rig.py's (each `ray start --block` in its own mount namespace with private /tmp,
which needs root for `unshare`; a head with no CPUs for work, a worker with `--cpus`). `pgt preprocess --engine ray`
is submitted with `ray job submit` (a shell command: the input is copied first) and reads the input from the head's
own disk (its private /tmp): the partitions'
tasks on the worker get their files through Ray's object store. Writes JSON (default
benchmarks/results/cluster_preprocess.json) and prints a table.

    python benchmarks/cluster_preprocess.py [--input geolife_positionfixes.parquet] [--cpus 2] [--partitions 7]
"""

from __future__ import annotations

import argparse
import hashlib
import json
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

    from tests.cluster_rig import SHARED, Cluster, cluster_env, require_isolated_nodes

    require_isolated_nodes()
    work = Path(tempfile.mkdtemp(prefix="pgt-bench-cluster-pp-"))
    shared = work / "shared"
    shared.mkdir()
    shutil.copyfile(args.input, shared / "input.parquet")
    shutil.copyfile(CONFIG, shared / "config.yaml")
    pgt = str(Path(sys.executable).parent / "pgt")
    partitions = ["--partitions", str(args.partitions)] if args.partitions else []

    began = time.time()
    subprocess.run([pgt, "preprocess", "--input", str(args.input), "--format", "positionfixes", "--config", str(CONFIG),
                    "--out", str(work / "local"), "--no-progress", *partitions], check=True, capture_output=True)
    local_s = time.time() - began

    rig = Cluster(cluster_env(work), shared)
    try:
        rig.start()
        command = (f"cp {SHARED}/input.parquet /tmp/input.parquet && {pgt} preprocess --input /tmp/input.parquet "
                   f"--format positionfixes --config {SHARED}/config.yaml --out {SHARED}/ray --engine ray "
                   f"--no-progress {' '.join(partitions)}")
        began = time.time()
        status, logs = rig.submit("bash", "-c", command, timeout_s=3600)  # `ray job submit`: a shell command
        ray_s = time.time() - began
    finally:
        rig.stop()
    if status != "SUCCEEDED":
        raise SystemExit(f"error: the Ray engine's job ended {status}: {logs[-3000:]}")
    local, ray = digests(work / "local"), digests(shared / "ray")
    manifest = json.loads((shared / "ray" / "manifest.json").read_text())
    report = {
        "what": "GeoLife preprocessed by the Ray engine on two nodes that share no disk, against the default engine",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "input": shown_path(args.input), "config": str(CONFIG.relative_to(ROOT)),
        "default_engine_wall_s": round(local_s, 1),
        "ray_engine_two_nodes_wall_s": round(ray_s, 1),  # submission to the job's end: the copy into /tmp included
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

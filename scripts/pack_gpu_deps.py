"""Pack what a GPU machine without PyPI lacks for the training path, in parts that each fit one transfer.

Such a machine (an image with torch and CUDA, pyarrow, pandas, numpy, pyyaml, aiohttp and the like) lacks Ray,
polars, and what Ray imports beyond those (jsonschema, pydantic). This downloads their wheels for its Python and
platform at the versions installed here (the project's pins), unpacks them, trims Ray of what training and Tune
never load (its Java jars, RLlib, Serve and its tests), keeps each file's mode (Ray's binaries are executables),
and writes one `.tar.xz` per part into `--out` (.gpu-deps, ignored by git), each at most `--max-part-mib`:

    ray.tar.xz      Ray (Train, Tune, Data, the dashboard's State API), jsonschema and pydantic
    polars.tar.xz   polars and its runtime, rich and what rich needs

On the GPU machine, from the project folder (each part may come in its own call):

    mkdir -p /tmp/pgt-deps && tar xJf .gpu-deps/ray.tar.xz -C /tmp/pgt-deps
    tar xJf .gpu-deps/polars.tar.xz -C /tmp/pgt-deps
    export PYTHONPATH=/tmp/pgt-deps:$PWD RAY_AUTH_MODE=disabled

The training path needs nothing else: MLflow, Prefect and Optuna are imported only by tracking, flows and
`--search optuna`, so a GPU run uses no tracking URI and `pgt tune --search random`.

    python scripts/pack_gpu_deps.py [--python-version 3.12] [--out .gpu-deps] [--max-part-mib 60]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = {  # part -> distributions (installed here, so pinned by the project)
    # Ray and what it imports that such an image lacks: jsonschema (runtime-env schemas, at `import ray`) and
    # pydantic (Ray Train V2's configs), with theirs; colorful and wcwidth (its logs); the rest, jsonschema's
    "ray": ("ray", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "jsonpointer",
            "rfc3339-validator", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "colorful",
            "wcwidth", "pytz"),
    "polars": ("polars", "polars-runtime-32", "rich", "markdown-it-py", "mdurl", "pygments"),
}
TRIMMED = ("ray/jars", "ray/rllib", "ray/serve", "ray/tests", "ray/tune/tests", "ray/train/tests", "ray/data/tests",
           "ray/llm")


def pinned(distribution: str) -> str:
    """`name==version` of the distribution installed here; SystemExit naming it when it is not."""
    try:
        return f"{distribution}=={importlib.metadata.version(distribution)}"
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"error: {distribution} is not installed here; install the project first (make install)") from None


def download(requirements: list[str], python_version: str, platform: str, dest: Path) -> list[Path]:
    """The wheels of `requirements` for that Python and platform (no dependencies: the parts list them)."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", python_version, "--implementation", "cp", "--platform", platform,
               "--dest", str(dest), *requirements]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise SystemExit(f"error: pip download {' '.join(requirements)}: {last}")
    return sorted(dest.glob("*.whl"))


def unpack(wheels: list[Path], into: Path) -> None:
    """Each wheel's files as pip would place them in site-packages (a wheel is a zip of exactly that), with the
    modes the wheel gives them: Ray's gcs_server and raylet must stay executable (zipfile drops the modes)."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                path = Path(archive.extract(info, into))
                mode = (info.external_attr >> 16) & 0o777
                if mode and not info.is_dir():
                    path.chmod(mode)


def trim(folder: Path) -> int:
    """Remove what the training path never loads (TRIMMED, source maps), and the symbol tables of the compiled
    files (Ray's raylet, gcs_server and _raylet.so, polars' runtime ship unstripped: a quarter of the parts'
    size, read only by debuggers); the bytes removed."""
    removed = 0
    for relative in TRIMMED:
        path = folder / relative
        if path.is_dir():
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
    for source_map in folder.rglob("*.js.map"):
        removed += source_map.stat().st_size
        source_map.unlink()
    return removed + strip_symbols(folder)


ELF = b"\x7fELF"


def strip_symbols(folder: Path) -> int:
    """`strip --strip-unneeded` on every ELF file under folder (the symbols a loader needs stay; modes kept); the
    bytes removed. Without a `strip` on PATH nothing is stripped and the parts are larger."""
    strip = shutil.which("strip")
    if strip is None:
        return 0
    removed = 0
    for path in folder.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        with open(path, "rb") as fh:
            if fh.read(4) != ELF:
                continue
        before = path.stat().st_size
        if subprocess.run([strip, "--strip-unneeded", str(path)], capture_output=True).returncode == 0:
            removed += before - path.stat().st_size
    return removed


def pack(folder: Path, archive: Path) -> int:
    """folder's contents as archive (.tar.xz, paths relative to folder); its size in bytes."""
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name)
    return archive.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (major.minor)")
    parser.add_argument("--platform", default="manylinux2014_x86_64")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-deps", help="where the parts go (a folder of its own)")
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--max-part-mib", type=float, default=60.0, help="the most one transfer carries, less the project")
    args = parser.parse_args()
    if args.out.exists() and any(p for p in args.out.iterdir() if not p.name.endswith(".tar.xz")):
        raise SystemExit(f"error: {args.out} holds files this script did not write; name an empty or new --out")
    args.out.mkdir(parents=True, exist_ok=True)
    too_large = []
    for part in args.parts:
        with tempfile.TemporaryDirectory(prefix=f"pgt-pack-{part}-") as tmp:
            wheels = download([pinned(d) for d in PARTS[part]], args.python_version, args.platform, Path(tmp) / "wheels")
            staging = Path(tmp) / "site"
            unpack(wheels, staging)
            removed = trim(staging)
            size = pack(staging, args.out / f"{part}.tar.xz")
        mib = size / 2**20
        print(f"{part}.tar.xz: {mib:.1f} MiB from {len(wheels)} wheels"
              + (f" ({removed / 2**20:.0f} MiB trimmed)" if removed else ""))
        if mib > args.max_part_mib:
            too_large.append(f"{part} ({mib:.1f} MiB)")
    if too_large:
        raise SystemExit(f"error: over --max-part-mib {args.max_part_mib:g}: {', '.join(too_large)}")
    print(f"wrote {args.out}; on the GPU machine: mkdir -p /tmp/pgt-deps && for f in {args.out.name}/*.tar.xz; do "
          "tar xJf $f -C /tmp/pgt-deps; done; export PYTHONPATH=/tmp/pgt-deps:$PWD RAY_AUTH_MODE=disabled")


if __name__ == "__main__":
    main()

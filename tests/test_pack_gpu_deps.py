"""scripts/pack_gpu_deps.py without the network: a wheel unpacked as site-packages, trimmed of what training
never loads, packed as tar.xz that unpacks to an importable package; an --out of other files is refused."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
import zipfile

from tests.conftest import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "pack_gpu_deps.py"


def load_script():
    spec = importlib.util.spec_from_file_location("pack_gpu_deps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_wheel_is_unpacked_trimmed_and_packed_importable(tmp_path):
    pack = load_script()
    wheel = tmp_path / "fakeray-1.0-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("ray/__init__.py", "VERSION = 'fake'\n")
        server = zipfile.ZipInfo("ray/core/src/ray/gcs/gcs_server")
        server.external_attr = 0o755 << 16  # as the real wheel marks Ray's binaries
        archive.writestr(server, "#!/bin/sh\necho serving\n")
        archive.writestr("ray/train/__init__.py", "")
        archive.writestr("ray/jars/ray_dist.jar", b"x" * 1000)
        archive.writestr("ray/rllib/__init__.py", "")
        archive.writestr("fakeray-1.0.dist-info/METADATA", "Name: fakeray\n")
    site = tmp_path / "site"
    pack.unpack([wheel], site)
    assert pack.trim(site) == 1000  # the jar's bytes; rllib's empty __init__ adds none
    assert not (site / "ray" / "jars").exists() and not (site / "ray" / "rllib").exists()
    size = pack.pack(site, tmp_path / "ray.tar.xz")
    assert size == (tmp_path / "ray.tar.xz").stat().st_size > 0
    with tarfile.open(tmp_path / "ray.tar.xz") as tar:
        tar.extractall(tmp_path / "deps", filter="data")
    r = subprocess.run([sys.executable, "-c", "import ray, ray.train; print(ray.VERSION, ray.__file__)"],
                       env={"PYTHONPATH": str(tmp_path / "deps")}, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["fake", str(tmp_path / "deps" / "ray" / "__init__.py")]
    # the binaries Ray starts stay executable through the unpacking, the tar.xz and its unpacking there
    server = tmp_path / "deps" / "ray" / "core" / "src" / "ray" / "gcs" / "gcs_server"
    assert subprocess.run([str(server)], capture_output=True, text=True).stdout == "serving\n"


def test_an_out_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert r.stderr.strip() == f"error: {tmp_path} holds files this script did not write; name an empty or new --out"
    assert (tmp_path / "notes.txt").read_text() == "mine"

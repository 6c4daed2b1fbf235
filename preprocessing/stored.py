"""`pgt preprocess` with its input or its output on object storage (s3://, gs://; a mount every node shares is a
local path).

The stages read local files, so an input named by a URI is first copied into a local scratch folder (with the Ray
engine on a cluster the driver then ships each partition's bytes to its task; no node opens a path another node
has). The manifest and the quarantine name the URI, not the copy. An output named by a URI is written locally,
then published: its files first, its manifest.json last, so that a reader (pgt.data.fetch.local_data) never takes a
half-copied folder for a complete one. A rerun whose stored manifest is this input's, format's, config's and code's
reuses it, as a local folder is reused.

Object storage has no lock: two runs into one URI at once are the user's to avoid (a local --out refuses the second).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from infra.errors import InputError
from infra.output import check_output_entries
from infra.storage import Storage, is_uri, open_storage, without_query
from preprocessing.config import PreprocessConfig
from preprocessing.engine import EngineConfig
from preprocessing.output import PRODUCER, is_own_manifest
from preprocessing.pipeline import (
    OUTPUT_FILES,
    OWN_FILES,
    PreprocessResult,
    input_sha256,
    preprocess,
    progress_bars,
    same_output,
)
from preprocessing.stages import check_format

MANIFEST = "manifest.json"
FOLDER_FORMATS = ("geolife-plt",)  # formats whose input is a folder; the others are one Parquet or CSV file


def fetch_input(uri: str, input_format: str, into: Path, progress: bool = True) -> Path:
    """The input at `uri` copied below the local folder `into`, its file or folder name kept (a file's suffix says
    Parquet or CSV); the local path returned. InputError when nothing is there or it is a file where the format
    reads a folder (or the reverse); ServiceError when the storage does not answer."""
    check_format(uri, input_format)
    storage = open_storage(uri)
    storage.check()
    expected = "folder" if input_format in FOLDER_FORMATS else "file"
    found = storage.kind()
    if found is None:
        raise InputError(without_query(uri), f"no such {expected} on the storage")
    if found != expected:
        what = "a GeoLife folder (Data/<user>/Trajectory/*.plt)" if expected == "folder" else "a Parquet or CSV file"
        raise InputError(without_query(uri), f"is a {found}; --format {input_format} reads {what}")
    local = Path(into) / (storage.path.rstrip("/").rpartition("/")[2] or "input")
    files = 1 if found == "file" else len(storage.files())
    with progress_bars(progress) as bar:
        task = bar.add_task("fetch input", total=files)
        storage.download(local, on_file=lambda size: bar.advance(task))
    return local


def kept_input(uri: str, input_format: str, folder: Path) -> Path:
    """The input at `uri` copied below `folder`, in a subfolder named by its content's hash, so that runs of the
    same bytes share one copy and a copy is never changed while another run reads it (the flow's input; a new
    content is a new subfolder). The local path returned."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".fetching-", dir=folder))
    try:
        fetched = fetch_input(uri, input_format, scratch, progress=False)
        home = folder / f"{input_sha256(fetched, input_format)[:16]}-{fetched.name}"
        if not (home / fetched.name).exists():
            try:
                scratch.rename(home)  # the copy whole, or not at all where another run's identical one just came
            except OSError:
                if not (home / fetched.name).exists():
                    raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return home / fetched.name


def check_stored_output(target: Storage) -> dict | None:
    """The stored manifest of an output folder on object storage (None where the folder is empty); InputError when
    the folder holds anything `pgt preprocess` did not write, which is never replaced; ServiceError when the storage
    does not answer, has no such bucket or refuses the credentials (check_output_entries asks it first)."""
    check_output_entries(target.uri, PRODUCER, OWN_FILES)
    if not target.entries():
        return None
    try:
        manifest = target.read_json(MANIFEST)
    except ValueError:
        manifest = None
    if not is_own_manifest(manifest) or not isinstance(manifest, dict):
        raise InputError(without_query(target.uri), "holds no `pgt preprocess` manifest.json beside its files; nothing there "
                                            "is replaced: choose another --out")
    return manifest


def publish_output(folder: Path, location: str) -> str:
    """A local `pgt preprocess` folder's files copied to `location` (a URI, or a folder every node mounts), for the
    nodes of a cluster to read; nothing is copied where the stored manifest.json is already this folder's. The
    stored manifest is removed first and written last, and files of an earlier output that this one lacks are
    removed, as a local folder is replaced whole. Returns `location`."""
    folder = Path(folder)
    manifest = (folder / MANIFEST).read_bytes()
    target = open_storage(location)
    if target.local is not None and target.local.resolve() == folder.resolve():
        return location
    check_stored_output(target)
    if target.read_bytes(MANIFEST) == manifest:
        return location
    target.delete(MANIFEST)
    ours = {path.name for path in folder.iterdir() if path.is_file()}
    for name in sorted(set(target.entries()) - ours):
        target.delete(name)
    for name in sorted(ours - {MANIFEST}):
        target.upload(folder / name, name)
    target.write_bytes(manifest, MANIFEST)
    return location


def preprocess_stored(input_path: str | Path, input_format: str, out: str | Path,
                      config: PreprocessConfig | None = None, force: bool = False, progress: bool = True,
                      engine: EngineConfig | None = None) -> PreprocessResult:
    """`preprocess` where the input, the output or both may be URIs (local paths go straight to it)."""
    if not is_uri(input_path) and not is_uri(out):
        return preprocess(input_path, input_format, out, config, force, progress, engine)
    check_format(input_path, input_format)
    config, engine = config or PreprocessConfig(), engine or EngineConfig()
    target = open_storage(out) if is_uri(out) else None
    if target is not None and target.local is not None:  # a file:// URI: the local folder, written in place
        out, target = target.local, None
    stored = None
    if target is not None:
        stored = check_stored_output(target)
    if engine.work_dir is not None:
        engine.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pgt-preprocess-", dir=engine.work_dir) as scratch:
        scratch = Path(scratch)
        local_input, source = Path(input_path), None
        if is_uri(input_path):
            local_input = fetch_input(str(input_path), input_format, scratch / "input", progress)
            source = without_query(input_path)
        with named_as(local_input, source):
            if target is None:
                return preprocess(local_input, input_format, out, config, force, progress, engine, source)
            if not force and stored is not None and set(OUTPUT_FILES) <= set(target.entries()) and same_output(
                    stored, input_sha256(local_input, input_format), input_format, config):
                return PreprocessResult(stored, str(out), reused=True)
            result = preprocess(local_input, input_format, scratch / "output", config, True, progress, engine, source)
        publish_output(result.out_dir, str(out))
        return PreprocessResult(result.manifest, str(out), reused=False)


@contextlib.contextmanager
def named_as(copy: Path, source: str | None):
    """An InputError about a file of the local copy `copy` of the input names it under `source`, the URI the user
    gave (the copy is gone once the run ends)."""
    try:
        yield
    except InputError as exc:
        if source is None or not exc.source.startswith(str(copy)):
            raise
        raise InputError(source + exc.source[len(str(copy)):], exc.problem) from None

"""A `pgt preprocess` folder named by a URI (s3://, gs://), made readable as a local folder on the node that reads it.

Every reader of the data (the driver, each Ray Train rank, each Tune trial) opens local files: where --data is a
URI, `local_data` copies the folder's files once per node into a cache folder and returns it. The copy is keyed by
the URI and kept while the stored manifest.json is byte-identical to the cached one (a folder preprocessed again
gets a new manifest, so a new copy); the processes of one node make it one at a time (a lock file), each copy
written beside its final name and renamed into place. A local path is returned as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from infra.errors import InputError
from infra.storage import is_uri, open_storage, without_query

MANIFEST = "manifest.json"
CACHE_ENV = "PGT_DATA_CACHE"  # where a node keeps its copies of data named by a URI; default: <temp>/pgt-data


def data_cache() -> Path:
    """This node's folder of data copies."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "pgt-data")


def local_data(location: str | Path) -> Path:
    """The local folder of the `pgt preprocess` output at `location` (a path, or a URI copied into data_cache()).
    InputError when the URI's folder holds no manifest.json; ServiceError when its storage does not answer."""
    if not is_uri(location):
        return Path(location)
    storage = open_storage(str(location))
    storage.check()
    manifest = storage.read_bytes(MANIFEST)
    if manifest is None:
        raise InputError(storage.uri, "no manifest.json; expected a `pgt preprocess` output folder")
    key = hashlib.sha256(without_query(storage.uri).encode()).hexdigest()[:16]
    target = data_cache() / key
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one copy at a time per node: the others wait for it, then use it
        cached = target / MANIFEST
        if cached.is_file() and cached.read_bytes() == manifest:
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=target.parent))
        try:
            for name in storage.files():
                if "/" not in name:  # a preprocess folder's files are all at its top
                    (staging / name).write_bytes(storage.read_bytes(name) or b"")
            (staging / MANIFEST).write_bytes(manifest)  # the manifest compared above, whatever changed meanwhile
            if target.exists():  # the copy of an earlier preprocessing of that folder
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


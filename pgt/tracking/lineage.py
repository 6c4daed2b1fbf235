"""What a run came from: its train, validation and test splits as MLflow dataset inputs (a digest of each file,
its rows, the preprocessing that made it), and the command and git commit it ran from (the UI's Source); what a
prediction came from: the registered version a model URI names (`model_version`)."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq

import pgt
from infra.storage import without_query
from pgt.tracking.store import mlflow_client

SPLIT_CONTEXT = {"train": "training", "validation": "validation", "test": "test"}  # dataset input contexts


def git_commit(folder: Path = Path(pgt.__file__).resolve().parent.parent) -> str | None:
    """The commit the project's checkout is at (with "-dirty" when it has uncommitted changes), or None outside
    a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def source_tags(command: str) -> dict[str, str]:
    """What the UI's Source column shows: the command that made the run, and the commit it ran from."""
    tags = {"mlflow.source.name": command, "mlflow.source.type": "LOCAL"}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def split_digests(data_dir: Path) -> dict[str, str]:
    """Each split's SHA-256 (file_digest), by split name."""
    return {split: file_digest(Path(data_dir) / f"{split}.parquet") for split in SPLIT_CONTEXT}


def split_datasets(data_dir: Path, source: str | None = None, digests: dict[str, str] | None = None) -> list:
    """MLflow dataset inputs for the splits of a `pgt preprocess` folder: name, a digest of the file (from
    `digests`, split_digests' of the same folder, where the caller has them), where it is kept (`source`, the
    folder's URI where it was copied from object storage; else its path), and as profile its rows and the
    preprocessing (input digest and settings) that made it."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    inputs = []
    for split, context in SPLIT_CONTEXT.items():
        path = (Path(data_dir) / f"{split}.parquet").resolve()
        uri = path.as_uri() if source is None else _file_uri(source, path.name)
        profile = {"num_rows": pq.read_metadata(path).num_rows, "input_sha256": manifest.get("input_sha256"),
                   "input": manifest.get("input"), "preprocessing": manifest.get("config")}
        name = (without_query(source).rstrip("/").rpartition("/")[2] if source else path.parent.name) or path.parent.name
        digest = digests[split] if digests else file_digest(path)
        dataset = Dataset(name=f"{name}/{split}", digest=digest[:16], source_type="local" if source is None
                          else "s3" if source.startswith("s3://") else "gcs",
                          source=json.dumps({"uri": uri}), profile=json.dumps(profile, default=str))
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)]))
    return inputs


def _file_uri(folder_uri: str, name: str) -> str:
    """The URI of a file in the folder `folder_uri` names (its query, the endpoint, kept)."""
    base, _, query = folder_uri.partition("?")
    return f"{base.rstrip('/')}/{name}" + (f"?{query}" if query else "")


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, computed once per process while the file is unchanged (a sweep's trial process
    runs many trials on one split)."""
    stat = Path(path).stat()
    return _digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def log_datasets(tracking_uri: str, run_id: str, data_dir: Path, source: str | None = None,
                 digests: dict[str, str] | None = None) -> None:
    """The splits a run trained and was scored on, as the run's dataset inputs (split_datasets). Two runs that log
    the same new dataset at once race in MLflow's store (a unique key on the dataset): the loser tries again, and
    then finds the dataset the winner created."""
    from mlflow.exceptions import MlflowException

    datasets = split_datasets(data_dir, source, digests)
    for attempt in range(3):
        try:
            mlflow_client(tracking_uri).log_inputs(run_id, datasets=datasets)
            return
        except MlflowException as exc:
            if "UNIQUE constraint" not in str(exc) or attempt == 2:
                raise
            time.sleep(0.2 * (attempt + 1))


def input_dataset(path: Path, context: str = "prediction"):
    """An MLflow dataset input for a file a run read: its name, a digest of its bytes, its path and size."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    path = Path(path).resolve()
    dataset = Dataset(name=path.name, digest=file_digest(path)[:16], source_type="local",
                      source=json.dumps({"uri": path.as_uri()}), profile=json.dumps({"bytes": path.stat().st_size}))
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])


def model_version(tracking_uri: str, model_uri: str) -> dict | None:
    """The registered version a models:/NAME@ALIAS or models:/NAME/VERSION URI names now: {"name", "version",
    "version_uri" (models:/NAME/VERSION, which keeps naming it once the alias moves)}; None for another URI."""
    if not model_uri.startswith("models:/"):
        return None
    path = model_uri.removeprefix("models:/")
    client = mlflow_client(tracking_uri)
    if "@" in path:
        name, alias = path.split("@", 1)
        version = client.get_model_version_by_alias(name, alias).version
    else:
        name, _, version = path.partition("/")
        if not version.isdigit():
            return None
    return {"name": name, "version": int(version), "version_uri": f"models:/{name}/{version}"}

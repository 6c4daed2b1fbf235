"""The tracking URI as the commands resolve it: paths made absolute (Ray workers run elsewhere), URIs kept."""

from __future__ import annotations

import pytest

from pgt.tracking.store import refusal_words, resolve_tracking_uri


@pytest.mark.parametrize(("given", "expected"), [
    ("sqlite:///rel/mlflow.db", "sqlite:///{cwd}/rel/mlflow.db"),  # relative SQLite: absolute
    ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
    ("rel/mlruns", "file://{cwd}/rel/mlruns"),  # a bare path: a file URI
    ("file:/abs/mlruns", "file:/abs/mlruns"),  # a file URI of one slash is a URI, not a relative path
    ("file:///abs/mlruns", "file:///abs/mlruns"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
])
def test_a_tracking_uri_is_made_absolute_only_where_it_is_a_path(given, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_tracking_uri(given) == expected.format(cwd=tmp_path.resolve())


@pytest.mark.parametrize(("body", "said"), [
    ('{"error_code": "PERMISSION_DENIED", "message": "Permission\\n denied"}', "Permission denied"),  # MLflow's JSON
    ("<!doctype html><html><title>500 Internal Server Error</title><h1>x</h1>", "500 Internal Server Error"),
    ("You are not authenticated.\n Please see the docs", "You are not authenticated. Please see the docs"),
    ('["a", "list"]', '["a", "list"]'),
])
def test_a_refusal_is_said_by_its_message_or_title(body, said):
    assert refusal_words(body) == said


def test_a_file_digest_is_computed_once_per_process_while_the_file_is_unchanged(tmp_path):
    """A sweep's trial process logs the same splits for every trial it runs: hashed once, and again once changed."""
    import hashlib
    import os

    from pgt.tracking.lineage import _digest, file_digest

    path = tmp_path / "train.parquet"
    path.write_bytes(b"a" * 1000)
    before = _digest.cache_info().hits
    assert file_digest(path) == hashlib.sha256(b"a" * 1000).hexdigest() == file_digest(path)
    assert _digest.cache_info().hits == before + 1
    path.write_bytes(b"b" * 1000)
    os.utime(path, ns=(1, 1))  # a rewrite within the clock's tick still changes the key (size, mtime)
    assert file_digest(path) == hashlib.sha256(b"b" * 1000).hexdigest()


def test_dataset_inputs_take_digests_hashed_elsewhere(synthetic_sequences, monkeypatch):
    """A sweep's driver hashes the splits once (split_digests) and every trial's dataset inputs carry those digests:
    given them, split_datasets reads no split's bytes."""
    import hashlib

    from pgt.tracking import lineage

    digests = lineage.split_digests(synthetic_sequences)
    assert digests["train"] == hashlib.sha256((synthetic_sequences / "train.parquet").read_bytes()).hexdigest()
    assert sorted(digests) == ["test", "train", "validation"]
    monkeypatch.setattr(lineage, "file_digest", lambda path: pytest.fail(f"hashed {path}"))
    given = {split: f"{split:0<64}" for split in digests}
    datasets = lineage.split_datasets(synthetic_sequences, digests=given)
    assert sorted(d.dataset.digest for d in datasets) == sorted(value[:16] for value in given.values())

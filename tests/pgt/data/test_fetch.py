"""Data named by a URI, copied once per node (file:// URIs here: the same pyarrow path as s3://, whose copy the S3
test of tests/pgt/training/test_run.py makes)."""

from __future__ import annotations

import shutil

import pytest

from infra.errors import InputError, SettingsError
from pgt.data.fetch import CACHE_ENV, local_data
from pgt.training.run import open_data


@pytest.fixture
def stored(synthetic_sequences, tmp_path, monkeypatch):
    """A copy of the synthetic sequences as a "bucket" folder, its URI, and this test's own node cache."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    folder = tmp_path / "bucket" / "seq"
    shutil.copytree(synthetic_sequences, folder)
    return folder, folder.as_uri()


def test_a_uri_is_copied_once_and_again_only_when_its_manifest_changes(stored, tmp_path):
    folder, uri = stored
    copy = local_data(uri)
    assert copy.parent == tmp_path / "cache"
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in folder.iterdir() if p.is_file())
    assert (copy / "train.parquet").read_bytes() == (folder / "train.parquet").read_bytes()
    stamp = (copy / "train.parquet").stat().st_mtime_ns
    assert local_data(uri) == copy and (copy / "train.parquet").stat().st_mtime_ns == stamp  # reused

    (folder / "train.parquet").write_bytes(b"changed")  # the same manifest: the copy stands
    assert (local_data(uri) / "train.parquet").read_bytes() != b"changed"
    (folder / "manifest.json").write_text((folder / "manifest.json").read_text().replace("{", "{\"again\": 1, ", 1))
    assert (local_data(uri) / "train.parquet").read_bytes() == b"changed"  # preprocessed again: copied again
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]
    assert local_data(folder) == folder  # a path is read where it is


def test_open_data_keeps_the_uri_and_reads_the_copy(stored):
    folder, uri = stored
    data = open_data(uri)
    assert data.source == uri and data.path == local_data(uri).resolve() and data.rows["train"] > 0
    assert open_data(folder).source == str(folder.resolve())


def test_a_uri_without_a_preprocessed_folder_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"empty: no manifest.json; expected a `pgt preprocess` output folder"):
        local_data((tmp_path / "empty").as_uri())
    with pytest.raises(SettingsError, match="storage URIs are s3:// or gs://"):
        local_data("ftp://host/seq")


"""`pgt preprocess` with its input or output on object storage (preprocessing.stored), against a real S3-compatible
server (moto's, started by scripts/start-s3.sh): the same output as from local files, the URI named where the copy
would be, reuse, and one-line refusals."""

from __future__ import annotations

import json

import polars as pl
import pyarrow.fs as pafs
import pytest

from infra.errors import InputError, ServiceError
from infra.storage import open_storage
from pgt.data.fetch import local_data
from preprocessing.pipeline import OUTPUT_FILES, preprocess
from preprocessing.stored import preprocess_stored, publish_output
from tests.infra.test_storage import bucket
from tests.preprocessing.test_pipeline import commuter_csv


@pytest.fixture
def stored_fixes(s3_server, credentials, tmp_path):
    """The commuter's fixes (test_pipeline) as a local CSV and as an object in a new bucket."""
    local = tmp_path / "fixes.csv"
    commuter_csv(local)
    folder = bucket(s3_server, "stored-fixes")
    open_storage(folder).upload(local, "fixes.csv")
    return local, folder


@pytest.fixture
def sequences(tmp_path):
    """A `pgt preprocess` output folder of the commuter's fixes."""
    commuter_csv(tmp_path / "fixes.csv")
    return preprocess(tmp_path / "fixes.csv", "positionfixes", tmp_path / "sequences", progress=False).out_dir


def tables(folder) -> dict[str, pl.DataFrame]:
    return {name: pl.read_parquet(folder / name) for name in OUTPUT_FILES if name.endswith(".parquet")}


def test_an_input_on_object_storage_gives_the_local_input_s_output_and_names_its_uri(stored_fixes, tmp_path):
    local, folder = stored_fixes
    uri = open_storage(folder).uri_of("fixes.csv")
    mine = preprocess(local, "positionfixes", tmp_path / "from-local", progress=False)
    theirs = preprocess_stored(uri, "positionfixes", tmp_path / "from-uri", progress=False)
    assert theirs.manifest["input"] == "s3://stored-fixes/run/fixes.csv"  # without the endpoint's query
    assert theirs.manifest["input_sha256"] == mine.manifest["input_sha256"]
    assert theirs.manifest["counts"] == mine.manifest["counts"]
    ours, copied = tables(tmp_path / "from-local"), tables(tmp_path / "from-uri")
    for name in ours:
        if name != "quarantine.parquet":
            assert copied[name].equals(ours[name]), name
    quarantine = copied["quarantine.parquet"]
    assert quarantine.height == ours["quarantine.parquet"].height == 2  # the commuter's two bad rows
    assert set(quarantine["source_file"]) == {"s3://stored-fixes/run/fixes.csv"}
    assert preprocess_stored(uri, "positionfixes", tmp_path / "from-uri", progress=False).reused
    assert not list(tmp_path.glob("pgt-preprocess-*"))


def test_an_output_on_object_storage_is_published_reused_and_read_back(stored_fixes, tmp_path):
    local, folder = stored_fixes
    out = open_storage(folder).uri_of("sequences")
    first = preprocess_stored(local, "positionfixes", out, progress=False)
    assert not first.reused and first.out_dir == out
    kept = open_storage(out)
    assert sorted(kept.entries()) == sorted(OUTPUT_FILES)
    assert kept.read_json("manifest.json") == json.loads(json.dumps(first.manifest, default=str))
    again = preprocess_stored(local, "positionfixes", out, progress=False)
    assert again.reused and again.manifest["input_sha256"] == first.manifest["input_sha256"]
    mine = preprocess(local, "positionfixes", tmp_path / "local", progress=False)
    read_back = tables(local_data(out))
    assert all(read_back[name].equals(table) for name, table in tables(tmp_path / "local").items())
    assert mine.manifest["counts"] == first.manifest["counts"]
    stamp = kept.read_bytes("manifest.json")
    forced = preprocess_stored(local, "positionfixes", out, force=True, progress=False)
    assert not forced.reused and kept.read_bytes("manifest.json") != stamp  # a new run's stage times


def test_storage_refusals_are_one_line_and_write_nothing(stored_fixes, tmp_path, s3_server):
    local, folder = stored_fixes
    storage = open_storage(folder)
    with pytest.raises(InputError, match=r"^s3://stored-fixes/run/missing.csv: no such file on the storage$"):
        preprocess_stored(storage.uri_of("missing.csv"), "positionfixes", tmp_path / "a", progress=False)
    with pytest.raises(InputError, match="is a file; --format geolife-plt reads a GeoLife folder"):
        preprocess_stored(storage.uri_of("fixes.csv"), "geolife-plt", tmp_path / "b", progress=False)
    storage.write_bytes(b"not Parquet", "bad.parquet")
    with pytest.raises(InputError, match=r"^s3://stored-fixes/run/bad.parquet: not a Parquet file"):
        preprocess_stored(storage.uri_of("bad.parquet"), "positionfixes", tmp_path / "c", progress=False)
    storage.write_bytes(b"theirs", "notes", "readme.txt")
    with pytest.raises(InputError, match=r"did not write \(readme.txt\)"):
        preprocess_stored(local, "positionfixes", storage.uri_of("notes"), progress=False)
    assert storage.child("notes").entries() == ["readme.txt"]
    endpoint = s3_server.removeprefix("http://")
    with pytest.raises(ServiceError, match="no such bucket 'nobucket'"):
        preprocess_stored(local, "positionfixes", f"s3://nobucket/x?endpoint_override={endpoint}&scheme=http",
                          progress=False)
    assert not any((tmp_path / name).exists() for name in "abc")


def test_a_folder_is_published_once_with_its_manifest_last(sequences, tmp_path):
    """publish_output copies a preprocess folder to storage (a file:// URI here) for a cluster's nodes, and copies
    nothing where the stored manifest is the folder's; a folder published to itself is left alone; a folder of
    someone else's files is refused."""
    target = (tmp_path / "bucket" / "seq").as_uri()
    assert publish_output(sequences, target) == target
    published = tmp_path / "bucket" / "seq"
    assert sorted(p.name for p in published.iterdir()) == sorted(p.name for p in sequences.iterdir() if p.is_file())
    assert (published / "train.parquet").read_bytes() == (sequences / "train.parquet").read_bytes()
    (published / "train.parquet").write_bytes(b"kept")  # the same manifest: nothing is copied again
    publish_output(sequences, target)
    assert (published / "train.parquet").read_bytes() == b"kept"
    assert publish_output(published, str(published)) == str(published)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"did not write \(notes.txt\)"):
        publish_output(sequences, str(tmp_path / "theirs"))


def test_a_new_output_replaces_the_stored_one_whole(sequences, tmp_path):
    """A stored output whose manifest differs is replaced: a file the new output lacks is removed with it."""
    target = tmp_path / "seq"
    publish_output(sequences, str(target))
    (target / "latest.parquet").write_bytes(b"of an earlier --fitted run")
    (target / "manifest.json").write_text(json.dumps({**json.loads((target / "manifest.json").read_text()),
                                                      "input_sha256": "earlier"}))
    publish_output(sequences, str(target))
    assert not (target / "latest.parquet").exists()
    assert (target / "manifest.json").read_bytes() == (sequences / "manifest.json").read_bytes()


def test_a_geolife_folder_on_object_storage_reads_as_the_local_folder(plt_sample, s3_server, credentials,
                                                                       tmp_path):
    folder = bucket(s3_server, "stored-plt")
    storage = open_storage(folder)
    storage.upload(plt_sample, "Data")
    files = storage.files("Data")
    assert files and all(name.endswith(".plt") or "/" in name for name in files)
    theirs = preprocess_stored(storage.uri_of("Data"), "geolife-plt", tmp_path / "from-uri", progress=False)
    mine = preprocess(plt_sample, "geolife-plt", tmp_path / "from-local", progress=False)
    assert theirs.manifest["counts"] == mine.manifest["counts"]
    assert theirs.manifest["input_sha256"] == mine.manifest["input_sha256"]
    quarantine = pl.read_parquet(tmp_path / "from-uri" / "quarantine.parquet")
    assert quarantine.height == 213 and quarantine["source_file"].str.starts_with("s3://stored-plt/run/Data/").all()
    assert isinstance(storage.filesystem, pafs.S3FileSystem)

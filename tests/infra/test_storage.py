"""Storage by path or URI (infra.storage) against a real S3-compatible server (moto's, started by scripts/start-s3.sh)."""

from __future__ import annotations

import time

import pytest

from infra.errors import ServiceError, SettingsError
from infra.storage import is_uri, open_storage, storage_problem
from tests.conftest import free_port


def bucket(s3_server: str, name: str) -> str:
    """A new bucket on the test server; the URI of a folder in it, the endpoint in the URI as pyarrow reads it."""
    import pyarrow.fs as pafs

    endpoint = s3_server.removeprefix("http://")
    pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir(name)
    return f"s3://{name}/run?endpoint_override={endpoint}&scheme=http&region=us-east-1"


def test_paths_and_uris_name_their_storage(tmp_path):
    assert not is_uri(tmp_path) and is_uri("s3://b/x") and is_uri("file:///tmp/x")
    local = open_storage(tmp_path / "a" / ".." / "b")
    assert local.local == tmp_path / "b" and local.uri == str(tmp_path / "b")
    assert open_storage(f"file://{tmp_path}/c").local == tmp_path / "c"
    local.write_bytes(b"x", "sub", "f.json")
    assert (tmp_path / "b" / "sub" / "f.json").read_bytes() == b"x" and local.files() == ["sub/f.json"]
    for uri, said in (("ftp://host/x", r"s3:// or gs://.*found ftp://"), ("s3:///x", "no bucket"),
                      ("s3://b/x?endpoint=1", r"unknown option\(s\) endpoint")):
        with pytest.raises(SettingsError, match=said):
            open_storage(uri)


def test_a_folder_on_s3_is_written_listed_and_read_back(s3_server, credentials, tmp_path):
    storage = open_storage(bucket(s3_server, "pgt-storage"))
    assert storage.local is None and storage.entries() == [] and storage.read_bytes("missing.json") is None
    storage.write_bytes(b'{"a": 1}', "metrics.json")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "one.png").write_bytes(b"png")
    storage.upload(tmp_path / "plots", "plots")
    assert storage.entries() == ["metrics.json", "plots"]
    assert storage.files() == ["metrics.json", "plots/one.png"] and storage.files("plots") == ["plots/one.png"]
    assert storage.read_bytes("metrics.json") == b'{"a": 1}' and storage.exists("plots", "one.png")
    child = storage.child("selection")
    assert child.uri.startswith("s3://pgt-storage/run/selection?endpoint_override=") and child.path == "pgt-storage/run/selection"


def test_the_endpoint_comes_from_aws_endpoint_url_too(s3_server, credentials, monkeypatch):
    bucket(s3_server, "pgt-endpoint")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    storage = open_storage("s3://pgt-endpoint/x?region=us-east-1")
    storage.write_bytes(b"1", "f")
    assert storage.read_bytes("f") == b"1"


def test_storage_that_cannot_be_used_fails_in_seconds_in_one_line(s3_server, credentials):
    began = time.monotonic()
    with pytest.raises(ServiceError, match=r"does not answer .*check the endpoint"):
        open_storage(f"s3://b/x?endpoint_override=127.0.0.1:{free_port()}&scheme=http&region=us-east-1").check()
    assert time.monotonic() - began < 15
    endpoint = s3_server.removeprefix("http://")
    with pytest.raises(ServiceError, match="no such bucket"):
        open_storage(f"s3://never-made/x?endpoint_override={endpoint}&scheme=http&region=us-east-1").check()


@pytest.mark.parametrize(("message", "meaning"), [
    ("When getting information for bucket 'b': AWS Error NETWORK_CONNECTION during HeadBucket operation: curlCode: 7, "
     "Could not connect to server; Details: Failed to connect to 127.0.0.1 port 46403", "the storage does not answer"),
    ("AWS Error ACCESS_DENIED during HeadBucket operation: No response body.", "the storage refused the credentials"),
    ("AWS Error UNKNOWN (HTTP status 403) during HeadBucket operation: No response body.",
     "the storage refused the credentials"),
    ("AWS Error NO_SUCH_BUCKET during HeadBucket operation", "no such bucket"),
])
def test_a_storage_error_is_named_by_its_kind_not_by_digits_of_the_port(message, meaning):
    assert storage_problem(message).startswith(meaning)

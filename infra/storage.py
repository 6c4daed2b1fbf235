"""Where a command keeps what it writes: a local folder, or a folder on object storage named by a URI (s3://,
gs://), opened as a pyarrow filesystem that Ray takes as a run's `storage_filesystem`.

An S3-compatible server's address comes from the URI as pyarrow reads it
(`s3://bucket/key?endpoint_override=HOST:PORT&scheme=http`), else from `AWS_ENDPOINT_URL` (which pyarrow itself
ignores); credentials from the environment as pyarrow reads them. Storage that does not answer, refuses the
credentials or has no such bucket fails in seconds, in one line, before any work.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from infra.errors import ServiceError, SettingsError

SCHEMES = ("s3", "gs", "gcs")  # object storage; a path on storage every node mounts (NFS) is a local path
S3_TIMEOUTS_S = {"connect_timeout": 3.0, "request_timeout": 10.0}  # an unreachable endpoint fails in seconds
COPY_THREADS = 8  # files copied at once by download: an object store's latency, not its bandwidth, bounds one at a time
COPY_BLOCK_BYTES = 1 << 22
S3_OPTIONS = ("endpoint_override", "scheme", "region", "access_key", "secret_key", "allow_bucket_creation")


def is_uri(text: str | Path) -> bool:
    """Whether `text` names storage by a URI (scheme://...) rather than a local path."""
    return "://" in str(text)


def without_query(uri: str | Path) -> str:
    """A URI as records and messages name it: without its query (an endpoint, or keys given in the URI)."""
    return str(uri).partition("?")[0]


@dataclass(frozen=True)
class Storage:
    """A folder on a pyarrow filesystem: `path` inside `filesystem`, named `uri`."""

    uri: str
    filesystem: pafs.FileSystem
    path: str

    @property
    def local(self) -> Path | None:
        """The folder as a local path, None on object storage."""
        return Path(self.path) if isinstance(self.filesystem, pafs.LocalFileSystem) else None

    def join(self, *parts: str) -> str:
        """A path inside the filesystem, below this folder."""
        return "/".join([self.path.rstrip("/"), *parts])

    def uri_of(self, *parts: str) -> str:
        """The URI of a file or folder below this one (its query, the endpoint, kept)."""
        base, _, query = self.uri.partition("?")
        return "/".join([base.rstrip("/"), *parts]) + (f"?{query}" if query else "")

    def child(self, *parts: str) -> Storage:
        return Storage(self.uri_of(*parts), self.filesystem, self.join(*parts))

    def exists(self, *parts: str) -> bool:
        return self._info(self.join(*parts)).type != pafs.FileType.NotFound

    def read_bytes(self, *parts: str) -> bytes | None:
        """A file's bytes, None where there is none."""
        if self._info(self.join(*parts)).type != pafs.FileType.File:
            return None
        with self.filesystem.open_input_stream(self.join(*parts)) as stream:
            return stream.read()

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """A whole file at once: readers never see half of one (an object store replaces an object whole; a local
        file is written beside its name and renamed over it)."""
        target = self.join(*parts)
        if self.local is not None:  # the hidden sibling infra.output's writers use, cleaned the same way
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                tmp.write_bytes(data)
                tmp.replace(path)
            finally:
                tmp.unlink(missing_ok=True)
            return
        self.filesystem.create_dir(target.rpartition("/")[0], recursive=True)
        with self.filesystem.open_output_stream(target) as stream:
            stream.write(data)

    def read_json(self, *parts: str):
        """A JSON file's content, None where there is none; ValueError when it is not JSON."""
        data = self.read_bytes(*parts)
        return None if data is None else json.loads(data)

    def write_json(self, data, *parts: str, **dump_kwargs) -> None:
        """JSON through write_bytes."""
        self.write_bytes((json.dumps(data, **dump_kwargs) + "\n").encode(), *parts)

    def upload(self, local: Path, *parts: str) -> None:
        """A local file, or a folder with everything below it, to this folder's `parts`."""
        local = Path(local)
        if local.is_dir():
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                self.write_bytes(path.read_bytes(), *parts, *path.relative_to(local).parts)
        else:
            self.write_bytes(local.read_bytes(), *parts)

    def kind(self, *parts: str) -> str | None:
        """"file" or "folder" for what is at `parts`, None where there is nothing."""
        found = self._info(self.join(*parts)).type
        return {pafs.FileType.File: "file", pafs.FileType.Directory: "folder"}.get(found)

    def download(self, local: Path, *parts: str, on_file: Callable[[int], object] | None = None) -> None:
        """The file at `parts` copied to the local path `local`, or the folder at `parts` with everything below it
        into the local folder `local`, a few files at a time (an object store answers each request with a delay);
        `on_file(size in bytes)` after each file."""
        local = Path(local)
        if self.kind(*parts) == "file":
            pairs = [(self.join(*parts), local)]
        else:
            pairs = [(self.join(*parts, name), local.joinpath(*name.split("/"))) for name in self.child(*parts).files()]

        def copy(pair: tuple[str, Path]) -> int:
            source, target = pair
            target.parent.mkdir(parents=True, exist_ok=True)
            with self._call(self.filesystem.open_input_stream, source) as stream, target.open("wb") as sink:
                return sum(sink.write(block) for block in iter(lambda: stream.read(COPY_BLOCK_BYTES), b""))

        with ThreadPoolExecutor(max_workers=COPY_THREADS) as pool:
            for size in pool.map(copy, pairs):
                if on_file is not None:
                    on_file(size)

    def entries(self) -> list[str]:
        """The names directly in this folder ([] where it does not exist)."""
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=False)
        return sorted(info.base_name for info in self._call(self.filesystem.get_file_info, selector))

    def files(self, *parts: str) -> list[str]:
        """The files below `parts`, as paths relative to this folder."""
        selector = pafs.FileSelector(self.join(*parts), allow_not_found=True, recursive=True)
        root = self.path.rstrip("/") + "/"
        return sorted(info.path.removeprefix(root) for info in self._call(self.filesystem.get_file_info, selector)
                      if info.type == pafs.FileType.File)

    def check(self) -> None:
        """ServiceError in one line unless the storage answers, its bucket exists and these credentials may list
        its folder."""
        if self.local is None and self._info(self.path.split("/")[0]).type == pafs.FileType.NotFound:
            raise ServiceError(f"{self.uri}: no such bucket {self.path.split('/')[0]!r}; create it first")
        if self.kind() != "file":  # a file (an input named by its URI) has no folder to list
            self.entries()

    def delete(self, *parts: str) -> None:
        """The file at `parts` removed (nothing where there is none)."""
        if self.kind(*parts) == "file":
            self._call(self.filesystem.delete_file, self.join(*parts))

    def _info(self, path: str) -> pafs.FileInfo:
        return self._call(self.filesystem.get_file_info, path)

    def _call(self, method, *args):
        try:
            return method(*args)
        except OSError as exc:
            raise ServiceError(f"{self.uri}: {storage_problem(str(exc))}") from None


_NO_ANSWER = ("NETWORK_CONNECTION", "curlCode: 7", "curlCode: 28", "Could not connect", "Connection refused")
_REFUSED = ("ACCESS_DENIED", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden")
_FORBIDDEN = re.compile(r"(status|code)\D{0,3}403\b")


def storage_problem(message: str) -> str:
    """What an error of pyarrow's S3 client means, in words, with the fix."""
    text = " ".join(message.split())
    # a refused connection's message names the port, which may hold "403": it is read before the credentials
    answered = not any(mark in text for mark in _NO_ANSWER)
    if answered and (any(mark in text for mark in _REFUSED) or _FORBIDDEN.search(text)):
        return (f"the storage refused the credentials ({text[:160]}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "to a key that may write there")
    if answered and ("NoSuchBucket" in text or "NO_SUCH_BUCKET" in text):
        return f"no such bucket ({text[:160]}); create it first"
    return f"the storage does not answer ({text[:160]}); check the endpoint and that its server is running"


def open_storage(target: str | Path) -> Storage:
    """The Storage a path or URI names. SettingsError for a URI this project cannot open."""
    text = str(target)
    if not is_uri(text):
        path = Path(text).resolve()
        return Storage(str(path), pafs.LocalFileSystem(), str(path))
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme == "file":
        path = Path(urllib.parse.unquote(parsed.path)).resolve()
        return Storage(str(path), pafs.LocalFileSystem(), str(path))
    if parsed.scheme not in SCHEMES:
        raise SettingsError(f"{text}: storage URIs are s3:// or gs:// (or a local path, a mount every node shares); "
                            f"found {parsed.scheme}://")
    if not parsed.netloc:
        raise SettingsError(f"{text}: no bucket; write {parsed.scheme}://BUCKET/FOLDER")
    path = f"{parsed.netloc}{parsed.path}".rstrip("/")
    if parsed.scheme != "s3":
        try:
            filesystem, path = pafs.FileSystem.from_uri(text)
        except (OSError, ValueError) as exc:
            raise SettingsError(f"{text}: {exc}") from None
        return Storage(text, filesystem, path)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    odd = sorted(set(query) - set(S3_OPTIONS))
    if odd:
        raise SettingsError(f"{text}: unknown option(s) {', '.join(odd)}; an s3:// URI takes {', '.join(S3_OPTIONS)}")
    options = {k: v for k, v in query.items() if k != "allow_bucket_creation"}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if "endpoint_override" not in options and endpoint:  # pyarrow reads the URI's, never this variable
        address = urllib.parse.urlsplit(endpoint)
        options |= {"endpoint_override": address.netloc or address.path, "scheme": address.scheme or "https"}
    keys = {"access_key": "AWS_ACCESS_KEY_ID", "secret_key": "AWS_SECRET_ACCESS_KEY", "session_token": "AWS_SESSION_TOKEN"}
    if "access_key" not in options and os.environ.get("AWS_ACCESS_KEY_ID"):
        # this environment's keys travel with the filesystem (Ray pickles it to its workers and controller, whose
        # processes may lack them); without keys here each process finds its own (an instance's role)
        options |= {name: os.environ[var] for name, var in keys.items() if os.environ.get(var)}
    return Storage(text, pafs.S3FileSystem(**options, **S3_TIMEOUTS_S,
                                           retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2)), path)

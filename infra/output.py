"""What any command may write where: apart from its inputs, only its own files, atomically, one writer at a time.

- `check_apart(out, inputs)`: an output is never one of the command's inputs, nor inside or around one.
- `check_output_file` / `check_output_entries`: an existing output is replaced only when this program wrote it
  (the producer mark in Parquet metadata, PNG text, a CSV header or a manifest).
- `output_lock(out_dir, command)` holds an exclusive lock on `.<name>.lock` beside the folder (removed after): a
  second writer of the same output, whatever the command, is refused in one line naming the holder's process.
- `write_folder(out_dir, files)` writes into a hidden temporary sibling, then swaps it into place; temporary
  folders left by killed runs (their process is gone) are removed by the next run.
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

import pyarrow.parquet as pq

from infra.errors import InputError
from infra.storage import is_uri, open_storage, without_query

TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old|split)-(?P<pid>\d+)-[0-9a-f]{8}$")


def temporary_sibling(path: Path, kind: str = "tmp") -> Path:
    """A hidden sibling `.<name>.<kind>-<pid>-<random>`: unique, and recognisable as this process's."""
    return path.parent / f".{path.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_temporaries(path: Path) -> list[Path]:
    """Remove the hidden temporary siblings of `path` whose writing process no longer runs; returns them."""
    removed = []
    if not path.parent.is_dir():
        return removed
    for entry in path.parent.iterdir():
        match = TEMPORARY.match(entry.name)
        if match and match["name"] == path.name and int(match["pid"]) != os.getpid() and not process_alive(int(match["pid"])):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def write_file_atomically(path: Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` into a unique temporary sibling, then rename it over `path`: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        write(tmp)
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename in (None, str(tmp)):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc  # the file being written, not its temporary
        raise
    return path


def write_json_atomically(path: Path, data, **dump_kwargs) -> Path:
    """Write JSON through write_file_atomically."""
    return write_file_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, **dump_kwargs) + "\n"))


@contextmanager
def output_lock(out_dir: Path, command: str) -> Iterator[Path]:
    """An exclusive lock on `.<name>.lock` beside out_dir for the whole run, removed after it. Another run
    holding it is refused with InputError naming the holder: one rule for every command (a wait could last a
    whole training)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out_dir.parent / f".{out_dir.name}.lock"
    while True:
        fh = lock_path.open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "process"  # what the holder wrote: its command and pid
            fh.close()
            raise InputError(out_dir, f"another {holder} is writing this output; wait for it to end or choose "
                                      f"another --out (lock: {lock_path})") from None
        try:
            same = os.fstat(fh.fileno()).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a lock file its previous holder removed while we waited
            break
        fh.close()
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"`{command}` (pid {os.getpid()})\n")
        fh.flush()
        yield lock_path
    finally:
        lock_path.unlink(missing_ok=True)
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def write_folder(out_dir: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a hidden temporary sibling, which then replaces out_dir: a crash or a kill leaves
    out_dir as it was. Call under `output_lock` after `check_output_folder`."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(out_dir)
    tmp, old = temporary_sibling(out_dir, "tmp"), temporary_sibling(out_dir, "old")
    tmp.mkdir()
    try:
        write(tmp)
        if out_dir.exists():
            out_dir.rename(old)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out_dir.exists():
            old.rename(out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# every command's --out: apart from its inputs, and never a file or folder someone else wrote

PRODUCER_KEY = b"pgt.producer"  # Parquet schema metadata and PNG text key naming the command that wrote the file


def check_apart(out: Path, inputs: dict[str, Path | str | None]) -> None:
    """InputError unless `out` is apart from every input (option -> path; None skipped): not the same path, not
    inside an input folder, and not a folder that holds an input (writing there would replace or delete it)."""
    for option, path in inputs.items():
        if path is None or is_uri(path) != is_uri(out):  # a URI's storage is no local folder
            continue
        if is_uri(out):  # the same storage, compared by bucket and key
            target, source = (PurePosixPath(without_query(uri).partition("://")[2]) for uri in (out, path))
        else:
            target, source = (Path(p).expanduser().resolve() for p in (out, path))
        if target == source:
            raise InputError(out, f"is {option} itself; writing there would replace it: choose another --out")
        if source in target.parents:
            raise InputError(out, f"lies inside {option} {path}; writing there would change it: choose an --out outside it")
        if target in source.parents:
            raise InputError(out, f"holds {option} {path}; writing there could replace it: choose an --out that does "
                                  "not contain it")


def written_by(path: Path, producer: str, csv_header: list[str] | None = None) -> bool:
    """Whether the file carries `producer`'s mark: Parquet schema metadata or PNG text (PRODUCER_KEY); a CSV, a
    header line exactly `csv_header`. An unreadable file is not ours."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            return (pq.read_schema(path).metadata or {}).get(PRODUCER_KEY) == producer.encode()
        if path.suffix == ".png":
            from PIL import Image

            with Image.open(path) as image:
                return image.info.get(PRODUCER_KEY.decode()) == producer
        if path.suffix == ".csv" and csv_header is not None:
            with path.open(encoding="utf-8") as fh:
                return fh.readline().rstrip("\r\n") == ",".join(csv_header)
    except Exception:  # any unreadable file: not one of ours
        return False
    return False


def check_output_file(out: Path, producer: str, suffixes: tuple[str, ...], csv_header: list[str] | None = None) -> None:
    """InputError (before any work) unless `out` can take `producer`'s output: a suffix it writes, not a folder,
    and either absent or a file `producer` wrote (written_by): nothing else is ever replaced."""
    out = Path(out)
    if out.is_dir():
        raise InputError(out, "is a folder; --out names a file")
    if out.suffix not in suffixes:
        raise InputError(out, f"--out must end in {' or '.join(suffixes)} (the output's format follows its suffix)")
    if out.exists() and not written_by(out, producer, csv_header):
        raise InputError(out, f"exists and was not written by `{producer}`; nothing is replaced: remove it or choose "
                              "another --out")


def check_output_entries(out: Path | str, producer: str, own: tuple[str, ...]) -> None:
    """InputError unless the folder `out` (a path, or a URI whose storage must answer) is absent, empty or holds only
    entries `producer` writes (`own`: names or glob patterns): a folder of someone else's files is never written
    into, and nothing of theirs is deleted."""
    if is_uri(out):
        storage = open_storage(out)
        storage.check()
        names = storage.entries()
    else:
        out = Path(out)
        if not out.exists():
            return
        if not out.is_dir():
            raise InputError(out, "exists and is not a folder; choose another --out")
        names = [p.name for p in out.iterdir()]
    foreign = sorted(name for name in names if not any(fnmatch.fnmatch(name, pattern) for pattern in own))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InputError(out, f"holds files that `{producer}` did not write ({shown}); nothing there is replaced: "
                              "choose another --out")


PARQUET_ROW_GROUP_ROWS = 512 ** 2  # polars' own default, kept when the writer is pyarrow's


def write_parquet(table, path: Path, compression: str = "zstd") -> Path:
    """Write a polars frame (or a pyarrow table) as Parquet with pyarrow's writer, which raises an OSError with its
    errno (ENOSPC: "no space left") where polars' writer can say "Invalid thrift: transport error" for a disk that
    fills while it writes the footer."""
    table = table.to_arrow() if hasattr(table, "to_arrow") else table
    pq.write_table(table, path, compression=compression, row_group_size=PARQUET_ROW_GROUP_ROWS)
    return Path(path)


def write_parquet_marked(path: Path, table, producer: str, metadata: dict[str, str] | None = None) -> Path:
    """Write a pyarrow table (or a polars frame) as Parquet atomically, marked as `producer`'s (written_by), with
    `metadata` as more key-value pairs of its schema."""
    table = table.to_arrow() if hasattr(table, "to_arrow") else table
    extra = {key.encode(): value.encode() for key, value in (metadata or {}).items()}
    marked = table.replace_schema_metadata({**(table.schema.metadata or {}), **extra, PRODUCER_KEY: producer.encode()})
    return write_file_atomically(path, lambda tmp: pq.write_table(marked, tmp))

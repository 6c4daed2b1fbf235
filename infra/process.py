"""What every command shares about the process it runs in: signals, disk errors, bounded reading, short messages.

- `handled_signals()`: SIGTERM and SIGHUP (what Prefect's cancel, systemd and `kill` send, and a closed terminal)
  are handled as Ctrl+C is, so the code that keeps a checkpoint consistent, closes an MLflow run as KILLED and
  stops Ray runs for them too; the command then exits 128 + the signal's number (130, 143, 129).
- `interruptible()`: a block that waits in Ray stops on SIGTERM and SIGHUP whoever handles them (Prefect's cancel).
- `uninterrupted()`: a short write that a signal must not cut in half takes the signal as it ends.
- `disk_problem(exc)`: a full, read-only or forbidden path as one line naming the path.
- `read_small_file(path)`: a user's settings file, read only when it is a regular file of at most a few MiB.
- `load_yaml(text, source)`: YAML whose aliases cannot multiply a value.
- `shorten(text)` / `listed(names)`: a value or a list of names cut, saying how many more there were.
- `exit_process(code)`: a command's end, as the interpreter's exit does it, without the teardown after it.
"""

from __future__ import annotations

import atexit
import errno
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import yaml

from infra.errors import InputError

HANDLED = (signal.SIGTERM, signal.SIGHUP)
MAX_SETTINGS_BYTES = 4 << 20  # a recipe or config file is a few hundred bytes; 4 MiB bounds a mistaken path
MAX_MESSAGE_CHARS = 300  # what one error line may quote of a value


class Signals:
    """The signal that ended the command (SIGINT included), or None."""

    def __init__(self) -> None:
        self.received: int | None = None

    @property
    def exit_code(self) -> int | None:
        return 128 + self.received if self.received is not None else None


@contextmanager
def handled_signals() -> Iterator[Signals]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt where the command runs (or call the SIGINT handler a library
    installed meanwhile, as Ray Tune does to stop a sweep cleanly), and which signal came is recorded. Only in the
    main thread; the previous handlers come back after."""
    caught = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def on_signal(signum, frame):
        caught.received = caught.received or signum
        interrupt(signum, frame)

    on_signal.interrupts = True  # raises KeyboardInterrupt itself: interruptible() leaves it in place

    def on_interrupt(signum, frame):
        caught.received = caught.received or signum
        signal.default_int_handler(signum, frame)

    previous = {s: signal.signal(s, on_signal) for s in HANDLED}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def interrupt(signum: int, frame) -> None:
    """What SIGTERM and SIGHUP do where work must stop as for Ctrl+C: call the SIGINT handler a library installed
    meanwhile (Ray Tune's graceful stop of a sweep), else raise KeyboardInterrupt."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler and not getattr(handler, "interrupts", False):
        handler(signal.SIGINT, frame)
        return
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def interruptible() -> Iterator[None]:
    """A block that waits in Ray (ray.get blocks the main thread in Ray's core) stops on SIGTERM and SIGHUP. Ray's
    core runs Python's signal handlers while it waits but ends the wait only for KeyboardInterrupt or SystemExit:
    another handler's exception (Prefect's TerminationSignal, when a flow run is cancelled) is swallowed, and the
    process waits until it is killed, its MLflow run left RUNNING and its lock file behind. Inside the block such
    a handler is replaced by one that raises KeyboardInterrupt; once the block has unwound (checkpoint kept,
    MLflow run KILLED, lock gone), the handler it replaced takes the signal. Prefect's is the exception: the process
    ends by the signal's default action instead, as Prefect itself ends it for a signal it did not ask for. Its
    worker then marks a cancelled run Cancelled (its handler, called here, would mark it Crashed: Prefect's runner
    is told of a cancel only while its own handler is installed). Handlers that interrupt already
    (handled_signals') stay. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    replaced = {s: signal.getsignal(s) for s in HANDLED}
    replaced = {s: h for s, h in replaced.items()
                if h is not None and h is not signal.SIG_IGN and not getattr(h, "interrupts", False)}

    def on_signal(signum, frame):
        received.append(signum)
        # not a library's Ctrl+C handler (Ray Train's graceful abort): it asks the Ray head, which the same signal
        # to the whole process group (Prefect's cancel) has stopped, and would wait for it forever
        raise KeyboardInterrupt(signal.Signals(signum).name)

    on_signal.interrupts = True
    for s in replaced:
        signal.signal(s, on_signal)
    try:
        yield
    finally:
        for s, handler in replaced.items():
            signal.signal(s, handler)
        if received:
            handler = replaced[received[0]]
            if callable(handler) and not str(getattr(handler, "__module__", "")).startswith("prefect."):
                handler(received[0], None)
            else:  # the default action: the process ends by the signal, as it would have
                signal.signal(received[0], signal.SIG_DFL)
                signal.raise_signal(received[0])


@contextmanager
def uninterrupted() -> Iterator[None]:
    """A short write that a signal must not cut in half (an MLflow write into a SQLite store, a checkpoint and the
    pruning of older ones): SIGINT, SIGTERM and SIGHUP that come meanwhile are held and take effect, through the
    handlers they had, as it ends. A KeyboardInterrupt raised inside SQLAlchemy's commit leaves the store locked by
    a connection nobody closes, and the run's next write fails on it instead of the command stopping. Only in the
    main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    # a handler set outside Python (getsignal gives None) cannot be put back: such a signal is left alone
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum))
                for s in (signal.SIGINT, *HANDLED) if signal.getsignal(s) is not None}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(held):  # each signal once, in the order they came
            signal.raise_signal(s)


DISK_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "not permitted"}


RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how polars and pyarrow's Rust and C++ writers say an errno


def disk_problem(exc: BaseException, where: str | None = None) -> str | None:
    """One line for a full, read-only or forbidden path (the path, what went wrong), else None. Looks through the
    chain of causes, and into the messages of writers that report an errno only as text (polars: "(os error 28)");
    `where` names the path when the error does not."""
    seen = 0
    while exc is not None and seen < 8:
        code = exc.errno if isinstance(exc, OSError) else None
        if code is None:
            found = RUST_OS_ERROR.search(str(exc))
            code = int(found[1]) if found else None
        if code in DISK_ERRNOS:
            path = (exc.filename if isinstance(exc, OSError) else None) or where or "a file"
            return f"{path}: {DISK_ERRNOS[code]} while writing; free space or choose a writable --out"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def exit_code_of(code: object) -> int:
    """The status a `SystemExit(code)` ends the interpreter with: None is 0, an int itself, anything else 1 (the
    interpreter prints it to stderr first, as exit_process does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def exit_process(code: object = 0) -> NoReturn:
    """End the process, from its main thread, as `sys.exit(code)` at the top of the program would, without the
    interpreter's teardown.

    What an exit does for the user still happens, in the interpreter's own order: the threads that are not daemons
    are told to stop where they registered for it and waited for, the atexit callbacks run (MLflow ends its active
    run and flushes its queue, Ray shuts down, logging flushes its handlers, temporary folders are removed), a code
    that is not a number is printed to stderr, and stdout and stderr are flushed (a closed pipe then exits 120, as
    the interpreter does). What is skipped is the teardown after that: every module and object freed one by one,
    which took 2.6-3.2 s of a `pgt train` that had imported torch, Ray and MLflow, where the system takes the
    process's memory back at once."""
    # the interpreter's own first step of an exit: threading's exit hooks (which tell the idle workers of every
    # ThreadPoolExecutor to stop, else waiting for them never ends), then the join of every thread not a daemon;
    # then its second, the atexit callbacks. Both are the functions Python 3.11 (the project's) calls at exit.
    threading._shutdown()
    atexit._run_exitfuncs()
    status = exit_code_of(code)
    if code is not None and not isinstance(code, int) and sys.stderr is not None:
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a reader that went away, or a stream a callback closed
            status = status or 120
    os._exit(status)


def read_small_file(path: Path | str, what: str, limit: int = MAX_SETTINGS_BYTES) -> str:
    """The text of a settings file; InputError naming it unless it is a regular UTF-8 file of at most `limit`
    bytes (a FIFO, a device such as /dev/zero or a folder is never opened for reading)."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as exc:
        raise InputError(path, f"cannot read the {what} ({exc.strerror or type(exc).__name__})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, f"the {what} is not a regular file")
    if info.st_size > limit:
        raise InputError(path, f"the {what} has {info.st_size:,} bytes; at most {limit:,} are read")
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(path, f"cannot read the {what} ({exc.strerror or type(exc).__name__})") from None
    if len(data) > limit:
        raise InputError(path, f"the {what} grew past {limit:,} bytes while being read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"the {what} is not UTF-8 text (byte {exc.start})") from None


def load_yaml(text: str, source: Path | str):
    """yaml.safe_load, refusing anchors and aliases (a few hundred bytes of aliases can expand to gigabytes):
    a settings file never needs them. ValueError naming `source`."""
    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.events.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in a settings file",
                                                  event.start_mark)
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=NoAliases)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InputError(source, f"not valid YAML ({shorten(' '.join(str(exc).split()), 200)})") from None


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, saying how many were left out."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def listed(names, shown: int = 8) -> str:
    """Names joined by commas, the first `shown` of them, saying how many more there were."""
    names = [shorten(str(n), 60) for n in names]
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more:,} more" if more > 0 else "")

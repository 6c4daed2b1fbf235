"""`pgt tune` as a user runs it, in a subprocess of its own (signals, exit codes and a fresh interpreter are the
point of the tests that use it)."""

from __future__ import annotations

import subprocess
import sys

PGT = [sys.executable, "-m", "pgt.cli"]


def tune_cli(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*PGT, "tune", *map(str, args)], capture_output=True, text=True, timeout=900, **kwargs)

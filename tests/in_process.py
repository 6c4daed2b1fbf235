"""`pgt` run in the test's own process (Typer's runner) for the checks whose subject is what a command refuses and
the one line it prints: no interpreter to start and no torch, polars and MLflow to import again (about 3 s a call on
2 busy cores). Signals, exit codes of a dying process, locks, servers and a fresh interpreter stay subprocesses."""

from __future__ import annotations

import subprocess
import sys
import traceback


def pgt_here(*args) -> subprocess.CompletedProcess:
    """`pgt ARGS` as the installed command runs it (one_line_errors included), its outcome in the shape of
    subprocess.run's: returncode, stdout, stderr. An exception that escaped the command is a crash, as a
    subprocess shows it: exit 1 and its traceback on stderr."""
    from typer.testing import CliRunner

    from pgt.cli import app

    argv = [str(a) for a in args]
    torch = sys.modules.get("torch")  # a command that trains sets torch's threads and deterministic mode: put back
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled()) if torch else None
    try:
        result = CliRunner().invoke(app, argv, catch_exceptions=True)
    finally:
        if before is not None:
            torch.set_num_threads(before[0])
            torch.use_deterministic_algorithms(before[1], warn_only=before[2])
    stderr = result.stderr
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(result.exception))
        code = 1
    return subprocess.CompletedProcess(["pgt", *argv], code, result.stdout, stderr)

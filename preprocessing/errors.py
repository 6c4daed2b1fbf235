"""The one error type for whole-input problems: it names the file and what was expected."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """A whole-file problem (missing path, missing column, header only, not Parquet, ...).

    The CLI prints it as one line, `error: <file>: <problem>`, and exits with code 2.
    """

    def __init__(self, source: Path | str, problem: str):
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")

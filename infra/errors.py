"""The error vocabulary every package raises and the command line catches once (pgt.cli.main):

- `InputError`: an input is wrong (a missing file or column, a damaged Parquet, a file of the wrong kind); it
  names the file and what was expected.
- `SettingsError`: settings that are each valid do not go together, or one is out of its bounds (a ValueError,
  so that callers that validate values catch it as one).

Either is printed as one line, `error: <message>`, with exit code 2.
"""

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

    def __reduce__(self):  # picklable, so that it crosses from a Ray task to the driver as itself
        return type(self), (self.source, self.problem)



class SettingsError(ValueError):
    """A setting out of its bounds or choices, or settings that do not go together: one line naming them."""

"""The error vocabulary every package raises and the command line catches once (pgt.options.one_line_errors):

- `InputError`: an input is wrong (a missing file or column, a damaged Parquet, a file of the wrong kind, a model
  URI that names nothing); it names the file or the option and what was expected.
- `SettingsError`: settings that are each valid do not go together, or one is out of its bounds or does not suit
  the machine (a compiler missing for --compile-model, a port in use).
- `ServiceError`: a server or cluster the settings name does not answer, or refuses (the MLflow tracking server,
  a Ray cluster).

Each is a `UserError`, printed as one line, `error: <message>`, with exit code 2; anything else keeps its traceback
and exits 1, since a bug should look like a bug. They are ValueErrors, so that callers which validate values
(a request's checks that answer HTTP 400, a probe that only asks whether a server answers) catch them as such.
"""

from __future__ import annotations

from pathlib import Path


class UserError(ValueError):
    """What the user can fix, said in one line: the CLI prints `error: <message>` and exits with code 2."""


class InputError(UserError):
    """A whole-file problem (missing path, missing column, header only, not Parquet, ...), or an input named by an
    option that is not what it should be: `<source>: <problem>`."""

    def __init__(self, source: Path | str, problem: str):
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")

    def __reduce__(self):  # picklable, so that it crosses from a Ray task to the driver as itself
        return type(self), (self.source, self.problem)


class SettingsError(UserError):
    """A setting out of its bounds or choices, settings that do not go together, or one the machine cannot honour:
    one line naming them."""


class ServiceError(UserError):
    """A server or cluster named by the settings does not answer, or refuses: one line naming it, what it said and
    the likely fix."""

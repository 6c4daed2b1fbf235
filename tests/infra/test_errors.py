"""The error vocabulary: an input's problem names the file, settings that do not go together name the settings,
and the command line turns either into one line and exit code 2 for every command, in one place."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import typer.main

from infra.errors import InputError, SettingsError
from pgt.cli import app
from pgt.config import LaunchConfig
from pgt.options import USER_ERRORS
from pgt.serving.config import ServeConfig


def test_an_input_error_names_its_file_and_crosses_processes_as_itself():
    error = InputError("data/points.csv", "missing column(s) tracked_at; found: user_id")
    assert str(error) == "data/points.csv: missing column(s) tracked_at; found: user_id"
    back = pickle.loads(pickle.dumps(error))  # a Ray task's error reaches the driver as itself
    assert type(back) is InputError and (back.source, back.problem) == (error.source, error.problem)


def test_settings_that_do_not_go_together_are_a_settings_error():
    with pytest.raises(SettingsError, match="data_engine 'ray' streams shards to Ray Train workers"):
        LaunchConfig(data_engine="ray", workers=0)
    with pytest.raises(SettingsError, match=r"max_buffered_mb \(1\) is below max_request_mb \(2\)"):
        ServeConfig(model_uri="models:/m@champion", max_request_mb=2.0, max_buffered_mb=1.0)
    assert issubclass(SettingsError, ValueError) and any(issubclass(SettingsError, kind) for kind in USER_ERRORS)


def test_every_command_ends_a_user_s_mistake_in_one_line():
    """Each command's function is wrapped once (pgt.options.one_line_errors), the entry point's `pgt tune` too."""
    commands = typer.main.get_command(app).commands
    assert {"preprocess", "synth", "train", "evaluate", "predict", "serve", "explain", "manifest", "tune"} <= set(commands)
    for name, command in commands.items():
        function, wrapped = command.callback, False
        while function is not None and not wrapped:
            wrapped = function.__dict__.get("one_line_errors", False)
            function = getattr(function, "__wrapped__", None)
        assert wrapped, name
    r = subprocess.run([sys.executable, "-m", "pgt.cli", "serve", "--model", "models:/m@champion", "--max-request-mb",
                        "2", "--max-buffered-mb", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: max_buffered_mb (1) is below max_request_mb (2): a request of the "
                                             "largest size could never be read"]


def test_only_a_user_s_mistake_is_one_line_and_a_bug_keeps_its_traceback(capsys):
    """InputError, SettingsError and ServiceError end a command in one line with exit code 2; any other exception,
    a ValueError from a library's own check included, propagates with its traceback (exit 1 from the CLI)."""
    from infra.errors import ServiceError, UserError
    from pgt.options import one_line_errors

    for error in (InputError("points.csv", "missing column tracked_at"), SettingsError("workers must be >= 0"),
                  ServiceError("MLflow tracking server http://127.0.0.1:1 is not reachable")):
        assert isinstance(error, UserError) and isinstance(error, ValueError)  # request checks catch them as such

        @one_line_errors
        def refused(error=error):
            raise error

        with pytest.raises(typer.Exit) as ended:
            refused()
        assert ended.value.exit_code == 2 and capsys.readouterr().err == f"error: {error}\n"

    @one_line_errors
    def buggy():
        raise ValueError("operands could not be broadcast together with shapes (3,) (4,)")

    with pytest.raises(ValueError, match="broadcast"):
        buggy()
    assert capsys.readouterr().err == ""

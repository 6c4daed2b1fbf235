"""What the `pgt` commands share: one-line errors, and options that default to "not given".

An option a user does not type stays None, and only typed options reach a config: every default lives in
its config dataclass (pgt.config, tune.config, preprocessing.config, preprocessing.synthetic), which the
help shows as the option's default. `option_for` builds an option from a setting's one definition
(infra.settings.setting): its help with its bounds, its default as shown, its environment variable and its
choices. `settings_options(*configs)` gives a command one such option per setting of its configs, so that no
command lists its options by name: what a config gains, its commands gain.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Union

import typer

from infra.errors import UserError
from infra.settings import CHOICES, ENV, bounds_text, help_of, setting_types, settings_of

MAX_ERROR_CHARS = 800  # an error line quotes values; a value of megabytes is cut in the middle


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2, no traceback; at most MAX_ERROR_CHARS of it (the end, which says what to do,
    is kept)."""
    message = " ".join(str(message).split())
    if len(message) > MAX_ERROR_CHARS:
        cut = len(message) - MAX_ERROR_CHARS
        message = f"{message[:MAX_ERROR_CHARS // 2]} ...({cut:,} characters cut)... {message[-MAX_ERROR_CHARS // 2:]}"
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


# what a user's mistake raises, in any package (infra/errors.py): a bad input, settings that do not go together or out
# of their bounds, a server that does not answer. Any other exception, a ValueError of a library included, is a bug
# and keeps its traceback
USER_ERRORS = (UserError,)


def one_line_errors(command: Callable) -> Callable:
    """A command whose USER_ERRORS end it with one line on stderr and exit code 2 (fail): caught here, once for every
    command, not in each."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except USER_ERRORS as exc:
            fail(str(exc))

    run.one_line_errors = True  # what tests/infra/test_errors.py looks for on every command
    return run


def default_of(config: type, name: str) -> str:
    """The default of a config dataclass's field, as `--help` shows it."""
    field = {**{f.name: f for f in dataclasses.fields(config)}, **settings_of(config)}[name]
    if field.default is dataclasses.MISSING:
        raise ValueError(f"{config.__name__}.{name} has no default")
    return str(field.default)


def flag_of(name: str) -> str:
    """A setting's option: --name with dashes."""
    return f"--{name.replace('_', '-')}"


def option_for(config: type, name: str, *flags: str, **extra: Any) -> Any:
    """A typer option (default None: "not given") for the setting `name` of a config dataclass: its help, its
    default as the help shows it and its environment variable, from the field's one definition; `extra` adds
    typer's own arguments. The flag is --name with dashes (--name/--no-name for a switch) unless `flags` are given.
    Bounds and choices are checked when the config is built, so a bad value fails in one line naming the setting,
    like a bad value from a recipe file."""
    field = settings_of(config)[name]
    bounds = bounds_text(field)
    help = help_of(config, name) + (f" In {bounds}." if bounds else "")
    if not flags:
        flags = (f"{flag_of(name)}/--no-{name.replace('_', '-')}",) if setting_types(config)[name] in (bool, bool | None) \
            else (flag_of(name),)
    if field.metadata.get(ENV):
        extra = {"envvar": field.metadata[ENV], **extra}
    return typer.Option(None, *flags, help=help, show_default=default_of(config, name), **extra)


def option_type(config: type, name: str) -> Any:
    """The type typer parses a setting's option as: its choices as a Literal (a list in --help), else its own type,
    None when not given."""
    choices = settings_of(config)[name].metadata.get(CHOICES)
    if choices:
        return Literal[tuple(choices)] | None
    kind = setting_types(config)[name]
    if isinstance(kind, types.UnionType) or getattr(kind, "__origin__", None) is Union:
        kind = next(arg for arg in kind.__args__ if arg is not type(None))
    return kind | None


@dataclass(frozen=True)
class Typed:
    """The settings' options a user typed (None ones left out), by setting name."""

    values: dict[str, Any]

    def of(self, config: type) -> dict[str, Any]:
        """Those that are settings of `config`: its keyword arguments, over its defaults."""
        names = settings_of(config)
        return {name: value for name, value in self.values.items() if name in names}

    def names(self) -> list[str]:
        return sorted(self.values)


def typed_from(params: dict[str, Any], *configs: type) -> Typed:
    """The settings of `configs` among a command's parsed parameters that were typed (not None)."""
    names = {name for config in configs for name in settings_of(config)}
    return Typed({name: value for name, value in params.items() if name in names and value is not None})


def settings_options(*configs: type, skip: tuple[str, ...] = (), flags: dict[str, tuple[str, ...]] | None = None
                     ) -> Callable[[Callable], Callable]:
    """A typer command with one option per setting of `configs` (option_for each; a setting named in two configs
    is one option, for both), after its own parameters. The command takes `typed: Typed`, the options a user typed,
    in place of them. `skip`: settings the command sets itself; `flags`: a setting's flags where they are not
    --name."""
    flags = flags or {}

    def decorate(command: Callable) -> Callable:
        own = inspect.signature(command, eval_str=True)
        parameters = [p for p in own.parameters.values() if p.name != "typed"]
        taken = {p.name for p in parameters}
        generated = {}
        for config in configs:
            for name in settings_of(config):
                if name in skip or name in taken or name in generated:
                    continue
                generated[name] = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                                    default=option_for(config, name, *flags.get(name, ())),
                                                    annotation=option_type(config, name))

        @functools.wraps(command)
        def with_settings(**values: Any) -> Any:
            typed = typed_from({name: values.pop(name) for name in generated}, *configs)
            return command(**values, typed=typed)

        with_settings.__signature__ = own.replace(parameters=[
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters] + list(generated.values()))
        return with_settings

    return decorate

"""What the `pgt` commands share: one-line errors, and options that default to "not given".

An option a user does not type stays None, and only typed options reach a config: every default lives in
its config dataclass (pgt.config, tune.config, preprocessing.config, preprocessing.synthetic), which the
help shows as the option's default. `option_for` builds an option from a setting's one definition
(preprocessing.settings.setting): its help with its bounds, and its default as shown. Choices are Literals built
from the registries (MODELS, RECIPES, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

import typer

from preprocessing.settings import bounds_text, help_of, settings_of

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


def default_of(config: type, name: str) -> str:
    """The default of a config dataclass's field, as `--help` shows it."""
    field = {**{f.name: f for f in dataclasses.fields(config)}, **settings_of(config)}[name]
    if field.default is dataclasses.MISSING:
        raise ValueError(f"{config.__name__}.{name} has no default")
    return str(field.default)


def given(params: dict[str, Any], *names: str) -> dict[str, Any]:
    """The options among `names` that were typed: those whose value is not None."""
    return {name: params[name] for name in names if params.get(name) is not None}


def option_for(config: type, name: str, *flags: str, **extra: Any) -> Any:
    """A typer option (default None: "not given") for the setting `name` of a config dataclass: its help, and its
    default as the help shows it, from the field's one definition; `extra` adds typer's own arguments (envvar, ...).
    The flag is --name with dashes unless `flags` are given. Bounds and choices are checked when the config is
    built, so a bad value fails in one line naming the setting, like a bad value from a recipe file."""
    bounds = bounds_text(settings_of(config)[name])
    help = help_of(config, name) + (f" In {bounds}." if bounds else "")
    return typer.Option(None, *(flags or (f"--{name.replace('_', '-')}",)), help=help,
                        show_default=default_of(config, name), **extra)

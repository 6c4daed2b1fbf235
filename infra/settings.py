"""One definition per setting: a config dataclass field that carries its help, bounds and choices.

    lr: float = setting(6.5e-4, "Peak learning rate, reached after warmup.", low=0.0, low_open=True)

The command line's options (pgt.options.option_for), the flows' parameters, the sweeps and the MLflow params
all read this one definition, and `check_settings` refuses a value of the wrong type, out of its bounds or not
among its choices with one line naming the field (SettingsError); `setting_problems` collects every such problem
of a config at once, for a settings file. No third-party import here: every layer may use it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from infra.errors import SettingsError

HELP, LOW, HIGH, LOW_OPEN, HIGH_OPEN, CHOICES, ENV = "help", "low", "high", "low_open", "high_open", "choices", "env"
NESTED = "nested"  # the metadata key of a field that holds another config of settings
# Settings renamed since records were written (old -> new). A stored record (a checkpoint's or a logged model's
# config, a preprocessing manifest) is read under today's names (stored_settings); a name a person types (a recipe
# or settings file, a sweep's base) is refused, the refusal naming the new one (renamed_hint).
RENAMED = {"memory_places": "memory_size"}


def setting(default: Any, help: str, *, low: float | None = None, high: float | None = None, low_open: bool = False,
            high_open: bool = False, choices: tuple | None = None, env: str | None = None) -> Any:
    """A dataclass field with a default, its help (one sentence or two, as `--help` shows it), bounds (low and
    high, each closed unless low_open / high_open), choices, and the environment variable a command line option
    reads when it is not typed (env)."""
    if not help:
        raise ValueError("a setting needs its help")
    return dataclasses.field(default=default, metadata={HELP: help, LOW: low, HIGH: high, LOW_OPEN: low_open,
                                                        HIGH_OPEN: high_open, CHOICES: choices, ENV: env})


def nested(config: type) -> Any:
    """A field that holds another config of settings (TrainConfig's network: ModelSettings), built with its
    defaults. Its settings count as the holder's own in settings_of, flat_settings and unflatten."""
    return dataclasses.field(default_factory=config, metadata={NESTED: config})


def settings_of(config: type | object) -> dict[str, dataclasses.Field]:
    """The settings of a config by name, in their order, those of its nested configs in their place."""
    found = {}
    for f in dataclasses.fields(config):
        if NESTED in f.metadata:
            found.update(settings_of(f.metadata[NESTED]))
        elif HELP in f.metadata:
            found[f.name] = f
    return found


def setting_types(config: type) -> dict[str, Any]:
    """The type of each setting of a config (settings_of's names), its annotation resolved."""
    hints = typing.get_type_hints(config)
    found = {}
    for f in dataclasses.fields(config):
        if NESTED in f.metadata:
            found.update(setting_types(f.metadata[NESTED]))
        elif HELP in f.metadata:
            found[f.name] = hints[f.name]
    return found


def flat_settings(config: object) -> dict[str, Any]:
    """Every field of a config instance, nested configs' settings flattened into it: the dict a recipe file,
    Ray and MLflow params hold (names are unique across the nesting)."""
    flat = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        flat.update(flat_settings(value) if NESTED in f.metadata else {f.name: value})
    return flat


def unflatten(config: type, values: dict[str, Any], what: str = "setting") -> dict[str, Any]:
    """The keyword arguments of `config` from a flat dict (flat_settings'): the nested configs built from their
    settings. ValueError naming the unknown keys."""
    own = {f.name: f for f in dataclasses.fields(config)}
    kwargs, taken = {}, set()
    for name, f in own.items():
        if NESTED in f.metadata:
            inner = settings_of(f.metadata[NESTED]).keys() | {g.name for g in dataclasses.fields(f.metadata[NESTED])}
            part = {k: v for k, v in values.items() if k in inner}
            taken |= part.keys()
            if name in values:  # already built (or a dict of its settings)
                taken.add(name)
                given = values[name]
                part = {**(dataclasses.asdict(given) if dataclasses.is_dataclass(given) else dict(given)), **part}
            kwargs[name] = f.metadata[NESTED](**unflatten(f.metadata[NESTED], part, what))
        elif name in values:
            kwargs[name] = values[name]
            taken.add(name)
    unknown = sorted(set(values) - taken)
    if unknown:
        raise SettingsError(f"unknown {what}(s): {', '.join(unknown)}{renamed_hint(unknown)}")
    return kwargs


def stored_settings(values: dict[str, Any]) -> dict[str, Any]:
    """A stored record's settings under today's names (RENAMED)."""
    return {RENAMED.get(name, name): value for name, value in values.items()}


def renamed_hint(names) -> str:
    """" (memory_places is memory_size now)" for the renamed among unknown names; "" for none."""
    hints = [f"{name} is {RENAMED[name]} now" for name in names if name in RENAMED]
    return f" ({'; '.join(hints)})" if hints else ""


def help_of(config: type | object, name: str) -> str:
    return settings_of(config)[name].metadata[HELP]


def bounds_text(field: dataclasses.Field) -> str:
    """The bounds as an interval, e.g. "[0.0, 1.0)"; "" without bounds."""
    meta = field.metadata
    return interval_text(meta.get(LOW), meta.get(HIGH), bool(meta.get(LOW_OPEN)), bool(meta.get(HIGH_OPEN)))


def interval_text(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """Bounds written as an interval, e.g. "[0.0, 1.0)", a missing one as -inf or inf (open); "" without bounds: how
    every refusal of a value out of its bounds names them."""
    if low is None and high is None:
        return ""
    opens = "(" if low_open or low is None else "["
    closes = ")" if high_open or high is None else "]"
    return f"{opens}{'-inf' if low is None else low}, {'inf' if high is None else high}{closes}"


def schema_bounds(field: dataclasses.Field) -> dict[str, float]:
    """The bounds as pydantic's field constraints (ge or gt, le or lt), which its JSON schema writes as minimum and
    maximum: a flow parameter's, for the Prefect server and UI."""
    meta, bounds = field.metadata, {}
    if meta.get(LOW) is not None:
        bounds["gt" if meta.get(LOW_OPEN) else "ge"] = meta[LOW]
    if meta.get(HIGH) is not None:
        bounds["lt" if meta.get(HIGH_OPEN) else "le"] = meta[HIGH]
    return bounds


def check_value(field: dataclasses.Field, value: Any) -> None:
    """SettingsError naming the field unless value has the field's type, lies within its bounds and among its choices."""
    meta, kind = field.metadata, field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    name = field.name
    if kind.replace(" ", "").endswith("|None"):  # optional: None passes, anything else is checked as the type
        if value is None:
            return
        kind = kind.replace(" ", "")[: -len("|None")]
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{name} must be a number, got {value!r}")
        if kind == "int" and not isinstance(value, int):
            raise SettingsError(f"{name} must be an integer, got {value!r}")
        if not math.isfinite(value):
            raise SettingsError(f"{name} must be a finite number, got {value!r}")
        low, high = meta.get(LOW), meta.get(HIGH)
        too_low = low is not None and (value <= low if meta.get(LOW_OPEN) else value < low)
        too_high = high is not None and (value >= high if meta.get(HIGH_OPEN) else value > high)
        if too_low or too_high:
            raise SettingsError(f"{name} must be in {bounds_text(field)}, got {value!r}")
    elif kind == "bool" and not isinstance(value, bool):
        raise SettingsError(f"{name} must be true or false, got {value!r}")
    choices = meta.get(CHOICES)
    if choices is not None and value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def setting_problems(config: object) -> list[str]:
    """Every setting of a config dataclass instance that check_value refuses, one message each (its nested configs
    check their own)."""
    problems = []
    for field in dataclasses.fields(config):
        if HELP in field.metadata:
            try:
                check_value(field, getattr(config, field.name))
            except SettingsError as exc:
                problems.append(str(exc))
    return problems


def check_settings(config: object, every: bool = False) -> None:
    """SettingsError for the first refused setting of a config (check_value), or with `every`, for all of them in
    one message (a settings file's problems at once)."""
    problems = setting_problems(config)
    if problems:
        raise SettingsError("; ".join(problems) if every else problems[0])

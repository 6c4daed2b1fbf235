"""infra.settings: a setting's one definition (help, bounds, choices) and the checks built from it."""

from __future__ import annotations

import dataclasses

import pytest

from infra.settings import bounds_text, check_settings, help_of, renamed_hint, setting, settings_of, stored_settings


@dataclasses.dataclass
class Example:
    name: str  # not a setting: no help
    closed: int = setting(1, "Closed bounds.", low=1, high=3)
    open_low: float = setting(0.5, "Open below.", low=0.0, low_open=True)
    open_high: float = setting(0.5, "Open above.", low=0.0, high=1.0, high_open=True)
    switch: bool = setting(False, "A switch.")
    pick: str = setting("a", "One of a, b.", choices=("a", "b"))
    maybe: float | None = setting(None, "None, or at least 0.", low=0.0)

    def __post_init__(self) -> None:
        check_settings(self)


@pytest.mark.parametrize("values", [{"closed": 1}, {"closed": 3}, {"open_low": 1e-12}, {"open_high": 0.0},
                                    {"open_high": 0.999999}, {"switch": True}, {"pick": "b"}, {"open_low": 2},
                                    {"maybe": 0.0}, {"maybe": None}])
def test_values_on_and_inside_the_bounds_pass(values):
    assert all(getattr(Example("x", **values), k) == v for k, v in values.items())


@pytest.mark.parametrize("values,message", [
    ({"closed": 0}, "closed must be in [1, 3], got 0"),
    ({"closed": 4}, "closed must be in [1, 3], got 4"),
    ({"closed": 2.0}, "closed must be an integer, got 2.0"),
    ({"closed": True}, "closed must be a number, got True"),
    ({"open_low": 0.0}, "open_low must be in (0.0, inf), got 0.0"),
    ({"open_low": float("inf")}, "open_low must be a finite number, got inf"),
    ({"open_high": 1.0}, "open_high must be in [0.0, 1.0), got 1.0"),
    ({"open_high": -1e-9}, "open_high must be in [0.0, 1.0), got -1e-09"),
    ({"switch": 1}, "switch must be true or false, got 1"),
    ({"pick": "c"}, "pick must be one of a, b, got 'c'"),
    ({"maybe": -0.5}, "maybe must be in [0.0, inf), got -0.5"),
    ({"maybe": "x"}, "maybe must be a number, got 'x'"),
])
def test_values_past_a_bound_or_of_another_type_fail_in_one_line_naming_the_setting(values, message):
    with pytest.raises(ValueError) as info:
        Example("x", **values)
    assert str(info.value) == message


def test_the_definition_carries_help_and_bounds():
    assert list(settings_of(Example)) == ["closed", "open_low", "open_high", "switch", "pick", "maybe"]
    assert help_of(Example, "pick") == "One of a, b."
    fields = settings_of(Example)
    assert [bounds_text(fields[n]) for n in fields] == ["[1, 3]", "(0.0, inf)", "[0.0, 1.0)", "", "", "[0.0, inf)"]


def test_a_setting_without_help_is_refused():
    with pytest.raises(ValueError, match="needs its help"):
        setting(1, "")


def test_a_renamed_settings_stored_name_reads_as_the_new_one_and_a_typed_one_is_named():
    """memory_places is memory_size now: a stored record's old name reads as the new one, others unchanged; the hint
    for unknown names names the new one for renamed names only."""
    assert stored_settings({"memory_places": 8, "lr": 0.1}) == {"memory_size": 8, "lr": 0.1}
    assert renamed_hint(["memory_places", "colour"]) == " (memory_places is memory_size now)"
    assert renamed_hint(["colour"]) == ""

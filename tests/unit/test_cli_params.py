"""Plain options are read without pydantic, to the same values, refusing the same input as
Typer's own pydantic-based reading (:mod:`ops.cli.params`); a refusal names the option, the
rule and the value."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError
from typer._adapters import try_build_adapter
from typer.models import OptionInfo
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app
from ops.cli.params import plain_converter

CASES: list[tuple[Any, dict[str, Any], list[Any]]] = [
    (bool, {}, [True, False, "yes", "No", "1", "0", "", " on ", "T", "maybe", 1, 0, 2]),
    (str, {}, ["a", "", b"bytes", 3]),
    (
        int,
        {},
        ["3", " 3 ", "3.0", "3.00", "-3.0", "3.", "3.5", "3.0_0", ".0", "x", "", "1_000", "1__0", "-4"],
    ),
    (int, {}, ["+5", "0x10", "1e3", "\u0661\u0662", "\uff13", 3, 3.0, 3.5]),
    (int, {"min": 0, "max": 10}, ["-1", "0", "10", "11", "x"]),
    (int, {"min": 1}, ["0", "1", "99999999999"]),
    (float, {}, ["1.5", " 2 ", "1e3", "1_0", "1__0", "1e308", "x", "\u0661", 5]),
    (float, {"min": 0, "max": 604800}, ["-1", "0", "604800", "604800.5"]),
    (list[str], {}, [("a", "b"), ["x"], ()]),
]


def outcome(read: Any, value: Any) -> tuple[str, Any]:
    try:
        result = read(value)
    except (ValueError, ValidationError) as exc:
        message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        return ("refused", message)
    return ("nan", None) if isinstance(result, float) and math.isnan(result) else ("read", result)


@pytest.mark.parametrize(
    ("annotation", "bounds", "value"),
    [(annotation, bounds, value) for annotation, bounds, values in CASES for value in values],
)
def test_plain_reading_matches_typers(annotation: Any, bounds: dict[str, Any], value: Any) -> None:
    """Each value is read to what Typer reads it to, or refused with Typer's message."""
    info = OptionInfo(**bounds)
    convert = plain_converter(annotation, info)
    assert convert is not None
    typer_reading = outcome(try_build_adapter(annotation, info).validate_python, value)
    assert outcome(convert, value) == typer_reading


@pytest.mark.parametrize("bounds", [{}, {"min": 0, "max": 604800}])
@pytest.mark.parametrize(
    "value", ["nan", "-inf", "infinity", " inf ", "1e400", "-1e400", float("inf"), float("nan")]
)
def test_a_float_that_is_not_finite_is_refused(bounds: dict[str, Any], value: Any) -> None:
    """Where Typer would read ``inf``, ``nan`` or an overflowing ``1e400``, the plain reading
    refuses it: no option means anything by an infinite or undefined number."""
    convert = plain_converter(float, OptionInfo(**bounds))
    assert convert is not None
    assert outcome(convert, value) == ("refused", "Input should be a finite number")


@pytest.mark.parametrize(
    ("annotation", "option"),
    [(float, OptionInfo(min=0, clamp=True)), (int, OptionInfo(parser=int)), (str, OptionInfo(min=1))],
)
def test_other_options_keep_typers_reading(annotation: Any, option: OptionInfo) -> None:
    """Clamped numbers, custom parsers and anything unusual are left to Typer."""
    assert plain_converter(annotation, option) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--limit", "20000"], "--limit must be an integer between 0 and 10000, got 20000"),
        (["list", "--limit", "-1"], "--limit must be an integer between 0 and 10000, got -1"),
        (["jobs", "0"], "count must be an integer between 1 and 100000, got 0"),
        (["up", "--fleet-size", "-1"], "--fleet-size must be an integer >= 0, got -1"),
        (["up", "--workers", "many"], "--workers must be an integer between 0 and 1000, got 'many'"),
        (
            ["submit", "--cpu-millis", "1", "--memory-mb", "1", "--sleep-s", "-1"],
            "--sleep-s must be a number between 0 and 604800, got -1.0",
        ),
        (
            ["submit", "--cpu-millis", "1", "--memory-mb", "1", "--sleep-s", "604801"],
            "--sleep-s must be a number between 0 and 604800, got 604801.0",
        ),
    ],
)
def test_an_option_out_of_its_range_is_refused_naming_it_and_the_range(args: list[str], message: str) -> None:
    """An option's bounds: exit 2, one line naming the option, the bounds and the value, nothing
    is sent."""
    result = CliRunner().invoke(app, [*args, "--control-planes", "127.0.0.1:1"] if args[0] != "up" else args)
    assert result.exit_code == EXIT_INVALID
    assert result.stderr == f"error: {message}\n"

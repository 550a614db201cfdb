"""Every number of seconds, rate or fraction ``stockade`` takes on its command line is finite:
``inf``, ``nan`` and what overflows to them (``1e400``) are refused like any bad value, for every
``float`` option of every command (:mod:`ops.cli.params`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app


def _float_options(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """(the command's words, the option's long name) of every float option of every command."""
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from _float_options(command, (*path, name))
            continue
        for param in command.params:
            descriptor = getattr(param, "type_descriptor", None)
            if param.param_type_name == "option" and "float" in str(getattr(descriptor, "annotation", "")):
                yield (*path, name), max(param.opts, key=len)


FLOAT_OPTIONS = sorted(_float_options(typer.main.get_command(app)))


def test_the_float_options_are_found() -> None:
    """The walk finds the options the fault report named (and many more)."""
    assert {(("submit",), "--sleep-s"), (("drain",), "--deadline-s"), (("up",), "--timeout-s")} <= set(
        FLOAT_OPTIONS
    )
    assert len(FLOAT_OPTIONS) > 40


@pytest.mark.parametrize("value", ["1e400", "-inf", "nan"])
@pytest.mark.parametrize(
    ("command", "option"), FLOAT_OPTIONS, ids=lambda x: "-".join(x) if isinstance(x, tuple) else x
)
def test_every_float_option_refuses_a_number_that_is_not_finite(
    command: tuple[str, ...], option: str, value: str
) -> None:
    """``inf``, ``nan`` or a number too large for a float is one line naming the option, the rule
    and the value as typed, exit 2, before the command does anything."""
    result = CliRunner().invoke(app, [*command, f"{option}={value}"])
    assert result.exit_code == EXIT_INVALID, result.output
    assert result.stderr.startswith(f"error: {option} must be a finite number")
    assert result.stderr.endswith(f", got '{value}'\n")
    assert result.stdout == ""


def test_a_finite_number_is_still_taken() -> None:
    """A large but finite number is read as before (here refused only by the option's bound)."""
    result = CliRunner().invoke(
        app, ["submit", "--cpu-millis", "1", "--memory-mb", "1", "--sleep-s", "1e300"]
    )
    assert result.stderr == "error: --sleep-s must be a number between 0 and 604800, got 1e+300\n"

"""Every command line ``stockade`` refuses is said in one style: one line on stderr, ``error:
<field> must be ..., got <value>`` (or what is missing or unknown, and which ``--help`` to read),
exit status 2; never Click's usage block, ``Error: Invalid value ...`` or pydantic's words."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app
from ops.cli.base import usage_line
from runtime.errors import InvalidArgument

CP = ("--control-planes", "127.0.0.1:1")
SUBMIT = ("submit", "--cpu-millis", "100", "--memory-mb", "64")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["job", "abc", *CP], "job_id must be an integer, got 'abc'"),
        (["job", "0", *CP], "job_id must be between 1 and 9223372036854775807, got 0"),
        (["logs", "7", "--tail", "-5", *CP], "--tail must be an integer between 0 and 100000, got -5"),
        (["list", "--limit", "many", *CP], "--limit must be an integer between 0 and 10000, got 'many'"),
        (
            ["list", "--state", "sleeping", *CP],
            "state must be empty or one of waiting, pending, assigned, "
            "running, succeeded, failed, cancelled, got 'sleeping'",
        ),
        (["cancel", "7", "--wait-s", "soon", *CP], "--wait-s must be a number >= 0, got 'soon'"),
        (["drain", "w-1", "--deadline-s", "x", *CP], "--deadline-s must be a number, got 'x'"),
        (
            ["submit", "--cpu-millis", "1.5", "--memory-mb", "64", *CP, "--", "true"],
            "--cpu-millis must be an integer, got '1.5'",
        ),
        (
            [*SUBMIT, "--sleep-s", "1e9", *CP],
            "--sleep-s must be a number between 0 and 604800, got 1000000000.0",
        ),
        (["jobs", "0", *CP], "count must be an integer between 1 and 100000, got 0"),
        (["kill-leader", "--timeout-s", "-1", *CP], "--timeout-s must be a number >= 0, got -1.0"),
        (["kill-worker", "--timeout-s", "-1", *CP], "--timeout-s must be a number >= 0, got -1.0"),
        (["up", "--workers", "many"], "--workers must be an integer between 0 and 1000, got 'many'"),
        (["bench", "pack", "--workers", "5000"], "--workers must be an integer between 1 and 1000, got 5000"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field_the_rule_and_the_value(args: list[str], line: str) -> None:
    """A value the command line cannot take, whether Click reads it or the command checks it,
    is refused in the same words: the field, the rule and the value, exit 2."""
    result = CliRunner().invoke(app, args)
    assert (result.exit_code, result.stderr) == (EXIT_INVALID, f"error: {line}\n")
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["job"], "job_id must be given; `stockade job --help` lists what it takes"),
        (
            ["submit", "--memory-mb", "64", "--", "true"],
            "--cpu-millis must be given; `stockade submit --help` lists what it takes",
        ),
        (
            ["status", "--bogus"],
            "`stockade status` has no option --bogus; `stockade status --help` lists what it takes",
        ),
        (
            ["chaos", "--failovers", "3"],
            "`stockade chaos` has no option --failovers (did you mean "
            "--db-failovers or --workers?); `stockade chaos --help` lists what it takes",
        ),
        (
            ["job", "1", "2", *CP],
            "got unexpected extra argument(s) (2); `stockade job --help` lists what it takes",
        ),
        (["bench", "nope"], "no such command 'nope'; `stockade bench --help` lists what it takes"),
        (
            ["job", "-1", *CP],
            "-1 is not a valid argument: no argument of `stockade job` is negative; "
            "`stockade job --help` lists what it takes",
        ),
    ],
)
def test_a_missing_or_unknown_part_is_one_line_naming_it_and_the_help(args: list[str], line: str) -> None:
    """A missing argument or option, an unknown option or command, one argument too many, or a
    negative number where an argument goes (read as an option) is refused in one line that
    names it and the command whose --help lists what it takes."""
    result = CliRunner().invoke(app, args)
    assert (result.exit_code, result.stderr) == (EXIT_INVALID, f"error: {line}\n")


def test_an_unknown_command_names_the_likely_one() -> None:
    """``stockade lgos`` names the command it may have meant, in the same style."""
    result = CliRunner().invoke(app, ["lgos"])
    assert result.exit_code == EXIT_INVALID
    assert (
        result.stderr
        == "error: no such command 'lgos' (did you mean 'logs'?); `stockade --help` lists what it takes\n"
    )


def test_stockade_alone_still_prints_its_help() -> None:
    """With no command, the help is shown as before (it is no refusal of a value)."""
    result = CliRunner().invoke(app, [])
    assert "Usage: stockade" in result.output and "error:" not in result.output


def test_typers_own_refusals_read_the_same() -> None:
    """A refusal of an option Typer reads itself (a path: pydantic's words) is said as the
    project's, and one carrying an InvalidArgument is that error's line."""
    from typer._click.exceptions import BadParameter

    class Path:
        param_type_name, opts, name = "option", ["--state-dir"], "state_dir"

    plain = BadParameter("Input should be a valid path.", param=Path())  # type: ignore[arg-type]
    assert usage_line(plain) == "--state-dir must be a valid path"
    invalid = InvalidArgument("--limit", 20000, "must be an integer between 0 and 10000")
    checked = BadParameter(str(invalid), param=Path())  # type: ignore[arg-type]
    checked.__cause__ = invalid
    assert usage_line(checked) == "--limit must be an integer between 0 and 10000, got 20000"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["logs", "7", "--tail"], "--tail must be given a value; `stockade logs --help` lists what it takes"),
        (
            ["jobs", "3", "--control-planes"],
            "--control-planes must be given a value; `stockade jobs --help` lists what it takes",
        ),
        (
            ["bench", "pack", "--workers"],
            "--workers must be given a value; `stockade bench pack --help` lists what it takes",
        ),
        (
            ["certs", "issue", "--role"],
            "--role must be given a value; `stockade certs issue --help` lists what it takes",
        ),
    ],
)
def test_an_option_without_its_value_names_the_subcommands_help(args: list[str], line: str) -> None:
    """An option given last without its value is refused naming the option and the help of
    the command (or nested command) it belongs to, not ``stockade --help``."""
    result = CliRunner().invoke(app, args)
    assert (result.exit_code, result.stderr) == (EXIT_INVALID, f"error: {line}\n")

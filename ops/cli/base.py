"""The ``stockade`` Typer application and its ``bench`` group, which the command modules
decorate their commands onto; how a command line that is refused is said."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import IO, Annotated, Any

import typer
from typer._click.exceptions import (
    BadOptionUsage,
    BadParameter,
    MissingParameter,
    NoArgsIsHelpError,
    NoSuchOption,
    UsageError,
)
from typer.core import TyperGroup

from ops.cli import params
from ops.cli.common import EXIT_INVALID
from runtime.errors import InvalidArgument

__all__ = ["StockadeGroup", "app", "bench_app", "command_group", "usage_line"]

params.install()


class RefusedCommandLine(UsageError):
    """A command line refused, said as every refusal of ``stockade`` is: one line on stderr,
    ``error: ...``, and exit status 2 (:data:`ops.cli.common.EXIT_INVALID`)."""

    exit_code = EXIT_INVALID

    def show(self, file: IO[Any] | None = None) -> None:
        (file or sys.stderr).write(f"error: {self.message}\n")


def usage_line(exc: UsageError) -> str:
    """What a refusal of Click's says, after ``error: ``: a bad value as ``--limit must be an
    integer between 0 and 10000, got 20000``; a missing or unknown one, with the command whose
    ``--help`` lists what it takes."""
    if isinstance(exc.__cause__, InvalidArgument):  # ops.cli.params: the rule and the value
        return str(exc.__cause__)
    command = exc.ctx.command_path if exc.ctx is not None else "stockade"
    hint = f"; `{command} --help` lists what it takes"
    if isinstance(exc, MissingParameter):
        return f"{params.param_field(exc.param)} must be given{hint}"
    if isinstance(exc, BadParameter):  # Typer's own reading (a path): its rule, pydantic's words
        rule = re.sub(r"^Input should be\b", "must be", exc.message).rstrip(".")
        return f"{params.param_field(exc.param)} {rule}"
    if isinstance(exc, BadOptionUsage) and " requires " in exc.message:  # the value left off
        return f"{exc.option_name} must be given a value{hint}"
    if isinstance(exc, NoSuchOption) and re.fullmatch(r"-\d+(\.\d*)?", exc.option_name or ""):
        # A negative number where an argument goes (`stockade job -1`) reads as an option.
        return f"{exc.option_name} is not a valid argument: no argument of `{command}` is negative{hint}"
    if isinstance(exc, NoSuchOption):
        guess = f" (did you mean {' or '.join(sorted(exc.possibilities))}?)" if exc.possibilities else ""
        return f"`{command}` has no option {exc.option_name}{guess}{hint}"
    text = re.sub(r"\. Did you mean (.*)\?$", r" (did you mean \1?)", exc.format_message()).rstrip(".")
    return text[:1].lower() + text[1:] + hint


@contextlib.contextmanager
def _one_line(group: TyperGroup | None = None, ctx: Any = None) -> Iterator[None]:
    """Click's refusals of a command line, said by :func:`usage_line` (a group alone still
    prints its help). A refusal without a context, raised after ``group`` chose a subcommand,
    is given the subcommand's, so that the line names its ``--help``."""
    try:
        yield
    except (RefusedCommandLine, NoArgsIsHelpError):
        raise
    except UsageError as exc:
        if exc.ctx is None and group is not None and ctx is not None and ctx.invoked_subcommand:
            command = group.get_command(ctx, ctx.invoked_subcommand)
            if command is not None:
                exc.ctx = command.context_class(command, info_name=ctx.invoked_subcommand, parent=ctx)
        raise RefusedCommandLine(usage_line(exc), exc.ctx) from exc


class StockadeGroup(TyperGroup):
    """The ``stockade`` command group: every command line Click refuses is one line,
    ``error: ...``, exit status 2, as :func:`ops.cli.common.fail` says every other refusal."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _one_line(self, ctx):
            return super().invoke(ctx)


app = typer.Typer(
    name="stockade",
    cls=StockadeGroup,
    help="Stockade: a cluster scheduler whose leaders can crash and freeze without placing "
    "or running a job twice.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        import importlib.metadata  # tens of milliseconds: only when asked

        sys.stdout.write(f"stockade {importlib.metadata.version('stockade')}\n")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the installed version and exit."
        ),
    ] = False,
) -> None:
    """Stockade: a cluster scheduler whose leaders can crash and freeze without placing or
    running a job twice."""


def command_group(name: str, help: str) -> typer.Typer:
    """The group ``stockade <name>`` of commands, added to :data:`app`: its refusals are said as
    every refusal of ``stockade`` is, and its help is printed when no command is given."""
    group = typer.Typer(cls=StockadeGroup, help=help, no_args_is_help=True)
    app.add_typer(group, name=name)
    return group


bench_app = command_group("bench", "Benchmarks that print measured numbers.")

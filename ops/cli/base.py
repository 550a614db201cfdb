"""The ``stockade`` Typer application and its ``bench`` group, which the command modules
decorate their commands onto."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ops.cli import params

__all__ = ["app", "bench_app"]

params.install()

app = typer.Typer(
    name="stockade",
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


bench_app = typer.Typer(help="Benchmarks that print measured numbers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

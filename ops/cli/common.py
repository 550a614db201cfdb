"""What every command group shares: exit statuses, the consoles, the one-line error handling,
Ctrl-C handling, and where the local cluster and the control planes are.

Imports here stay light (no trio, no protocol, no server side): every ``stockade`` call,
``--help`` included, imports this module.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from ops.cluster import CONTROL_PLANES_ENV
from runtime.errors import (
    ClusterBusy,
    IdempotencyConflict,
    InvalidArgument,
    NotFound,
    RemoteError,
    Unavailable,
)

if TYPE_CHECKING:
    from rich.console import Console

    from ops.cluster import StateDir


EXIT_UNAVAILABLE = 1
"""Exit status when the cluster cannot be reached or the command cannot be carried out."""
EXIT_INVALID = 2
"""Exit status for invalid input (a value out of range, an unknown job)."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention)."""
EXIT_TOO_LATE = 3
"""Exit status of ``stockade cancel`` when the job had ended on its own before the cancel
took effect (its end stands)."""

_PIPED_WIDTH = 120
"""Columns of output written to a pipe or file (rich would assume 80) unless $COLUMNS says."""


def _console(*, stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, highlight=False, width=_PIPED_WIDTH if piped else None)


@functools.cache
def console() -> Console:
    """The console of standard output (made on first use: rich is not imported before)."""
    return _console()


@functools.cache
def err_console() -> Console:
    """The console of standard error."""
    return _console(stderr=True)


ControlPlanesOption = Annotated[
    str | None,
    typer.Option(
        "--control-planes",
        help=f"Control-plane addresses, host:port,... (default: ${CONTROL_PLANES_ENV}, "
        "else .stockade/cluster.json).",
        show_default=False,
    ),
]


# ---------------------------------------------------------------------------- helpers


def fail(message: str, code: int = EXIT_UNAVAILABLE) -> NoReturn:
    err_console().print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def _operational(exc: Exception) -> bool:
    """Whether ``exc`` is an expected failure of the launcher or the embedded database (their
    modules are looked up only when loaded: an error of a module never imported cannot occur)."""
    kinds = [
        getattr(sys.modules.get(module), name, None)
        for module, name in (("ops.cluster", "ClusterError"), ("ops.pg", "EmbeddedPostgresError"))
    ]
    return any(isinstance(kind, type) and isinstance(exc, kind) for kind in kinds)


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """Turn Stockade's errors into one line on stderr and an exit status; no traceback."""
    try:
        yield
    except (InvalidArgument, NotFound, IdempotencyConflict) as exc:
        fail(str(exc), EXIT_INVALID)
    except ClusterBusy as exc:
        from ops.rpc import DEFAULT_BUSY_RETRY_S

        fail(
            f"the cluster is too busy to take this now: every control plane answered 'busy' "
            f"for {DEFAULT_BUSY_RETRY_S:g} s (what they refused was not stored); try again later. "
            f"Details: {exc}",
            EXIT_UNAVAILABLE,
        )
    except (Unavailable, RemoteError) as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    except Exception as exc:
        if not _operational(exc):
            raise
        fail(str(exc), EXIT_UNAVAILABLE)


def _interrupted(exc: BaseException) -> bool:
    """True when ``exc`` is a KeyboardInterrupt, also inside trio's exception groups."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and any(_interrupted(e) for e in exc.exceptions)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """For commands that start processes of their own (chaos, the benchmarks): SIGTERM stops
    them as Ctrl-C does, so their clean-up (stopping the cluster they started) runs; either
    ends with one line and exit status 130 instead of a traceback."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGINT))
    try:
        yield
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        err_console().print("interrupted: what this command started has been stopped")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def local_state() -> StateDir:
    """The local cluster's state folder (``./.stockade`` or ``$STOCKADE_STATE_DIR``)."""
    from ops.cluster import StateDir, default_state_dir

    return StateDir(default_state_dir())


def control_plane_addresses(option: str | None) -> list[str]:
    """The control planes a client command calls: ``option``, else the environment, else the
    local cluster's ``cluster.json``.

    Raises:
        ClusterError: none is given anywhere.
    """
    from ops.cluster import resolve_addresses

    return resolve_addresses(option, local_state())


def shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)

"""The ``stockade`` command: one module per command group (:data:`COMMANDS`). How a call stays
fast and how it fails: docs/design.md, "The stockade command: start-up and failures".
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

    from ops.cli.common import EXIT_INTERRUPTED, EXIT_INVALID, EXIT_TOO_LATE, EXIT_UNAVAILABLE

__all__ = ["EXIT_INTERRUPTED", "EXIT_INVALID", "EXIT_TOO_LATE", "EXIT_UNAVAILABLE", "app", "main"]

COMMANDS: dict[str, tuple[str, ...]] = {
    "local": ("up", "down", "kill-leader", "kill-worker", "prometheus-config"),
    "jobs": ("jobs", "submit", "run", "job", "list", "jobs-list", "cancel", "status"),
    "logs": ("logs",),
    "console": ("console",),
    "workers": ("cordon", "uncordon", "drain"),
    "audit": ("audit",),
    "accounts": ("account",),
    "schedules": ("schedule",),
    "chaos": ("chaos", "check"),
    "processes.control_plane": ("cp",),
    "processes.agents": ("agent", "fleet"),
    "processes.database": ("database",),
    "bench": ("bench",),
    "certs": ("certs",),
    "image": ("image",),
}
"""Each module that registers commands on the app, with the commands it registers, in the
order ``--help`` lists them (a unit test keeps this equal to what the modules register)."""

CLIENT_GROUPS = ("jobs", "logs", "workers", "audit", "accounts")
"""The groups whose commands are one short call: they run with the garbage collector paused."""


def load_commands(args: Sequence[str] | None = None) -> typer.Typer:
    """The ``stockade`` app with the command group that ``args`` (the command line after the
    program) names registered; every group when ``args`` is None or names no known command first."""
    was_enabled = gc.isenabled()
    gc.disable()  # while the modules load (Typer's among them): no garbage to collect yet
    try:
        from ops.cli.base import app

        groups = [group for group, names in COMMANDS.items() if args and args[0] in names]
        for group in groups or COMMANDS:
            importlib.import_module(f"ops.cli.{group}")
    finally:
        if was_enabled:
            gc.enable()
    return app


def main() -> None:
    """The console entry point (``stockade``).

    A client command (:data:`CLIENT_GROUPS`) runs with the garbage collector paused and, once
    it has answered, ends with ``os._exit`` after flushing its output: the interpreter's
    teardown would take another 50 ms, and such a call has nothing left to close. Ctrl-C while
    the modules load ends with one line and exit status 130.
    """
    args = sys.argv[1:]
    if args[:1] in (["--help"], ["--version"], ["status"], ["submit"]):
        _run_fast(args)
    client = bool(args) and any(args[0] in COMMANDS[group] for group in CLIENT_GROUPS)
    try:
        app = load_commands(args)
    except KeyboardInterrupt:
        print("interrupted: nothing was started", file=sys.stderr)
        sys.exit(_EXIT_INTERRUPTED)
    if not client:
        app()
        return
    gc.disable()
    try:
        app()
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _run_fast(args: list[str]) -> None:
    """Run a hot command through :mod:`ops.cli.fast`, without Typer or trio, ending the process
    as a client command does; return when that layer leaves it to the Typer app (``sys.argv``
    then carries what the layer added, the idempotency key of a submit it sent)."""
    gc.disable()
    from ops.cli import fast

    try:
        status = fast.run(args)
        if status is not None:
            sys.stdout.flush()
    except KeyboardInterrupt:  # as the Typer app ends on Ctrl-C: status 130, nothing said
        status = _EXIT_INTERRUPTED
    except BrokenPipeError:  # as the Typer app ends when its reader is gone: status 1, quietly
        os._exit(1)
    if status is None:
        sys.argv[1:] = args
        gc.enable()
        return
    sys.stderr.flush()
    os._exit(status)


_EXIT_INTERRUPTED = 130
"""As ops.cli.common.EXIT_INTERRUPTED (not imported: --help must stay light)."""


def _exit_status(exc: SystemExit) -> int:
    """The status ``raise SystemExit(code)`` would exit with (a message is printed, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def __getattr__(name: str) -> typer.Typer | int:
    """``ops.cli.app``: the app with every command registered (for tests and other callers);
    the exit statuses of :mod:`ops.cli.common` (not imported before: ``--help`` stays light)."""
    if name == "app":
        return load_commands()
    if name in __all__:
        from ops.cli import common

        value: int = getattr(common, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

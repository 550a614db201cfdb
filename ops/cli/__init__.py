"""The ``stockade`` command: run a control plane or an agent, drive the local cluster, use it.

One module per command group, each of which only parses options and renders answers:
:mod:`ops.cli.processes` (``cp``, ``agent``, ``fleet``), :mod:`ops.cli.local` (``up``,
``down``, ``kill-leader``, ``kill-worker``), :mod:`ops.cli.jobs` (``jobs``, ``submit``,
``job``, ``list``, ``cancel``, ``status``), :mod:`ops.cli.chaos` (``chaos``, ``check``) and
:mod:`ops.cli.bench` (``bench failover|pack|overload``); :mod:`ops.cli.common` holds what they
share, :mod:`ops.cli.render` how answers are shown and :mod:`ops.cli.params` how option values
are read.

Start-up: every call imports every command module (Typer needs each command's options), so
those import only light modules at the top; what a command needs (rich, trio, the protocol,
the client, the launcher, the server side) it imports when it runs. ``stockade --help`` and
``stockade status`` start in well under 0.3 s on an idle machine; a unit test
(``tests/unit/test_cli_startup.py``) fails when a light call loads a heavy module.

Client commands find the control planes in ``--control-planes host:port,...``, else in
``$STOCKADE_CONTROL_PLANES``, else in ``.stockade/cluster.json`` (or ``$STOCKADE_STATE_DIR``'s),
else in the user config (``~/.config/stockade/config.toml``; see :mod:`ops.config`), where
``stockade up`` records the cluster it started. Expected failures print one line
(``error: ...``) and exit with 2 for invalid input (bad value, unknown job) or 1 when the
cluster cannot be reached or the command cannot be carried out; Ctrl-C exits 130 saying what
is left running. No expected condition shows a traceback.
"""

from __future__ import annotations

import importlib

from ops.cli.app import app
from ops.cli.common import EXIT_INTERRUPTED, EXIT_INVALID, EXIT_TOO_LATE, EXIT_UNAVAILABLE

__all__ = ["EXIT_INTERRUPTED", "EXIT_INVALID", "EXIT_TOO_LATE", "EXIT_UNAVAILABLE", "app", "main"]

COMMAND_GROUPS = ("local", "jobs", "chaos", "processes", "bench")
"""The modules that register commands on :data:`app`, in the order ``--help`` lists them."""

for _group in COMMAND_GROUPS:
    importlib.import_module(f"ops.cli.{_group}")


def main() -> None:
    """The console entry point (``stockade``)."""
    app()

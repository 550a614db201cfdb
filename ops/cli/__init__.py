"""The ``stockade`` command: run a control plane or an agent, drive the local cluster, use it.

One module per command group, each of which only parses options and renders answers:
:mod:`ops.cli.processes` (``cp``, ``agent``, ``fleet``), :mod:`ops.cli.local` (``up``,
``down``, ``kill-leader``, ``kill-worker``), :mod:`ops.cli.jobs` (``jobs``, ``submit``,
``job``, ``list``, ``cancel``, ``status``), :mod:`ops.cli.chaos` (``chaos``, ``check``) and
:mod:`ops.cli.bench` (``bench failover|pack|overload``); :mod:`ops.cli.common` holds what they
share and :mod:`ops.cli.render` how answers are shown.

Client commands find the control planes in ``--control-planes host:port,...``, else in
``$STOCKADE_CONTROL_PLANES``, else in ``.stockade/cluster.json``. Errors print one line
(``error: ...``) and exit with 2 for invalid input (bad value, unknown job) or 1 when the
cluster cannot be reached or the command cannot be carried out.
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

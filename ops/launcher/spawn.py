"""Starting one of the local cluster's long-lived processes (a control plane, an agent, a fleet,
etcd, Patroni): :func:`start_logged`. Light imports, as :mod:`ops.launcher.state`'s, so a
command that only looks at a cluster pays for nothing more.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ops.launcher.state import open_log

if TYPE_CHECKING:
    from runtime.os_users import RunAs


def start_logged(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str],
    cwd: Path | None = None,
    run_as: RunAs | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own (a terminal's Ctrl-C does not reach it), reading
    nothing, its stdout and stderr appended to ``log_path`` (:func:`~ops.launcher.state.open_log`).

    Args:
        argv: the program and its arguments.
        log_path: the log, made private, then owned by ``run_as`` when that is another user.
        env: the process's whole environment.
        cwd: its working folder; None: this process's.
        run_as: the user it runs as; None: this process's.

    Raises:
        OSError: the log cannot be opened or handed over, or the program cannot be started.
    """
    kwargs = run_as.subprocess_kwargs() if run_as is not None else {}
    with open_log(log_path) as log:
        if run_as is not None and run_as.is_other_user:
            os.fchown(log.fileno(), run_as.uid, run_as.gid)
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            **kwargs,
        )

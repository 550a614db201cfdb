"""Operating-system helpers of the launcher: recognising its processes, stopping a group of
them, free ports, and the tail of a log."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from agent.adoption import supervisor_of
from agent.fence import FENCE_DEADLINE_FILE
from ops import pidfile
from ops.launcher.state import LISTEN_HOST, MARKER_ENV, ClusterError, ProcessSpec, option_value
from runtime.settings.agent import DEFAULT_LEAVE_TIMEOUT_S
from runtime.text import tail_lines


def runs_spec(cmdline: Sequence[str], spec: ProcessSpec) -> bool:
    """Whether ``cmdline`` is ``python -m ops.cli <kind> --id <id> ...``."""
    try:
        start = list(cmdline).index("ops.cli")
    except ValueError:
        return False
    rest = list(cmdline[start + 1 :])
    if not rest or rest[0] != spec.kind:
        return False
    return any(a == "--id" and b == spec.id for a, b in itertools.pairwise(rest))


def cmdline(process: psutil.Process) -> list[str]:
    """``["?"]`` when it cannot be read."""
    try:
        return process.cmdline()
    except psutil.Error:
        return ["?"]


CONTROL_PLANE_STOP_S = 10.0
"""How long a control plane has from SIGTERM to exit (it hands its lease on) before SIGKILL."""
STOP_TIMEOUT_S = CONTROL_PLANE_STOP_S
"""How long a control plane, a container, or a process killed on purpose is waited for after
SIGTERM before SIGKILL, in seconds."""
WORKER_STOP_SLACK_S = 10.0
"""What a worker's process has from SIGTERM beyond its leave budget (its jobs' stop and its
exit, on a loaded machine), in seconds."""
PER_WORKER_STOP_S = 0.5
"""What a worker's process has from SIGTERM per worker it hosts (a fleet's take turns to
leave), in seconds."""


def stop_deadline_s(spec: ProcessSpec, workers: int) -> float:
    """How long the process of ``spec`` may take from SIGTERM to exit before SIGKILL, in
    seconds: :data:`CONTROL_PLANE_STOP_S` for a control plane; for a worker's process (hosting
    ``workers``) its ``--leave-timeout-s`` (or the default) plus :data:`WORKER_STOP_SLACK_S`
    plus :data:`PER_WORKER_STOP_S` per worker, so that it can leave rather than be declared dead."""
    if spec.kind == "cp":
        return CONTROL_PLANE_STOP_S
    leave_s = DEFAULT_LEAVE_TIMEOUT_S
    given = option_value(spec.args, "--leave-timeout-s")
    if given is not None:
        with contextlib.suppress(ValueError):
            leave_s = float(given)
    return leave_s + WORKER_STOP_SLACK_S + PER_WORKER_STOP_S * max(1, workers)


def terminate(group: Mapping[str, psutil.Process], deadlines_s: Mapping[str, float]) -> list[str]:
    """SIGTERM every process of ``group`` (id -> process), then SIGKILL each one still alive
    ``deadlines_s[id]`` seconds after; returns the ids that needed SIGKILL."""
    for process in group.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    began = time.monotonic()
    alive = dict(group)
    killed: list[str] = []
    while alive:
        elapsed_s = time.monotonic() - began
        for process_id in [i for i in alive if deadlines_s[i] <= elapsed_s]:
            with contextlib.suppress(psutil.NoSuchProcess):
                alive[process_id].kill()
            killed.append(process_id)
            del alive[process_id]
        if not alive:
            break
        next_s = min(deadlines_s[i] for i in alive) - elapsed_s
        _, still = psutil.wait_procs(list(alive.values()), timeout=max(0.0, next_s))
        alive = {i: p for i, p in alive.items() if p in still}
    psutil.wait_procs([group[i] for i in killed], timeout=5.0)
    return killed


def marked_processes(root: Path) -> list[psutil.Process]:
    """Live processes (not zombies, not this one) whose environment names state folder ``root``."""
    marker = str(root)
    found = []
    me = os.getpid()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            ours = process.pid != me and process.environ().get(MARKER_ENV) == marker
            if ours and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def kill_marked(root: Path) -> list[int]:
    """SIGKILL every process :func:`marked_processes` finds; returns their pids."""
    left = marked_processes(root)
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(left, timeout=5.0)
    return [p.pid for p in left]


def job_supervisors(root: Path) -> list[psutil.Process]:
    """Live job supervisors of the cluster's workers: processes whose command line names the
    fence-deadline file of a work folder under ``root``. They carry no marker and outlive a
    killed agent until its fence deadlines have passed."""
    deadlines = [str(path) for path in (root / "workers").glob(f"*/{FENCE_DEADLINE_FILE}")]
    if not deadlines:
        return []
    found = []
    for process in psutil.process_iter():
        argv = cmdline(process)
        if any(supervisor_of(argv, deadline) is not None for deadline in deadlines):
            with contextlib.suppress(psutil.Error):
                if process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
    return found


def kill_job_supervisors(root: Path) -> list[int]:
    """SIGUSR1 every job supervisor (it kills its job and exits), SIGKILL those alive 5 s
    later; returns their pids."""
    left = job_supervisors(root)
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGUSR1)
    _, alive = psutil.wait_procs(left, timeout=5.0)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=5.0)
    return [p.pid for p in left]


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LISTEN_HOST, port))
        except OSError:
            return False
    return True


def postmaster_port(pg_dir: Path) -> int | None:
    return pidfile.read_port(pg_dir / "data" / "postmaster.pid", line=3)


LOG_TAIL_LINES = 20


def exited(what: str, log_path: Path) -> ClusterError:
    """``what`` (a process that exited) and the last lines of its log, as one error."""
    return ClusterError(f"{what}; last lines of {log_path}:\n" + tail(log_path))


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a process's log, read in bounded memory."""
    try:
        return "\n".join(tail_lines(path, max_lines=lines).lines)
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"

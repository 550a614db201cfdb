"""Operating-system helpers of the launcher: recognising its processes, stopping a group of
them, free ports, and the tail of a log."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from agent.adoption import supervisor_of
from agent.fence import FENCE_DEADLINE_FILE
from ops.launcher.state import LISTEN_HOST, MARKER_ENV, ProcessSpec
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
    """The command line of ``process``, or ``["?"]`` when it cannot be read."""
    try:
        return process.cmdline()
    except psutil.Error:
        return ["?"]


def terminate(group: Mapping[str, psutil.Process], timeout_s: float) -> list[str]:
    """SIGTERM every process of ``group`` (id -> process), SIGKILL those still alive after
    ``timeout_s`` seconds; returns the ids that needed SIGKILL."""
    for process in group.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(list(group.values()), timeout=timeout_s)
    killed = [process_id for process_id, p in group.items() if p in alive]
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=5.0)
    return killed


def marked_processes(root: Path) -> list[psutil.Process]:
    """Live processes (not zombies, not this one) whose environment names state folder ``root``."""
    marker = str(root)
    found = []
    me = os.getpid()
    for process in psutil.process_iter():
        if process.pid == me:
            continue
        try:
            if process.environ().get(MARKER_ENV) != marker:
                continue
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
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
    """Live job supervisors of the cluster's workers (command jobs' reapers, container jobs'
    supervisors): processes whose command line names the fence-deadline file of a work folder
    under ``root`` (:func:`agent.adoption.supervisor_of`). They carry no marker (jobs get a
    clean environment) and outlive a killed agent until its fence deadlines have passed."""
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
    """Stop every job supervisor :func:`job_supervisors` finds: SIGUSR1 first (it kills its
    job's whole tree, or its container, and exits), SIGKILL for those still alive 5 s later;
    returns their pids."""
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
    """The port in ``pg/data/postmaster.pid``, if there is one."""
    try:
        return int((pg_dir / "data" / "postmaster.pid").read_text().splitlines()[3])
    except (OSError, ValueError, IndexError):
        return None


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a process's log, read in bounded memory (a log may be large)."""
    try:
        return "\n".join(tail_lines(path, max_lines=lines).lines)
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"

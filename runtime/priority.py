"""CPU priority for the processes that keep the cluster live.

:func:`ask_for_priority` lowers the process's nice value (``--nice``, -5 by default) before it
starts its threads; without ``CAP_SYS_NICE`` the process keeps the priority it inherited and
says so once. Why: docs/design.md, "CPU priority for liveness".
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from runtime.errors import InvalidArgument

MIN_NICE = -20
MAX_NICE = 19

DEFAULT_NICE = -5
"""The nice value control planes, agents, fleets and the embedded PostgreSQL ask for."""


@attrs.frozen
class Priority:
    """What :func:`ask_for_priority` did: the nice value ``asked`` for, the one in effect
    ``now``, and why the system ``refused`` (empty when it did not)."""

    asked: int
    now: int
    refused: str = ""


def check_nice(nice: int) -> int:
    """``nice`` if it lies in -20..19, else InvalidArgument."""
    if not MIN_NICE <= nice <= MAX_NICE:
        raise InvalidArgument("nice", nice, f"must be between {MIN_NICE} and {MAX_NICE}")
    return nice


def ask_for_priority(nice: int, *, log: Any | None = None) -> Priority:
    """Set the calling thread's nice value to ``nice`` (-20..19, lower: more CPU) unless it is
    already at least that high a priority; threads it starts later inherit it. ``log`` is told
    once (a warning) when the system refuses. InvalidArgument: ``nice`` is out of range."""
    return _raise_priority(0, nice, children=False, log=log, what="CPU priority")


def children_of(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes ([] when it is gone)."""
    import psutil  # here: the CLI imports this module to register --nice, and needs no psutil

    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def renice_server(pid: int, nice: int, *, log: Any | None = None) -> Priority:
    """:func:`ask_for_priority` for a server process ``pid`` that forks a process per
    connection (PostgreSQL's postmaster) and its current children; later ones inherit it."""
    return _raise_priority(pid, nice, children=True, log=log, what="database server's CPU priority")


def _raise_priority(pid: int, nice: int, *, children: bool, log: Any | None, what: str) -> Priority:
    """Set ``pid``'s nice value (0: the calling thread) to ``nice``, and its children's too
    when ``children``, unless it already runs at that priority or higher."""
    check_nice(nice)
    current = os.getpriority(os.PRIO_PROCESS, pid)
    if current <= nice:
        return Priority(asked=nice, now=current)
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
        for child in children_of(pid) if children else ():
            try:
                os.setpriority(os.PRIO_PROCESS, child, nice)
            except ProcessLookupError:
                pass
    except OSError as exc:
        refused = f"{type(exc).__name__}: {exc.strerror or exc}"
        if log is not None:
            log.warning(
                f"{what} not raised: runs at its inherited nice value",
                asked_nice=nice,
                nice=current,
                error=refused,
                hint="needs CAP_SYS_NICE (root has it); see --nice",
            )
        return Priority(asked=nice, now=current, refused=refused)
    return Priority(asked=nice, now=os.getpriority(os.PRIO_PROCESS, pid))

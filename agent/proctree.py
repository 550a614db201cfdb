"""The process tree of a job's reaper, read from ``/proc``: its children, its descendants, their
states, and the signals that kill them. Imports only the standard library (the reaper's start
cost)."""

from __future__ import annotations

import os

try:
    import _signal as signal  # ``signal`` without the enum wrappers: ~4 ms less start cost
except ImportError:  # pragma: no cover - not CPython
    import signal  # type: ignore[no-redef]


def children() -> list[int]:
    """This process's children (the reaper is single-threaded)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", encoding="ascii") as file:
            return [int(p) for p in file.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: scan every process
        return children_by_parent().get(me, [])


def descendants() -> list[int]:
    """Every descendant of this process, parents before their children: the job's whole tree,
    whatever process group or session its members moved to (this process is a subreaper). A
    process created meanwhile may be left out: callers repeat until the tree is stable."""
    me = os.getpid()
    if os.path.exists(f"/proc/{me}/task/{me}/children"):
        children_of = _task_children
    else:
        children_of = children_by_parent().get  # type: ignore[assignment]
    found: list[int] = []
    frontier = [me]
    while frontier:
        kids = children_of(frontier.pop(0), [])
        found.extend(kids)
        frontier.extend(kids)
    return found


def _task_children(pid: int, default: list[int]) -> list[int]:
    """The children of every thread of ``pid`` (``/proc/<pid>/task/<tid>/children``); ``default``
    when it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return default
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as file:
                kids.extend([int(p) for p in file.read().split()])
        except (OSError, ValueError):
            continue
    return kids


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from scanning ``/proc/*/stat`` (for kernels without
    ``/proc/<pid>/task/<tid>/children``)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    return parents


def state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``T`` stopped, ``Z`` zombie ...), or
    None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            return file.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def kill_group(pgid: int, sig: int) -> None:
    """Signal the process group ``pgid``; one that is gone, or not ours to signal, is skipped."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_children() -> None:
    """SIGKILL every child of this process; safe from pid reuse: a child stays ours (at worst a
    zombie) until this process reaps it."""
    for pid in children():
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

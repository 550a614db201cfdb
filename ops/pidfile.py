"""Reading pid and port files (the launcher's ``pids/*.pid``, PostgreSQL's ``postmaster.pid``,
Patroni's and etcd's): whatever a file holds, a reader gets a number in range or None.

A missing, empty or cut-short file, or one holding nonsense (a negative pid: ``postmaster.pid``
of a single-user backend, as ``initdb`` runs), means "not running", never an exception.
Nonsense in a complete file is said once per file and content, on stderr, when the reader asks
for it (``warn``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psutil

PID_MAX = 4_194_304
"""The largest pid Linux hands out (``PID_MAX_LIMIT`` on 64-bit machines)."""
PORT_MAX = 65_535

_log = logging.getLogger("stockade.pidfile")
_said: set[tuple[str, str]] = set()


def read_pid(path: Path, *, line: int = 0, warn: bool = False) -> int | None:
    """The pid on line ``line`` of ``path``, or None when the file is missing, empty, unfinished
    or holds no pid in 1..:data:`PID_MAX` there (then, with ``warn``, a complete file is said
    once on stderr)."""
    value = _read_line(path, line)
    if value is None:
        return None
    number = _number(value, 1, PID_MAX)
    if number is None and warn:
        _say(path, value, f"1..{PID_MAX}")
    return number


def read_port(path: Path, *, line: int) -> int | None:
    """The TCP port on line ``line`` of ``path``, or None (as :func:`read_pid`; 1..65535)."""
    value = _read_line(path, line)
    return None if value is None else _number(value, 1, PORT_MAX)


def process(pid: int | None) -> psutil.Process | None:
    """The live process ``pid``, or None: no pid, gone, out of range, or not ours to see."""
    if pid is None:
        return None
    try:
        return psutil.Process(pid)
    except (psutil.Error, ValueError, OverflowError):
        return None


def write_pid(path: Path, pid: int) -> None:
    """Write ``pid`` to ``path`` at once (a temporary file renamed over it): a reader never sees
    it half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(f"{pid}\n")
    os.replace(temporary, path)


def _read_line(path: Path, line: int) -> str | None:
    """Line ``line`` of ``path``, stripped, when the file has it whole (a newline after it)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    # What follows the last newline is unfinished (every writer ends its lines with one).
    complete = text.split("\n")[:-1]
    if line >= len(complete):
        return None
    value = complete[line].strip()
    return value or None


def _number(value: str, low: int, high: int) -> int | None:
    try:
        number = int(value)
    except ValueError:
        return None
    return number if low <= number <= high else None


def _say(path: Path, value: str, rule: str) -> None:
    key = (str(path), value)
    if key in _said:
        return
    _said.add(key)
    _log.warning("warning: %s holds no pid in %s, got %r; taken as not running", path, rule, value[:40])

"""The worker's append-only JSON-lines log of what it started and stopped (``agent.jsonl``): one
flushed line per event, dated by the database's clock (:mod:`agent.dbclock`). The keys of each
line and when each is written: docs/design.md, "The job log: agent.jsonl".
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import attrs
import trio

from agent.dbclock import DatabaseClock
from agent.work_folder import create_private


class LogEvent(StrEnum):
    START = "start"
    STOP = "stop"
    REGISTER = "register"
    SELF_FENCE = "self_fence"
    PAUSE = "pause"
    RESUME = "resume"
    LEAVE = "leave"


@attrs.frozen(kw_only=True)
class _Line:
    """A line to write: its keys but ``time``, and what dates it."""

    record: dict[str, Any]
    at: float
    """Trio time of its event."""
    latest: bool
    """Dated by the latest the database's clock can read at ``at`` (a start), else the earliest."""
    not_before_s: float | None
    on_written: Callable[[float], None] | None


class JobLog:
    """Writes ``agent.jsonl`` lines for one worker to ``path``, dated by ``clock`` (the
    database's clock as the agent knows it; None: a clock of its own)."""

    def __init__(self, path: Path, *, worker_id: str, clock: DatabaseClock | None = None) -> None:
        self.path = path
        self.worker_id = worker_id
        self.clock = DatabaseClock() if clock is None else clock
        self._file: IO[str] | None = None
        self._waiting: list[_Line] = []

    def open(self) -> None:
        """Open for appending (creating the folder and the file as needed); idempotent. Raises
        OSError when the folder or the file cannot be created."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # It names every job of the worker: the agent's alone (jobs run as other uids).
            fd = create_private(self.path, os.O_WRONLY | os.O_APPEND)
            self._file = os.fdopen(fd, "a", encoding="utf-8")

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(
        self,
        event: LogEvent,
        *,
        incarnation: int | None,
        epoch: int,
        job_id: int | None = None,
        assignment_id: int | None = None,
        reason: str | None = None,
        exit_code: int | None = None,
        grace_ms: int | None = None,
        at: float | None = None,
        not_before_s: float | None = None,
        started: bool = True,
        left: bool = False,
        units: tuple[tuple[str, tuple[str, ...]], ...] = (),
        on_written: Callable[[float], None] | None = None,
    ) -> float | None:
        """Append one line and flush it, dated by the database's clock; while that clock is not
        known yet, keep it until :meth:`flush` can write it (and every line after it, in order).

        Args:
            at: trio time of the event when it happened before now; None: now.
            not_before_s: the line's ``time`` is not earlier than this (a stop's start line).
            grace_ms: on a stop line, the grace of its own the job was stopped with (a
                preemption's), in milliseconds; None: none (the line has no such key).
            started: on a stop line, whether the job really ran.
            left: on a leave line, whether a control plane recorded the worker as left.
            units: on a start line, the device units the job holds, (name, unit ids) pairs:
                written as ``"units": {"gpu": ["0", "3"]}`` (none: no such key), so the checker
                can tell that no unit was held by two running jobs (docs/devices.md).
            on_written: called with the line's ``time`` once it is written.

        Returns:
            The line's ``time``; None when it waits for the clock.

        Raises:
            RuntimeError: the log is not open.
            OSError: the line, or one that waited before it, could not be written.
        """
        if self._file is None:
            raise RuntimeError(f"job log {self.path} is not open")
        record: dict[str, Any] = {
            "event": event.value,
            "worker_id": self.worker_id,
            "incarnation": incarnation,
            "job_id": job_id,
            "assignment_id": assignment_id,
            "epoch": epoch,
            "time": None,
        }
        if event is LogEvent.STOP:
            record["reason"] = reason
            record["started"] = started
            if exit_code is not None:
                record["exit_code"] = exit_code
            if grace_ms is not None:
                record["grace_ms"] = grace_ms
        if event is LogEvent.LEAVE:
            record["left"] = left
        if units:
            record["units"] = {name: list(ids) for name, ids in units}
        line = _Line(
            record=record,
            at=trio.current_time() if at is None else at,
            latest=event is LogEvent.START,
            not_before_s=not_before_s,
            on_written=on_written,
        )
        self._waiting.append(line)
        self.flush()
        return record["time"] if not self._waiting else None

    def flush(self) -> None:
        """Write the lines that wait for the database's clock, in order, once it is known. No
        checkpoint. Raises OSError when a line could not be written (it and those after it wait)."""
        if self._file is None or not self.clock.known:
            return
        while self._waiting:
            line = self._waiting[0]
            dated = self.clock.latest(line.at) if line.latest else self.clock.earliest(line.at)
            assert dated is not None  # the clock is known
            if line.not_before_s is not None:
                dated = max(dated, line.not_before_s)
            line.record["time"] = dated
            if self.clock.reading is None:
                line.record["clock"] = "worker"
            self._file.write(json.dumps(line.record) + "\n")
            self._file.flush()
            self._waiting.pop(0)
            if line.on_written is not None:
                line.on_written(dated)

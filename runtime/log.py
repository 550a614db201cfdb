"""Structured logging (structlog), one line per event, to stderr.

Call :func:`configure` once per process; get loggers with :func:`get`. Console output is
human-readable; ``json=True`` gives JSON lines for machines.

Every line about a job, in every process, names it with the same keys, where they apply:
``job_id``, ``assignment_id`` (the run), ``epoch`` (of the decision: the placement, the
declaration, the fenced end; on a worker, of the Assign that started the run) and ``worker_id``
(bound to every agent line), and on a worker ``incarnation``. A line about a batch (a placer
round, a heartbeat's outcomes, a dead worker's requeues, an Assign of several jobs) lists
``job_ids`` and ``assignment_ids`` (and ``worker_ids``) as parallel lists rather than logging one
line per job: a round of 500 placements costs one line on the hot path, and ``jq
'select(.job_id == 7 or (.job_ids // [] | index(7)))'`` finds both kinds.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterable
from typing import Any, TextIO, cast

import attrs
import structlog


def configure(*, json: bool = False, level: str = "INFO", **context: Any) -> None:
    """Set up structlog for this process, binding ``context`` (e.g. ``cp_id="cp-1"``) to every line."""
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _Stderr())),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**context)
    quiet_pool_floor_retries()


class _Stderr:
    """``sys.stderr`` as it is when a line is written, not as it was when :func:`configure` ran:
    a stream replaced since (pytest's capture of one test, closed after it) is not written to."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _DropPoolFloorRetries(logging.Filter):
    """Drops asyncpg's ``Failed to restore the pool connection floor; retrying`` warning (with
    its traceback), logged once per attempt while the database is away: the pool's owner logs
    the outage itself, once per change (:mod:`runtime.outage`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to restore the pool connection floor")


def quiet_pool_floor_retries() -> None:
    """Install :class:`_DropPoolFloorRetries` on asyncpg's pool logger (idempotent)."""
    pool_logger = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, _DropPoolFloorRetries) for f in pool_logger.filters):
        pool_logger.addFilter(_DropPoolFloorRetries())


def bind(**context: Any) -> None:
    """Bind ``context`` to every line the current task logs from now on, and the tasks it starts.

    trio runs each task in a copy of its parent's context, so a binding made in one task
    (e.g. ``worker_id`` in a fleet's per-worker task) reaches no sibling.
    """
    structlog.contextvars.bind_contextvars(**context)


def counted(ids_key: str, **batches: Iterable[Any]) -> dict[str, Any]:
    """The keys of a line about batches of ids: each batch's count under its name and its ids
    under ``<name>_<ids_key>``; ``counted("job_ids", released=[3, 4])`` is ``{"released": 2,
    "released_job_ids": [3, 4]}``."""
    keys: dict[str, Any] = {}
    for name, batch in batches.items():
        ids = list(batch)
        keys[name] = len(ids)
        keys[f"{name}_{ids_key}"] = ids
    return keys


def get(name: str) -> Any:
    """A logger that adds ``actor=name`` to every line."""
    return structlog.get_logger().bind(actor=name)


@attrs.define
class Tally:
    """Events worth a warning (a late wake, a long collection), counted between two lines so
    that at most one line is logged per interval: :meth:`add` each, then :meth:`take`."""

    count: int = 0
    worst: float = 0.0
    logged_at: float = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.worst = max(self.worst, value)

    def take(self, now: float, every_s: float) -> tuple[int, float] | None:
        """``(count, worst)`` since the last line, starting the count again, when some event
        was counted and the last line is at least ``every_s`` old at ``now``; else None."""
        if not self.count or now - self.logged_at < every_s:
            return None
        taken = (self.count, self.worst)
        self.count, self.worst, self.logged_at = 0, 0.0, now
        return taken

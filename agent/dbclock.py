"""The database's clock as one agent knows it: the times its ``agent.jsonl`` lines carry.

Every registration and heartbeat reply carries the database's ``now()``; with trio's clock one
such :class:`Reading` brackets the database's clock at any other instant, and
:class:`DatabaseClock` keeps the one that brackets the present most tightly (Cristian's
algorithm: F. Cristian, "Probabilistic clock synchronization", Distributed Computing 3(3),
1989). docs/design.md, "Times: one clock".
"""

from __future__ import annotations

import math
import time

import attrs
import trio

MAX_DRIFT = 500e-6
"""How far apart the rates of the agent's monotonic clock and the database's clock may be, as a
fraction: 500 ppm, the most the Linux kernel slews a clock to correct it (a free-running crystal
is within about 100 ppm). A reading's bracket widens by this much of the time since it."""


@attrs.frozen(kw_only=True)
class Reading:
    """The database's clock read once (Unix seconds), at some instant between the trio times
    ``sent_at`` and ``received_at`` of a request and its reply."""

    database_unix_s: float
    sent_at: float
    received_at: float

    def earliest(self, at: float) -> float:
        """The earliest the database's clock can read at trio time ``at``, Unix seconds."""
        gap = at - self.received_at
        return self.database_unix_s + gap - abs(gap) * MAX_DRIFT

    def latest(self, at: float) -> float:
        """The latest the database's clock can read at trio time ``at``, Unix seconds."""
        gap = at - self.sent_at
        return self.database_unix_s + gap + abs(gap) * MAX_DRIFT

    def width_s(self, at: float) -> float:
        """How wide its bracket is at trio time ``at``, seconds."""
        return self.latest(at) - self.earliest(at)


@attrs.define(kw_only=True)
class DatabaseClock:
    """The best :class:`Reading` of the database's clock so far, and times from it."""

    reading: Reading | None = None
    """The reading kept; None before any reply that told the database's time."""
    worker_clock: bool = False
    """True when a control plane answered without telling the database's time and none ever
    told it: times are the worker's wall clock (an older control plane)."""

    @property
    def known(self) -> bool:
        """Whether times can be told: a reply came (with the database's time, or without)."""
        return self.reading is not None or self.worker_clock

    def observe(self, database_unix_s: float | None, *, sent_at: float, received_at: float) -> bool:
        """Take the database's time a reply told (``database_unix_s``; None or 0: it told none)
        for a request sent at trio time ``sent_at`` and answered at ``received_at``; keep it
        when it brackets the present at least as tightly as the reading kept. Returns whether
        it was kept. No checkpoint."""
        if (
            not database_unix_s
            or not math.isfinite(database_unix_s)
            or database_unix_s < 0
            or received_at < sent_at
        ):
            if self.reading is None:
                self.worker_clock = True
            return False
        new = Reading(database_unix_s=database_unix_s, sent_at=sent_at, received_at=received_at)
        if self.reading is not None and new.width_s(received_at) > self.reading.width_s(received_at):
            return False
        self.reading = new
        self.worker_clock = False
        return True

    def earliest(self, at: float) -> float | None:
        """The earliest the database's clock can read at trio time ``at``, Unix seconds (the
        worker's wall clock then, in :attr:`worker_clock` mode); None while not :attr:`known`."""
        if self.reading is not None:
            return self.reading.earliest(at)
        return _wall_clock(at) if self.worker_clock else None

    def latest(self, at: float) -> float | None:
        """The latest the database's clock can read at trio time ``at``, as :meth:`earliest`."""
        if self.reading is not None:
            return self.reading.latest(at)
        return _wall_clock(at) if self.worker_clock else None


def _wall_clock(at: float) -> float:
    """Trio time ``at`` on this machine's wall clock: only for a control plane that tells no
    database time (the lines written then say ``"clock": "worker"``)."""
    return time.time() + (at - trio.current_time())

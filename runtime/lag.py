"""Event-loop lag: how late a trio loop wakes a task that asked to wake at a given time.

One :class:`LoopLag` per trio loop records it as a histogram, a warning line,
:attr:`LoopLag.recent_max_s` and :attr:`LoopLag.last_wake_monotonic`. Why and how:
docs/design.md, "Event-loop lag".
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import attrs
import trio

from runtime import log, metrics


@attrs.define(eq=False, kw_only=True)
class LoopLag:
    """The lag monitor of one trio loop. Run :meth:`run` as a task of that loop.

    Args:
        loop: the loop's name in metrics and logs (``main``, ``ingest``, ``lease``, ``agent``).
        interval_s: time between two wakes, in seconds.
        warn_after_s: a wake later than this, in seconds, is logged.
        window_s: :attr:`recent_max_s` covers this many seconds.
        log_every_s: at most one warning line per this many seconds.
    """

    loop: str
    interval_s: float = 0.1
    warn_after_s: float = 0.25
    window_s: float = 1.0
    log_every_s: float = 5.0
    last_wake_monotonic: float = attrs.field(factory=time.monotonic)
    """``time.monotonic()`` at the monitor's last wake (readable from any thread)."""
    _recent: deque[tuple[float, float]] = attrs.field(factory=deque)
    """(trio time of the wake, lag in s) of the wakes within ``window_s``."""
    _late: log.Tally = attrs.field(factory=log.Tally)
    _log: Any = attrs.field(factory=lambda: log.get("loop_lag"))

    @property
    def recent_max_s(self) -> float:
        """The worst lag of the wakes in the last ``window_s`` seconds, in seconds (0 if none)."""
        return max((lag for _, lag in self._recent), default=0.0)

    def observe(self, due: float, woke: float) -> float:
        """Record one wake at trio time ``woke`` of a sleep due at ``due``; returns the lag (s)."""
        lag = max(0.0, woke - due)
        self.last_wake_monotonic = time.monotonic()
        self._recent.append((woke, lag))
        while self._recent and self._recent[0][0] < woke - self.window_s:
            self._recent.popleft()
        metrics.EVENT_LOOP_LAG_SECONDS.labels(self.loop).observe(lag)
        if lag > self.warn_after_s:
            self._late.add(lag)
            if late := self._late.take(woke, self.log_every_s):
                self._log.warning(
                    "event loop lagging",
                    loop=self.loop,
                    lag_s=round(lag, 3),
                    late_wakes=late[0],
                    worst_lag_s=round(late[1], 3),
                    warn_after_s=self.warn_after_s,
                )
        return lag

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Wake every ``interval_s`` and record the lag, until cancelled."""
        task_status.started()
        due = trio.current_time() + self.interval_s
        while True:
            await trio.sleep_until(due)
            woke = trio.current_time()
            self.observe(due, woke)
            due = woke + self.interval_s  # after a stall: from now, not the missed wakes

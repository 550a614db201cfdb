"""Event-loop lag: how late a trio loop wakes a task that asked to wake at a given time.

Every Stockade process runs one :class:`LoopLag` per trio loop (a control plane has three: its
main loop, its ingest's and its lease keeper's; an agent or a fleet has one). The monitor sleeps
until a deadline every ``interval_s`` and records by how much it woke late: that is how long
any other task of the loop that became ready at the same moment waited too (a long computation
between two checkpoints, a burst of ready tasks, or the process waiting for a CPU). The lag is

- a Prometheus histogram, ``stockade_event_loop_lag_seconds{loop=...}``;
- a warning log line when one wake is later than ``warn_after_s`` (at most one line every
  ``log_every_s``, carrying how many late wakes and the worst since the previous line);
- :attr:`LoopLag.recent_max_s`, the worst lag of the last ``window_s`` seconds, which a control
  plane's ingest uses to shed new work before its heartbeat answers slow down;
- :attr:`LoopLag.last_wake_monotonic`, the ``time.monotonic()`` of the last wake, which another
  thread may read (a float attribute: reads and writes are atomic under the GIL) to tell a
  loop that is merely slow from one that has stopped.

Measuring with a sleeping task is the method of Node.js's ``monitorEventLoopDelay`` and of
asyncio's debug mode (``slow_callback_duration``): the delay between a timer's due time and
its callback.
"""

from __future__ import annotations

import math
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
    _late_since_log: int = 0
    _worst_since_log_s: float = 0.0
    _logged_at: float = -math.inf
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
            self._late_since_log += 1
            self._worst_since_log_s = max(self._worst_since_log_s, lag)
            if woke - self._logged_at >= self.log_every_s:
                self._log.warning(
                    "event loop lagging",
                    loop=self.loop,
                    lag_s=round(lag, 3),
                    late_wakes=self._late_since_log,
                    worst_lag_s=round(self._worst_since_log_s, 3),
                    warn_after_s=self.warn_after_s,
                )
                self._logged_at = woke
                self._late_since_log = 0
                self._worst_since_log_s = 0.0
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

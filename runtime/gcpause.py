"""Garbage-collector pauses: how long each of the interpreter's collections held every thread.

:class:`GcPauses` times every collection (``gc.callbacks``) and reports them
(``stockade_gc_pause_seconds``, a warning past ``warn_after_s``), and may freeze what survived
each full collection; :func:`collect_less_often` raises the young generation's threshold. Why
and how: docs/design.md, "Garbage-collector pauses".
"""

from __future__ import annotations

import gc
import time
from collections import deque
from typing import Any

import attrs
import trio

from runtime import log, metrics


@attrs.define(eq=False, kw_only=True)
class GcPauses:
    """The collection monitor of one process: :meth:`run` on one loop (or :meth:`install`,
    :meth:`drain` and :meth:`uninstall`, or use it as a context manager).

    Args:
        interval_s: how often the timed collections are recorded, in seconds.
        warn_after_s: a collection longer than this, in seconds, is logged.
        log_every_s: at most one warning line per this many seconds.
        freeze_survivors: after every full collection, ``gc.freeze()`` what survived it, so
            that the next one scans only what was promoted since.
        thaw_every_s: with ``freeze_survivors``, ``gc.unfreeze()`` this often, in seconds, so
            that what became cyclic garbage after it was frozen is freed.
    """

    interval_s: float = 1.0
    warn_after_s: float = 0.1
    log_every_s: float = 5.0
    freeze_survivors: bool = False
    thaw_every_s: float = 3600.0
    _started_at: float | None = None
    _done: deque[tuple[int, float]] = attrs.field(factory=lambda: deque(maxlen=10_000))
    _long: log.Tally = attrs.field(factory=log.Tally)
    _frozen_objects: int = 0
    """The permanent generation's size, read after each full collection only: counting it
    walks every frozen object, with every thread held."""
    _log: Any = attrs.field(factory=lambda: log.get("gc"))

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Called by the interpreter around every collection: no lock, no logging, no metric.
        if phase == "start":
            self._started_at = time.perf_counter()
        elif self._started_at is not None:
            generation = int(info.get("generation", -1))
            self._done.append((generation, time.perf_counter() - self._started_at))
            self._started_at = None
            if self.freeze_survivors and generation == 2:
                # Every tracked object is a survivor of the collection that just ended (a full
                # one collects every generation), so this freezes nothing that is garbage now.
                gc.freeze()

    def install(self) -> None:
        """Start timing collections (idempotent)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop timing collections (idempotent)."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def __enter__(self) -> GcPauses:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def drain(self, now: float) -> list[tuple[int, float]]:
        """Record the collections timed since the last call, at trio time ``now``: the metric,
        and a warning line for long ones (rate-limited). Returns them as (generation, s)."""
        done = [self._done.popleft() for _ in range(len(self._done))]
        for generation, pause_s in done:
            metrics.GC_PAUSE_SECONDS.labels(str(generation)).observe(pause_s)
            if pause_s > self.warn_after_s:
                self._long.add(pause_s)
        if any(generation == 2 for generation, _ in done):
            self._frozen_objects = gc.get_freeze_count()
            metrics.GC_FROZEN_OBJECTS.set(self._frozen_objects)
        if long := self._long.take(now, self.log_every_s):
            self._log.warning(
                "garbage collection paused every thread",
                long_collections=long[0],
                longest_s=round(long[1], 3),
                warn_after_s=self.warn_after_s,
                tracked_objects=gc.get_count(),
                frozen_objects=self._frozen_objects,
            )
        return done

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Install the hook, record every ``interval_s`` until cancelled, then uninstall it."""
        self.install()
        self._frozen_objects = gc.get_freeze_count()
        metrics.GC_FROZEN_OBJECTS.set(self._frozen_objects)
        task_status.started()
        thawed_at = trio.current_time()
        try:
            while True:
                await trio.sleep(self.interval_s)
                now = trio.current_time()
                self.drain(now)
                if self.freeze_survivors and now - thawed_at >= self.thaw_every_s:
                    self._log.info(
                        "frozen objects given back to the collector", frozen_objects=self._frozen_objects
                    )
                    gc.unfreeze()
                    self._frozen_objects = 0
                    metrics.GC_FROZEN_OBJECTS.set(0)
                    thawed_at = now
        finally:
            self.uninstall()


YOUNG_THRESHOLD = 10_000
"""Allocations (less deallocations) between two collections of the youngest generation, for a
process with a large heap (CPython's default is 700); see :func:`collect_less_often`."""
MIDDLE_THRESHOLD = 10
"""Youngest-generation collections between two of the middle one (CPython's default)."""


def collect_less_often() -> tuple[int, int, int]:
    """Collect the youngest generation every :data:`YOUNG_THRESHOLD` allocations instead of 700,
    and return the thresholds in force.

    Why: CPython 3.11 runs a full collection once the objects promoted to the oldest generation
    since the last one exceed a quarter of it, and a full collection scans every tracked object.
    An object is promoted when it survives two young collections; at 700 allocations apiece, a
    control plane's short-lived objects (a round's rows and workers, a call's messages, alive
    for a few milliseconds) survived them and were promoted by the hundred thousand a second,
    so with a 2,000-worker cluster the leader ran a full collection over its million-object
    heap every 5 to 6 s, each holding every thread for 0.6 to 1.1 s (measured with
    :class:`GcPauses`; long enough to lose the lease). With a young generation 14 times larger
    most of them are freed by their reference counts before a collection can promote them.
    Larger is worse: at 50,000 a young collection itself held a loaded leader for 0.1 to 0.5 s.
    """
    _, _, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, oldest)
    return gc.get_threshold()

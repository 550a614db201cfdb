"""The heartbeat interval the cluster asks of its workers, and the dead_after that goes with it.

The leader chooses both (:func:`choose_policy`, a pure function of the cluster's size, the
measured cost of a heartbeat and the heartbeats' waits) and writes them in a fenced write; every
control plane tells them to the workers. docs/design.md, "Heartbeat interval".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TypedDict

import attrs

from runtime.settings.leader import ReconcilerSettings

STEP_MS = 50
"""Intervals are whole multiples of this (ms), so small changes in the measured cost do not
turn into a stream of new intervals."""

MAX_SENT_US = 2**63 - 1
"""A heartbeat's ``sent_monotonic_us`` is recorded as at most this (a bigint)."""
MAX_DEAD_AFTER_MS = 2**31 - 1
"""A heartbeat's ``dead_after_in_use_ms`` is recorded as at most this (an integer)."""

UNMEASURED_COST_US = 4000.0
"""The CPU time one heartbeat is taken to cost a control plane (µs) until the replicas measured
it: about what one cost on a 2-core machine with mutual TLS (docs/scale.md)."""
HYSTERESIS = 0.1
"""A new interval is taken only when it differs from the one in force by more than this
fraction of it (or the one in force is outside the bounds). Small: the stabilization window
(:data:`SHRINK_AFTER_S`) damps the noise already, and a quarter held a stale interval for a
whole 10-minute run (docs/design.md, "Heartbeat interval")."""
WAIT_INTERVALS = 1.0
"""The interval is at least this many times the 99th percentile of the heartbeats' waits."""
SHRINK_AFTER_S = 30.0
"""The interval is at least the longest one wanted over this many seconds (the leader's
choices in its term)."""
MAX_WAITED_MS = 600_000
"""A heartbeat's ``waited_ms`` is counted as at most this."""
OUTLIER_WAITS = 3
"""The waits of this many workers, those that waited longest, never set a replica's percentile:
a frozen, cut-off or starved worker reports long waits of its own making, and in a small
cluster the 99th percentile is the largest."""


class Measured(TypedDict):
    """What the rule is given of the cluster (:func:`choose_policy`'s arguments of the same names)."""

    workers: int
    costs_us: Sequence[float]
    waits_ms: Sequence[float]
    replicas: int


@attrs.frozen(kw_only=True)
class HeartbeatPolicy:
    """What the cluster tells workers: the heartbeat interval and the dead_after (both ms)."""

    interval_ms: int
    dead_after_ms: int
    workers: int = 0
    """Alive workers when it was chosen."""
    cpu_per_heartbeat_us: float | None = None
    """The measured CPU time one heartbeat costs a control plane (µs), None: not measured."""
    reason: str = ""


def dead_after_ms_for(interval_ms: int, settings: ReconcilerSettings) -> int:
    """The dead_after (ms) that goes with ``interval_ms``:
    ``max(dead_after_s, interval * dead_after_intervals)``, rounded up to a whole ms."""
    return max(
        math.ceil(settings.dead_after_s * 1000 - 1e-6),
        math.ceil(interval_ms * settings.dead_after_intervals - 1e-6),
    )


def default_policy(settings: ReconcilerSettings) -> HeartbeatPolicy:
    """The policy before the leader chose one: the shortest interval and its dead_after."""
    interval_ms = _whole_steps(settings.heartbeat_interval_min_s * 1000)
    return HeartbeatPolicy(
        interval_ms=interval_ms,
        dead_after_ms=dead_after_ms_for(interval_ms, settings),
        reason="the control planes' settings",
    )


def _whole_steps(ms: float) -> int:
    """``ms`` rounded up to a whole :data:`STEP_MS`, at least one step."""
    return max(STEP_MS, math.ceil(ms / STEP_MS - 1e-9) * STEP_MS)


def _bounds_ms(settings: ReconcilerSettings) -> tuple[int, int]:
    """The operator's bounds of the interval in whole steps (ms): the shortest and the longest."""
    low_ms = _whole_steps(settings.heartbeat_interval_min_s * 1000)
    return low_ms, max(low_ms, math.floor(settings.heartbeat_interval_max_s * 1000 / STEP_MS) * STEP_MS)


def _wanted(
    workers: int,
    costs_us: Sequence[float],
    waits_ms: Sequence[float],
    settings: ReconcilerSettings,
    replicas: int = 0,
) -> tuple[int, float | None, str]:
    """The interval the rule wants (ms, within the bounds), the cost it used (None: none was
    measured, the default stood in), and why. The heartbeats are shared by ``replicas`` (the
    live control planes) or by those that measured a cost, whichever are more; by one while
    none has (a registration storm is not spread on a guess)."""
    low_ms, high_ms = _bounds_ms(settings)
    measured = sorted(c for c in costs_us if math.isfinite(c) and c > 0)
    replicas = max(1, len(measured), replicas if measured else 0)
    cost_us = measured[len(measured) // 2] if measured else None
    wanted_ms = workers * (cost_us or UNMEASURED_COST_US) / 1000 / (replicas * settings.heartbeat_cpu_budget)
    why = (
        f"{workers} workers x {cost_us or UNMEASURED_COST_US:.0f} us per heartbeat"
        f"{'' if cost_us else ' (not measured yet: the default)'} over {replicas} control planes"
        f" at {settings.heartbeat_cpu_budget:g} of a core"
    )
    wait_ms = max((w for w in waits_ms if math.isfinite(w) and w > 0), default=0.0)
    if wait_ms * WAIT_INTERVALS > wanted_ms:
        wanted_ms = wait_ms * WAIT_INTERVALS
        why = f"heartbeats waited up to {wait_ms:.0f} ms for their answers (99th percentile; {why})"
    interval_ms = min(high_ms, _whole_steps(max(wanted_ms, low_ms)))
    if interval_ms == high_ms and wanted_ms > high_ms:
        why += f": capped at heartbeat_interval_max_s = {settings.heartbeat_interval_max_s:g}"
    return interval_ms, cost_us, why


def wanted_interval_ms(
    *,
    workers: int,
    costs_us: Sequence[float],
    waits_ms: Sequence[float] = (),
    settings: ReconcilerSettings,
    replicas: int = 0,
) -> int | None:
    """The interval (ms) the rule wants now, within the bounds, before the stabilization window
    and :data:`HYSTERESIS` (what :class:`LongestWithin` keeps); the arguments as
    :func:`choose_policy`'s. None while no replica has measured a cost (a guess is not to be held
    for :data:`SHRINK_AFTER_S`)."""
    interval_ms, cost_us, _ = _wanted(workers, costs_us, waits_ms, settings, replicas)
    return None if cost_us is None else interval_ms


def choose_policy(
    *,
    workers: int,
    costs_us: Sequence[float],
    current: HeartbeatPolicy | None,
    settings: ReconcilerSettings,
    waits_ms: Sequence[float] = (),
    floor_ms: int = 0,
    replicas: int = 0,
) -> HeartbeatPolicy:
    """The heartbeat policy for ``workers`` alive workers (see the module's rule).

    Args:
        workers: alive workers (>= 0).
        costs_us: the CPU time one heartbeat costs each live control plane (µs; non-positive or
            non-finite entries ignored): their median is the cost, their count the replicas.
        current: the policy in force (None: none was chosen yet).
        settings: the ``heartbeat_interval_*``, ``heartbeat_cpu_budget`` and ``dead_after_*``.
        waits_ms: each live control plane's 99th percentile of the heartbeats' waits (ms); the
            interval is at least :data:`WAIT_INTERVALS` times the largest.
        floor_ms: the interval is at least this (ms, within the bounds; :class:`LongestWithin`).
        replicas: the live control planes, measured or not: once one measured a cost, the
            heartbeats are taken as spread over these (a replica that has not measured yet
            still takes its share).

    Returns:
        ``current`` itself when the new interval is within :data:`HYSTERESIS` of it and within
        the bounds, else the new policy.
    """
    low_ms, high_ms = _bounds_ms(settings)
    interval_ms, cost_us, why = _wanted(workers, costs_us, waits_ms, settings, replicas)
    held_ms = min(high_ms, _whole_steps(floor_ms)) if floor_ms > 0 else 0
    if held_ms > interval_ms:
        interval_ms = held_ms
        why += f": held at {held_ms} ms, the longest wanted in the last {SHRINK_AFTER_S:g} s"
    if (
        current is not None
        and low_ms <= current.interval_ms <= high_ms
        and abs(interval_ms - current.interval_ms) <= HYSTERESIS * current.interval_ms
        and current.dead_after_ms == dead_after_ms_for(current.interval_ms, settings)
    ):
        return current
    return HeartbeatPolicy(
        interval_ms=interval_ms,
        dead_after_ms=dead_after_ms_for(interval_ms, settings),
        workers=workers,
        cpu_per_heartbeat_us=cost_us,
        reason=why,
    )


@attrs.define
class LongestWithin:
    """The largest value added within the last ``window_s`` seconds: the interval the leader may
    shrink to (:data:`SHRINK_AFTER_S`)."""

    window_s: float = SHRINK_AFTER_S
    _values: deque[tuple[float, int]] = attrs.field(factory=deque)

    def add(self, now: float, value: int) -> int:
        """Add ``value`` at time ``now`` (s, any clock that only moves on); returns the largest
        value added within the window, this one included."""
        while self._values and self._values[0][0] <= now - self.window_s:
            self._values.popleft()
        # Only values larger than every later one can ever be the largest: the deque stays
        # decreasing, and its first entry is the answer.
        while self._values and self._values[-1][1] <= value:
            self._values.pop()
        self._values.append((now, value))
        return self._values[0][1]


@attrs.define
class _WorkerWaits:
    """One worker's reported waits: its largest within the window and its latest (ms), and when
    each was reported (s). Updated in place: one per heartbeat."""

    largest_at: float
    largest_ms: int
    latest_at: float
    latest_ms: int


@attrs.define
class HeartbeatWaits:
    """How long the heartbeats a replica recorded had waited for their answers, as their workers
    report it (``HeartbeatRequest.waited_ms``), over the last ``window_s`` seconds, counted per
    worker (docs/design.md, "Heartbeat interval"): each worker's largest wait within the window
    (its latest once that largest is older) is one value; fewer than ``min_workers``: none.
    """

    window_s: float = 10.0
    min_workers: int = 10
    _by_worker: dict[str, _WorkerWaits] = attrs.field(factory=dict)

    def add(self, now: float, worker_id: str, waited_ms: int) -> None:
        """Count a wait (ms; 0: not said, ignored) that ``worker_id`` reported at ``now`` (s,
        trio time)."""
        if waited_ms <= 0:
            return
        ms = min(waited_ms, MAX_WAITED_MS)
        held = self._by_worker.get(worker_id)
        if held is None:
            self._by_worker[worker_id] = _WorkerWaits(
                largest_at=now, largest_ms=ms, latest_at=now, latest_ms=ms
            )
            return
        if ms >= held.largest_ms or held.largest_at <= now - self.window_s:
            held.largest_at, held.largest_ms = now, ms
        held.latest_at, held.latest_ms = now, ms

    def p99_ms(self, now: float) -> float | None:
        """The 99th percentile (nearest rank) over the workers that reported within the window
        of each one's wait (ms), and never one of the :data:`OUTLIER_WAITS` largest; None when
        fewer than ``min_workers`` reported."""
        since = now - self.window_s
        for worker_id in [w for w, h in self._by_worker.items() if h.latest_at <= since]:
            del self._by_worker[worker_id]
        if len(self._by_worker) < self.min_workers:
            return None
        values = sorted(
            h.largest_ms if h.largest_at > since else h.latest_ms for h in self._by_worker.values()
        )
        return float(values[min(math.ceil(0.99 * len(values)), len(values) - OUTLIER_WAITS) - 1])


@attrs.define
class HeartbeatCost:
    """What one heartbeat costs a control plane's ingest, in CPU µs: the ingest thread's CPU
    time per heartbeat recorded between two :meth:`measure` calls, exponentially smoothed with
    ``weight`` (it errs high: all the thread's work is charged). A span of fewer than
    ``min_heartbeats`` is added to the next."""

    min_heartbeats: int = 50
    weight: float = 0.3
    cost_us: float | None = None
    _cpu_s: float | None = None
    _heartbeats: int = 0

    def measure(self, cpu_s: float, heartbeats: int) -> float | None:
        """Account for the thread's CPU time ``cpu_s`` (seconds) and the heartbeats recorded so
        far, ``heartbeats``; returns the smoothed cost (µs), None before one was measured."""
        if self._cpu_s is None:
            self._cpu_s, self._heartbeats = cpu_s, heartbeats
            return self.cost_us
        count = heartbeats - self._heartbeats
        if count < self.min_heartbeats:
            return self.cost_us
        span_us = (cpu_s - self._cpu_s) * 1e6 / count
        self._cpu_s, self._heartbeats = cpu_s, heartbeats
        self.cost_us = (
            span_us if self.cost_us is None else (1 - self.weight) * self.cost_us + self.weight * span_us
        )
        return self.cost_us

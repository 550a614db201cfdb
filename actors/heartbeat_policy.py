"""The heartbeat interval the cluster asks of its workers, and the dead_after that goes with it.

The leader chooses both (:func:`choose_policy`, a pure function of the cluster's size and the
measured cost of a heartbeat) and writes them in a fenced write (the ``heartbeat_policy`` row);
every control plane tells them to the workers in its replies, read in the statement that
records the heartbeat. Why the self-fence still holds when they change is argued in
docs/design.md, "Heartbeat interval".

The rule follows Nomad's heartbeat TTL (``nomad/heartbeat.go``: the TTL grows with the number of
nodes so that the servers receive about ``max_heartbeats_per_second``), with the rate taken
from what a heartbeat measurably costs rather than from a constant::

    interval = clamp(workers * cpu_per_heartbeat / (replicas * cpu_budget),
                     interval_min, interval_max)
    dead_after = max(dead_after_s, interval * dead_after_intervals)

So the heartbeats take at most ``heartbeat_cpu_budget`` of a core per replica while the
interval stays within the operator's bounds, and a dead worker is noticed ``dead_after_intervals``
intervals after its last heartbeat, never sooner than the operator's ``dead_after_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from runtime.settings import ReconcilerSettings

STEP_MS = 50
"""Intervals are whole multiples of this (ms), so small changes in the measured cost do not
turn into a stream of new intervals."""

MAX_SENT_US = 2**63 - 1
"""A heartbeat's ``sent_monotonic_us`` is recorded as at most this (a bigint)."""
MAX_DEAD_AFTER_MS = 2**31 - 1
"""A heartbeat's ``dead_after_in_use_ms`` is recorded as at most this (an integer)."""

UNMEASURED_COST_US = 4000.0
"""The CPU time one heartbeat is taken to cost a control plane (µs) until the replicas measured
it: about what one cost on a 2-core machine with mutual TLS (docs/scale.md), so a cluster that
starts with hundreds of workers gets a long enough interval before any cost is measured,
rather than the shortest one."""
HYSTERESIS = 0.25
"""A new interval is taken only when it differs from the one in force by more than this
fraction of it (or when the one in force is outside the bounds)."""


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


def choose_policy(
    *,
    workers: int,
    costs_us: Sequence[float],
    current: HeartbeatPolicy | None,
    settings: ReconcilerSettings,
) -> HeartbeatPolicy:
    """The heartbeat policy for ``workers`` alive workers (see the module's rule).

    Args:
        workers: alive workers (>= 0).
        costs_us: the CPU time one heartbeat costs each live control plane (µs, as each
            measured it; non-positive or non-finite entries are ignored). Their median is the
            cost; their count the replicas sharing the heartbeats (at least one).
        current: the policy in force (None: none was chosen yet).
        settings: ``heartbeat_interval_min_s``, ``heartbeat_interval_max_s``,
            ``heartbeat_cpu_budget``, ``dead_after_s``, ``dead_after_intervals``.

    Returns:
        ``current`` itself when the new interval is within :data:`HYSTERESIS` of it and within
        the bounds, else the new policy.
    """
    low_ms = _whole_steps(settings.heartbeat_interval_min_s * 1000)
    high_ms = max(low_ms, math.floor(settings.heartbeat_interval_max_s * 1000 / STEP_MS) * STEP_MS)
    measured = sorted(c for c in costs_us if math.isfinite(c) and c > 0)
    replicas = max(1, len(measured))
    cost_us = measured[len(measured) // 2] if measured else None
    wanted_ms = workers * (cost_us or UNMEASURED_COST_US) / 1000 / (replicas * settings.heartbeat_cpu_budget)
    why = (
        f"{workers} workers x {cost_us or UNMEASURED_COST_US:.0f} us per heartbeat"
        f"{'' if cost_us else ' (not measured yet: the default)'} over {replicas} control planes"
        f" at {settings.heartbeat_cpu_budget:g} of a core"
    )
    interval_ms = min(high_ms, _whole_steps(max(wanted_ms, low_ms)))
    if interval_ms == high_ms and wanted_ms > high_ms:
        why += f": capped at heartbeat_interval_max_s = {settings.heartbeat_interval_max_s:g}"
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
class HeartbeatCost:
    """What one heartbeat costs a control plane's ingest, in CPU µs: the CPU time of the ingest's
    thread (everything it served) per heartbeat recorded, over the time between two
    :meth:`measure` calls, smoothed. All of the thread's work is charged to the heartbeats, so
    the cost errs high, and the interval chosen from it errs long.

    Args:
        min_heartbeats: a span with fewer heartbeats than this is not measured (it is added to
            the next).
        weight: the new span's weight in the smoothed value (exponential smoothing).
    """

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

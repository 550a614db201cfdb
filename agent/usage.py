"""What running command jobs use, measured from their cgroups every ``usage_interval_s`` and carried
by the next heartbeat (docs/console.md, "Usage"): :func:`read_usage` reads the counters (blocking),
:class:`UsageMeter` turns two readings into :class:`UsageSample` values (CPU averaged over the span
between them, memory as held at the second).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import attrs
import trio

from agent.messages import WORKER_TOTAL, UsageSample
from agent.resources import JobResources, JobUsage
from runtime.loops import Periodic

MAX_SAMPLE_VALUE = 2**31 - 1
"""The largest ``cpu_millis``, ``memory_mb`` or ``span_ms`` a sample carries (the database's
``integer``); a larger measure is carried as this."""


def read_usage(
    resources: JobResources, names: Mapping[int, str]
) -> tuple[dict[int, JobUsage], dict[int, float]]:
    """The counters of the jobs' cgroups named in ``names`` (assignment id -> cgroup name) and,
    under :data:`WORKER_TOTAL`, of all the worker's jobs (a job whose cgroup is gone is left
    out), and when each was read: the middle of its own reads, on the monotonic clock (seconds).
    Blocking (file reads): run it in a thread. Each time is taken here, beside its reads, not
    when the thread's result reaches the event loop, nor once for all: on a busy machine a
    thread waits for a core between two reads, and a tenth of a second is a fiftieth of a 5 s
    span."""
    readings: dict[int, JobUsage] = {}
    read_at_s: dict[int, float] = {}

    def read(assignment_id: int, usage: Callable[[], JobUsage]) -> None:
        began = time.monotonic()
        readings[assignment_id] = usage()
        read_at_s[assignment_id] = (began + time.monotonic()) / 2

    read(WORKER_TOTAL, resources.jobs_usage)
    for assignment_id, name in names.items():
        confined = resources.find(name)
        if confined is not None:
            read(assignment_id, confined.usage)
    return readings, read_at_s


def _capped(value: float) -> int:
    return min(MAX_SAMPLE_VALUE, max(0, round(value)))


@attrs.define
class UsageMeter:
    """Turns successive readings of cgroup counters into samples: the first reading of a job
    only sets its baseline, each later one gives the CPU used since the one before."""

    _last: dict[int, tuple[float, float]] = attrs.field(factory=dict)
    """Assignment id -> (time in seconds, CPU seconds counted) of its previous reading."""

    def samples(
        self, readings: Mapping[int, JobUsage], at_s: float | Mapping[int, float]
    ) -> tuple[UsageSample, ...]:
        """The samples of ``readings`` (assignment id -> counters) taken at ``at_s`` (seconds,
        any monotonic clock: one time for all, or each id's own, as :func:`read_usage` gives),
        in the order of ``readings``: one for each id read before at an earlier time with a CPU
        count then and now. A counter that went back (a cgroup made anew) starts a new baseline;
        ids not in ``readings`` are forgotten."""
        out: list[UsageSample] = []
        last: dict[int, tuple[float, float]] = {}
        for assignment_id, usage in readings.items():
            if usage.cpu_s is None:
                continue
            read_at_s = at_s if isinstance(at_s, float | int) else at_s[assignment_id]
            last[assignment_id] = (read_at_s, usage.cpu_s)
            before = self._last.get(assignment_id)
            if before is None or read_at_s <= before[0] or usage.cpu_s < before[1]:
                continue
            span_s = read_at_s - before[0]
            out.append(
                UsageSample(
                    assignment_id=assignment_id,
                    cpu_millis=_capped((usage.cpu_s - before[1]) / span_s * 1000),
                    memory_mb=_capped((usage.memory_bytes or 0) / 2**20),
                    span_ms=_capped(span_s * 1000),
                )
            )
        self._last = last
        return tuple(out)


@attrs.define
class UsageReporter:
    """Measures a worker's running command jobs every ``interval_s`` and keeps the newest samples
    for the next heartbeat (:meth:`take`); a sample a heartbeat that failed carried is not sent
    again (the next measure follows soon)."""

    resources: JobResources
    interval_s: float
    """Seconds between measures (``usage_interval_s``)."""
    cgroup_names: Callable[[], Mapping[int, str]]
    """The running command jobs' cgroups: assignment id -> cgroup name."""
    meter: UsageMeter = attrs.field(factory=UsageMeter)
    _pending: tuple[UsageSample, ...] = ()

    def take(self) -> tuple[UsageSample, ...]:
        """The samples measured since the last call (none most of the time)."""
        taken, self._pending = self._pending, ()
        return taken

    async def run(self) -> None:
        """Measure every ``interval_s`` until cancelled (the first measure sets the baselines)."""
        ticks = Periodic(self.interval_s, last_at=trio.current_time())
        while True:
            names = dict(self.cgroup_names())
            readings, read_at_s = await trio.to_thread.run_sync(read_usage, self.resources, names)
            self._pending = self.meter.samples(readings, read_at_s)
            await ticks.tick()

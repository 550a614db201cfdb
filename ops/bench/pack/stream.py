"""The job stream of ``stockade bench pack``: seeded job draws, their arrivals over time, the
makespan's lower bound.

The job stream (:func:`job_stream`): seeded; 55 % small jobs (250-1000 cpu_millis with 1, 2 or 3
GiB per core), 20 % CPU-heavy (2000-4000 cpu_millis, 1024-2048 MiB), 20 % memory-heavy
(500-1000 cpu_millis, 4096-8192 MiB), 5 % large (6000-8000 cpu_millis, 12288-16384 MiB);
durations log-normal with a median of 6 s and sigma 0.6, clipped to 1-30 s. Workers alternate
16000/32768 and 8000/16384 (cpu_millis/memory_mb). Weighted by duration the stream asks about
2.03 MiB per millicore and the workers offer 2.048, so both resources can be nearly full at
once, and the mix of CPU-heavy and memory-heavy shapes makes a worker's leftover room matter.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import attrs
import trio

WORKER_SHAPES = ((16000, 32768), (8000, 16384))


@attrs.frozen(kw_only=True)
class JobDraw:
    """One job of the stream."""

    cpu_millis: int
    memory_mb: int
    duration_s: float


def job_stream(count: int, seed: int) -> list[JobDraw]:
    """The seeded job stream described in the module docstring."""
    rng = random.Random(seed)
    jobs = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.55:  # small, 1-3 GiB per core
            cpu = rng.choice((250, 500, 750, 1000))
            mem = cpu * rng.choice((1024, 2048, 3072)) // 1000
        elif kind < 0.75:  # CPU-heavy
            cpu, mem = rng.choice((2000, 3000, 4000)), rng.choice((1024, 2048))
        elif kind < 0.95:  # memory-heavy
            cpu, mem = rng.choice((500, 1000)), rng.choice((4096, 6144, 8192))
        else:  # large
            cpu, mem = rng.choice((6000, 8000)), rng.choice((12288, 16384))
        duration = min(30.0, max(1.0, rng.lognormvariate(math.log(6.0), 0.6)))
        jobs.append(JobDraw(cpu_millis=cpu, memory_mb=mem, duration_s=round(duration, 3)))
    return jobs


def arrival_times(count: int, rate_per_s: float, seed: int) -> list[float]:
    """Seconds after the first submit at which each of ``count`` jobs arrives: a Poisson process.

    Job 0 arrives at 0.0; each later gap is exponential with mean ``1 / rate_per_s``, drawn from
    a ``random.Random("arrivals:{seed}")``: independent of :func:`job_stream`'s draws.

    Returns:
        ``count`` non-decreasing times in seconds, the first 0.0.

    Raises:
        ValueError: ``count`` < 0 or ``rate_per_s`` <= 0.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    rng = random.Random(f"arrivals:{seed}")
    times = []
    now_s = 0.0
    for i in range(count):
        if i:
            now_s += rng.expovariate(rate_per_s)
        times.append(now_s)
    return times


def lower_bound_s(jobs: Sequence[JobDraw], workers: int, arrivals_s: Sequence[float] | None = None) -> float:
    """The makespan no schedule can beat: max(total cpu x s / total cpu, same for memory,
    longest job, and, given ``arrivals_s`` (seconds, one per job), the latest arrival plus
    duration)."""
    shapes = [WORKER_SHAPES[i % len(WORKER_SHAPES)] for i in range(workers)]
    total_cpu = sum(s[0] for s in shapes)
    total_mem = sum(s[1] for s in shapes)
    cpu_work = sum(j.cpu_millis * j.duration_s for j in jobs)
    mem_work = sum(j.memory_mb * j.duration_s for j in jobs)
    bound = max(cpu_work / total_cpu, mem_work / total_mem, max(j.duration_s for j in jobs))
    if arrivals_s is not None:
        bound = max(bound, max(a + j.duration_s for a, j in zip(arrivals_s, jobs, strict=True)))
    return bound


T = TypeVar("T")


async def submit_arriving(
    submit: Callable[[Sequence[T]], Awaitable[None]],
    items: Sequence[T],
    arrivals_s: Sequence[float],
    *,
    started: float,
    batch_interval_s: float,
) -> None:
    """Submit each item once its arrival time has come, in batches, in order.

    Wakes at ``started``, then every ``batch_interval_s`` (or at the next arrival, if later).

    Args:
        submit: awaits the submission of one batch (a non-empty slice of ``items``).
        items: what to submit, in arrival order.
        arrivals_s: seconds after ``started`` at which each item arrives, non-decreasing.
        started: time 0, on trio's clock (``trio.current_time()``).
        batch_interval_s: seconds between batches, > 0.
    """
    sent = 0
    next_at = started
    while sent < len(items):
        await trio.sleep_until(next_at)
        now = trio.current_time()
        due = bisect.bisect_right(arrivals_s, now - started, lo=sent)
        if due > sent:
            await submit(items[sent:due])
            sent = due
        if sent < len(items):
            next_at = max(now + batch_interval_s, started + arrivals_s[sent])

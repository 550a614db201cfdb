"""The packing benchmark's arithmetic: the job stream, the makespan bound, histogram
quantiles, and the over-commit check on workers' logs."""

from __future__ import annotations

import pytest

from ops.benchpack import (
    WORKER_SHAPES,
    histogram_quantile,
    job_stream,
    lower_bound_s,
    overcommitted_workers,
)
from ops.checker import Run


def test_the_job_stream_is_seeded_and_mixed() -> None:
    """The same seed gives the same jobs; the stream holds small, CPU-heavy, memory-heavy and
    large jobs, and asks about as much memory per millicore (weighted by duration) as the
    workers offer, so both resources can be full at once."""
    jobs = job_stream(2000, seed=7)
    assert jobs == job_stream(2000, seed=7) and jobs != job_stream(2000, seed=8)
    shapes = {(j.cpu_millis, j.memory_mb) for j in jobs}
    assert {(250, 256), (4000, 1024), (500, 8192), (8000, 16384)} <= shapes
    assert all(1.0 <= j.duration_s <= 30.0 for j in jobs)
    asked = sum(j.memory_mb * j.duration_s for j in jobs) / sum(j.cpu_millis * j.duration_s for j in jobs)
    offered = sum(m for _, m in WORKER_SHAPES) / sum(c for c, _ in WORKER_SHAPES)
    assert asked == pytest.approx(offered, rel=0.05)


def test_the_lower_bound_is_the_largest_of_cpu_memory_and_longest_job() -> None:
    """Two 16000-millicore workers alternate with 8000 ones; 24000 total cpu."""
    jobs = job_stream(1, seed=1)
    one = jobs[0]
    bound = lower_bound_s(jobs, workers=2)
    assert bound == pytest.approx(
        max(one.cpu_millis * one.duration_s / 24000, one.memory_mb * one.duration_s / 49152, one.duration_s)
    )


def test_histogram_quantile_interpolates_within_a_bucket() -> None:
    """100 observations: 50 under 1 ms, 50 between 1 and 2 ms; p50 = 1 ms, p99 = 1.98 ms."""
    buckets = [(0.001, 50.0), (0.002, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.00198)
    assert histogram_quantile(0.5, []) is None


def run(worker: str, job: int, start: float, end: float) -> Run:
    return Run(worker_id=worker, incarnation=1, job_id=job, assignment_id=job, started_at=start, ended_at=end)


def test_overcommit_is_found_from_overlapping_runs_only() -> None:
    """Two 600-millicore jobs overlapping on a 1000-millicore worker over-commit it; back to
    back (one stops as the other starts) they do not."""
    sizes = {1: (600, 10), 2: (600, 10)}
    caps = {"w-1": (1000, 100)}
    assert overcommitted_workers([run("w-1", 1, 0, 5), run("w-1", 2, 4, 9)], sizes, caps) == ["w-1"]
    assert overcommitted_workers([run("w-1", 1, 0, 5), run("w-1", 2, 5, 9)], sizes, caps) == []

"""The packing benchmark's arithmetic: the job stream, the arrival times and their batched
submission, the makespan bound, histogram quantiles, the over-commit check on workers' logs,
and the scale curve's gangs."""

from __future__ import annotations

import itertools
import random
import re
import statistics
from collections.abc import Sequence

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from rich.console import Console

from ops.bench.pack import (
    PackReport,
    PackSettings,
    PhaseFigures,
    ScalePoint,
    Scenario,
    WaitFigures,
    histogram_quantile,
    overcommitted_workers,
    placer_figures,
    render,
    wait_figures,
)
from ops.bench.pack.queue import GANG_TASKS, check_shares, gang_sizes, gang_spec
from ops.bench.pack.stream import WORKER_SHAPES, arrival_times, job_stream, lower_bound_s, submit_arriving
from ops.checker_records import Run
from runtime.errors import InvalidArgument


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


def test_arrival_times_are_a_seeded_poisson_process() -> None:
    """The same seed gives the same times, another seed others; job 0 arrives at 0, the times
    never decrease, and over 20,000 gaps the mean gap is 1 / rate within 3 %."""
    times = arrival_times(20_000, rate_per_s=105.0, seed=1)
    assert times == arrival_times(20_000, rate_per_s=105.0, seed=1)
    assert times != arrival_times(20_000, rate_per_s=105.0, seed=2)
    assert times[0] == 0.0 and len(times) == 20_000
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= 0 for gap in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / 105.0, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(1 / 105.0, rel=0.05)  # exponential: sd = mean


def test_arrival_times_reject_a_rate_that_is_not_positive() -> None:
    """A rate of 0 or less is refused, naming the value."""
    with pytest.raises(ValueError, match="rate_per_s must be > 0, got 0"):
        arrival_times(10, rate_per_s=0, seed=1)


async def test_arriving_jobs_are_submitted_in_batches_once_their_time_has_come(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every item goes out once, in order, at the first wake-up at or after its arrival; the
    wake-ups come a batch interval apart, or at the next arrival when that is later, so items
    arriving close together share a batch and none waits longer than one interval."""
    arrivals = [0.0, 0.02, 0.05, 0.31, 0.32, 2.0]
    batches: list[tuple[float, list[int]]] = []
    started = trio.current_time()

    async def submit(items: Sequence[int]) -> None:
        batches.append((trio.current_time() - started, list(items)))
        await trio.sleep(0.01)

    await submit_arriving(submit, list(range(6)), arrivals, started=started, batch_interval_s=0.1)
    assert [items for _, items in batches] == [[0], [1, 2], [3], [4], [5]]
    assert [at for at, _ in batches] == pytest.approx([0.0, 0.1, 0.31, 0.41, 2.0])


def test_the_lower_bound_is_the_largest_of_cpu_memory_and_longest_job() -> None:
    """Two 16000-millicore workers alternate with 8000 ones; 24000 total cpu."""
    jobs = job_stream(1, seed=1)
    one = jobs[0]
    bound = lower_bound_s(jobs, workers=2)
    assert bound == pytest.approx(
        max(one.cpu_millis * one.duration_s / 24000, one.memory_mb * one.duration_s / 49152, one.duration_s)
    )


def test_the_lower_bound_counts_the_latest_arrival_plus_its_duration() -> None:
    """A job arriving late ends no earlier than its arrival plus its duration."""
    jobs = job_stream(2, seed=1)
    assert lower_bound_s(jobs, workers=100, arrivals_s=[0.0, 500.0]) == pytest.approx(
        500.0 + jobs[1].duration_s
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


def test_wait_figures_split_out_the_large_jobs() -> None:
    """Median wait over every job; median and max over jobs of 6000 cpu_millis or more."""
    waits = [(250, 0.1), (1000, 0.3), (6000, 2.0), (8000, 5.0), (500, 0.2)]
    assert wait_figures(waits) == WaitFigures(wait_p50_s=0.3, large_wait_p50_s=3.5, large_wait_max_s=5.0)
    assert wait_figures([(250, 1.0)]).large_wait_max_s is None


def test_the_placers_figures_are_read_from_real_metrics_text() -> None:
    """The exposition prometheus_client writes for the placer's metrics, read back: rounds,
    placements, the longest round and each phase's quantiles (a phase's series apart from the
    others')."""
    registry = CollectorRegistry()
    rounds = Histogram("stockade_placer_round_seconds", "", buckets=(0.001, 0.01, 0.1), registry=registry)
    phases = Histogram(
        "stockade_placer_phase_seconds", "", ["phase"], buckets=(0.001, 0.01, 0.1), registry=registry
    )
    Gauge("stockade_placer_round_max_seconds", "", registry=registry).set(0.05)
    Counter("stockade_placements", "", registry=registry).inc(7)
    for seconds in (0.0005, 0.005, 0.005, 0.05):
        rounds.observe(seconds)
    phases.labels("commit").observe(0.05)
    phases.labels("read").observe(0.0005)
    figures = placer_figures(generate_latest(registry).decode())
    assert (figures.rounds, figures.placements, figures.round_max_ms) == (4, 7, 50.0)
    assert figures.round_p50_ms == pytest.approx(5.5)
    assert figures.round_phases["commit"].p50_ms == pytest.approx(55.0)
    assert figures.round_phases["read"].p50_ms == pytest.approx(0.5)
    assert figures.round_phases["decide"] == PhaseFigures(p50_ms=None, p99_ms=None)


@pytest.mark.parametrize("tasks", [0, 1, 2, 3, 9, 40, 1000])
def test_gang_sizes_add_up_to_the_tasks_in_gangs_of_2_to_8(tasks: int) -> None:
    """The sizes add up to the tasks asked (one short for a lone task: no gang of one), each 2 to 8."""
    sizes = gang_sizes(tasks, random.Random(tasks))
    assert sum(sizes) == (tasks if tasks != 1 else 0)
    assert all(GANG_TASKS[0] <= size <= GANG_TASKS[1] for size in sizes)


def test_every_third_gang_spreads_and_each_is_a_checked_gang_spec() -> None:
    """Gang k has the tasks asked, spreads when k is a multiple of 3, and asks no devices."""
    specs = [gang_spec(k, 4) for k in range(6)]
    assert [s.spread for s in specs] == [True, False, False, True, False, False]
    assert all(s.tasks == 4 and not s.resources for s in specs)


@pytest.mark.parametrize(
    ("device_share", "gang_share", "message"),
    [
        (0.0, 1.5, "--gang-share must be between 0 and 1, got 1.5"),
        (-0.1, 0.0, "--device-share must be between 0 and 1, got -0.1"),
        (0.75, 0.5, "--gang-share must be at most 1 - --device-share 0.75 = 0.25"),
    ],
)
def test_shares_that_do_not_fit_one_queue_are_refused(
    device_share: float, gang_share: float, message: str
) -> None:
    """A share outside 0 to 1, or a device and a gang share over 1 together, is refused by name."""
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        check_shares(device_share, gang_share)


def test_the_scale_line_names_the_gang_share_and_the_failed_rounds() -> None:
    """A scale point with gangs and rounds the database cancelled says both on its line."""
    point = ScalePoint(
        pending=10_000,
        workers=100,
        first_round_ms=250.0,
        round_p50_ms=20.0,
        round_p99_ms=90.0,
        round_max_ms=95.0,
        placed=30,
        device_share=0.25,
        gang_share=0.1,
        gang_tasks=1000,
        failed_rounds=3,
    )
    console = Console(width=300, record=True)
    console.print(
        render(
            PackReport(settings=PackSettings(), all_at_once=Scenario(title="", policies=()), scale=(point,))
        )
    )
    shown = console.export_text()
    assert "(25% asking gpu, 10% in gangs): round p50 20.0 ms" in shown
    assert "; 3 rounds failed (a statement cancelled at its timeout)" in shown

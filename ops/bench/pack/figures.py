"""The figures ``stockade bench pack`` reports, computed from what a run measured (pure, but
:func:`scrape`, which reads a /metrics page).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import attrs
from prometheus_client.samples import Sample

from ops.bench import metrics
from ops.checker_records import Run

PHASES = ("read", "decide", "commit", "dispatch")
"""The phases of a placer round, each with a histogram of its own."""
LARGE_CPU_MILLIS = 6000
"""The stream's large jobs ask this much CPU or more (see :func:`ops.bench.pack.stream.job_stream`)."""


@attrs.frozen(kw_only=True)
class PhaseFigures:
    """One phase of a placer round: its p50 and p99, in milliseconds (None: no rounds)."""

    p50_ms: float | None = None
    p99_ms: float | None = None


@attrs.frozen(kw_only=True)
class PlacerFigures:
    """The leader's placer, from its Prometheus histograms: round time quantiles and max (ms),
    each phase's p50 / p99, rounds and placements."""

    round_p50_ms: float | None = None
    round_p99_ms: float | None = None
    round_max_ms: float | None = None
    round_phases: dict[str, PhaseFigures] = attrs.field(factory=dict)
    rounds: int = 0
    placements: int = 0


@attrs.frozen(kw_only=True)
class ProbeFigures:
    """Durable commits on a connection of the benchmark's own (:func:`probe_figures`)."""

    db_commit_p50_ms: float | None = None
    db_commit_p99_ms: float | None = None
    db_commit_max_ms: float | None = None
    db_stalls: tuple[tuple[float, float], ...] = ()
    """[seconds since the first submit, latency s] of each commit slower than the stall limit."""


@attrs.frozen(kw_only=True)
class WaitFigures:
    """Seconds jobs waited for their first placement (:func:`wait_figures`)."""

    wait_p50_s: float | None = None
    large_wait_p50_s: float | None = None
    large_wait_max_s: float | None = None


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile from cumulative (upper bound, count) buckets, interpolating linearly
    within the bucket, as Prometheus' ``histogram_quantile`` does."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower_bound
            span = count - lower_count
            return lower_bound + (upper - lower_bound) * ((rank - lower_count) / span if span else 1.0)
        lower_bound, lower_count = upper, count
    return lower_bound


def _buckets(samples: Sequence[Sample], name: str, **labels: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) pairs of histogram ``name``, for the series whose labels
    other than ``le`` are exactly ``labels`` (e.g. ``phase="commit"``)."""
    return sorted(
        (float(s.labels["le"]), s.value)
        for s in samples
        if s.name == f"{name}_bucket" and {k: v for k, v in s.labels.items() if k != "le"} == labels
    )


def placer_figures(text: str) -> PlacerFigures:
    """The placer's figures from a control plane's /metrics text (Prometheus' text format, read
    with ``prometheus_client``'s parser): round time quantiles and max, the p50 / p99 of each
    phase of a round, rounds and placements."""
    samples = metrics.samples(text)
    buckets = _buckets(samples, "stockade_placer_round_seconds")

    def value(name: str) -> float:
        return next((s.value for s in samples if s.name == name and not s.labels), 0.0)

    phases = {}
    for phase in PHASES:
        series = _buckets(samples, "stockade_placer_phase_seconds", phase=phase)
        phases[phase] = PhaseFigures(
            p50_ms=_ms(histogram_quantile(0.5, series)), p99_ms=_ms(histogram_quantile(0.99, series))
        )
    return PlacerFigures(
        round_p50_ms=_ms(histogram_quantile(0.5, buckets)),
        round_p99_ms=_ms(histogram_quantile(0.99, buckets)),
        round_max_ms=_ms(value("stockade_placer_round_max_seconds")),
        round_phases=phases,
        rounds=int(buckets[-1][1]) if buckets else 0,
        placements=int(value("stockade_placements_total")),
    )


def scrape(address: str) -> PlacerFigures:
    """:func:`placer_figures` of the control plane whose /metrics is at ``address`` (host:port)."""
    return placer_figures(metrics.fetch_text(address))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def probe_figures(probes: Sequence[tuple[float, float]], *, stall_s: float = 1.0) -> ProbeFigures:
    """The p50, p99 and max commit latency (ms) over ``probes`` ((time s, latency s) pairs from
    :func:`ops.bench.pack.scenarios.probe_commits`), and each commit slower than ``stall_s``."""
    latencies = sorted(latency for _, latency in probes)
    if not latencies:
        return ProbeFigures()
    return ProbeFigures(
        db_commit_p50_ms=_ms(latencies[len(latencies) // 2]),
        db_commit_p99_ms=_ms(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]),
        db_commit_max_ms=_ms(latencies[-1]),
        db_stalls=tuple((round(t, 2), round(latency, 3)) for t, latency in probes if latency > stall_s),
    )


def wait_figures(waits: Sequence[tuple[int, float]]) -> WaitFigures:
    """How long jobs waited for their first placement, from (cpu_millis, wait_s) pairs:
    ``wait_p50_s`` over every job, ``large_wait_p50_s`` and ``large_wait_max_s`` over the jobs
    of ``LARGE_CPU_MILLIS`` or more (the ones a policy that strands room makes wait longest).
    None where there are no such jobs."""
    every = [w for _, w in waits]
    large = [w for cpu, w in waits if cpu >= LARGE_CPU_MILLIS]
    return WaitFigures(
        wait_p50_s=round(statistics.median(every), 2) if every else None,
        large_wait_p50_s=round(statistics.median(large), 2) if large else None,
        large_wait_max_s=round(max(large), 2) if large else None,
    )


def overcommitted_workers(
    runs: Sequence[Run],
    sizes: dict[int, tuple[int, int]],
    capacities: dict[str, tuple[int, int]],
) -> list[str]:
    """Workers whose jobs running at the same time (from the workers' own start and stop
    records) ever needed more CPU or memory than the worker has.

    Args:
        runs: every run, from :func:`ops.checker.load_runs`.
        sizes: job id -> (cpu_millis, memory_mb).
        capacities: worker id -> (cpu_millis, memory_mb).
    """
    events: dict[str, list[tuple[float, int, int, int]]] = {}
    for run in runs:
        cpu, mem = sizes[run.job_id]
        # At equal times a stop (0) sorts before a start (1): a job ending as another begins
        # does not overlap it.
        events.setdefault(run.worker_id, []).append((run.started_at, 1, cpu, mem))
        events.setdefault(run.worker_id, []).append((run.ended_at, 0, -cpu, -mem))
    over = []
    for worker_id, timeline in events.items():
        cap_cpu, cap_mem = capacities[worker_id]
        cpu = mem = 0
        for _, _, d_cpu, d_mem in sorted(timeline):
            cpu, mem = cpu + d_cpu, mem + d_mem
            if cpu > cap_cpu or mem > cap_mem:
                over.append(worker_id)
                break
    return sorted(over)

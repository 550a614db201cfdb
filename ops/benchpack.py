"""``stockade bench pack``: how well and how fast the placer packs, on this machine.

Three parts, each printing measured numbers (timing goals are never asserted in tests):

1. Packing: for each policy (best fit, first fit, worst fit), a fresh cluster (3 control
   planes, 100 workers hosted in fleets) gets the same seeded stream of 10,000 sleep jobs in
   two scenarios, each on a fresh cluster: all submitted at the start ("all at once"), then
   arriving over time ("arriving"): a Poisson process at ``PackSettings.arrival_rate_per_s``
   (105 jobs/s, about 91 % of what the 100 workers can run for this stream), its gaps drawn by
   ``arrival_times`` from a generator of their own, submitted in batches every 0.1 s. All at
   once, the queue is so long that any free room is refilled by some small job and the
   policies tie; arriving near capacity, the queue stays short and how well a policy keeps
   room usable shows. Sampled every 0.5 s from the database: allocated / total capacity of
   CPU and memory, the pending count and how many of those have been pending for a second or
   more. Reported per scenario: ``cpu_use_waiting`` and ``memory_use_waiting`` (mean use over
   the samples taken while some job had been pending for a second or more: waiting for room,
   not for the next round; ``PackSettings.waiting_after_s``), ``cpu_use_pending`` (the same
   over every sample with any job pending), time
   from the first submit until every job finished and jobs per second, makespan against its
   lower bound (the largest of total requested cpu x seconds over total CPU, the same for
   memory, the longest job and, when jobs arrive, the latest arrival plus duration), the
   leader's round time p50 / p99 (from its Prometheus histogram, interpolated within a bucket
   as ``histogram_quantile`` does) and max, and placements per second.
2. Burst: 10,000 small jobs submitted at once into an empty cluster with room for all of
   them; the time from the first submit until every job is started by its worker (its start
   record in the worker's log): ``burst_placements_per_s``.
3. Scale curve: the real placer round (reads, decision, fenced commit) against a database
   holding 1,000 / 10,000 / 100,000 pending jobs and 100 / 1,000 simulated busy workers, with a
   little room freed before each round so every round places a job or two.

The job stream (``job_stream``): seeded; 55 % small jobs (250-1000 cpu_millis with 1, 2 or 3
GiB per core), 20 % CPU-heavy (2000-4000 cpu_millis, 1024-2048 MiB), 20 % memory-heavy
(500-1000 cpu_millis, 4096-8192 MiB), 5 % large (6000-8000 cpu_millis, 12288-16384 MiB);
durations log-normal with a median of 6 s and sigma 0.6, clipped to 1-30 s. Workers alternate
16000/32768 and 8000/16384 (cpu_millis/memory_mb). Weighted by duration the stream asks about
2.03 MiB per millicore and the workers offer 2.048, so both resources can be nearly full at
once; a stream asking less memory per core than the workers offer caps memory use at that
ratio (an earlier stream asked 1.52: memory use could not pass 0.74 with CPU full), and the
mix of CPU-heavy and memory-heavy shapes makes a worker's leftover room matter.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import random
import shutil
import statistics
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from actors.ingest import apply_schema
from actors.ledger import Ledger
from actors.messages import DispatcherInbox, LeaseInbox, LedgerInbox, RoleChange
from actors.placer import PgPlacerStore, Placer
from actors.role import RoleView
from ops import checker
from ops.cluster import LocalCluster, StateDir, metrics_address
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.settings import PLACEMENT_POLICIES, LedgerSettings, PlacerSettings

WORKER_SHAPES = ((16000, 32768), (8000, 16384))
POLICIES = PLACEMENT_POLICIES
"""The policies a pack benchmark compares by default (every one :mod:`actors.placement` knows)."""


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

    Job 0 arrives at 0.0; each later gap is exponential with mean ``1 / rate_per_s``. The gaps
    come from a ``random.Random`` of their own, seeded with the string ``"arrivals:{seed}"``:
    deterministic, and independent of :func:`job_stream`'s draws (seeded with the integer
    ``seed`` itself, it would draw the very uniforms the stream draws).

    Args:
        count: jobs, >= 0.
        rate_per_s: mean arrivals per second, > 0.
        seed: the job stream's seed.

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


PHASES = ("read", "decide", "commit", "dispatch")


def placer_figures(text: str) -> dict[str, Any]:
    """The placer's figures from a control plane's /metrics text (Prometheus' text format, read
    with ``prometheus_client``'s parser): round time quantiles and max, the p50 / p99 of each
    phase of a round, rounds and placements."""
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    buckets = _buckets(samples, "stockade_placer_round_seconds")

    def value(name: str) -> float:
        return next((s.value for s in samples if s.name == name and not s.labels), 0.0)

    phases = {}
    for phase in PHASES:
        series = _buckets(samples, "stockade_placer_phase_seconds", phase=phase)
        phases[phase] = {
            "p50_ms": _ms(histogram_quantile(0.5, series)),
            "p99_ms": _ms(histogram_quantile(0.99, series)),
        }
    return {
        "round_p50_ms": _ms(histogram_quantile(0.5, buckets)),
        "round_p99_ms": _ms(histogram_quantile(0.99, buckets)),
        "round_max_ms": _ms(value("stockade_placer_round_max_seconds")),
        "round_phases": phases,
        "rounds": int(buckets[-1][1]) if buckets else 0,
        "placements": int(value("stockade_placements_total")),
    }


def scrape(address: str) -> dict[str, Any]:
    """:func:`placer_figures` of the control plane whose /metrics is at ``address`` (host:port)."""
    return placer_figures(urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode())


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


# $1: seconds a job must have been pending to count as waiting (PackSettings.waiting_after_s).
SAMPLE = """
SELECT coalesce(sum(a.cpu_allocated_millis), 0)::float8 / greatest(sum(w.cpu_millis), 1) AS cpu,
       coalesce(sum(a.memory_allocated_mb), 0)::float8 / greatest(sum(w.memory_mb), 1) AS mem,
       (SELECT count(*) FROM jobs WHERE state = 'pending') AS pending,
       (SELECT count(*) FROM jobs
         WHERE state = 'pending' AND submitted_at < now() - make_interval(secs => $1)) AS waiting,
       (SELECT count(*) FROM jobs WHERE state IN ('succeeded', 'failed')) AS done
  FROM workers w JOIN worker_allocations a ON a.worker_id = w.id WHERE w.state = 'alive'
"""


PROBE_TABLE = "CREATE TABLE IF NOT EXISTS bench_commit_probe (id int PRIMARY KEY, at timestamptz)"
PROBE_COMMIT = """
INSERT INTO bench_commit_probe VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = EXCLUDED.at
"""


async def probe_commits(
    database_url: str, probes: list[tuple[float, float]], *, started: float, interval_s: float = 0.2
) -> None:
    """Commit one row every ``interval_s`` on a connection of its own, durably (the server's
    default ``synchronous_commit``), and append (seconds since ``started``, commit latency in
    seconds) to ``probes``, until cancelled.

    The cluster's liveness rests on the database answering: a lease renewal, a heartbeat with
    outcomes and every fenced write commit durably. When workers fence themselves at once, a
    commit that took seconds at the same moment points at the database (its WAL flush, or its
    processes waiting for a CPU); fast commits rule it out.
    """
    db = await PgConnection.connect(database_url)
    try:
        await db.execute(PROBE_TABLE)
        while True:
            began = trio.current_time()
            await db.execute(PROBE_COMMIT)
            probes.append((began - started, trio.current_time() - began))
            await trio.sleep_until(began + interval_s)
    finally:
        await db.close()


def probe_figures(probes: Sequence[tuple[float, float]], *, stall_s: float = 1.0) -> dict[str, Any]:
    """``db_commit_p50_ms``, ``db_commit_p99_ms``, ``db_commit_max_ms`` over ``probes`` ((time
    s, latency s) pairs from :func:`probe_commits`), and ``db_stalls``: [time s, latency s] of
    each commit slower than ``stall_s``."""
    latencies = sorted(latency for _, latency in probes)
    if not latencies:
        return {"db_commit_p50_ms": None, "db_commit_p99_ms": None, "db_commit_max_ms": None, "db_stalls": []}
    return {
        "db_commit_p50_ms": _ms(latencies[len(latencies) // 2]),
        "db_commit_p99_ms": _ms(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]),
        "db_commit_max_ms": _ms(latencies[-1]),
        "db_stalls": [[round(t, 2), round(latency, 3)] for t, latency in probes if latency > stall_s],
    }


@attrs.frozen(kw_only=True)
class PackSettings:
    """One benchmark run."""

    jobs: int = 10_000
    workers: int = 100
    seed: int = 1
    policies: tuple[str, ...] = POLICIES
    fleet_size: int = 25
    sample_interval_s: float = 0.5
    finish_timeout_s: float = 900.0
    burst_jobs: int = 10_000
    scale_pending: tuple[int, ...] = (1_000, 10_000, 100_000)
    scale_workers: tuple[int, ...] = (100, 1_000)
    scale_rounds: int = 40
    duration_scale: float = 1.0
    """Multiplies every job's duration (a smoke test runs the same stream faster)."""
    arrival_rate_per_s: float = 105.0
    """Jobs per second of the arriving scenario (0: skip it). The 100 workers can run about
    115.3 jobs/s of the 10,000-job stream of seed 1: their 1,200,000 cpu_millis over the
    stream's mean of 10,407 cpu_millis x s per job (memory would allow 115.9: 2,457,600 MiB
    over 21,210 MiB x s). 105 is about 91 % of that: near capacity the queue stays short, so
    the room a policy leaves decides what can start (all at once, some small job always
    fits). Not scaled by ``duration_scale``."""
    arrival_batch_interval_s: float = 0.1
    """How often the arriving scenario submits every job whose arrival time has come."""
    waiting_after_s: float = 1.0
    """A job pending this long (seconds since its submission) is waiting for room:
    ``cpu_use_waiting`` averages the samples taken while some job was. Ten placement rounds:
    a job that just arrived waits for the next round, not for room, and counting the samples
    where only such jobs were pending would measure the arrival process (while an empty
    cluster fills, every sample has a batch of them) rather than the packing."""


def _cluster(root: Path, settings: PackSettings, policy: str) -> LocalCluster:
    capacities = tuple(WORKER_SHAPES[i % len(WORKER_SHAPES)] for i in range(settings.workers))
    return LocalCluster(
        StateDir(root),
        # 100 workers on 2 cores: heartbeats every second with a 1.5 s deadline (a saturated
        # control plane answers late), and the fence and dead_after widened to match.
        cp_args=("--policy", policy, "--dead-after-s", "5"),
        agent_args=(
            "--heartbeat-interval-s",
            "1.0",
            "--heartbeat-timeout-s",
            "1.5",
            "--self-fence-after-s",
            "3.5",
        ),
        fleet_size=settings.fleet_size,
        worker_capacities=capacities,
        metrics=True,
    )


async def _submit(client: ControlPlaneClient, specs: Sequence[pb.JobSpec]) -> None:
    for start in range(0, len(specs), 5000):
        await client.call(
            "submit_jobs", pb.SubmitJobsRequest(specs=list(specs[start : start + 5000])), timeout_s=60
        )


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

    Wakes at ``started`` and then every ``batch_interval_s`` (or at the next arrival, if that
    is later) and passes ``submit`` every item not yet submitted whose arrival has come.
    Returns once all are submitted.

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


async def run_policy(
    settings: PackSettings,
    policy: str,
    root: Path,
    progress: Callable[[str], None],
    *,
    arrival_rate_per_s: float | None = None,
) -> dict[str, Any]:
    """Run the job stream under ``policy`` on a fresh cluster; returns its figures and samples.

    Args:
        settings: the run's settings.
        policy: one of :data:`POLICIES`.
        root: the cluster's state folder (emptied first).
        progress: called with a line now and then.
        arrival_rate_per_s: None submits every job at the start; a rate (jobs per second, > 0)
            submits job ``i`` at ``arrival_times(settings.jobs, rate, settings.seed)[i]``
            seconds after the first submit, while sampling goes on.

    Returns:
        The figures described in the module docstring, ``arrival_rate_per_s``, the checker's
        counts and ``samples``: [seconds since the first submit, cpu use, memory use, pending,
        waiting (pending for ``settings.waiting_after_s`` or longer)].
    """
    label = policy if arrival_rate_per_s is None else f"{policy} arriving at {arrival_rate_per_s:g}/s"
    cluster = _cluster(root, settings, policy)
    await trio.to_thread.run_sync(cluster.down)
    shutil.rmtree(root, ignore_errors=True)
    try:
        await trio.to_thread.run_sync(
            lambda: cluster.up(control_planes=3, workers=settings.workers, timeout_s=180)
        )
        config = cluster.config()
        stream = job_stream(settings.jobs, settings.seed)
        specs = [
            pb.JobSpec(
                name=f"pack-{i}",
                cpu_millis=j.cpu_millis,
                memory_mb=j.memory_mb,
                sleep=pb.SleepRuntime(duration_ms=int(j.duration_s * 1000 * settings.duration_scale)),
            )
            for i, j in enumerate(stream)
        ]
        arrivals = (
            None
            if arrival_rate_per_s is None
            else arrival_times(settings.jobs, arrival_rate_per_s, settings.seed)
        )
        samples: list[tuple[float, float, float, int, int]] = []
        probes: list[tuple[float, float]] = []
        async with asyncio_bridge():
            client = ControlPlaneClient(config.control_plane_addresses, timeout_s=5.0)
            db = await PgConnection.connect(config.database_url)
            try:
                finished_at: float | None = None
                async with trio.open_nursery() as nursery:
                    started = trio.current_time()
                    nursery.start_soon(
                        functools.partial(probe_commits, config.database_url, probes, started=started)
                    )
                    if arrivals is None:
                        await _submit(client, specs)
                    else:
                        nursery.start_soon(
                            functools.partial(
                                submit_arriving,
                                functools.partial(_submit, client),
                                specs,
                                arrivals,
                                started=started,
                                batch_interval_s=settings.arrival_batch_interval_s,
                            )
                        )
                    with trio.move_on_after(settings.finish_timeout_s):
                        while True:
                            row = await db.fetchrow(SAMPLE, settings.waiting_after_s)
                            assert row is not None
                            now = trio.current_time() - started
                            samples.append(
                                (
                                    now,
                                    float(row["cpu"]),
                                    float(row["mem"]),
                                    int(row["pending"]),
                                    int(row["waiting"]),
                                )
                            )
                            if int(row["done"]) >= settings.jobs:
                                finished_at = now
                                break
                            if len(samples) % 20 == 0:
                                progress(
                                    f"{label}: {now:.0f} s, {row['done']} done, {row['pending']} pending, "
                                    f"cpu {row['cpu']:.0%}, memory {row['mem']:.0%}"
                                )
                            await trio.sleep(settings.sample_interval_s)
                    # Past the timeout, stop submitting too; jobs_finished then falls short of jobs.
                    nursery.cancel_scope.cancel()
                status = await client.call("status", pb.StatusRequest())
            finally:
                client.close()
                await db.close()
            history = await checker.load_history(config.database_url)
            db = await PgConnection.connect(config.database_url)
            try:
                sizes = {r["id"]: (r["cpu_millis"], r["memory_mb"]) for r in await db.fetch(SIZES)}
                capacities = {r["id"]: (r["cpu_millis"], r["memory_mb"]) for r in await db.fetch(CAPACITIES)}
                waits = wait_figures([(r["cpu_millis"], r["wait_s"]) for r in await db.fetch(WAITS)])
            finally:
                await db.close()
        leader = config.process(status.leader) if status.leader else None
        placer = scrape(metrics_address(leader) or "") if leader is not None else {}
        worker_dirs = [cluster.state.work_dir(w.id) for w in config.workers]
        runs = checker.load_runs(worker_dirs)
        report = checker.check_logs(history, worker_dirs)
        over = overcommitted_workers(runs, sizes, capacities)
    finally:
        await trio.to_thread.run_sync(cluster.down)
    waiting = [s for s in samples if s[4] > 0]
    pending = [s for s in samples if s[3] > 0]
    scaled = [attrs.evolve(j, duration_s=j.duration_s * settings.duration_scale) for j in stream]
    bound = lower_bound_s(scaled, settings.workers, arrivals)
    placing_s = max((s[0] for s in waiting), default=0.0) or (finished_at or 0.0)
    return {
        "policy": policy,
        "arrival_rate_per_s": arrival_rate_per_s,
        "cpu_use_waiting": round(statistics.fmean(s[1] for s in waiting), 4) if waiting else None,
        "memory_use_waiting": round(statistics.fmean(s[2] for s in waiting), 4) if waiting else None,
        "cpu_use_pending": round(statistics.fmean(s[1] for s in pending), 4) if pending else None,
        "finished_s": None if finished_at is None else round(finished_at, 2),
        "jobs_per_s": None if not finished_at else round(settings.jobs / finished_at, 2),
        "makespan_lower_bound_s": round(bound, 2),
        "makespan_over_bound": None if not finished_at else round(finished_at / bound, 3),
        **placer,
        "mean_pending_while_waiting": round(statistics.fmean(s[3] for s in waiting)) if waiting else 0,
        **waits,
        "placements_per_s": round(placer.get("placements", 0) / placing_s, 1) if placing_s else None,
        "double_placements": report.double_placements,
        "double_runs": report.double_runs,
        "overcommitted_workers": over,
        "lease_losses": max(0, report.elections - 1),
        "worker_deaths": report.worker_deaths,
        "self_fences": report.self_fences,
        "extra_assignments": report.extra_assignments,
        "lost_successes": report.lost_successes,
        **probe_figures(probes),
        "jobs_finished": report.jobs_finished,
        "unfinished_job_ids": list(report.unfinished_job_ids),
        "samples": [[round(t, 2), round(c, 4), round(m, 4), p, w] for t, c, m, p, w in samples],
    }


def overcommitted_workers(
    runs: Sequence[checker.Run],
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


SIZES = "SELECT id, cpu_millis, memory_mb FROM jobs"
# Per job: its size and the seconds from its submission to its first assignment (database time).
WAITS = """
SELECT j.cpu_millis, extract(epoch FROM min(a.created_at) - j.submitted_at)::float8 AS wait_s
  FROM jobs j JOIN assignments a ON a.job_id = j.id
 GROUP BY j.id, j.cpu_millis, j.submitted_at
"""
LARGE_CPU_MILLIS = 6000
"""The stream's large jobs ask this much CPU or more (see :func:`job_stream`)."""


def wait_figures(waits: Sequence[tuple[int, float]]) -> dict[str, float | None]:
    """How long jobs waited for their first placement, from (cpu_millis, wait_s) pairs:
    ``wait_p50_s`` over every job, ``large_wait_p50_s`` and ``large_wait_max_s`` over the jobs
    of ``LARGE_CPU_MILLIS`` or more (the ones a policy that strands room makes wait longest).
    None where there are no such jobs."""
    every = [w for _, w in waits]
    large = [w for cpu, w in waits if cpu >= LARGE_CPU_MILLIS]
    return {
        "wait_p50_s": round(statistics.median(every), 2) if every else None,
        "large_wait_p50_s": round(statistics.median(large), 2) if large else None,
        "large_wait_max_s": round(max(large), 2) if large else None,
    }


CAPACITIES = "SELECT id, cpu_millis, memory_mb FROM workers"


async def run_burst(settings: PackSettings, root: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    """10,000 small jobs into an empty cluster with room for all: seconds until every one is
    started by its worker, and placements per second."""
    cluster = _cluster(root, settings, "best_fit")
    await trio.to_thread.run_sync(cluster.down)
    shutil.rmtree(root, ignore_errors=True)
    try:
        await trio.to_thread.run_sync(
            lambda: cluster.up(control_planes=3, workers=settings.workers, timeout_s=180)
        )
        config = cluster.config()
        specs = [
            pb.JobSpec(
                name=f"burst-{i}", cpu_millis=100, memory_mb=128, sleep=pb.SleepRuntime(duration_ms=300_000)
            )
            for i in range(settings.burst_jobs)
        ]
        async with asyncio_bridge():
            client = ControlPlaneClient(config.control_plane_addresses, timeout_s=5.0)
            try:
                submitted_at = time.time()
                await _submit(client, specs)
                started: dict[int, float] = {}
                with trio.move_on_after(300):
                    while len(started) < settings.burst_jobs:
                        await trio.sleep(0.5)
                        for worker in config.workers:
                            log_path = cluster.state.work_dir(worker.id) / "agent.jsonl"
                            if log_path.exists():
                                for record in checker.read_jsonl(log_path):
                                    if record.get("event") == "start":
                                        started.setdefault(int(record["job_id"]), float(record["time"]))
                        progress(f"burst: {len(started)} of {settings.burst_jobs} started")
            finally:
                client.close()
    finally:
        await trio.to_thread.run_sync(cluster.down)
    if len(started) < settings.burst_jobs:
        return {
            "burst_jobs": settings.burst_jobs,
            "burst_started": len(started),
            "burst_s": None,
            "burst_placements_per_s": None,
        }
    elapsed = max(started.values()) - submitted_at
    return {
        "burst_jobs": settings.burst_jobs,
        "burst_started": len(started),
        "burst_s": round(elapsed, 2),
        "burst_placements_per_s": round(settings.burst_jobs / elapsed, 1),
    }


async def run_scale_point(database_url: str, pending: int, workers: int, rounds: int) -> dict[str, Any]:
    """The real placer round against ``pending`` jobs and ``workers`` simulated busy workers."""
    async with asyncio_bridge():
        await apply_schema(database_url)
        db = await PgConnection.connect(database_url)
        try:
            await db.execute("TRUNCATE assignments, jobs, workers, lease_history, stale_writes CASCADE")
            await db.execute(
                "UPDATE lease SET holder = 'bench', epoch = 1, expires_at = now() + interval '1 hour'"
            )
            await db.execute(
                "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)"
                " SELECT 'w-' || i, '127.0.0.1:1', 16000, 32768, i FROM generate_series(1, $1) i",
                workers,
            )
            await db.execute(
                "UPDATE worker_allocations SET cpu_allocated_millis = 15900, memory_allocated_mb = 32000"
            )
            await db.execute(
                "INSERT INTO jobs (name, cpu_millis, memory_mb, runtime, sleep_ms, pending_seq)"
                " SELECT 'scale', (ARRAY[250,500,1000,2000,4000])[1 + i % 5],"
                " (ARRAY[256,512,1024,2048])[1 + i % 4], 'sleep', 1000, nextval('pending_seq')"
                " FROM generate_series(1, $1) i",
                pending,
            )
            await db.execute("ANALYZE")
            ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
            lease_send, _lease_recv = trio.open_memory_channel[LeaseInbox](64)
            dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](100_000)
            _roles_send, roles_recv = trio.open_memory_channel[RoleChange](8)
            ledger = Ledger(
                cp_id="bench",
                database_url=database_url,
                settings=LedgerSettings(),
                inbox=ledger_recv,
                lease_inbox=lease_send,
            )
            placer = Placer(
                settings=PlacerSettings(),
                store=PgPlacerStore(database_url=database_url, application_name="bench"),
                role=RoleView(changes=roles_recv, lease_inbox=lease_send),
                ledger=ledger_send,
                dispatcher=dispatch_send,
            )
            times: list[float] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(ledger.run)
                await db.execute("UPDATE workers SET last_heartbeat_at = now()")
                first = time.perf_counter()
                await placer.round(1)  # reads the whole queue once
                first_ms = (time.perf_counter() - first) * 1000
                rng = random.Random(pending + workers)
                for _ in range(rounds):
                    worker = rng.randint(1, workers)
                    # The simulated workers heartbeat, as live ones would (else they go stale
                    # and the placer rightly places nothing on them).
                    await db.execute("UPDATE workers SET last_heartbeat_at = now()")
                    await db.execute(
                        "UPDATE worker_allocations SET cpu_allocated_millis = cpu_allocated_millis - 2000,"
                        " memory_allocated_mb = memory_allocated_mb - 2048 WHERE worker_id = $1",
                        f"w-{worker}",
                    )
                    t = time.perf_counter()
                    await placer.round(1)
                    times.append((time.perf_counter() - t) * 1000)
                    while True:
                        try:
                            dispatch_recv.receive_nowait()
                        except trio.WouldBlock:
                            break
                nursery.cancel_scope.cancel()
            await placer.store.close()  # type: ignore[attr-defined]
        finally:
            await db.close()
    times.sort()
    return {
        "pending": pending,
        "workers": workers,
        "first_round_ms": round(first_ms, 1),
        "round_p50_ms": round(statistics.median(times), 2),
        "round_p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 2),
        "round_max_ms": round(times[-1], 2),
        "placed": placer.stats.placements,
    }


def growth(points: Sequence[dict[str, Any]]) -> list[str]:
    """Sentences on how the round time grows with the pending queue and the worker count."""
    lines = []
    by = {(p["pending"], p["workers"]): p["round_p50_ms"] for p in points}
    pendings = sorted({p["pending"] for p in points})
    for workers in sorted({p["workers"] for p in points}):
        row = [by[(n, workers)] for n in pendings if (n, workers) in by]
        if len(row) >= 2:
            lines.append(
                f"{workers} workers: p50 {' -> '.join(f'{v} ms' for v in row)} for "
                f"{' -> '.join(str(n) for n in pendings)} pending "
                f"(x{row[-1] / row[0]:.1f} for x{pendings[-1] // pendings[0]} jobs)"
            )
    return lines


def plot(scenarios: Sequence[tuple[str, Sequence[dict[str, Any]]]], path: Path) -> None:
    """Allocated CPU and memory over time as one PNG: a row per policy, a column per scenario.

    Args:
        scenarios: (title, results) pairs, e.g. ``("all at once", [...])``; each result as
            :func:`run_policy` returns it, the same policies in the same order in every
            scenario.
        path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(len(results) for _, results in scenarios)
    figure, axes = plt.subplots(
        rows, len(scenarios), figsize=(9 * len(scenarios), 2.6 * rows), sharex="col", squeeze=False
    )
    for column, (title, results) in enumerate(scenarios):
        for row, result in enumerate(results):
            axis = axes[row, column]
            samples = result["samples"]
            t = [s[0] for s in samples]
            axis.plot(t, [s[1] for s in samples], label="CPU allocated")
            axis.plot(t, [s[2] for s in samples], label="memory allocated")
            axis.set_ylim(0, 1.05)
            axis.set_ylabel("fraction")
            axis.set_title(
                f"{title}, {result['policy']}: cpu_use_waiting {result['cpu_use_waiting']}, "
                f"memory_use_waiting {result['memory_use_waiting']}",
                fontsize=9,
            )
            axis.grid(alpha=0.3)
            axis.legend(loc="lower left", fontsize=8)
        for row in range(len(results), rows):
            axes[row, column].set_visible(False)
        axes[len(results) - 1, column].set_xlabel("seconds since the first submit")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def save(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")

"""The scenarios of ``stockade bench pack``, each on a cluster or a database of its own: the
stream under one policy (all at once or arriving), the burst, the scale curve's points, and
:func:`run_pack`, which runs them all as the command asks. See :mod:`ops.bench.pack`.
"""

from __future__ import annotations

import functools
import random
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import trio

from ops import checker
from ops.bench import heartbeat_flags, operator_client
from ops.bench.pack.figures import (
    PlacerFigures,
    overcommitted_workers,
    probe_figures,
    scrape,
    wait_figures,
)
from ops.bench.pack.queue import check_shares, seed_queue
from ops.bench.pack.report import BurstResult, PackReport, PolicyResult, ScalePoint, Scenario
from ops.bench.pack.rounds import BenchPlacer, percentiles_ms
from ops.bench.pack.stream import (
    WORKER_SHAPES,
    arrival_times,
    job_stream,
    lower_bound_s,
    submit_arriving,
)
from ops.bench.settings import PackSettings
from ops.cluster import ClusterDriver, DockerCluster, LocalCluster, StateDir, metrics_address
from ops.launcher.pg import EmbeddedPostgres
from ops.launcher.ports import free_port
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.text import read_jsonl


def _cluster(root: Path, settings: PackSettings, policy: str, *, docker: bool = False) -> ClusterDriver:
    capacities = tuple(WORKER_SHAPES[i % len(WORKER_SHAPES)] for i in range(settings.workers))
    # 100 workers on 2 cores: the heartbeat deadline, fence and dead_after widened to match the
    # interval, which the control planes' bounds pin (left to choose, the leader counts only its
    # own cost, not the 100 agents sharing the machine, and the heartbeats take the CPU the
    # placements are measured with).
    cp_args, agent_args = heartbeat_flags(settings.heartbeat_interval_s)
    cp_args = ("--policy", policy, *cp_args)
    if docker:
        return DockerCluster(
            StateDir(root),
            cp_args=cp_args,
            agent_args=agent_args,
            worker_capacities=capacities,
            insecure=settings.insecure,
        )
    return LocalCluster(
        StateDir(root),
        cp_args=cp_args,
        agent_args=agent_args,
        fleet_size=settings.fleet_size,
        worker_capacities=capacities,
        metrics=True,
        insecure=settings.insecure,
    )


async def _start_afresh(cluster: ClusterDriver, workers: int) -> None:
    """Start ``cluster`` anew (whatever ran in its state folder stopped and removed) and wait
    until it is ready."""
    await trio.to_thread.run_sync(cluster.down)
    shutil.rmtree(cluster.state.root, ignore_errors=True)
    await trio.to_thread.run_sync(lambda: cluster.up(control_planes=3, workers=workers, timeout_s=180))


async def _submit(client: ControlPlaneClient, specs: Sequence[pb.JobSpec]) -> None:
    for start in range(0, len(specs), 5000):
        await client.call(
            "submit_jobs", pb.SubmitJobsRequest(specs=list(specs[start : start + 5000])), timeout_s=60
        )


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
    """Commit one row durably every ``interval_s`` on a connection of its own, and append
    (seconds since ``started``, commit latency in seconds) to ``probes``, until cancelled: when
    workers fence themselves at once, slow commits at that moment point at the database.
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


async def run_policy(
    settings: PackSettings,
    policy: str,
    root: Path,
    progress: Callable[[str], None],
    *,
    arrival_rate_per_s: float | None = None,
    docker: bool = False,
) -> PolicyResult:
    """Run the job stream under ``policy`` on a fresh cluster; returns its figures and samples.

    Args:
        settings: the run's settings.
        policy: one of :data:`POLICIES`.
        root: the cluster's state folder (emptied first).
        progress: called with a line now and then.
        arrival_rate_per_s: None submits every job at the start; a rate (jobs per second, > 0)
            submits them at :func:`arrival_times`.
        docker: run each worker in a container of its own instead of in fleets (the result
            then has ``agent_memory_mb``).

    Returns:
        The figures, the checker's counts and the samples: [seconds since the first submit, cpu
        use, memory use, pending, waiting (pending for ``settings.waiting_after_s`` or longer)].
    """
    label = policy if arrival_rate_per_s is None else f"{policy} arriving at {arrival_rate_per_s:g}/s"
    cluster = _cluster(root, settings, policy, docker=docker)
    agent_memory_mb: tuple[float, float, float] | None = None
    try:
        await _start_afresh(cluster, settings.workers)
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
            client = ControlPlaneClient(config.control_plane_addresses, timeout_s=5.0, tls=config.client_tls)
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
        placer = scrape(metrics_address(leader) or "") if leader is not None else PlacerFigures()
        worker_dirs = [cluster.state.work_dir(w.id) for w in config.workers]
        runs = checker.load_runs(worker_dirs)
        report = checker.check_logs(history, worker_dirs)
        over = overcommitted_workers(runs, sizes, capacities)
        if isinstance(cluster, DockerCluster):
            agent_memory_mb = await trio.to_thread.run_sync(cluster.agent_memory_mb)
    finally:
        await trio.to_thread.run_sync(cluster.down)
    waiting = [s for s in samples if s[4] > 0]
    pending = [s for s in samples if s[3] > 0]
    scaled = [attrs.evolve(j, duration_s=j.duration_s * settings.duration_scale) for j in stream]
    bound = lower_bound_s(scaled, settings.workers, arrivals)
    placing_s = max((s[0] for s in waiting), default=0.0) or (finished_at or 0.0)
    return PolicyResult(
        policy=policy,
        arrival_rate_per_s=arrival_rate_per_s,
        cpu_use_waiting=round(statistics.fmean(s[1] for s in waiting), 4) if waiting else None,
        memory_use_waiting=round(statistics.fmean(s[2] for s in waiting), 4) if waiting else None,
        cpu_use_pending=round(statistics.fmean(s[1] for s in pending), 4) if pending else None,
        finished_s=None if finished_at is None else round(finished_at, 2),
        jobs_per_s=None if not finished_at else round(settings.jobs / finished_at, 2),
        makespan_lower_bound_s=round(bound, 2),
        makespan_over_bound=None if not finished_at else round(finished_at / bound, 3),
        placer=placer,
        mean_pending_while_waiting=round(statistics.fmean(s[3] for s in waiting)) if waiting else 0,
        waits=waits,
        placements_per_s=round(placer.placements / placing_s, 1) if placing_s else None,
        overcommitted_workers=tuple(over),
        check=report,
        probes=probe_figures(probes),
        samples=tuple((round(t, 2), round(c, 4), round(m, 4), p, w) for t, c, m, p, w in samples),
        agent_memory_mb=agent_memory_mb,
    )


SIZES = "SELECT id, cpu_millis, memory_mb FROM jobs"
# Per job: its size and the seconds from its submission to its first assignment (database time).
WAITS = """
SELECT j.cpu_millis, extract(epoch FROM min(a.created_at) - j.submitted_at)::float8 AS wait_s
  FROM jobs j JOIN assignments a ON a.job_id = j.id
 GROUP BY j.id, j.cpu_millis, j.submitted_at
"""


CAPACITIES = "SELECT id, cpu_millis, memory_mb FROM workers"


async def run_burst(settings: PackSettings, root: Path, progress: Callable[[str], None]) -> BurstResult:
    """10,000 small jobs into an empty cluster with room for all: seconds until every one is
    started by its worker, and placements per second."""
    cluster = _cluster(root, settings, "best_fit")
    try:
        await _start_afresh(cluster, settings.workers)
        config = cluster.config()
        specs = [
            pb.JobSpec(
                name=f"burst-{i}", cpu_millis=100, memory_mb=128, sleep=pb.SleepRuntime(duration_ms=300_000)
            )
            for i in range(settings.burst_jobs)
        ]
        async with asyncio_bridge(), operator_client(config, timeout_s=5.0) as client:
            submitted_at = time.time()
            await _submit(client, specs)
            started: dict[int, float] = {}
            with trio.move_on_after(300):
                while len(started) < settings.burst_jobs:
                    await trio.sleep(0.5)
                    for worker in config.workers:
                        log_path = cluster.state.work_dir(worker.id) / "agent.jsonl"
                        if log_path.exists():
                            for record in read_jsonl(log_path):
                                if record.get("event") == "start":
                                    started.setdefault(int(record["job_id"]), float(record["time"]))
                    progress(f"burst: {len(started)} of {settings.burst_jobs} started")
    finally:
        await trio.to_thread.run_sync(cluster.down)
    elapsed = max(started.values()) - submitted_at if len(started) >= settings.burst_jobs else None
    return BurstResult(
        burst_jobs=settings.burst_jobs,
        burst_started=len(started),
        burst_s=None if elapsed is None else round(elapsed, 2),
        burst_placements_per_s=None if elapsed is None else round(settings.burst_jobs / elapsed, 1),
    )


async def run_scale_point(
    database_url: str,
    pending: int,
    workers: int,
    rounds: int,
    accounts: int = 1,
    device_share: float = 0.0,
    gang_share: float = 0.0,
) -> ScalePoint:
    """The real placer round against ``pending`` jobs of ``accounts`` accounts (round-robin;
    weights 1, 2 and 3 in turn) and ``workers`` simulated busy workers, each running 16 jobs of
    those accounts (with their active assignments, confirmed: proven workers). With
    ``device_share`` > 0 every worker offers 8 gpu units and about that share of the jobs asks
    1 to 4 of them (docs/devices.md); about ``gang_share`` of them are tasks of gangs of 2 to 8,
    a third of the gangs spread, stored as SubmitJob stores them
    (:func:`ops.bench.pack.queue.seed_queue`; docs/gangs.md).

    Raises:
        InvalidArgument: the shares do not fit (:func:`ops.bench.pack.queue.check_shares`).
    """
    check_shares(device_share, gang_share)
    rng = random.Random(pending + workers)
    async with asyncio_bridge(), BenchPlacer.open(database_url, workers=workers, rng=rng) as bench:
        await bench.add_busy_workers()
        # Its own generator, so the rounds free the same room with gangs or without.
        gang_tasks = await seed_queue(
            bench.db,
            pending=pending,
            accounts=accounts,
            device_share=device_share,
            gang_share=gang_share,
            rng=random.Random(pending),
        )
        if device_share > 0:
            await bench.db.execute(
                """UPDATE workers SET resources = '{"gpu": ["0","1","2","3","4","5","6","7"]}'::jsonb"""
            )
        # What the busy workers run: 16 jobs each, of the same accounts (fair share reads what
        # each account's running jobs hold in every round with two accounts queued).
        await bench.db.execute(
            "INSERT INTO jobs (name, cpu_millis, memory_mb, runtime, sleep_ms, state, started_at, owner)"
            " SELECT 'busy', 1000, 2000, 'sleep', 600000, 'running', now(), 'account-' || (i % $2)"
            " FROM generate_series(1, $1) i",
            16 * workers,
            accounts,
        )
        # Their runs, as a real cluster holds them: each busy worker's 16 active assignments,
        # confirmed an hour ago (the workers are proven, not on trial). Without them the
        # statistics say assignments is empty, and every read plans it as such.
        await bench.db.execute(
            "INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch,"
            " created_at, confirmed_at)"
            " SELECT j.id, 'w-' || k, k, j.cpu_millis, j.memory_mb, 1, now() - interval '1 hour',"
            " now() - interval '1 hour'"
            " FROM (SELECT id, cpu_millis, memory_mb, (row_number() OVER (ORDER BY id) - 1) % $1 + 1 AS k"
            " FROM jobs WHERE name = 'busy') j",
            workers,
        )
        await bench.db.execute(
            "UPDATE worker_allocations SET cpu_allocated_millis = 15900, memory_allocated_mb = 32000,"
            " unconfirmed_assignments = 0, confirmed_assignments = 16"
        )
        await bench.db.execute("DELETE FROM accounts")
        if accounts > 1:
            await bench.db.execute(
                "INSERT INTO accounts (name, weight) SELECT 'account-' || k, 1 + k % 3"
                " FROM generate_series(0, $1 - 1) k",
                accounts,
            )
        await bench.db.execute("ANALYZE")
        first_ms, _ = await bench.round(free_room=False)  # reads the whole queue once
        times = [(await bench.round())[0] for _ in range(rounds)]
    p50, p99, top = percentiles_ms(times)
    return ScalePoint(
        pending=pending,
        workers=workers,
        first_round_ms=round(first_ms, 1),
        round_p50_ms=p50,
        round_p99_ms=p99,
        round_max_ms=top,
        placed=bench.placer.stats.placements,
        accounts=accounts,
        device_share=device_share,
        gang_share=gang_share,
        gang_tasks=gang_tasks,
        failed_rounds=bench.failed_rounds,
    )


def run_pack(settings: PackSettings, root: Path, progress: Callable[[str], None]) -> PackReport:
    """Run every scenario ``settings`` asks for, one after the other, each in a folder of
    ``root``: every policy all at once (and arriving, unless ``arrival_rate_per_s`` is 0),
    then the burst and the scale curve (on an embedded PostgreSQL of its own); ``progress`` is
    called with a line now and then.

    Raises:
        ClusterError: a cluster could not be started.
        EmbeddedPostgresError: the scale curve's database could not be started.
        InvalidArgument: the scale curve's device and gang shares do not fit one queue
            (:func:`ops.bench.pack.queue.check_shares`); nothing ran.
    """
    if settings.scale:
        check_shares(settings.scale_device_share, settings.scale_gang_share)
    all_at_once: list[PolicyResult] = []
    arriving: list[PolicyResult] = []
    if settings.docker:
        name = settings.policies[0]
        for docker, where in ((False, "fleets"), (True, "containers")):
            result = trio.run(
                functools.partial(
                    run_policy, settings, name, root / f"{name}-{where}", progress, docker=docker
                )
            )
            all_at_once.append(attrs.evolve(result, policy=f"{name} in {where}"))
        return PackReport(
            settings=settings,
            all_at_once=Scenario(
                title="all at once: workers in fleets, and in containers", policies=tuple(all_at_once)
            ),
            arriving=None,
            burst=None,
            scale=(),
        )
    for name in () if settings.only_scale else settings.policies:
        all_at_once.append(trio.run(run_policy, settings, name, root / name, progress))
        if settings.arrival_rate_per_s > 0:
            arriving.append(
                trio.run(
                    functools.partial(
                        run_policy,
                        settings,
                        name,
                        root / f"{name}-arriving",
                        progress,
                        arrival_rate_per_s=settings.arrival_rate_per_s,
                    )
                )
            )
    burst = (
        trio.run(run_burst, settings, root / "burst", progress)
        if settings.burst and not settings.only_scale
        else None
    )
    scale: list[ScalePoint] = []
    if settings.scale:
        server = EmbeddedPostgres(data_dir=root / "scale-pg", port=free_port())
        url = server.start()
        try:
            for n_workers in settings.scale_workers:
                for pending in settings.scale_pending:
                    progress(
                        f"scale: {pending} pending, {n_workers} workers, {settings.scale_accounts} accounts"
                    )
                    scale.append(
                        trio.run(
                            run_scale_point,
                            url,
                            pending,
                            n_workers,
                            settings.scale_rounds,
                            settings.scale_accounts,
                            settings.scale_device_share,
                            settings.scale_gang_share,
                        )
                    )
        finally:
            server.stop()
    return PackReport(
        settings=settings,
        all_at_once=Scenario(title="all at once", policies=tuple(all_at_once)),
        arriving=(
            Scenario(title=f"arriving at {settings.arrival_rate_per_s:g} jobs/s", policies=tuple(arriving))
            if settings.arrival_rate_per_s > 0
            else None
        ),
        burst=burst,
        scale=tuple(scale),
    )

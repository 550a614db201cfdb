"""``stockade bench scale``: what heartbeats and placement cost as the worker count doubles.

For each worker count N, on a fresh cluster (3 control planes, embedded PostgreSQL with
``pg_stat_statements``): N workers (:mod:`ops.bench.loadgen`, or real agents with
``--real-agents``) hold sleep jobs while ``pending_jobs`` more wait (topped up every second);
after a warm-up (the jobs running, and the heartbeat interval unchanged for
:data:`ops.bench.settings.SETTLED_S`) one window of ``duration_s`` is measured from outside the
control plane. Early in it a few workers holding long jobs are killed and their jobs timed, by
database time, to their new assignments confirmed running. The figures:
:class:`ops.bench.scale_report.ScalePoint`.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from actors.heartbeat_policy import HeartbeatPolicy, default_policy
from ops.bench import heartbeat_flags
from ops.bench.measure_heartbeat import table_update_counts
from ops.bench.metrics import MetricsDelta, cpu_seconds, cpu_used, per_1000, read_metrics
from ops.bench.pack.figures import histogram_quantile
from ops.bench.scale_report import REAL_AGENTS_LIMIT, ScalePoint, ScaleReport
from ops.bench.settings import ScaleSettings
from ops.cluster import LocalCluster, StateDir
from ops.launcher.pg import EmbeddedPostgres
from ops.launcher.ports import free_port
from ops.launcher.state import ClusterConfig
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.errors import StockadeError
from runtime.settings.agent import AgentSettings
from runtime.settings.leader import ReconcilerSettings

__all__ = ["ScaleSettings", "run_scale"]

WORKER_CPU_MILLIS = 1000
WORKER_MEMORY_MB = 1024
JOB_CPU_MILLIS = 500
"""Every job asks half a worker: two per worker."""
JOB_MEMORY_MB = 256
LONG_JOB_MS = 3_600_000
"""Long jobs (held by the workers that are killed) outlast any step."""
LONG_PRIORITY = 10
"""Long jobs go before the queue, so a killed worker's jobs are placed again first."""
WARM_UP_TIMEOUT_S = 120.0
RECOVERY_TIMEOUT_S = 60.0
"""How long after the window the killed workers' jobs are waited for."""


def _agent_default(name: str) -> float:
    """The default of the agent setting ``name`` (seconds)."""
    return float(getattr(attrs.fields(AgentSettings), name).default)


def _untold_policy(fixed_s: float | None) -> HeartbeatPolicy:
    """What the control planes tell while the leader chose no policy: their defaults, or the
    bench's fixed interval and 5 times it."""
    if fixed_s is None:
        return default_policy(ReconcilerSettings())
    return HeartbeatPolicy(interval_ms=round(fixed_s * 1000), dead_after_ms=round(5 * fixed_s * 1000))


class BenchFailed(StockadeError):
    """The bench could not run a step (the message says what failed)."""


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


# -- SQL the bench reads --------------------------------------------------------------------

PENDING = "SELECT count(*) FROM jobs WHERE state = 'pending'"
CONFIRMED = "SELECT count(*) FROM assignments WHERE state = 'active' AND confirmed_at IS NOT NULL"
NOW = "SELECT extract(epoch FROM now())::float8"
POLICY = "SELECT interval_ms, dead_after_ms FROM heartbeat_policy"
"""The heartbeat interval and dead_after the leader chose (no row: the control planes' defaults)."""
POLICY_AGE = """
SELECT coalesce(extract(epoch FROM now() - max(decided_at))::float8, 'Infinity') FROM heartbeat_policy
"""
"""Seconds since the leader last chose an interval (infinite: it has not; the defaults hold)."""
STATEMENTS = """
SELECT coalesce(sum(total_exec_time), 0)::float8, coalesce(sum(calls), 0)::float8
  FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
"""
# Workers holding confirmed long jobs, busiest first.
HOLDERS = """
SELECT a.worker_id, count(*) AS held
  FROM assignments a JOIN jobs j ON j.id = a.job_id
 WHERE a.state = 'active' AND a.confirmed_at IS NOT NULL AND j.name LIKE 'scale-long-%'
 GROUP BY a.worker_id ORDER BY held DESC, a.worker_id
"""
ACTIVE_ON = "SELECT job_id FROM assignments WHERE state = 'active' AND worker_id = ANY($1::text[])"
# $1 the lost jobs, $2 the killed workers, $3 the kill (unix s, database time). For each lost
# job placed again elsewhere: seconds from the kill to its first new assignment (placed) and to
# the first one confirmed running (NULL while none is).
MOVED = """
SELECT job_id, extract(epoch FROM min(confirmed_at))::float8 - $3 AS seconds,
       extract(epoch FROM min(created_at))::float8 - $3 AS placed_s
  FROM assignments
 WHERE job_id = ANY($1::bigint[]) AND worker_id <> ALL($2::text[]) AND created_at >= to_timestamp($3)
 GROUP BY job_id
"""
# $1 the killed workers, $2 the kill (unix s, database time): seconds from the kill to each
# one's death declared (NULL: none was).
DECLARED = """
SELECT array_agg(extract(epoch FROM declared_at)::float8 - $2) FROM worker_deaths
 WHERE worker_id = ANY($1::text[]) AND declared_at >= to_timestamp($2)
"""
DEATHS = """
SELECT worker_id FROM worker_deaths WHERE declared_at BETWEEN to_timestamp($1) AND to_timestamp($2)
"""
ELECTIONS = (
    "SELECT count(*) FROM lease_history WHERE acquired_at BETWEEN to_timestamp($1) AND to_timestamp($2)"
)


# -- the load generator's process -----------------------------------------------------------


@attrs.define
class LoadGenProcess:
    """``python -m ops.bench.loadgen`` as a child: commands on its stdin, JSON lines on its stdout."""

    process: subprocess.Popen[str]

    @classmethod
    def start(cls, args: Sequence[str], log_path: Path) -> LoadGenProcess:
        log = log_path.open("w")
        process = subprocess.Popen(
            [sys.executable, "-m", "ops.bench.loadgen", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            bufsize=1,
        )
        log.close()
        return cls(process)

    async def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        """The next line whose ``event`` is ``event``.

        Raises:
            BenchFailed: it exited, or said nothing such within ``timeout_s``.
        """
        assert self.process.stdout is not None
        with trio.move_on_after(timeout_s):
            while True:
                line = await trio.to_thread.run_sync(self.process.stdout.readline, abandon_on_cancel=True)
                if not line:
                    raise BenchFailed(f"the load generator exited (code {self.process.poll()})")
                message: dict[str, Any] = json.loads(line)
                if message.get("event") == event:
                    return message
        raise BenchFailed(f"the load generator said no {event!r} within {timeout_s:g} s")

    async def ask(self, command: dict[str, Any], event: str, timeout_s: float = 30.0) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return await self.expect(event, timeout_s)

    def stop(self) -> None:
        """Ask it to stop; kill it when it has not within 5 s."""
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.write('{"cmd": "stop"}\n')
                self.process.stdin.close()
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.process.kill()
                self.process.wait()


# -- one step -------------------------------------------------------------------------------


def _specs(settings: ScaleSettings, count: int, first: int, rng: random.Random) -> list[pb.JobSpec]:
    low, high = settings.job_s
    return [
        pb.JobSpec(
            name=f"scale-{i}",
            cpu_millis=JOB_CPU_MILLIS,
            memory_mb=JOB_MEMORY_MB,
            sleep=pb.SleepRuntime(duration_ms=int(rng.uniform(low, high) * 1000)),
        )
        for i in range(first, first + count)
    ]


async def _submit(client: ControlPlaneClient, specs: Sequence[pb.JobSpec]) -> None:
    for start in range(0, len(specs), 2000):
        await client.call(
            "submit_jobs", pb.SubmitJobsRequest(specs=list(specs[start : start + 2000])), timeout_s=60
        )


@attrs.define
class _Step:
    settings: ScaleSettings
    workers: int
    root: Path
    progress: Callable[[str], None]
    pg: EmbeddedPostgres | None = None
    cluster: LocalCluster | None = None
    loadgen: LoadGenProcess | None = None

    @property
    def real(self) -> bool:
        return self.settings.real_agents and self.workers <= REAL_AGENTS_LIMIT

    def stop(self) -> None:
        """Stop everything this step started (also after a failure or Ctrl-C)."""
        if self.loadgen is not None:
            self.loadgen.stop()
        if self.cluster is not None:
            try:
                self.cluster.down()
            except StockadeError as exc:
                self.progress(f"stopping the cluster: {exc}")
        if self.pg is not None:
            self.pg.stop()

    def _start(self) -> ClusterConfig:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        fixed_s = self.settings.heartbeat_interval_s
        interval_s = _agent_default("heartbeat_interval_s") if fixed_s is None else fixed_s
        timeout_s = _agent_default("heartbeat_timeout_s") if fixed_s is None else 1.5 * fixed_s
        fence_s = _agent_default("self_fence_after_s") if fixed_s is None else 3.5 * fixed_s
        self.pg = EmbeddedPostgres(
            data_dir=self.root / "pg", port=free_port(), preload_libraries=("pg_stat_statements",)
        )
        url = self.pg.start()
        cp_args, agent_args = ((), ()) if fixed_s is None else heartbeat_flags(fixed_s)
        self.cluster = LocalCluster(
            StateDir(self.root / "cluster"),
            database_url=url,
            cp_args=cp_args,
            agent_args=agent_args,
            # At least four fleets, so killing one leaves workers to take its jobs.
            fleet_size=min(self.settings.fleet_size, max(1, -(-self.workers // 4))),
            worker_capacities=((WORKER_CPU_MILLIS, WORKER_MEMORY_MB),),
            metrics=True,
            insecure=self.settings.insecure,
        )
        self.cluster.up(control_planes=3, workers=self.workers if self.real else 0, timeout_s=300)
        config = self.cluster.config()
        if not self.real:
            from ops.bench.loadgen.generator import worker_ids
            from ops.certs import ensure_issued

            args = ["--control-planes", ",".join(config.control_plane_addresses)]
            args += f"--workers {self.workers} --cpu-millis {WORKER_CPU_MILLIS}".split()
            args += f"--memory-mb {WORKER_MEMORY_MB} --interval-s {interval_s:g}".split()
            args += f"--timeout-s {timeout_s:g} --self-fence-s {fence_s:g}".split()
            if self.settings.insecure:
                args.append("--insecure")
            else:
                cert_dir = self.cluster.state.cert_dir
                ensure_issued(cert_dir, [("worker", w) for w in worker_ids(self.workers)])
                args += ["--cert-dir", str(cert_dir)]
            self.loadgen = LoadGenProcess.start(args, self.root / "loadgen.log")
        return config

    async def run(self) -> ScalePoint:
        settings = self.settings
        mode = "real_agents" if self.real else "loadgen"
        self.progress(f"{self.workers} workers ({mode}): starting the cluster")
        config = await trio.to_thread.run_sync(self._start)
        assert self.pg is not None and self.cluster is not None
        metrics = config.metrics_addresses()
        cp_ids = [spec.id for spec in config.control_planes]
        cp_metrics = [metrics[i] for i in cp_ids if i in metrics]
        agent_metrics = [a for i, a in metrics.items() if i not in cp_ids]
        rng = random.Random(settings.seed)
        async with asyncio_bridge():
            db = await PgConnection.connect(self.pg.url())
            client = ControlPlaneClient(config.control_plane_addresses, timeout_s=10.0, tls=config.client_tls)
            try:
                await db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                if self.loadgen is not None:
                    await self.loadgen.expect("registered", timeout_s=WARM_UP_TIMEOUT_S + self.workers / 10)
                long_jobs = [
                    pb.JobSpec(
                        name=f"scale-long-{i}",
                        cpu_millis=JOB_CPU_MILLIS,
                        memory_mb=JOB_MEMORY_MB,
                        priority=LONG_PRIORITY,
                        sleep=pb.SleepRuntime(duration_ms=LONG_JOB_MS),
                    )
                    for i in range(2 * settings.kills)
                ]
                await _submit(client, long_jobs)
                submitted = 2 * self.workers + settings.pending_jobs
                await _submit(client, _specs(settings, submitted, 0, rng))
                self.progress(f"{self.workers} workers: warming up")
                with trio.move_on_after(WARM_UP_TIMEOUT_S):
                    while await db.fetchval(CONFIRMED) < 1.5 * self.workers:  # noqa: ASYNC110 (polls the database)
                        await trio.sleep(0.5)
                # The window measures a cluster that has run a while: the interval chosen from a
                # start's costs (registrations, first connections) is held for SHRINK_AFTER_S.
                self.progress(f"{self.workers} workers: waiting for the heartbeat interval to settle")
                with trio.move_on_after(WARM_UP_TIMEOUT_S):
                    while await db.fetchval(POLICY_AGE) < settings.settle_s:  # noqa: ASYNC110 (polls the database)
                        await trio.sleep(1.0)
                await trio.sleep(3 * await self._interval_s(db))
                return await self._window(db, client, config, cp_metrics, agent_metrics, rng, submitted, mode)
            finally:
                client.close()
                await db.close()

    async def _window(
        self,
        db: PgConnection,
        client: ControlPlaneClient,
        config: ClusterConfig,
        cp_metrics: Sequence[str],
        agent_metrics: Sequence[str],
        rng: random.Random,
        submitted: int,
        mode: str,
    ) -> ScalePoint:
        settings = self.settings
        assert self.pg is not None and self.cluster is not None
        pg = self.pg
        cluster = self.cluster
        pg_pid = int((self.pg.pgdata / "postmaster.pid").read_text().split()[0])
        cp_pids = [p for i, p in cluster.pids(config).items() if i.startswith("cp-")]
        pending: list[int] = []
        self.progress(f"{self.workers} workers: measuring {settings.duration_s:g} s")

        async def top_up() -> None:
            nonlocal submitted
            own = await PgConnection.connect(pg.url())  # one caller per connection
            try:
                while True:
                    count = int(await own.fetchval(PENDING))
                    pending.append(count)
                    if count < settings.pending_jobs:
                        missing = min(settings.pending_jobs - count, 5000)
                        await _submit(client, _specs(settings, missing, submitted, rng))
                        submitted += missing
                    await trio.sleep(1.0)
            finally:
                with trio.CancelScope(shield=True):
                    await own.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(top_up)
            await db.execute("SELECT pg_stat_statements_reset()")
            before = await trio.to_thread.run_sync(read_metrics, [*cp_metrics, *agent_metrics])
            cp_before, db_before = cpu_seconds(cp_pids), cpu_seconds([pg_pid], with_children=True)
            gen_pid = [self.loadgen.process.pid] if self.loadgen is not None else []
            gen_before = cpu_seconds(gen_pid)
            if self.loadgen is not None:
                await self.loadgen.ask({"cmd": "stats", "reset": True}, "stats")
            t0 = float(await db.fetchval(NOW))
            updates_before = await table_update_counts(db)
            await trio.sleep(min(settings.duration_s / 3, 10.0))
            killed, kill_at, lost = await self._kill(db, config)
            await trio.sleep_until(
                trio.current_time() + settings.duration_s - min(settings.duration_s / 3, 10.0)
            )
            t1 = float(await db.fetchval(NOW))
            updates = await table_update_counts(db) - updates_before
            after = await trio.to_thread.run_sync(read_metrics, [*cp_metrics, *agent_metrics])
            cp_cpu = cpu_used(cp_before, cpu_seconds(cp_pids))
            db_cpu = cpu_used(db_before, cpu_seconds([pg_pid], with_children=True))
            gen_cpu = cpu_used(gen_before, cpu_seconds(gen_pid)) if gen_pid else None
            exec_ms, calls = await db.fetchrow(STATEMENTS) or (None, None)
            stats = await self.loadgen.ask({"cmd": "stats"}, "stats") if self.loadgen is not None else None
            moved, placed = await self._recovery(db, lost, killed, kill_at)
            declared = await db.fetchval(DECLARED, killed, kill_at)
            nursery.cancel_scope.cancel()
        told = await db.fetchrow(POLICY)
        untold = _untold_policy(settings.heartbeat_interval_s)
        deaths = [r[0] for r in await db.fetch(DEATHS, t0, float(await db.fetchval(NOW)))]
        elections = int(await db.fetchval(ELECTIONS, t0, t1))
        delta = MetricsDelta.of(before, after)
        heartbeats = delta.heartbeats
        rounds = delta.rounds
        if stats is not None:
            ack_p50, ack_p99 = stats["ack_p50_ms"], stats["ack_p99_ms"]
            acked = int(stats["acks"])
            failures, reregisters, fences = stats["failures"], stats["reregisters"], stats["self_fences"]
        else:
            trips = delta.round_trips
            ack_p50, ack_p99 = _ms(histogram_quantile(0.5, trips)), _ms(histogram_quantile(0.99, trips))
            acked = int(trips[-1][1]) if trips else 0
            failures, reregisters, fences = int(delta.agent_failures), 0, 0
        window_s = t1 - t0
        return ScalePoint(
            workers=self.workers,
            mode=mode,
            duration_s=round(window_s, 3),
            heartbeat_interval_s=told[0] / 1000 if told else untold.interval_ms / 1000,
            dead_after_s=told[1] / 1000 if told else untold.dead_after_ms / 1000,
            heartbeats=int(heartbeats),
            heartbeats_per_s=round(heartbeats / window_s, 2) if window_s > 0 else 0.0,
            heartbeats_acked=acked,
            ack_p50_ms=ack_p50,
            ack_p99_ms=ack_p99,
            heartbeat_failures=failures,
            reregisters=reregisters,
            self_fences=fences,
            cp_cpu_s_per_1000_heartbeats=per_1000(cp_cpu, heartbeats),
            db_cpu_s_per_1000_heartbeats=per_1000(db_cpu, heartbeats),
            db_exec_ms_per_1000_heartbeats=per_1000(exec_ms, heartbeats),
            db_calls_per_heartbeat=round(calls / heartbeats, 3)
            if calls is not None and heartbeats > 0
            else None,
            loadgen_cpu_s_per_1000_heartbeats=per_1000(gen_cpu, heartbeats),
            false_deaths=len([w for w in deaths if w not in killed]),
            deaths=len(deaths),
            elections=elections,
            pending_p50=int(statistics.median(pending)) if pending else None,
            placer_rounds=int(rounds[-1][1]) if rounds else 0,
            placer_round_p50_ms=_ms(histogram_quantile(0.5, rounds)),
            placer_round_p99_ms=_ms(histogram_quantile(0.99, rounds)),
            killed_workers=tuple(killed),
            jobs_moved=len(moved),
            jobs_not_moved=len(lost) - len(moved),
            recovery_p50_s=round(statistics.median(moved), 3) if moved else None,
            recovery_max_s=round(max(moved), 3) if moved else None,
            recovery_declared_p50_s=round(statistics.median(declared), 3) if declared else None,
            recovery_placed_p50_s=round(statistics.median(placed), 3) if placed else None,
            workers_updates=updates.updates,
            workers_hot_share=round(updates.hot_share, 4),
            workers_dead_rows=updates.dead_rows,
            cp_gc_pauses_over_100_ms=delta.gc_pauses_over(0.1),
            loadgen_gc_pause_max_ms=None if stats is None else stats.get("gc_pause_max_ms"),
        )

    async def _interval_s(self, db: PgConnection) -> float:
        """The heartbeat interval in force, in seconds."""
        told = await db.fetchrow(POLICY)
        if told:
            return float(told[0]) / 1000
        return self.settings.heartbeat_interval_s or _agent_default("heartbeat_interval_s")

    async def _kill(self, db: PgConnection, config: ClusterConfig) -> tuple[list[str], float, list[int]]:
        """Kill workers holding long jobs: ``kills`` simulated ones, or the fleet of the busiest
        real one. Returns the killed ids, the kill's database time and their active jobs."""
        holders = [r[0] for r in await db.fetch(HOLDERS)]
        fleet: str | None = None
        if self.loadgen is None:
            assert self.cluster is not None
            hosting = {w.id: p.id for p in config.processes for w in config.workers_in(p.id)}
            fleet = hosting.get(holders[0]) if holders else None
            if fleet is None:
                return [], 0.0, []
            targets = [w.id for w in config.workers_in(fleet)]
        else:
            targets = holders[: self.settings.kills]
        if not targets:
            return [], 0.0, []
        lost = [int(r[0]) for r in await db.fetch(ACTIVE_ON, targets)]
        kill_at = float(await db.fetchval(NOW))
        if self.loadgen is not None:
            await self.loadgen.ask({"cmd": "kill", "ids": targets}, "killed")
        elif self.cluster is not None and fleet is not None:
            await trio.to_thread.run_sync(self.cluster.kill, fleet)
        self.progress(f"{self.workers} workers: killed {', '.join(targets)} holding {len(lost)} jobs")
        return targets, kill_at, lost

    async def _recovery(
        self, db: PgConnection, lost: list[int], killed: list[str], kill_at: float
    ) -> tuple[list[float], list[float]]:
        """Seconds from the kill to each lost job's new assignment confirmed running elsewhere,
        waiting up to :data:`RECOVERY_TIMEOUT_S` for the last ones, and to each one's first new
        assignment (placed, confirmed or not yet)."""
        moved: dict[int, float] = {}
        placed: dict[int, float] = {}
        with trio.move_on_after(RECOVERY_TIMEOUT_S):
            while lost and len(moved) < len(lost):
                rows = await db.fetch(MOVED, lost, killed, kill_at)
                placed = {int(r[0]): float(r[2]) for r in rows}
                moved = {int(r[0]): float(r[1]) for r in rows if r[1] is not None}
                await trio.sleep(0.5)
        return sorted(moved.values()), sorted(placed.values())


async def run_scale(
    settings: ScaleSettings, root: Path, progress: Callable[[str], None] = print
) -> ScaleReport:
    """Run one step per worker count of ``settings`` (each on a fresh cluster under
    ``root/n-<N>``, stopped before the next starts) and return the report.

    Raises:
        BenchFailed: a step could not run (what it started is stopped first).
        ops.config.ClusterError: the cluster could not start.
    """
    points = []
    for count in settings.workers:
        step = _Step(settings=settings, workers=count, root=root / f"n-{count}", progress=progress)
        try:
            point = await step.run()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(step.stop)
        points.append(point)
        progress(
            f"{count} workers: {point.heartbeats_per_s} heartbeats/s, ack p99 {point.ack_p99_ms} ms, "
            f"false deaths {point.false_deaths}"
        )
    return ScaleReport(settings=settings.to_json(), points=tuple(points))

"""Grouped heartbeats against one statement per heartbeat, side by side (docs/design.md,
"Grouped heartbeats").

Drives ``--workers`` simulated workers through the ingest's own Heartbeat handler (no gRPC)
for ``--seconds``, with groups off and on (``--wait-s``), and, with ``--usage-every N``, grouped
again with every Nth heartbeat of a worker carrying usage samples (one per running assignment
and the worker's total, as an agent's every ``usage_interval_s``; docs/console.md, "Usage"); it
prints per mode the statements, commits and database server CPU per heartbeat (read from /proc:
a server on this machine only), this process's CPU, the handler's latency and the ``workers``
table's HOT updates::

    python -m ops.bench.measure_heartbeat_groups [--database-url URL] [--workers 300] [--seconds 10]
        [--usage-every 20]

Without ``--database-url`` it starts an embedded PostgreSQL (fsync on) in a temporary folder.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import trio

from actors import ingest, schema
from actors.ingest_gate import open_pool
from ops.bench.measure_heartbeat import UpdateCounts, _count_round_trips, table_update_counts
from ops.bench.measuring import measure_parser, run_on_database
from protocol import pb
from runtime.aio import PgConnection
from runtime.idempotency_keys import new_idempotency_key
from runtime.settings.control_plane import IngestSettings

CP_ID = "cp-m"
COMMITS = (
    "SELECT xact_commit FROM pg_stat_database, pg_stat_clear_snapshot() WHERE datname = current_database()"
)
PLACE = """
WITH made AS (
    INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch)
    SELECT j, $2, $3, 10, 1, 0 FROM unnest($1::bigint[]) j RETURNING id
)
SELECT array_agg(id) FROM made
"""
"""Assignments of the jobs $1 on worker $2 at incarnation $3, by hand (no leader runs here)."""
INGEST_PIDS = "SELECT pid FROM pg_stat_activity WHERE application_name = $1"
STATS_SETTLE_S = 1.5
"""Statistics reach pg_stat_* up to about a second after the transactions that made them."""


def _server_cpu_s(pids: list[int]) -> float:
    """User and system CPU of these (server) processes, in seconds; 0 for one not on this
    machine."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / tick


async def _setup(url: str, workers: int, running: int) -> list[pb.HeartbeatRequest]:
    """Register the workers and place ``running`` sleep jobs on each; their heartbeat requests."""
    await schema.apply_schema(url)
    pool = await open_pool(CP_ID, url, IngestSettings(heartbeat_group_wait_s=0))
    try:
        service = ingest.ControlPlaneService(cp_id=CP_ID, pool=pool)
        requests = []
        for n in range(workers):
            reg = await service.register_worker(
                pb.RegisterWorkerRequest(
                    worker_id=f"w-{n}",
                    address="127.0.0.1:9",
                    cpu_millis=64000,
                    memory_mb=65536,
                    agent_run_id=new_idempotency_key(),
                    registration_seq=1,
                )
            )
            requests.append(pb.HeartbeatRequest(worker_id=f"w-{n}", incarnation=reg.incarnation))
        if running:
            spec = pb.JobSpec(
                name="m", cpu_millis=10, memory_mb=1, sleep=pb.SleepRuntime(duration_ms=3_600_000)
            )
            submitted = await service.submit_jobs(
                pb.SubmitJobsRequest(
                    specs=[spec] * (workers * running), idempotency_key=new_idempotency_key()
                )
            )
            job_ids = list(submitted.job_ids)
            async with pool.acquire() as conn:
                for n, request in enumerate(requests):
                    mine = job_ids[n * running : (n + 1) * running]
                    ids = await conn.fetchval(PLACE, mine, request.worker_id, request.incarnation)
                    request.running_assignment_ids = list(ids)
                await conn.execute("UPDATE jobs SET state = 'assigned'")
        return requests
    finally:
        await pool.close()


def with_usage(request: pb.HeartbeatRequest) -> pb.HeartbeatRequest:
    """``request`` carrying a usage sample of each running assignment and of the whole worker."""
    samples = [
        pb.UsageSample(assignment_id=a, cpu_millis=1900, memory_mb=40, span_ms=5000)
        for a in [*request.running_assignment_ids, 0]
    ]
    return pb.HeartbeatRequest(
        worker_id=request.worker_id,
        incarnation=request.incarnation,
        running_assignment_ids=list(request.running_assignment_ids),
        usage=samples,
    )


async def measure_mode(
    url: str,
    requests: list[pb.HeartbeatRequest],
    *,
    wait_s: float,
    seconds: float,
    interval_s: float,
    usage_every: int = 0,
) -> dict[str, Any]:
    """Heartbeat every worker each ``interval_s`` for ``seconds`` through a fresh ingest service
    with ``heartbeat_group_wait_s = wait_s``, every ``usage_every``-th heartbeat of a worker
    carrying usage samples (0: none); what it cost. Its pool is closed before the database's
    counts are read: a server process hands its statistics over when it ends (an idle one may
    keep them up to 10 s)."""
    settings = IngestSettings(heartbeat_group_wait_s=wait_s)
    admin = await PgConnection.connect(url)
    try:
        await trio.sleep(STATS_SETTLE_S)
        commits = await admin.fetchval(COMMITS)
        updates: UpdateCounts = await table_update_counts(admin)
        pool = await open_pool(CP_ID, url, settings)
        try:
            service = ingest.ControlPlaneService(cp_id=CP_ID, pool=pool, settings=settings)
            pids = [r["pid"] for r in await admin.fetch(INGEST_PIDS, f"stockade {CP_ID} ingest")]
            latencies_s: list[float] = []
            failures = [0]

            async def worker(request: pb.HeartbeatRequest, first_at: float, stop_at: float) -> None:
                due, beats, used = first_at, random.randrange(max(1, usage_every)), with_usage(request)
                while due < stop_at:
                    await trio.sleep_until(due)
                    beats += 1
                    started = time.perf_counter()
                    try:
                        await service.heartbeat(used if usage_every and beats % usage_every == 0 else request)
                        latencies_s.append(time.perf_counter() - started)
                    except Exception:
                        failures[0] += 1
                    due += interval_s

            counter = _count_round_trips()
            async with trio.open_nursery() as nursery:
                if wait_s > 0:
                    await nursery.start(service.run_heartbeat_group)
                cpu_s, server_s = time.process_time(), _server_cpu_s(pids)
                begin = trio.current_time()
                async with trio.open_nursery() as fleet:
                    for request in requests:
                        first_at = begin + random.uniform(0, interval_s)
                        fleet.start_soon(worker, request, first_at, begin + seconds)
                cpu_s, server_s = time.process_time() - cpu_s, _server_cpu_s(pids) - server_s
                trips = counter[0]
                nursery.cancel_scope.cancel()
        finally:
            await pool.close()
        await trio.sleep(STATS_SETTLE_S)
        commits = await admin.fetchval(COMMITS) - commits
        updates = await table_update_counts(admin) - updates
    finally:
        await admin.close()
    count = len(latencies_s)
    latencies_s.sort()
    return {
        "heartbeat_group_wait_s": wait_s,
        "usage_every": usage_every,
        "heartbeats": count,
        "failed": failures[0],
        "statements_per_heartbeat": trips / count,
        "commits_per_heartbeat": commits / count,
        "server_cpu_us_per_heartbeat": server_s / count * 1e6,
        "process_cpu_ms_per_1000": cpu_s / count * 1e6,
        "p50_ms": latencies_s[count // 2] * 1000,
        "p99_ms": latencies_s[int(count * 0.99)] * 1000,
        "workers_updates_per_heartbeat": updates.updates / count,
        "workers_hot_share": updates.hot_share,
    }


def main() -> None:
    parser = measure_parser(__doc__, database_help="a database to use (its schema is applied)")
    parser.add_argument("--workers", type=int, default=300, help="simulated workers")
    parser.add_argument("--interval-s", type=float, default=0.25, help="each worker's heartbeat interval")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per mode")
    parser.add_argument("--running", type=int, default=2, help="running assignments each worker lists")
    parser.add_argument(
        "--wait-s", type=float, default=0.005, help="heartbeat_group_wait_s of the grouped run"
    )
    parser.add_argument(
        "--usage-every",
        type=int,
        default=0,
        help="also run grouped with every Nth heartbeat of a worker carrying usage samples (0: not)",
    )
    args = parser.parse_args()
    modes = [(0.0, 0), (args.wait_s, 0), *([(args.wait_s, args.usage_every)] if args.usage_every > 0 else [])]

    async def run(url: str) -> list[dict[str, Any]]:
        requests = await _setup(url, args.workers, args.running)
        common = {"seconds": args.seconds, "interval_s": args.interval_s}
        return [
            await measure_mode(url, requests, wait_s=wait_s, usage_every=every, **common)
            for wait_s, every in modes
        ]

    results = run_on_database(args.database_url, run)
    fleet = f"{args.workers} workers every {args.interval_s:g} s, {args.running} running each"
    print(f"{fleet}, {args.seconds:g} s a mode")
    for key in results[0]:
        values = [r[key] for r in results]
        shown = [f"{v:14.3f}" if isinstance(v, float) else f"{v:14}" for v in values]
        print(f"  {key:32}" + "".join(shown))
    single, grouped = results[:2]
    for key in ("statements_per_heartbeat", "commits_per_heartbeat"):
        if grouped[key] > 0:
            print(f"  {key} single / grouped: {single[key] / grouped[key]:.1f}x")
    print(database_cpu_ratio_line(single, grouped))


def database_cpu_ratio_line(single: dict[str, Any], grouped: dict[str, Any]) -> str:
    """How many times less database CPU a grouped heartbeat costs than a single one, both in µs."""
    one, many = single["server_cpu_us_per_heartbeat"], grouped["server_cpu_us_per_heartbeat"]
    ratio = f"{one / many:.1f}x" if many > 0 else "n/a (no grouped CPU measured)"
    return f"database CPU per heartbeat, single / grouped: {one:.0f} / {many:.0f} µs = {ratio}"


if __name__ == "__main__":
    main()

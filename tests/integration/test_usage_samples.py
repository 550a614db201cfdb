"""Usage samples on a real PostgreSQL: carried by heartbeats through the real ingest (grouped or
alone), stored per job and per worker, read back as the console's series, and swept after their
retention (docs/console.md, "Usage")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from serving import ingest_and_leader
from test_console import console_on, get, seed_cluster
from test_leave import EPOCH, Cluster

from actors import queries
from actors.queries import console as q
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.errors import InvalidArgument


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Cluster(cp=cp, admin=admin, database_url=database_url)


async def db_execute(database_url: str, sql: str, *args: Any) -> None:
    """Run ``sql`` on a connection of its own (beside a console, which has its own loop)."""
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            await db.execute(sql, *args)
        finally:
            await db.close()


def used(assignment_id: int, cpu_millis: int, memory_mb: int = 10) -> pb.UsageSample:
    return pb.UsageSample(
        assignment_id=assignment_id, cpu_millis=cpu_millis, memory_mb=memory_mb, span_ms=5000
    )


async def heartbeat(
    cluster: Cluster,
    worker_id: str,
    incarnation: int,
    running: list[int],
    usage: list[pb.UsageSample],
    **more: Any,
) -> pb.HeartbeatReply:
    reply: pb.HeartbeatReply = await cluster.cp.call(
        "heartbeat",
        pb.HeartbeatRequest(
            worker_id=worker_id, incarnation=incarnation, running_assignment_ids=running, usage=usage, **more
        ),
    )
    return reply


async def stored(cluster: Cluster) -> list[tuple[Any, ...]]:
    rows = await cluster.admin.fetch(
        "SELECT worker_id, job_id, assignment_id, cpu_millis, memory_mb, span_ms FROM usage_samples"
        " ORDER BY at, worker_id, assignment_id NULLS FIRST"
    )
    return [tuple(r) for r in rows]


async def test_a_liveness_heartbeats_samples_are_stored_per_job_and_for_the_worker(cluster: Cluster) -> None:
    """A grouped heartbeat's samples are stored: its job's with the job id, the worker's total
    with none; a sample naming an assignment of another worker (or none) is dropped."""
    i1 = await cluster.register("w-1")
    i2 = await cluster.register("w-2")
    job = await cluster.submit()
    mine = await cluster.place(job, "w-1", i1)
    theirs = await cluster.place(await cluster.submit(), "w-2", i2)
    reply = await heartbeat(
        cluster, "w-1", i1, [mine, theirs], [used(mine, 1900, 12), used(0, 2050, 40), used(theirs, 5)]
    )
    assert not reply.reregister
    assert await stored(cluster) == [("w-1", None, None, 2050, 40, 5000), ("w-1", job, mine, 1900, 12, 5000)]


async def test_a_heartbeat_with_outcomes_stores_its_samples_too(cluster: Cluster) -> None:
    """A heartbeat recorded alone (it carries an outcome) stores its samples as a grouped one does."""
    incarnation = await cluster.register("w-1")
    job = await cluster.submit()
    assignment = await cluster.place(job, "w-1", incarnation)
    other = await cluster.submit()
    running = await cluster.place(other, "w-1", incarnation)
    done = pb.JobOutcome(
        assignment_id=assignment, job_id=job, state="succeeded", has_exit_code=True, exit_code=0
    )
    await heartbeat(cluster, "w-1", incarnation, [running], [used(running, 700)], finished=[done])
    assert await cluster.admin.fetchval("SELECT state FROM jobs WHERE id = $1", job) == "succeeded"
    assert await stored(cluster) == [("w-1", other, running, 700, 10, 5000)]


async def test_a_heartbeat_told_to_register_again_stores_no_sample(cluster: Cluster) -> None:
    """An unknown worker's (or a dead incarnation's) samples are not kept."""
    reply = await heartbeat(cluster, "w-9", 3, [], [used(0, 1000)])
    assert reply.reregister
    assert await stored(cluster) == []


async def test_too_many_samples_are_refused_with_nothing_stored(cluster: Cluster) -> None:
    """More samples than running assignments plus one: the heartbeat is refused, naming the field."""
    incarnation = await cluster.register("w-1")
    before = await cluster.admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'")
    with pytest.raises(InvalidArgument, match="usage must hold at most one per running assignment plus one"):
        await heartbeat(cluster, "w-1", incarnation, [], [used(0, 1), used(0, 2)])
    assert await stored(cluster) == []
    assert await cluster.admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'") == before


async def test_the_console_reads_a_jobs_and_a_workers_series_oldest_first(cluster: Cluster) -> None:
    """CONSOLE_JOB_USAGE and CONSOLE_WORKER_USAGE: the newest samples of the span, oldest first,
    with the database's now; none older than the span."""
    incarnation = await cluster.register("w-1")
    job = await cluster.submit()
    assignment = await cluster.place(job, "w-1", incarnation)
    await cluster.admin.execute(
        "INSERT INTO usage_samples (at, worker_id, job_id, assignment_id, cpu_millis, memory_mb, span_ms)"
        " VALUES (now() - interval '20 min', 'w-1', $1, $2, 5, 5, 5000),"
        "        (now() - interval '20 min', 'w-1', NULL, NULL, 5, 5, 5000)",
        job,
        assignment,
    )
    for cpu_millis in (1000, 1500, 1900):
        await heartbeat(
            cluster, "w-1", incarnation, [assignment], [used(assignment, cpu_millis), used(0, cpu_millis + 1)]
        )
    row = await cluster.admin.fetchrow(q.CONSOLE_JOB_USAGE, job, 900.0, 2)
    assert row is not None
    assert list(row["cpu_millis"]) == [1500, 1900]
    assert list(row["unix_s"]) == sorted(row["unix_s"]) and row["now_unix_s"] >= row["unix_s"][-1]
    row = await cluster.admin.fetchrow(q.CONSOLE_WORKER_USAGE, "w-1", 900.0, 10)
    assert row is not None
    assert list(row["cpu_millis"]) == [1001, 1501, 1901]
    row = await cluster.admin.fetchrow(q.CONSOLE_JOB_USAGE, job + 1000, 900.0, 10)
    assert row is not None and list(row["unix_s"]) == []


async def test_the_sweep_deletes_samples_past_their_retention_a_batch_at_a_time(cluster: Cluster) -> None:
    """SWEEP_USAGE_SAMPLES deletes at most its batch of the samples older than the retention and
    says how many; newer ones stay."""
    await cluster.admin.execute(
        "INSERT INTO usage_samples (at, worker_id, cpu_millis, memory_mb, span_ms)"
        " SELECT now() - make_interval(secs => s), 'w-1', s, 0, 5000 FROM generate_series(100, 104) s"
    )
    assert await cluster.admin.fetchval(queries.SWEEP_USAGE_SAMPLES, 50.0, 2) == 2
    assert await cluster.admin.fetchval(queries.SWEEP_USAGE_SAMPLES, 50.0, 10) == 3
    assert await cluster.admin.fetchval(queries.SWEEP_USAGE_SAMPLES, 50.0, 10) == 0
    await cluster.admin.execute(
        "INSERT INTO usage_samples (worker_id, cpu_millis, memory_mb, span_ms) VALUES ('w-1', 1, 1, 1)"
    )
    assert await cluster.admin.fetchval(queries.SWEEP_USAGE_SAMPLES, 50.0, 10) == 0
    assert await cluster.admin.fetchval("SELECT count(*) FROM usage_samples") == 1


async def test_the_job_and_worker_parts_show_the_newest_figures_and_the_charts(database_url: str) -> None:
    """A job's part shows its newest sample in cores and MiB beside what it asked, with both
    charts; its worker's part shows the worker's total; a job without samples says why."""
    job_id = await seed_cluster(database_url)
    await db_execute(
        database_url,
        "INSERT INTO usage_samples"
        " (at, worker_id, job_id, assignment_id, cpu_millis, memory_mb, span_ms)"
        " VALUES (now() - interval '10 s', 'w-1', $1, 1, 1200, 30, 5000),"
        "        (now() - interval '5 s', 'w-1', $1, 1, 1930, 41, 5000),"
        "        (now() - interval '5 s', 'w-1', NULL, NULL, 2400, 90, 5000)",
        job_id,
    )
    async with console_on(database_url) as console:
        _, _, job = await get(console, f"/part/jobs/{job_id}")
        _, _, worker = await get(console, "/part/workers/w-1")
        await db_execute(database_url, "DELETE FROM usage_samples WHERE job_id IS NOT NULL")
        _, _, unmeasured = await get(console, f"/part/jobs/{job_id}")
    assert 'id="usage-cpu" data-cpu-millis="1930">1.93 cores' in job and "of 0.50 asked" in job
    assert 'data-memory-mb="41">41 MiB' in job and "of 256 asked" in job
    assert 'id="usage-cpu-chart"' in job and 'id="usage-memory-chart"' in job and 'class="asked"' in job
    assert "2 samples over the last 15 min" in job
    assert 'data-cpu-millis="2400">2.40 cores' in worker and 'class="asked"' not in worker
    assert 'id="usage-none"' not in worker
    assert 'id="usage-none"' in unmeasured and "sleep and container jobs" in unmeasured


async def test_get_job_and_status_carry_the_newest_figures(cluster: Cluster) -> None:
    """GetJob's usage is its active run's newest sample (none once it ended); Status gives each
    worker its jobs' newest total."""
    incarnation = await cluster.register("w-1")
    job = await cluster.submit()
    assignment = await cluster.place(job, "w-1", incarnation)
    for cpu_millis in (1200, 1930):
        await heartbeat(
            cluster, "w-1", incarnation, [assignment], [used(assignment, cpu_millis, 41), used(0, 2400, 90)]
        )
    info = await cluster.cp.call("get_job", pb.GetJobRequest(job_id=job))
    assert info.usage is not None and (info.usage.cpu_millis, info.usage.memory_mb) == (1930, 41)
    assert 0 <= info.usage.age_s < 60
    status = await cluster.cp.call("status", pb.StatusRequest())
    (worker,) = status.workers
    assert worker.usage is not None and (worker.usage.cpu_millis, worker.usage.memory_mb) == (2400, 90)
    done = pb.JobOutcome(
        assignment_id=assignment, job_id=job, state="succeeded", has_exit_code=True, exit_code=0
    )
    await heartbeat(cluster, "w-1", incarnation, [], [], finished=[done])
    assert (await cluster.cp.call("get_job", pb.GetJobRequest(job_id=job))).usage is None


async def test_a_groups_statement_stores_the_samples_of_its_alive_members_only(cluster: Cluster) -> None:
    """RECORD_HEARTBEATS_AND_USAGE answers each member as RECORD_HEARTBEATS does, in member
    order, and stores the samples of the members recorded alive: none of an unknown worker's."""
    incarnation = await cluster.register("w-1")
    job = await cluster.submit()
    assignment = await cluster.place(job, "w-1", incarnation)
    rows = await cluster.admin.fetch(
        queries.RECORD_HEARTBEATS_AND_USAGE,
        ["w-9", "w-1"],
        [3, incarnation],
        [1, 1],
        [0, 0],
        [assignment],
        [2],
        250,
        2500,
        [1, 2, 2],
        [0, assignment, 0],
        [500, 1900, 2000],
        [5, 41, 50],
        [5000, 5000, 5000],
    )
    assert [(r["member"], r["alive"]) for r in rows] == [(1, False), (2, True)]
    assert await stored(cluster) == [
        ("w-1", None, None, 2000, 50, 5000),
        ("w-1", job, assignment, 1900, 41, 5000),
    ]

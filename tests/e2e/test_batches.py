"""End to end under load: one big batch of tiny jobs on the default cluster (3 control planes, 5
workers, each a process of its own, default settings).

Best fit sends every job of such a batch to the tightest worker with room, which must pace its
process starts instead of starving its own heartbeats, and the leader must hand it no more than
it acknowledges. Each test checks the whole record afterwards: every job succeeded exactly once
(by the workers' logs), no job started again unless it was placed again, no worker was declared
dead, there was one election, and no success was lost.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import pytest
import trio
import trio_asyncio

from ops import checker, rpc
from ops.cluster import LocalCluster
from protocol import pb
from runtime.aio import asyncio_bridge

pytestmark = pytest.mark.e2e

BATCH = 400
DONE_TIMEOUT_S = 180.0


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[LocalCluster]:
    """The default cluster on the test's database, brought down afterwards also when the test fails."""
    local = LocalCluster(tmp_path / "stockade", database_url=database_url)
    try:
        local.up()
        yield local
    finally:
        local.down()


def _run_batch(cluster: LocalCluster, runtime: Callable[[], dict[str, object]]) -> None:
    """Submit BATCH jobs of 10 cpu_millis and 16 MiB with ``runtime()`` in one SubmitJobs call,
    wait until none is unfinished, then check the record (see the module docstring)."""
    config = cluster.config()
    addresses = config.control_plane_addresses
    specs = [
        pb.JobSpec(name=f"batch-{index}", cpu_millis=10, memory_mb=16, **runtime())  # type: ignore[arg-type]
        for index in range(BATCH)
    ]
    reply = rpc.call(
        addresses, "submit_jobs", pb.SubmitJobsRequest(specs=specs), timeout_s=10, tls=config.client_tls
    )
    job_ids = list(reply.job_ids)
    assert len(job_ids) == BATCH
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while True:
        states = collections.Counter(
            j.state
            for j in rpc.call(
                addresses, "list_jobs", pb.ListJobsRequest(limit=BATCH), tls=config.client_tls
            ).jobs
        )
        if states["succeeded"] + states["failed"] + states["cancelled"] == BATCH:
            break
        if time.monotonic() >= deadline:
            pytest.fail(
                f"not done after {DONE_TIMEOUT_S} s: {dict(states)}\n" + _unfinished_story(cluster, job_ids)
            )
        time.sleep(0.5)
    assert states == {"succeeded": BATCH}

    async def load() -> checker.History:
        async with asyncio_bridge():
            return await checker.load_history(config.database_url)

    history = trio.run(load)
    report = checker.check_logs(history, [cluster.state.work_dir(w.id) for w in config.workers])
    assert report.ok, report.details
    assert (report.elections, report.worker_deaths) == (1, 0)
    runs = checker.load_runs([cluster.state.work_dir(w.id) for w in config.workers])
    succeeded_runs = collections.Counter(r.job_id for r in runs if r.stop_reason == "succeeded")
    assert set(succeeded_runs) == set(job_ids)
    assert set(succeeded_runs.values()) == {1}, "a job completed more than once"
    # A self-fence may stop a job and have it placed again (an extra assignment and an extra
    # start, never a second success); the target for this batch is exactly-once
    # completion and no death. Zero self-fences is the packing benchmark's target, where the
    # remaining ones are tracked (docs/benchmarks.md, "just bench-pack").
    assert len(runs) - BATCH <= report.extra_assignments, "a job started again without being placed again"


def _unfinished_story(cluster: LocalCluster, job_ids: list[int]) -> str:
    """What the database, the workers' logs and the job folders say of the jobs of
    ``job_ids`` that have not ended: a failure's message, so a rare hang can be told apart
    (never started, started and not reaped, reaped and not reported, reported and not
    recorded)."""
    config = cluster.config()

    async def rows() -> list[asyncpg.Record]:
        connection = await asyncpg.connect(config.database_url)
        try:
            return list(
                await connection.fetch(
                    "SELECT j.id, j.state, j.reason, j.detail, a.id AS assignment_id, a.worker_id,"
                    " a.worker_incarnation, a.state AS a_state, a.created_at, a.confirmed_at, a.ended_at,"
                    " w.last_heartbeat_at, w.incarnation AS w_incarnation, now() AS now"
                    " FROM jobs j LEFT JOIN assignments a ON a.job_id = j.id"
                    " LEFT JOIN workers w ON w.id = a.worker_id"
                    " WHERE j.id = ANY($1::bigint[])"
                    " AND j.state NOT IN ('succeeded', 'failed', 'cancelled') ORDER BY j.id, a.id",
                    job_ids,
                )
            )
        finally:
            await connection.close()

    async def load() -> list[asyncpg.Record]:
        async with asyncio_bridge():
            return await trio_asyncio.aio_as_trio(rows)()

    lines: list[str] = []
    for row in trio.run(load):
        lines.append(f"database: {dict(row)}")
        if row["assignment_id"] is None:
            continue
        worker_id, assignment_id = row["worker_id"], row["assignment_id"]
        work_dir = cluster.state.work_dir(worker_id)
        marker = f'"assignment_id": {assignment_id},'
        journal = work_dir / "agent.jsonl"
        if journal.exists():
            journal_lines = journal.read_text().splitlines()
            lines += [f"  {journal.name}: {line}" for line in journal_lines if marker in line]
        log = cluster.state.log_path(worker_id)
        if log.exists():
            needle = f"assignment_id={assignment_id} "
            lines += [f"  log: {line}" for line in log.read_text().splitlines() if needle in line]
        job_dir = work_dir / "jobs" / f"{row['id']}-{assignment_id}"
        if job_dir.is_dir():
            for path in sorted(job_dir.iterdir()):
                text = path.read_text(errors="replace")[:500] if path.is_file() else "(folder)"
                lines.append(f"  {path.name}: {text!r}")
        else:
            lines.append(f"  no job folder {job_dir}")
    return "\n".join(lines)


def test_a_batch_of_400_true_jobs_completes_each_job_once(cluster: LocalCluster) -> None:
    """400 `true` command jobs of 10 cpu_millis and 16 MiB in one SubmitJobs: every one succeeds
    exactly once, with no death and no second election."""
    _run_batch(cluster, lambda: {"command": pb.CommandRuntime(argv=["true"])})


def test_a_batch_of_400_one_second_sleep_jobs_completes_each_job_once(cluster: LocalCluster) -> None:
    """400 one-second sleep jobs of 10 cpu_millis and 16 MiB in one SubmitJobs: every one
    succeeds exactly once, with no death and no second election."""
    _run_batch(cluster, lambda: {"sleep": pb.SleepRuntime(duration_ms=1000)})

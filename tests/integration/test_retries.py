"""Retries, counted losses and the leader's backing of timeouts, on a real PostgreSQL: what
record_outcomes (schema.sql), the orphan sweep and END_TIMED_OUT_ASSIGNMENTS do to a job with
attempts left, and with none.

The leader's statements are run directly on an admin connection holding the lease at epoch 1;
what a worker sends goes through an ingest actor, as in production.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
from serving import ingest_and_leader

from actors import queries
from protocol import pb
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.jobs import CommandRuntime, JobSpec
from runtime.wire_jobs import job_spec_to_pb

EPOCH = 1


@attrs.frozen
class Cluster:
    cp: ControlPlaneClient
    admin: PgConnection

    async def register(self, worker_id: str = "w-1") -> int:
        reply = await self.cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(
                worker_id=worker_id, address="127.0.0.1:9", cpu_millis=4000, memory_mb=4096
            ),
        )
        incarnation = int(reply.incarnation)
        await self.heartbeat(worker_id, incarnation)
        return incarnation

    async def heartbeat(self, worker_id: str, incarnation: int, *finished: pb.JobOutcome) -> None:
        await self.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(worker_id=worker_id, incarnation=incarnation, finished=list(finished)),
        )

    async def submit(self, **lifecycle: Any) -> int:
        spec = JobSpec(
            name="t", cpu_millis=100, memory_mb=16, runtime=CommandRuntime(argv=("false",)), **lifecycle
        )
        reply = await self.cp.call("submit_job", pb.SubmitJobRequest(spec=job_spec_to_pb(spec.check())))
        return int(reply.job_id)

    async def place(self, job_id: int, worker_id: str, incarnation: int) -> int:
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS, [job_id], [worker_id], [incarnation], EPOCH, True, [], [], [], [], []
        )
        assert rows[0]["assignment_id"] is not None
        return int(rows[0]["assignment_id"])

    async def job(self, job_id: int) -> dict[str, Any]:
        row = await self.admin.fetchrow(
            "SELECT state, failures, reason, detail, not_before > now() AS waits,"
            " started_at IS NOT NULL AS started FROM jobs WHERE id = $1",
            job_id,
        )
        assert row is not None
        return dict(row)

    async def assignment(self, assignment_id: int) -> dict[str, Any]:
        row = await self.admin.fetchrow(
            "SELECT state, end_reason, counted, detail FROM assignments WHERE id = $1", assignment_id
        )
        assert row is not None
        return dict(row)


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with ingest_and_leader(database_url, epoch=EPOCH, presence_interval_s=1.0) as (cp, admin):
        yield Cluster(cp=cp, admin=admin)


def failed(assignment_id: int, job_id: int, detail: str = "exit code 3") -> pb.JobOutcome:
    return pb.JobOutcome(
        assignment_id=assignment_id,
        job_id=job_id,
        state="failed",
        has_exit_code=True,
        exit_code=3,
        run_ms=1000,
        detail=detail,
    )


async def test_a_failed_run_with_attempts_left_is_pending_again_after_its_backoff(cluster: Cluster) -> None:
    """A failed run spends an attempt (counted on its assignment); the job is pending again,
    not started, not before its retry delay (database time), with a reason naming the attempt."""
    incarnation = await cluster.register()
    job_id = await cluster.submit(max_attempts=3, retry_backoff_s=600)
    aid = await cluster.place(job_id, "w-1", incarnation)
    await cluster.heartbeat("w-1", incarnation, failed(aid, job_id))
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"], job["started"]) == ("pending", 1, False)
    assert job["reason"] == "retrying: attempt 1 of 3 failed (exit code 3)"
    assert await cluster.assignment(aid) == {
        "state": "finished",
        "end_reason": "failed",
        "counted": True,
        "detail": "exit code 3",
    }
    # The placer's read says how long it must still wait (up to the cap, never negative).
    row = await cluster.admin.fetchrow(queries.PENDING_JOBS, 100)
    assert row is not None and row["p_id"] == [job_id]
    assert 0.0 <= row["p_wait_s"][0] <= 600.0


async def test_the_last_attempt_failing_ends_the_job_failed(cluster: Cluster) -> None:
    """Once max_attempts runs failed, the job ends failed with the last run's detail and start;
    a timeout's detail makes the assignment's end reason ``timeout``."""
    incarnation = await cluster.register()
    job_id = await cluster.submit(max_attempts=2, retry_backoff_s=0)
    first = await cluster.place(job_id, "w-1", incarnation)
    await cluster.heartbeat("w-1", incarnation, failed(first, job_id))
    second = await cluster.place(job_id, "w-1", incarnation)
    await cluster.heartbeat(
        "w-1", incarnation, failed(second, job_id, "timeout: ran past its timeout_s of 1 s")
    )
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"], job["reason"], job["started"]) == ("failed", 2, "", True)
    assert job["detail"].startswith("timeout:")
    assert (await cluster.assignment(second))["end_reason"] == "timeout"


async def test_a_run_failing_after_a_cancel_was_asked_is_not_retried(cluster: Cluster) -> None:
    """A cancel asked while the job ran stands: its failed run is not retried."""
    incarnation = await cluster.register()
    job_id = await cluster.submit(max_attempts=5)
    aid = await cluster.place(job_id, "w-1", incarnation)
    await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=job_id))
    await cluster.heartbeat("w-1", incarnation, failed(aid, job_id))
    assert (await cluster.job(job_id))["state"] == "failed"


async def test_a_run_lost_with_its_worker_spends_no_attempt_unless_count_lost(cluster: Cluster) -> None:
    """A worker restart loses both runs: the plain job is pending again with nothing spent,
    the count_lost job with one attempt has spent it and ends failed, saying why."""
    old = await cluster.register()
    plain = await cluster.submit(max_attempts=1)
    counted = await cluster.submit(max_attempts=1, count_lost=True)
    plain_aid = await cluster.place(plain, "w-1", old)
    counted_aid = await cluster.place(counted, "w-1", old)
    await cluster.register()  # a new incarnation: the old one's runs are lost
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    assert (await cluster.job(plain))["state"] == "pending"
    assert (await cluster.job(plain))["failures"] == 0
    job = await cluster.job(counted)
    assert (job["state"], job["failures"]) == ("failed", 1)
    assert job["detail"].startswith("worker_restarted: the run was lost with its worker")
    assert not (await cluster.assignment(plain_aid))["counted"]
    assert (await cluster.assignment(counted_aid))["counted"]


async def test_a_late_failure_of_a_requeued_job_with_attempts_left_keeps_it_pending(cluster: Cluster) -> None:
    """The failure of a run lost with its worker arrives after the requeue: it spends an
    attempt, and the job, with attempts left, stays pending."""
    old = await cluster.register()
    job_id = await cluster.submit(max_attempts=3)
    aid = await cluster.place(job_id, "w-1", old)
    new = await cluster.register()
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    await cluster.heartbeat("w-1", new, failed(aid, job_id))
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("pending", 1)


async def test_the_leader_stops_a_run_past_its_timeout_and_retries_or_fails_it(cluster: Cluster) -> None:
    """A run past its timeout by the margin is found overdue; once its worker acknowledged the
    stop, the leader's fenced write ends it (reason timeout, counted): with an attempt left
    the job is pending again, with none it ends failed."""
    incarnation = await cluster.register()
    retried = await cluster.submit(max_attempts=2, timeout_s=0.001, retry_backoff_s=0)
    ended = await cluster.submit(max_attempts=1, timeout_s=0.001)
    first = await cluster.place(retried, "w-1", incarnation)
    second = await cluster.place(ended, "w-1", incarnation)
    assert await cluster.admin.fetch(queries.OVERDUE_ASSIGNMENTS, 60.0) == []
    await trio.sleep(0.05)
    overdue = await cluster.admin.fetch(queries.OVERDUE_ASSIGNMENTS, 0.0)
    assert sorted(r["assignment_id"] for r in overdue) == [first, second]
    rows = await cluster.admin.fetch(queries.END_TIMED_OUT_ASSIGNMENTS, EPOCH, [first, second])
    assert sorted(r["id"] for r in rows) == [first, second]
    job = await cluster.job(retried)
    assert (job["state"], job["started"], job["reason"]) == (
        "pending",
        False,
        "retrying: attempt 1 of 2 failed (timeout)",
    )
    job = await cluster.job(ended)
    assert (job["state"], job["failures"]) == ("failed", 1) and job["detail"].startswith("timeout:")
    assignment = await cluster.assignment(second)
    assert (assignment["state"], assignment["end_reason"], assignment["counted"]) == (
        "cancelled",
        "timeout",
        True,
    )


async def test_a_late_failure_of_a_job_placed_again_spends_an_attempt_once(cluster: Cluster) -> None:
    """The failure of a run lost with its worker arrives after the job was placed again: it
    spends an attempt (once, however often the worker sends it), so the run now going on is
    the job's last when it had one attempt left."""
    old = await cluster.register()
    job_id = await cluster.submit(max_attempts=2, retry_backoff_s=0)
    lost = await cluster.place(job_id, "w-1", old)
    new = await cluster.register()
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    again = await cluster.place(job_id, "w-1", new)
    for _ in range(2):  # the worker sends it again until a reply acknowledges it
        await cluster.heartbeat("w-1", new, failed(lost, job_id))
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("assigned", 1)
    await cluster.heartbeat("w-1", new, failed(again, job_id))
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("failed", 2)


async def test_a_late_success_revives_the_dependants_its_loss_had_cancelled(cluster: Cluster) -> None:
    """A count_lost job failed by its worker's loss, its dependant (and that one's) cancelled
    as dependency_failed; the run's success then arrives: the job succeeded, and both
    dependants wait again."""
    old = await cluster.register()
    parent = await cluster.submit(max_attempts=1, count_lost=True)
    aid = await cluster.place(parent, "w-1", old)
    child = await cluster.submit(after=(parent,))
    grandchild = await cluster.submit(after=(child,))
    new = await cluster.register()
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    await cluster.admin.execute(
        "UPDATE jobs SET state = 'cancelled', detail = 'dependency_failed: job ' || $2, "
        "reason = 'dependency_failed: job ' || $2 WHERE id = $1",
        child,
        str(parent),
    )
    await cluster.admin.execute(
        "UPDATE jobs SET state = 'cancelled', detail = 'dependency_failed: job ' || $2 WHERE id = $1",
        grandchild,
        str(child),
    )
    success = pb.JobOutcome(
        assignment_id=aid, job_id=parent, state="succeeded", has_exit_code=True, run_ms=1000
    )
    await cluster.heartbeat("w-1", new, success)
    assert (await cluster.job(parent))["state"] == "succeeded"
    for job_id, waits_for in ((child, parent), (grandchild, child)):
        job = await cluster.job(job_id)
        assert (job["state"], job["reason"], job["detail"]) == ("waiting", f"waiting for job {waits_for}", "")

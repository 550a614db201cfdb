"""A job's history (queries.JOB_EVENTS through GetJobEvents) on a real PostgreSQL: rebuilt from
the jobs, assignments, worker_deaths and lease_history tables, in time order, with the epoch of
every decision.

The leader's statements (placement, death declaration, orphan sweep, fenced ends, settling
waiting jobs) are run directly on an admin connection holding the lease; what a worker sends
goes through an ingest actor, as in production. A takeover is played by bumping the lease's
epoch and appending its reign to lease_history, as the lease keeper's takeover does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from serving import ingest_and_leader

from actors import queries
from ops.client.results import JobEvent, JobHistory, history_from_pb
from protocol import pb
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.errors import NotFound
from runtime.jobs import CommandRuntime, JobSpec
from runtime.wire_jobs import job_spec_to_pb


@attrs.define
class Cluster:
    cp: ControlPlaneClient
    admin: PgConnection
    epoch: int = 1

    async def take_over(self, holder: str) -> int:
        """A takeover by ``holder``: the next epoch, and its reign in lease_history."""
        previous = await self.admin.fetchval("SELECT holder FROM lease WHERE id = 1")
        self.epoch += 1
        await self.admin.execute("UPDATE lease SET holder = $1, epoch = $2 WHERE id = 1", holder, self.epoch)
        await self.admin.execute(
            "INSERT INTO lease_history (epoch, holder, previous) VALUES ($1, $2, $3)",
            self.epoch,
            holder,
            previous,
        )
        return self.epoch

    async def register(self, worker_id: str) -> int:
        reply = await self.cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(
                worker_id=worker_id, address="127.0.0.1:9", cpu_millis=4000, memory_mb=4096
            ),
        )
        incarnation = int(reply.incarnation)
        await self.heartbeat(worker_id, incarnation)
        return incarnation

    async def heartbeat(
        self,
        worker_id: str,
        incarnation: int,
        *,
        running: tuple[int, ...] = (),
        finished: tuple[pb.JobOutcome, ...] = (),
    ) -> None:
        await self.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(
                worker_id=worker_id,
                incarnation=incarnation,
                running_assignment_ids=list(running),
                finished=list(finished),
            ),
        )

    async def submit(self, **lifecycle: Any) -> int:
        spec = JobSpec(
            name="t", cpu_millis=100, memory_mb=16, runtime=CommandRuntime(argv=("true",)), **lifecycle
        )
        reply = await self.cp.call("submit_job", pb.SubmitJobRequest(spec=job_spec_to_pb(spec.check())))
        return int(reply.job_id)

    async def place(self, job_id: int, worker_id: str, incarnation: int) -> int:
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS,
            [job_id],
            [worker_id],
            [incarnation],
            self.epoch,
            True,
            [],
            [],
            [],
            [],
            [],
        )
        assert rows[0]["assignment_id"] is not None
        return int(rows[0]["assignment_id"])

    async def events(self, job_id: int) -> JobHistory:
        reply = await self.cp.call("get_job_events", pb.GetJobEventsRequest(job_id=job_id))
        return history_from_pb(reply)


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    """One ingest actor, a client of it, and an admin connection holding the lease as cp-1 at
    epoch 1 (its reign recorded in lease_history)."""
    async with ingest_and_leader(database_url, epoch=1) as (cp, admin):
        await admin.execute("INSERT INTO lease_history (epoch, holder) VALUES (1, 'cp-1')")
        yield Cluster(cp=cp, admin=admin)


def outcome(
    assignment_id: int, job_id: int, state: str = "succeeded", exit_code: int = 0, *, ended_ago_ms: int = 0
) -> pb.JobOutcome:
    return pb.JobOutcome(
        assignment_id=assignment_id,
        job_id=job_id,
        state=state,
        has_exit_code=True,
        exit_code=exit_code,
        detail=f"exit code {exit_code}",
        run_ms=100,
        ended_ago_ms=ended_ago_ms,
    )


def story(history: JobHistory) -> list[tuple[Any, ...]]:
    """Each event as (kind, assignment, worker, epoch, leader, state, reason, exit code)."""
    return [
        (e.kind, e.assignment_id, e.worker_id, e.epoch, e.leader, e.state, e.reason, e.exit_code)
        for e in history.events
    ]


def times(history: JobHistory) -> list[float]:
    return [e.at_unix_s for e in history.events if e.at_unix_s is not None]


def only(history: JobHistory, kind: str) -> JobEvent:
    (event,) = (e for e in history.events if e.kind == kind)
    return event


async def test_a_run_lost_with_its_dead_worker_then_placed_again_tells_its_story(cluster: Cluster) -> None:
    """Placed on w-1 at epoch 1, confirmed, w-1 declared dead at epoch 2 by another leader, the
    run ended lost (fenced at epoch 2), the job requeued with its loss backoff, placed on w-2 at
    epoch 2 and succeeded: in that order, each with its worker, incarnation, epoch and leader."""
    w1 = await cluster.register("w-1")
    job_id = await cluster.submit()
    first = await cluster.place(job_id, "w-1", w1)
    await cluster.heartbeat("w-1", w1, running=(first,))
    epoch = await cluster.take_over("cp-2")
    # Judged by the declaration's dead_after alone (0 s: silent now), not by the one told at
    # registration (docs/design.md, "Heartbeat interval").
    await cluster.admin.execute("UPDATE workers SET dead_after_ms = NULL")
    dead = await cluster.admin.fetch(queries.DECLARE_DEAD_WORKERS, epoch, 0.0, ["w-1"], [w1], None)
    assert [r["id"] for r in dead] == ["w-1"]
    swept = await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, epoch, [30.0], 500)
    assert list(swept["requeued_ids"]) == [job_id]
    w2 = await cluster.register("w-2")
    second = await cluster.place(job_id, "w-2", w2)
    await cluster.heartbeat("w-2", w2, finished=(outcome(second, job_id),))

    history = await cluster.events(job_id)
    assert history.state == "succeeded"
    assert story(history) == [
        ("submitted", None, None, None, None, None, None, None),
        ("placed", first, "w-1", 1, "cp-1", None, None, None),
        ("confirmed", first, "w-1", None, None, None, None, None),
        ("worker_dead", first, "w-1", 2, "cp-2", None, None, None),
        ("ended", first, "w-1", 2, "cp-2", "lost", "worker_dead", None),
        ("requeued", first, None, None, None, None, None, None),
        ("placed", second, "w-2", 2, "cp-2", None, None, None),
        ("ended", second, "w-2", None, None, "finished", "succeeded", 0),
        ("final", None, None, None, None, "succeeded", None, 0),
    ]
    assert only(history, "worker_dead").incarnation == w1
    assert [e.incarnation for e in history.events if e.kind == "placed"] == [w1, w2]
    assert (only(history, "worker_dead").detail or "").startswith("last heartbeat ")
    requeue = only(history, "requeued")
    assert requeue.not_before_unix_s is not None and requeue.at_unix_s is not None
    assert requeue.not_before_unix_s >= requeue.at_unix_s
    # Database time, in order.
    assert times(history) == sorted(times(history))


async def test_a_cancelled_running_job_shows_the_request_and_the_fenced_end(cluster: Cluster) -> None:
    """A cancel asked of a running job: the request, then the run ended cancelled by the leader's
    fenced write (its epoch), then the final cancelled state, and no requeue."""
    w1 = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", w1)
    await cluster.heartbeat("w-1", w1, running=(aid,))
    reply = await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=job_id, idempotency_key="k-1"))
    assert reply.state == "cancelling"
    ended = await cluster.admin.fetch(queries.END_CANCELLED_ASSIGNMENTS, 1, [aid], "cancelled", False, [])
    assert [r["id"] for r in ended] == [aid]

    history = await cluster.events(job_id)
    assert [e.kind for e in history.events] == [
        "submitted",
        "placed",
        "confirmed",
        "cancel_requested",
        "ended",
        "final",
    ]
    end = only(history, "ended")
    assert (end.state, end.reason, end.epoch, end.leader) == ("cancelled", "cancelled", 1, "cp-1")
    assert only(history, "final").state == "cancelled"


async def test_a_job_cancelled_while_pending_records_when(cluster: Cluster) -> None:
    """A pending job cancelled at once: submitted, cancel requested, cancelled; the request's time
    is kept (jobs.cancel_requested_at), and a second cancel does not move it."""
    job_id = await cluster.submit()
    await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=job_id, idempotency_key="k-1"))
    first = await cluster.admin.fetchval("SELECT cancel_requested_at FROM jobs WHERE id = $1", job_id)
    await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=job_id, idempotency_key="k-2"))
    assert await cluster.admin.fetchval("SELECT cancel_requested_at FROM jobs WHERE id = $1", job_id) == first

    history = await cluster.events(job_id)
    assert [e.kind for e in history.events] == ["submitted", "cancel_requested", "final"]
    assert (history.state, only(history, "final").state) == ("cancelled", "cancelled")


async def test_a_retried_job_shows_the_failed_run_and_its_backoff(cluster: Cluster) -> None:
    """A run that failed with attempts left: its end (failed, exit code 3, decided by the worker's
    report, so no epoch), the requeue with the retry's not_before, the second run, success."""
    w1 = await cluster.register("w-1")
    job_id = await cluster.submit(max_attempts=2, retry_backoff_s=60.0)
    first = await cluster.place(job_id, "w-1", w1)
    await cluster.heartbeat("w-1", w1, finished=(outcome(first, job_id, "failed", 3),))
    history = await cluster.events(job_id)
    assert history.state == "pending"
    assert [e.kind for e in history.events] == ["submitted", "placed", "ended", "requeued"]
    end = only(history, "ended")
    assert (end.state, end.reason, end.outcome, end.exit_code, end.epoch) == (
        "finished",
        "failed",
        "failed",
        3,
        None,
    )
    requeue = only(history, "requeued")
    assert requeue.not_before_unix_s is not None and requeue.at_unix_s is not None
    assert requeue.not_before_unix_s >= requeue.at_unix_s

    second = await cluster.place(job_id, "w-1", w1)
    await cluster.heartbeat("w-1", w1, finished=(outcome(second, job_id),))
    history = await cluster.events(job_id)
    assert [(e.kind, e.assignment_id) for e in history.events] == [
        ("submitted", None),
        ("placed", first),
        ("ended", first),
        ("requeued", first),
        ("placed", second),
        ("ended", second),
        ("final", None),
    ]
    assert only(history, "requeued").not_before_unix_s == requeue.not_before_unix_s


async def test_a_job_whose_dependency_failed_shows_the_wait_and_the_cancel(cluster: Cluster) -> None:
    """A job submitted after another waits for it (the event names it), and is cancelled with
    dependency_failed once the leader settles it."""
    w1 = await cluster.register("w-1")
    first = await cluster.submit()
    after = await cluster.submit(after=(first,))
    aid = await cluster.place(first, "w-1", w1)
    await cluster.heartbeat("w-1", w1, finished=(outcome(aid, first, "failed", 1),))
    await cluster.admin.fetchrow(queries.SETTLE_WAITING_JOBS, [], [after], [first])

    history = await cluster.events(after)
    assert [e.kind for e in history.events] == ["submitted", "waiting", "final"]
    assert only(history, "waiting").detail == f"waiting for job {first}"
    final = only(history, "final")
    assert (final.state, final.detail) == ("cancelled", f"dependency_failed: job {first}")


async def test_an_unknown_job_has_no_history(cluster: Cluster) -> None:
    """GetJobEvents of a job id no job has is NOT_FOUND, naming the id."""
    with pytest.raises(NotFound, match="job_id 999 not found"):
        await cluster.events(999)


async def test_a_run_reported_after_it_ended_still_reads_in_time_order(cluster: Cluster) -> None:
    """A run whose report reached the database some milliseconds after it ended: the job
    finished then (the database's clock, before the run's end was recorded), and its history,
    ordered by that one clock, lists the run's end before the job's final event, which is not
    earlier than any other."""
    w1 = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", w1)
    # Placed a minute ago: nothing clamps the run's times to its assignment's creation.
    await cluster.admin.execute(
        "UPDATE assignments SET created_at = created_at - interval '1 minute' WHERE id = $1", aid
    )
    await cluster.admin.execute(
        "UPDATE jobs SET submitted_at = submitted_at - interval '1 minute' WHERE id = $1", job_id
    )
    await cluster.heartbeat("w-1", w1, finished=(outcome(aid, job_id, ended_ago_ms=40),))
    history = await cluster.events(job_id)
    assert [e.kind for e in history.events] == ["submitted", "placed", "ended", "final"]
    assert times(history) == sorted(times(history))
    finished = await cluster.admin.fetchval(
        "SELECT extract(epoch FROM finished_at)::float8 FROM jobs WHERE id = $1", job_id
    )
    ended, final = only(history, "ended").at_unix_s, only(history, "final").at_unix_s
    assert ended is not None and final == ended
    assert finished == pytest.approx(ended - 0.040, abs=1e-6)


async def test_a_run_lost_then_reported_late_shows_its_requeue_before_the_final_event(
    cluster: Cluster,
) -> None:
    """A run lost when its worker registered again, whose success is reported after the job was
    requeued: the loss, the requeue, then the job's final success, in time order (the run ended
    before the leader ended it, by the database's clock)."""
    old = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", old)
    new = await cluster.register("w-1")
    swept = await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, cluster.epoch, [], 500)
    assert list(swept["requeued_ids"]) == [job_id]
    await cluster.heartbeat("w-1", new, finished=(outcome(aid, job_id),))
    history = await cluster.events(job_id)
    assert [(e.kind, e.state, e.reason) for e in history.events] == [
        ("submitted", None, None),
        ("placed", None, None),
        ("ended", "lost", "worker_restarted"),
        ("requeued", None, None),
        ("final", "succeeded", None),
    ]
    assert times(history) == sorted(times(history))

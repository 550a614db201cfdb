"""Clean stops on a real PostgreSQL: a worker's leave through a real ingest (gRPC), and the
requeue of its jobs by a real leader (ledger and reconciler, fenced writes under epoch 1).

The leader's reconciler runs with a ``dead_after_s`` of an hour, so nothing it does here can
be a dead-worker declaration: what ends a left worker's assignments is the leave alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
from serving import ingest_and_leader
from test_fenced_write_size import Leader, until

from actors import queries
from protocol import pb
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument
from runtime.settings.leader import ReconcilerSettings

EPOCH = 1
RUN = "run-a"
NO_DEATHS = ReconcilerSettings(reconcile_interval_s=0.25, dead_after_s=3600.0)


@attrs.frozen
class Cluster:
    cp: ControlPlaneClient
    admin: PgConnection
    database_url: str

    async def register(
        self, worker_id: str, run_id: str = RUN, seq: int = 1, *, heartbeat: bool = True
    ) -> int:
        """Register as agent run ``run_id`` (registration ``seq``), then heartbeat once (unless
        ``heartbeat`` is false)."""
        reply = await self.cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(
                worker_id=worker_id,
                address="127.0.0.1:9",
                cpu_millis=4000,
                memory_mb=4096,
                agent_run_id=run_id,
                registration_seq=seq,
            ),
        )
        if heartbeat:
            await self.heartbeat(worker_id, int(reply.incarnation))
        return int(reply.incarnation)

    async def heartbeat(self, worker_id: str, incarnation: int, *running: int) -> pb.HeartbeatReply:
        reply: pb.HeartbeatReply = await self.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(
                worker_id=worker_id, incarnation=incarnation, running_assignment_ids=list(running)
            ),
        )
        return reply

    async def leave(
        self, worker_id: str, incarnation: int, run_id: str = RUN, *finished: pb.JobOutcome
    ) -> pb.LeaveWorkerReply:
        reply: pb.LeaveWorkerReply = await self.cp.call(
            "leave_worker",
            pb.LeaveWorkerRequest(
                worker_id=worker_id, incarnation=incarnation, agent_run_id=run_id, finished=list(finished)
            ),
        )
        return reply

    async def submit(self) -> int:
        reply = await self.cp.call(
            "submit_job",
            pb.SubmitJobRequest(
                spec=pb.JobSpec(
                    name="t", cpu_millis=100, memory_mb=16, sleep=pb.SleepRuntime(duration_ms=60_000)
                )
            ),
        )
        return int(reply.job_id)

    async def place(self, job_id: int, worker_id: str, incarnation: int) -> int:
        """The placer's claim (COMMIT_PLACEMENTS) of one job under epoch 1; the assignment id."""
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS, [job_id], [worker_id], [incarnation], EPOCH, True, [], [], [], [], []
        )
        assignment_id = rows[0]["assignment_id"]
        assert assignment_id is not None
        return int(assignment_id)

    async def worker(self, worker_id: str) -> dict[str, Any]:
        row = await self.admin.fetchrow(
            "SELECT state, incarnation, left_at IS NOT NULL AS has_left_at FROM workers WHERE id = $1",
            worker_id,
        )
        assert row is not None
        return dict(row)

    async def assignment(self, assignment_id: int) -> dict[str, Any]:
        row = await self.admin.fetchrow(
            "SELECT state, end_reason, ended_epoch FROM assignments WHERE id = $1", assignment_id
        )
        assert row is not None
        return dict(row)

    async def job(self, job_id: int) -> dict[str, Any]:
        row = await self.admin.fetchrow(
            "SELECT state, losses, not_before, reason FROM jobs WHERE id = $1", job_id
        )
        assert row is not None
        return dict(row)

    async def count(self, query: str) -> int:
        return int(await self.admin.fetchval(query))


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    """One ingest actor, a client of it, and an admin connection holding the lease at epoch 1."""
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Cluster(cp=cp, admin=admin, database_url=database_url)


def succeeded(assignment_id: int, job_id: int) -> pb.JobOutcome:
    return pb.JobOutcome(
        assignment_id=assignment_id,
        job_id=job_id,
        state="succeeded",
        has_exit_code=True,
        exit_code=0,
        run_ms=1000,
    )


async def run_leader_until(cluster: Cluster, query: str) -> None:
    """Run a leader (epoch 1, no death possible) until ``query`` returns true."""
    async with trio.open_nursery() as nursery:
        await nursery.start(Leader(epoch=EPOCH, settings=NO_DEATHS).run, cluster.database_url)

        async def done() -> bool:
            return bool(await cluster.admin.fetchval(query))

        await until(done)
        nursery.cancel_scope.cancel()


async def test_a_leave_makes_the_row_left_and_the_leader_requeues_its_jobs_as_stopped(
    cluster: Cluster,
) -> None:
    """A worker running three jobs leaves, reporting one of them succeeded: that one is
    finished, the row is left (logged once in worker_leaves), and the leader's fenced pass ends
    the other two assignments as stopped (worker_left, under epoch 1) and puts their jobs back
    to pending at once: no loss counted, no backoff."""
    incarnation = await cluster.register("w-1")
    jobs = [await cluster.submit() for _ in range(3)]
    aids = [await cluster.place(job, "w-1", incarnation) for job in jobs]
    await cluster.heartbeat("w-1", incarnation, *aids)  # confirmed: running

    reply = await cluster.leave("w-1", incarnation, RUN, succeeded(aids[0], jobs[0]))
    assert (reply.left, reply.epoch) == (True, EPOCH)
    assert await cluster.worker("w-1") == {"state": "left", "incarnation": incarnation, "has_left_at": True}
    assert await cluster.count("SELECT count(*) FROM worker_leaves WHERE worker_id = 'w-1'") == 1
    assert (await cluster.job(jobs[0]))["state"] == "succeeded"

    await run_leader_until(cluster, "SELECT count(*) = 0 FROM assignments WHERE state = 'active'")
    assert await cluster.assignment(aids[0]) == {
        "state": "finished",
        "end_reason": "succeeded",
        "ended_epoch": None,
    }
    for aid, job in zip(aids[1:], jobs[1:], strict=True):
        assert await cluster.assignment(aid) == {
            "state": "stopped",
            "end_reason": "worker_left",
            "ended_epoch": EPOCH,
        }
        assert await cluster.job(job) == {"state": "pending", "losses": 0, "not_before": None, "reason": ""}
    assert await cluster.count("SELECT count(*) FROM worker_deaths") == 0
    assert (await cluster.worker("w-1"))["state"] == "left"


async def test_a_left_worker_silent_before_its_jobs_are_requeued_is_never_declared_dead(
    cluster: Cluster,
) -> None:
    """A worker leaves while its job's assignment is still active (the leader has not yet ended
    it) and its last heartbeat is long past dead_after: the death judgment leaves the row left
    (its own incarnation's assignments are the leader's to end as stopped), no death is logged,
    and the assignment ends as worker_left. (Before, a stop slower than dead_after, as under
    load, could meet the judgment first and turn a clean leave into a death.)"""
    incarnation = await cluster.register("w-1")
    job = await cluster.submit()
    aid = await cluster.place(job, "w-1", incarnation)
    await cluster.heartbeat("w-1", incarnation, aid)
    assert (await cluster.leave("w-1", incarnation)).left
    await cluster.admin.execute(
        "UPDATE workers SET last_heartbeat_at = now() - interval '1 hour' WHERE id = 'w-1'"
    )
    declared = await cluster.admin.fetch(
        queries.DECLARE_DEAD_WORKERS, EPOCH, 0.001, ["w-1"], [incarnation], None
    )
    assert declared == []
    judged = await cluster.count("SELECT count(*) FROM judged_workers WHERE id = 'w-1'")
    assert judged == 0
    await run_leader_until(cluster, "SELECT count(*) = 0 FROM assignments WHERE state = 'active'")
    assert await cluster.assignment(aid) == {
        "state": "stopped",
        "end_reason": "worker_left",
        "ended_epoch": EPOCH,
    }
    assert await cluster.count("SELECT count(*) FROM worker_deaths") == 0
    assert (await cluster.worker("w-1"))["state"] == "left"


async def test_a_leave_of_another_incarnation_or_agent_run_changes_nothing(cluster: Cluster) -> None:
    """A leave naming the right incarnation but another agent run (forged), and a leave of an
    earlier incarnation from the right run (late, after the agent registered again), are
    answered left: false and change nothing: the row stays alive in its incarnation, and the
    leader does not end the current incarnation's assignment."""
    first = await cluster.register("w-1", RUN, 1)
    forged = await cluster.leave("w-1", first, "someone-else")
    assert not forged.left and "agent_run_id is not the run" in forged.detail
    assert "someone-else" not in forged.detail and RUN not in forged.detail
    second = await cluster.register("w-1", RUN, 2)
    job = await cluster.submit()
    aid = await cluster.place(job, "w-1", second)
    late = await cluster.leave("w-1", first, RUN)
    assert not late.left and f"incarnation {first} of worker w-1 is not current" in late.detail
    assert await cluster.worker("w-1") == {"state": "alive", "incarnation": second, "has_left_at": False}
    assert await cluster.count("SELECT count(*) FROM worker_leaves") == 0

    # A later assignment on another worker, ended by its leave, shows the leader's pass ran.
    other = await cluster.register("w-2", "run-b", 1)
    witness = await cluster.place(await cluster.submit(), "w-2", other)
    assert (await cluster.leave("w-2", other, "run-b")).left
    await run_leader_until(cluster, f"SELECT state <> 'active' FROM assignments WHERE id = {witness}")
    assert (await cluster.assignment(aid))["state"] == "active"


async def test_a_copy_of_a_leave_is_answered_left_and_logged_once(cluster: Cluster) -> None:
    """The same leave twice (a hedged or retried copy): both answered left, one worker_leaves row."""
    incarnation = await cluster.register("w-1")
    assert (await cluster.leave("w-1", incarnation)).left
    again = await cluster.leave("w-1", incarnation)
    assert again.left and "copy" in again.detail
    assert await cluster.count("SELECT count(*) FROM worker_leaves") == 1


async def test_a_left_worker_that_starts_again_registers_as_usual(cluster: Cluster) -> None:
    """After leaving, a new agent run registers a new incarnation: alive, heartbeats accepted,
    and jobs can be placed on it; a heartbeat of the incarnation that left is told to register."""
    left = await cluster.register("w-1", RUN, 1)
    assert (await cluster.leave("w-1", left)).left
    assert (await cluster.heartbeat("w-1", left)).reregister
    again = await cluster.register("w-1", "run-b", 1)
    assert again > left
    assert await cluster.worker("w-1") == {"state": "alive", "incarnation": again, "has_left_at": False}
    assert not (await cluster.heartbeat("w-1", again)).reregister
    await cluster.place(await cluster.submit(), "w-1", again)


@pytest.mark.parametrize(
    ("incarnation", "run_id", "message"),
    [
        (0, RUN, "incarnation must be between 1 and"),
        (1, "", "agent_run_id must not be empty"),
    ],
)
async def test_an_invalid_leave_is_refused_naming_the_field_and_stores_nothing(
    cluster: Cluster, incarnation: int, run_id: str, message: str
) -> None:
    """A leave with incarnation 0 or no agent run id is refused with INVALID_ARGUMENT naming the
    field, the value and the rule; the outcome it carried is not recorded, the row stays alive."""
    real = await cluster.register("w-1")
    job = await cluster.submit()
    aid = await cluster.place(job, "w-1", real)
    with pytest.raises(InvalidArgument, match=message):
        await cluster.leave("w-1", incarnation, run_id, succeeded(aid, job))
    assert (await cluster.worker("w-1"))["state"] == "alive"
    assert (await cluster.assignment(aid))["state"] == "active"


async def test_a_left_row_still_holding_another_incarnations_job_is_judged_by_silence(
    cluster: Cluster,
) -> None:
    """The agent running a job is gone (SIGKILLed); then a registration it did not send (another
    run claiming the worker id) and that run's leave make the row left in a new incarnation.
    The old incarnation's assignment is still active, and no agent will ever stop or report
    it: the row is judged by its silence like a live one, declared dead after dead_after_s, and
    the job placed again (before, it stayed running for ever, as a left row was never judged)."""
    old = await cluster.register("w-1", RUN, 1)
    job = await cluster.submit()
    aid = await cluster.place(job, "w-1", old)
    await cluster.heartbeat("w-1", old, aid)
    forged = await cluster.register("w-1", "another-run", 1, heartbeat=False)
    assert (await cluster.leave("w-1", forged, "another-run")).left
    deaths = ReconcilerSettings(reconcile_interval_s=0.25, dead_after_s=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(Leader(epoch=EPOCH, settings=deaths).run, cluster.database_url)

        async def ended() -> bool:
            return bool(
                await cluster.admin.fetchval(f"SELECT state <> 'active' FROM assignments WHERE id = {aid}")
            )

        await until(ended)
        nursery.cancel_scope.cancel()
    assert await cluster.assignment(aid) == {
        "state": "lost",
        "end_reason": "worker_dead",
        "ended_epoch": EPOCH,
    }
    assert (await cluster.job(job))["state"] == "pending"
    assert (await cluster.worker("w-1"))["state"] == "dead"

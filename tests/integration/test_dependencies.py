"""Dependencies and arrays on a real PostgreSQL: submissions through a real ingest over gRPC,
the leader's settling of waiting jobs (its read, :func:`actors.dependencies.plan_waiting`, and
its fenced statement) run by hand on an admin connection holding the lease at epoch 1, as in
``test_outcomes``; one test sends the settling write through a real ledger under a stale epoch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
import trio
from serving import ingest_and_leader

from actors import queries
from actors.dependencies import plan_waiting
from actors.ledger import Ledger
from actors.messages import LeaseInbox, LedgerInbox, SettledJobs, SettleWaitingJobs
from actors.reconciler_store import waiting_job
from ops.checker import load_history
from protocol import pb
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument, StaleEpoch
from runtime.reply import Reply

EPOCH = 1
ACTIVE = "('pending', 'assigned', 'running')"


@attrs.define
class Cluster:
    cp: ControlPlaneClient
    admin: PgConnection
    database_url: str
    incarnation: int = 0

    async def submit(
        self, *, after: tuple[int, ...] = (), array: pb.JobArray | None = None, key: str = ""
    ) -> int:
        spec = pb.JobSpec(
            name="t",
            cpu_millis=100,
            memory_mb=16,
            command=pb.CommandRuntime(argv=["true"]),
            after=list(after),
        )
        if array is not None:
            spec.array = array
        reply = await self.cp.call("submit_job", pb.SubmitJobRequest(spec=spec, idempotency_key=key))
        return int(reply.job_id)

    async def worker(self) -> int:
        if not self.incarnation:
            reply = await self.cp.call(
                "register_worker",
                pb.RegisterWorkerRequest(
                    worker_id="w-1", address="127.0.0.1:9", cpu_millis=64000, memory_mb=65536
                ),
            )
            self.incarnation = int(reply.incarnation)
        return self.incarnation

    async def place(self, job_id: int) -> int:
        """The placer's claim of one pending job on w-1; the assignment id."""
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS,
            [job_id],
            ["w-1"],
            [await self.worker()],
            EPOCH,
            True,
            [],
            [],
            [],
            [],
            [],
        )
        assert rows[0]["assignment_id"] is not None, f"job {job_id} was not pending"
        return int(rows[0]["assignment_id"])

    async def finish(self, job_id: int, state: str = "succeeded") -> None:
        """Place ``job_id`` and report its end from w-1."""
        aid = await self.place(job_id)
        code = 0 if state == "succeeded" else 1
        outcome = pb.JobOutcome(
            assignment_id=aid,
            job_id=job_id,
            state=state,
            has_exit_code=True,
            exit_code=code,
            run_ms=1000,
            detail=f"exit code {code}",
        )
        await self.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(worker_id="w-1", incarnation=await self.worker(), finished=[outcome]),
        )

    async def settle(self) -> tuple[list[int], list[int]]:
        """The leader's settling, as its reconcile pass runs it, until nothing is left to settle:
        (released, cancelled) job ids."""
        released: list[int] = []
        cancelled: list[int] = []
        while True:
            rows = await self.admin.fetch(queries.WAITING_JOBS, 500)
            plan = plan_waiting([waiting_job(r) for r in rows], most=500)
            if not plan:
                return released, cancelled
            row = await self.admin.fetchrow(
                queries.SETTLE_WAITING_JOBS,
                list(plan.release),
                [j for j, _ in plan.cancel],
                [d for _, d in plan.cancel],
            )
            assert row is not None
            released += row["released_ids"]
            cancelled += row["cancelled_ids"]

    async def job(self, job_id: int) -> dict[str, object]:
        row = await self.admin.fetchrow(
            "SELECT state, reason, detail, array_id, array_index, pending_seq, pending_xid"
            " FROM jobs WHERE id = $1",
            job_id,
        )
        assert row is not None
        return dict(row)

    async def states(self, *job_ids: int) -> list[str]:
        return [str((await self.job(j))["state"]) for j in job_ids]


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Cluster(cp=cp, admin=admin, database_url=database_url)


async def test_a_job_waits_until_every_dependency_succeeded_then_becomes_pending(cluster: Cluster) -> None:
    """A job after two unfinished jobs is stored waiting, its reason naming both; it stays
    waiting while one is unfinished, and becomes pending with a new pending_seq and this
    transaction's id once both succeeded."""
    a, b = await cluster.submit(), await cluster.submit()
    c = await cluster.submit(after=(b, a))
    job = await cluster.job(c)
    assert (job["state"], job["reason"]) == ("waiting", f"waiting for job {a}, {b}")
    await cluster.finish(a)
    assert await cluster.settle() == ([], [])
    assert await cluster.states(c) == ["waiting"]
    before = job["pending_seq"]
    await cluster.finish(b)
    assert await cluster.settle() == ([c], [])
    job = await cluster.job(c)
    assert (job["state"], job["reason"]) == ("pending", "")
    assert int(job["pending_seq"]) > int(before)  # type: ignore[call-overload]
    current_xid = await cluster.admin.fetchval("SELECT pg_current_xact_id()::text::bigint")
    assert 0 < int(job["pending_xid"]) < int(current_xid)  # type: ignore[call-overload]
    await cluster.place(c)  # the placer may claim it


async def test_a_job_whose_dependencies_already_succeeded_is_pending_at_once(cluster: Cluster) -> None:
    """Every dependency succeeded before the submission: the job is pending when stored."""
    a = await cluster.submit()
    await cluster.finish(a)
    b = await cluster.submit(after=(a,))
    assert (await cluster.job(b))["state"] == "pending"


async def test_a_failed_dependency_cancels_its_dependants_and_theirs(cluster: Cluster) -> None:
    """a fails: b (after a) is cancelled with dependency_failed: job a, and c (after b) with
    dependency_failed: job b, in the same settling; d (after an unrelated job) stays waiting."""
    a, other = await cluster.submit(), await cluster.submit()
    b = await cluster.submit(after=(a,))
    c = await cluster.submit(after=(b,))
    d = await cluster.submit(after=(other,))
    await cluster.finish(a, "failed")
    assert await cluster.settle() == ([], [b, c])
    for job_id, dependency in ((b, a), (c, b)):
        job = await cluster.job(job_id)
        assert job["state"] == "cancelled"
        assert job["reason"] == job["detail"] == f"dependency_failed: job {dependency}"
    assert await cluster.states(d) == ["waiting"]


async def test_a_cancelled_dependency_cancels_its_dependants(cluster: Cluster) -> None:
    """A user cancels a pending job: the job waiting for it is cancelled with its reason."""
    a = await cluster.submit()
    b = await cluster.submit(after=(a,))
    await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=a))
    assert await cluster.settle() == ([], [b])
    assert (await cluster.job(b))["reason"] == f"dependency_failed: job {a}"


async def test_a_missing_dependency_or_the_jobs_own_id_is_refused_and_nothing_stored(
    cluster: Cluster,
) -> None:
    """after naming a job that does not exist, or the id the job itself would get (the next
    one), is refused with InvalidArgument naming the field, the ids and the rule; nothing is
    stored, not even the idempotency key (a corrected retry with it works)."""
    a = await cluster.submit()
    jobs_before = await cluster.admin.fetchval("SELECT count(*) FROM jobs")
    for after in ((a, a + 1000), (a + 1,)):
        with pytest.raises(InvalidArgument) as info:
            await cluster.submit(after=after, key="k-1")
        message = str(info.value)
        assert message.startswith("after must name jobs that exist")
        assert f"no job {after[-1]}" in message
    with pytest.raises(InvalidArgument, match=r"specs\[1\]\.after must name jobs that exist"):
        spec = pb.JobSpec(name="t", cpu_millis=1, memory_mb=1, sleep=pb.SleepRuntime(duration_ms=1))
        bad = pb.JobSpec(
            name="t", cpu_millis=1, memory_mb=1, sleep=pb.SleepRuntime(duration_ms=1), after=[a + 7]
        )
        await cluster.cp.call("submit_jobs", pb.SubmitJobsRequest(specs=[spec, bad]))
    assert await cluster.admin.fetchval("SELECT count(*) FROM jobs") == jobs_before
    assert await cluster.admin.fetchval("SELECT count(*) FROM idempotency_keys WHERE key = 'k-1'") == 0
    b = await cluster.submit(after=(a,), key="k-1")
    assert b > a and await cluster.states(b) == ["waiting"]


async def test_a_dependency_on_a_newer_job_cannot_be_stored(cluster: Cluster) -> None:
    """The database itself refuses a job whose dependency is not older than it (no cycle can
    form): jobs_after_older_check."""
    a = await cluster.submit()
    with pytest.raises(Exception, match="jobs_after_older_check"):
        await cluster.admin.execute("UPDATE jobs SET after_ids = ARRAY[id] WHERE id = $1", a)


async def test_an_array_with_a_limit_never_has_more_tasks_active_than_it(cluster: Cluster) -> None:
    """An array of 5 tasks (indices 3-7) with %2: one row per task, array_id the first task's
    id and the reply's; 2 pending and 3 waiting (reason array limit: 2 running) at first; as
    tasks finish one by one, at most 2 are ever pending, assigned or running, and all 5 succeed
    in index order; GetJob of a task counts the array's tasks per state."""
    array_id = await cluster.submit(array=pb.JobArray(first_index=3, last_index=7, max_running=2))
    rows = await cluster.admin.fetch(
        "SELECT id, array_id, array_index, state, reason FROM jobs WHERE array_id = $1 ORDER BY array_index",
        array_id,
    )
    assert [r["array_index"] for r in rows] == [3, 4, 5, 6, 7]
    assert rows[0]["id"] == array_id and {r["array_id"] for r in rows} == {array_id}
    assert [r["state"] for r in rows] == ["pending", "pending", "waiting", "waiting", "waiting"]
    assert rows[4]["reason"] == "array limit: 2 running"
    info = await cluster.cp.call("get_job", pb.GetJobRequest(job_id=int(rows[4]["id"])))
    assert (info.array_id, info.array_index) == (array_id, 7)
    assert {c.state: c.count for c in info.array_counts} == {"pending": 2, "waiting": 3}
    finished: list[int] = []
    while len(finished) < 5:
        active = await cluster.admin.fetch(
            f"SELECT id, array_index FROM jobs WHERE array_id = $1 AND state IN {ACTIVE} ORDER BY id",
            array_id,
        )
        assert 1 <= len(active) <= 2
        await cluster.place(int(active[-1]["id"]))  # assigned, still counted
        await cluster.settle()
        assert await cluster.admin.fetchval(
            f"SELECT count(*) FROM jobs WHERE array_id = $1 AND state IN {ACTIVE}",
            array_id,
        ) == len(active)
        await cluster.admin.execute(
            "UPDATE assignments SET state = 'finished' WHERE job_id = $1", int(active[-1]["id"])
        )
        await cluster.admin.execute(
            "UPDATE jobs SET state = 'succeeded' WHERE id = $1", int(active[-1]["id"])
        )
        finished.append(int(active[-1]["array_index"]))
        await cluster.settle()
        assert (
            await cluster.admin.fetchval(
                f"SELECT count(*) FROM jobs WHERE array_id = $1 AND state IN {ACTIVE}",
                array_id,
            )
            <= 2
        )
    assert sorted(finished) == [3, 4, 5, 6, 7]
    assert await cluster.admin.fetchval("SELECT count(*) FROM jobs WHERE state = 'waiting'") == 0


async def test_cancel_by_array_id_cancels_every_task_that_has_not_ended(cluster: Cluster) -> None:
    """Cancel of an array's id: its pending and waiting tasks are cancelled at once, an
    assigned one is asked to cancel (cancelling), one that ended is left; only_this_task
    cancels the first task alone."""
    array_id = await cluster.submit(array=pb.JobArray(first_index=1, last_index=4, max_running=2))
    ids = [
        r["id"]
        for r in await cluster.admin.fetch("SELECT id FROM jobs WHERE array_id = $1 ORDER BY id", array_id)
    ]
    await cluster.finish(ids[0])
    await cluster.place(ids[1])
    reply = await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=array_id))
    assert (reply.state, reply.tasks) == ("cancelling", 3)
    assert await cluster.states(*ids) == ["succeeded", "assigned", "cancelled", "cancelled"]
    assert await cluster.admin.fetchval("SELECT cancel_requested FROM jobs WHERE id = $1", ids[1])
    other = await cluster.submit(array=pb.JobArray(first_index=0, last_index=2))
    reply = await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=other, only_this_task=True))
    assert (reply.state, reply.tasks) == ("cancelled", 0)
    rows = await cluster.admin.fetch("SELECT state FROM jobs WHERE array_id = $1 ORDER BY array_index", other)
    assert [r["state"] for r in rows] == ["cancelled", "pending", "pending"]


async def test_an_arrays_id_reads_as_the_array_and_its_other_tasks_as_one_job(cluster: Cluster) -> None:
    """GetJob of an array's id gives the array's spec (its range and limit), so the job's spec
    submitted again is the array again; another task's spec is one job's."""
    array = pb.JobArray(first_index=3, last_index=6, max_running=2)
    array_id = await cluster.submit(array=array)
    head = await cluster.cp.call("get_job", pb.GetJobRequest(job_id=array_id))
    assert head.spec.array == array and (head.array_id, head.array_index) == (array_id, 3)
    task = await cluster.cp.call("get_job", pb.GetJobRequest(job_id=array_id + 1))
    assert task.spec.array is None and (task.array_id, task.array_index) == (array_id, 4)
    again = await cluster.cp.call("submit_job", pb.SubmitJobRequest(spec=head.spec))
    rows = await cluster.admin.fetch(
        "SELECT array_index FROM jobs WHERE array_id = $1 ORDER BY array_index", int(again.job_id)
    )
    assert [r["array_index"] for r in rows] == [3, 4, 5, 6]


async def test_a_job_after_an_arrays_id_waits_for_every_task(cluster: Cluster) -> None:
    """A job after an array's id waits until every task succeeded, not only the first (whose
    id the array's is); a job after another task's id waits for that task alone; a job after
    a finished array is pending at once."""
    array_id = await cluster.submit(array=pb.JobArray(first_index=1, last_index=3))
    tasks = [array_id, array_id + 1, array_id + 2]
    whole = await cluster.submit(after=(array_id,))
    one = await cluster.submit(after=(tasks[1],))
    assert (await cluster.job(whole))["reason"] == f"waiting for job {array_id}"
    await cluster.finish(tasks[0])
    assert await cluster.settle() == ([], [])
    await cluster.finish(tasks[1])
    assert await cluster.settle() == ([one], [])
    assert await cluster.states(whole) == ["waiting"]
    await cluster.finish(tasks[2])
    assert await cluster.settle() == ([whole], [])
    later = await cluster.submit(after=(array_id,))
    assert (await cluster.job(later))["state"] == "pending"


async def test_a_failed_or_cancelled_task_cancels_the_jobs_after_its_array(cluster: Cluster) -> None:
    """One task of an array fails while the others succeed: the job after the array is
    cancelled, its reason naming the array's id; a cancelled task does the same."""
    array_id = await cluster.submit(array=pb.JobArray(first_index=0, last_index=2))
    after = await cluster.submit(after=(array_id,))
    await cluster.finish(array_id)
    await cluster.finish(array_id + 2)
    await cluster.finish(array_id + 1, "failed")
    assert await cluster.settle() == ([], [after])
    assert (await cluster.job(after))["reason"] == f"dependency_failed: job {array_id}"
    history = await load_history(cluster.database_url)
    assert history.dependency_states[array_id] == "failed"  # what stockade check reads
    other = await cluster.submit(array=pb.JobArray(first_index=0, last_index=1))
    waiting = await cluster.submit(after=(other,))
    await cluster.finish(other)
    await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=other + 1, only_this_task=True))
    assert await cluster.settle() == ([], [waiting])


async def test_a_settling_write_under_a_stale_epoch_changes_nothing(
    cluster: Cluster, database_url: str
) -> None:
    """Through the real ledger: a SettleWaitingJobs under epoch 2 while epoch 1 holds the lease
    is refused (StaleEpoch) and the waiting job stays waiting; under epoch 1 it is released."""
    a = await cluster.submit()
    await cluster.finish(a)
    await cluster.admin.execute(
        "UPDATE jobs SET state = 'waiting' WHERE id = $1", a
    )  # a job with no dependency
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    lease_send, _lease_recv = trio.open_memory_channel[LeaseInbox](8)
    from runtime.settings.leader import LedgerSettings

    ledger = Ledger(
        cp_id="cp-1",
        database_url=database_url,
        settings=LedgerSettings(),
        inbox=ledger_recv,
        lease_inbox=lease_send,
    )

    async def settle(epoch: int) -> SettledJobs:
        reply: Reply[SettledJobs] = Reply()
        await ledger_send.send(SettleWaitingJobs(epoch=epoch, release=(a,), cancel=(), reply=reply))
        return await reply.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(ledger.run)
        with pytest.raises(StaleEpoch):
            await settle(2)
        assert await cluster.states(a) == ["waiting"]
        assert (await settle(1)).released_job_ids == (a,)
        nursery.cancel_scope.cancel()
    assert await cluster.states(a) == ["pending"]

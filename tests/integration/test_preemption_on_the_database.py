"""Preemption on a real PostgreSQL (docs/preemption.md): the fenced mark (PreemptAssignments)
through a real ledger, refused under an older epoch; the cooldown; and a real reconciler that
stops a marked run with the preemption's grace and, once acknowledged, ends it as stopped
('preempted') with its job pending again, no attempt spent, reason ``preempted by job N``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
import trio
from serving import ingest_and_leader, placer_with_ledger
from test_drain import DrainLeader, Drains
from test_fenced_write_size import run_ledger, take_over_as_cp_2, until
from test_leave import succeeded

from actors import queries
from actors.messages import EndPreemptedAssignments, LedgerInbox, PreemptAssignments
from protocol import pb
from runtime.errors import StaleEpoch
from runtime.reply import Reply
from runtime.settings.leader import PlacerSettings

EPOCH = 1


@attrs.frozen
class Preemptions(Drains):
    """test_drain's cluster, with jobs of a priority and a size."""

    async def submit_job(self, *, priority: int, cpu_millis: int = 4000, memory_mb: int = 4096) -> int:
        reply = await self.cp.call(
            "submit_job",
            pb.SubmitJobRequest(
                spec=pb.JobSpec(
                    name="t",
                    cpu_millis=cpu_millis,
                    memory_mb=memory_mb,
                    priority=priority,
                    sleep=pb.SleepRuntime(duration_ms=600_000),
                )
            ),
        )
        return int(reply.job_id)

    async def running_low_job(self) -> tuple[int, int, int]:
        """w-1 (4000 cpu_millis, 4096 MiB) full with a priority-0 job, confirmed running:
        (incarnation, job id, assignment id)."""
        incarnation = await self.register("w-1")
        job = await self.submit_job(priority=0)
        aid = await self.place(job, "w-1", incarnation)
        await self.heartbeat("w-1", incarnation, aid)
        return incarnation, job, aid

    async def marks(self, aid: int) -> tuple[int | None, bool]:
        row = await self.admin.fetchrow(
            "SELECT preempted_by, preempt_requested_at IS NOT NULL AS requested FROM assignments"
            " WHERE id = $1",
            aid,
        )
        assert row is not None
        return row["preempted_by"], bool(row["requested"])


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Preemptions]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Preemptions(cp=cp, admin=admin, database_url=database_url)


async def preempt(
    ledger: trio.MemorySendChannel[LedgerInbox],
    epoch: int,
    preemptions: tuple[tuple[int, int], ...],
    cooldown_s: float = 60.0,
) -> tuple[int, ...]:
    reply: Reply[tuple[int, ...]] = Reply()
    await ledger.send(
        PreemptAssignments(epoch=epoch, preemptions=preemptions, cooldown_s=cooldown_s, reply=reply)
    )
    return await reply.wait()


async def test_the_fenced_mark_sets_the_preemption_and_a_deposed_leaders_changes_nothing(
    cluster: Preemptions,
) -> None:
    """Under the current epoch the mark sets preempted_by, preempt_requested_at and the job's
    preempted_at; once cp-2 took over, cp-1's mark of another run is refused (StaleEpoch),
    recorded as a stale write, and changes nothing."""
    _, low, aid = await cluster.running_low_job()
    high = await cluster.submit_job(priority=10)
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, cluster.database_url)
        assert await preempt(ledger, EPOCH, ((aid, high),)) == (aid,)
        assert await cluster.marks(aid) == (high, True)
        assert await cluster.admin.fetchval("SELECT preempted_at IS NOT NULL FROM jobs WHERE id = $1", low)

        w2 = await cluster.register("w-2")
        other = await cluster.submit_job(priority=0)
        other_aid = await cluster.place(other, "w-2", w2)
        await take_over_as_cp_2(cluster.admin)
        with pytest.raises(StaleEpoch):
            await preempt(ledger, EPOCH, ((other_aid, high),))
        nursery.cancel_scope.cancel()
    assert await cluster.marks(other_aid) == (None, False)
    assert await cluster.admin.fetchval("SELECT preempted_at IS NULL FROM jobs WHERE id = $1", other)
    assert await cluster.count("SELECT count(*) FROM stale_writes WHERE what = 'preempt 1 assignments'") == 1


async def test_a_job_is_preempted_at_most_once_per_cooldown(cluster: Preemptions) -> None:
    """A job preempted a moment ago is not marked again within the cooldown (its new run
    stays), but is once the cooldown is 0; an assignment already marked is not marked twice."""
    incarnation, low, aid = await cluster.running_low_job()
    high = await cluster.submit_job(priority=10)
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, cluster.database_url)
        assert await preempt(ledger, EPOCH, ((aid, high),)) == (aid,)
        assert await preempt(ledger, EPOCH, ((aid, high),), cooldown_s=0.0) == ()
        # The run ends (stopped by its worker), the job runs again: still in its cooldown.
        await cluster.admin.execute(
            "UPDATE assignments SET state = 'stopped', ended_at = now(), end_reason = 'preempted'"
            " WHERE id = $1",
            aid,
        )
        await cluster.admin.execute("UPDATE jobs SET state = 'pending' WHERE id = $1", low)
        again = await cluster.place(low, "w-1", incarnation)
        assert await preempt(ledger, EPOCH, ((again, high),), cooldown_s=3600.0) == ()
        assert await cluster.marks(again) == (None, False)
        assert await preempt(ledger, EPOCH, ((again, high),), cooldown_s=0.0) == (again,)
        nursery.cancel_scope.cancel()


async def test_an_acknowledged_preemption_requeues_without_spending_an_attempt(
    cluster: Preemptions,
) -> None:
    """A real reconciler stops the marked run on its worker with the preemption's grace and,
    once the worker acknowledged, ends it as stopped ('preempted', under epoch 1): its job is
    pending again at once, no attempt spent, no loss, no backoff, reason 'preempted by job N'."""
    _, low, aid = await cluster.running_low_job()
    high = await cluster.submit_job(priority=10)
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, cluster.database_url)
        assert await preempt(ledger, EPOCH, ((aid, high),)) == (aid,)
        nursery.cancel_scope.cancel()

    leader = DrainLeader(epoch=EPOCH)
    async with trio.open_nursery() as nursery:
        await nursery.start(leader.run, cluster.database_url)
        await until(
            lambda: cluster.admin.fetchval("SELECT count(*) = 0 FROM assignments WHERE state = 'active'")
        )
        nursery.cancel_scope.cancel()
    assert leader.stopped == [("w-1", (aid,))]
    assert leader.graces_s == [5.0]
    assert await cluster.assignment(aid) == {
        "state": "stopped",
        "end_reason": "preempted",
        "ended_epoch": EPOCH,
    }
    assert await cluster.job_row(low) == {
        "state": "pending",
        "losses": 0,
        "not_before": None,
        "attempts": 1,
        "reason": f"preempted by job {high}",
    }
    assert await cluster.count("SELECT failures FROM jobs WHERE id = " + str(low)) == 0
    detail = await cluster.admin.fetchval("SELECT detail FROM assignments WHERE id = $1", aid)
    assert detail == f"preempted by job {high}"


async def test_a_run_that_ends_on_its_own_during_the_grace_keeps_its_outcome(cluster: Preemptions) -> None:
    """A marked run whose success its worker reported before the preemption's end is neither
    read as due nor ended by EndPreemptedAssignments: the job stays succeeded."""
    incarnation, low, aid = await cluster.running_low_job()
    high = await cluster.submit_job(priority=10)
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, cluster.database_url)
        assert await preempt(ledger, EPOCH, ((aid, high),)) == (aid,)
        await cluster.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(worker_id="w-1", incarnation=incarnation, finished=[succeeded(aid, low)]),
        )
        assert await cluster.admin.fetch(queries.PREEMPT_DUE_ASSIGNMENTS) == []
        reply: Reply[tuple[int, ...]] = Reply()
        await ledger.send(EndPreemptedAssignments(epoch=EPOCH, assignment_ids=(aid,), reply=reply))
        assert await reply.wait() == ()
        nursery.cancel_scope.cancel()
    assert (await cluster.assignment(aid))["state"] == "finished"
    assert (await cluster.job_row(low))["state"] == "succeeded"


PREEMPTING = PlacerSettings(preemption=True, preempt_cooldown_s=60.0)


async def test_a_leaders_round_preempts_a_lower_priority_run_and_places_the_job_where_it_freed_room(
    cluster: Preemptions,
) -> None:
    """w-1 is full with a priority-0 job; a priority-10 job of the same size is submitted: a
    real placer's round (preemption on) marks the low job's assignment to be preempted by it and
    holds w-1 for it; a real reconciler stops the run and, once acknowledged, requeues the low
    job; the next round places the high job on w-1, and the low one waits (no room)."""
    incarnation, low, aid = await cluster.running_low_job()
    high = await cluster.submit_job(priority=10)
    async with placer_with_ledger(cluster.database_url, PREEMPTING) as placer:
        assert await placer.round(EPOCH) == ()
        assert await cluster.marks(aid) == (high, True)
        assert placer.held == {}  # worked out at the next round's start
        leader = DrainLeader(epoch=EPOCH)
        async with trio.open_nursery() as nursery:
            await nursery.start(leader.run, cluster.database_url)
            await until(
                lambda: cluster.admin.fetchval("SELECT state = 'pending' FROM jobs WHERE id = $1", low)
            )
            nursery.cancel_scope.cancel()
        await cluster.heartbeat("w-1", incarnation)
        committed = await placer.round(EPOCH)
        assert placer.held == {"w-1": high}
    assert [(c.job_id, c.worker_id) for c in committed] == [(high, "w-1")]
    assert (await cluster.job_row(low))["state"] == "pending"
    assert (await cluster.job_row(low))["attempts"] == 1


async def test_preemption_off_preempts_nothing(cluster: Preemptions) -> None:
    """With preemption off (the default) the same round marks nothing."""
    _, _, aid = await cluster.running_low_job()
    await cluster.submit_job(priority=10)
    async with placer_with_ledger(cluster.database_url) as placer:
        assert await placer.round(EPOCH) == ()
    assert await cluster.marks(aid) == (None, False)


async def test_a_job_in_its_cooldown_is_not_preempted_by_a_round(cluster: Preemptions) -> None:
    """A running job preempted within the cooldown is not a victim: the round marks nothing."""
    _, low, aid = await cluster.running_low_job()
    await cluster.admin.execute("UPDATE jobs SET preempted_at = now() WHERE id = $1", low)
    await cluster.submit_job(priority=10)
    async with placer_with_ledger(cluster.database_url, PREEMPTING) as placer:
        assert await placer.round(EPOCH) == ()
    assert await cluster.marks(aid) == (None, False)


async def test_a_mark_lapses_when_its_preempting_job_is_no_longer_pending(cluster: Preemptions) -> None:
    """The preempting job is cancelled before the reconciler stopped its victim: the victim is no
    longer due (its run is left alone), is preemptible again, and a later preemption may mark it
    anew. (Before, the victim was killed for a job that no longer waited.)"""
    incarnation, _, aid = await cluster.running_low_job()
    high = await cluster.submit_job(priority=10)
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, cluster.database_url)
        assert await preempt(ledger, EPOCH, ((aid, high),), cooldown_s=0.0) == (aid,)

        async def due() -> list[int]:
            return [
                int(r["assignment_id"]) for r in await cluster.admin.fetch(queries.PREEMPT_DUE_ASSIGNMENTS)
            ]

        async def preemptible() -> list[int]:
            row = await cluster.admin.fetchrow(queries.PREEMPTIBLE, 10, 0.0, ["w-1"], [incarnation])
            assert row is not None
            return list(row["v_assignment_id"] or [])

        assert await due() == [aid] and await preemptible() == []
        await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=high))
        assert await due() == [] and await preemptible() == [aid]
        later = await cluster.submit_job(priority=10)
        assert await preempt(ledger, EPOCH, ((aid, later),), cooldown_s=0.0) == (aid,)
        assert await cluster.marks(aid) == (later, True)
        assert await due() == [aid]
        nursery.cancel_scope.cancel()

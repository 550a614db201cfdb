"""Restarts that keep jobs, on a real PostgreSQL through a real ingest (gRPC): a registration
that asks to continue an incarnation, and every refusal; a planned restart's hold, and what the
leader's statements make of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from serving import ingest_and_leader
from test_leave import EPOCH, Cluster, succeeded

from actors import queries
from protocol import pb
from runtime.errors import IdempotencyConflict, InvalidArgument

OLD_RUN = "run-old"
NEW_RUN = "run-new"


class Restarts(Cluster):
    async def resume(
        self,
        worker_id: str,
        incarnation: int,
        *held: int,
        run_id: str = NEW_RUN,
        seq: int = 1,
        cpu_millis: int = 4000,
        finished: tuple[pb.JobOutcome, ...] = (),
    ) -> pb.RegisterWorkerReply:
        """A restarted agent's registration asking to continue ``incarnation``, holding ``held``."""
        reply: pb.RegisterWorkerReply = await self.cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(
                worker_id=worker_id,
                address="127.0.0.1:10",
                cpu_millis=cpu_millis,
                memory_mb=4096,
                agent_run_id=run_id,
                registration_seq=seq,
                finished=list(finished),
                resume_incarnation=incarnation,
                held_assignment_ids=list(held),
            ),
        )
        return reply

    async def row(self, worker_id: str) -> dict[str, object]:
        record = await self.admin.fetchrow(
            """SELECT state, incarnation, agent_run_id, cpu_millis, address, hold_until IS NOT NULL AS held
                 FROM workers WHERE id = $1""",
            worker_id,
        )
        assert record is not None
        return dict(record)


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Restarts]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Restarts(cp=cp, admin=admin, database_url=database_url)


async def test_a_continued_incarnation_keeps_what_its_agent_holds_and_releases_the_rest(
    cluster: Restarts,
) -> None:
    """A restarted agent holding one running job, reporting one that ended meanwhile, and
    knowing nothing of a third: the row keeps its incarnation with the new run, address,
    capacity and a fresh heartbeat; the held assignment stays active; the outcome finishes its
    own; the third is released (stopped, end_reason released) and its job pending again at
    once, with no loss and no backoff; the allocation counts only what is still active."""
    incarnation = await cluster.register("w-1", OLD_RUN)
    jobs = [await cluster.submit() for _ in range(3)]
    aids = [await cluster.place(job, "w-1", incarnation) for job in jobs]
    await cluster.heartbeat("w-1", incarnation, aids[0], aids[1])  # the third is unconfirmed

    before_resume = await cluster.admin.fetchval("SELECT clock_timestamp()")
    reply = await cluster.resume(
        "w-1", incarnation, aids[0], cpu_millis=3000, finished=(succeeded(aids[1], jobs[1]),)
    )
    assert (reply.resumed, reply.incarnation) == (True, incarnation)
    assert (list(reply.stop_assignment_ids), list(reply.released_assignment_ids)) == ([], [aids[2]])
    row = await cluster.row("w-1")
    assert (row["state"], row["incarnation"], row["agent_run_id"], row["cpu_millis"], row["address"]) == (
        "alive",
        incarnation,
        NEW_RUN,
        3000,
        "127.0.0.1:10",
    )
    fresh = "SELECT last_heartbeat_at >= $1 FROM workers WHERE id = 'w-1'"
    assert await cluster.admin.fetchval(fresh, before_resume), "the continuation did not count as a heartbeat"
    assert (await cluster.assignment(aids[0]))["state"] == "active"
    assert (await cluster.job(jobs[0]))["state"] == "running"
    assert (await cluster.assignment(aids[1]))["state"] == "finished"
    assert (await cluster.job(jobs[1]))["state"] == "succeeded"
    assert await cluster.assignment(aids[2]) == {
        "state": "stopped",
        "end_reason": "released",
        "ended_epoch": None,
    }
    assert await cluster.job(jobs[2]) == {"state": "pending", "losses": 0, "not_before": None, "reason": ""}
    allocation = await cluster.admin.fetchrow(
        "SELECT incarnation, cpu_allocated_millis FROM worker_allocations WHERE worker_id = 'w-1'"
    )
    assert allocation is not None and tuple(allocation) == (incarnation, 100)
    # Heartbeats of the continued incarnation are those of a live worker.
    assert not (await cluster.heartbeat("w-1", incarnation, aids[0])).reregister


async def test_a_held_assignment_that_ended_meanwhile_is_listed_to_stop(cluster: Restarts) -> None:
    """A held assignment the control plane ended while the agent was away (here, by hand, as
    an acknowledged cancel would) is listed to stop; nothing else changes for it."""
    incarnation = await cluster.register("w-1", OLD_RUN)
    job = await cluster.submit()
    aid = await cluster.place(job, "w-1", incarnation)
    await cluster.admin.execute(
        "UPDATE assignments SET state = 'cancelled', ended_at = now(), end_reason = 'cancelled'"
        " WHERE id = $1",
        aid,
    )
    reply = await cluster.resume("w-1", incarnation, aid)
    assert reply.resumed and list(reply.stop_assignment_ids) == [aid]
    assert list(reply.released_assignment_ids) == []


async def test_a_worker_declared_dead_is_not_continued(cluster: Restarts) -> None:
    """Declared dead while its agent was away: the incarnation is not continued (incarnation 0),
    the row and the assignments stay as the declaration left them, and the outcomes the
    registration carried are still recorded."""
    incarnation = await cluster.register("w-1", OLD_RUN)
    jobs = [await cluster.submit() for _ in range(2)]
    aids = [await cluster.place(job, "w-1", incarnation) for job in jobs]
    # Judged by the declaration's dead_after alone (0 s: silent now), not by the one told at
    # registration (docs/design.md, "Heartbeat interval").
    await cluster.admin.execute("UPDATE workers SET dead_after_ms = NULL")
    declared = await cluster.admin.fetch(
        queries.DECLARE_DEAD_WORKERS, EPOCH, -1.0, ["w-1"], [incarnation], None
    )
    assert [r["id"] for r in declared] == ["w-1"]
    reply = await cluster.resume("w-1", incarnation, aids[0], finished=(succeeded(aids[1], jobs[1]),))
    assert (reply.resumed, reply.incarnation, list(reply.released_assignment_ids)) == (False, 0, [])
    row = await cluster.row("w-1")
    assert (row["state"], row["incarnation"], row["agent_run_id"]) == ("dead", incarnation, OLD_RUN)
    assert (await cluster.assignment(aids[0]))["state"] == "active"  # the leader's sweep ends it
    assert (await cluster.job(jobs[1]))["state"] == "succeeded"


async def test_a_worker_registered_again_since_is_not_continued(cluster: Restarts) -> None:
    """Another registration since (a new incarnation) wins: the old one is not continued."""
    old = await cluster.register("w-1", OLD_RUN)
    aid = await cluster.place(await cluster.submit(), "w-1", old)
    newer = await cluster.register("w-1", "run-other")
    reply = await cluster.resume("w-1", old, aid)
    assert (reply.resumed, reply.incarnation) == (False, 0)
    row = await cluster.row("w-1")
    assert (row["incarnation"], row["agent_run_id"]) == (newer, "run-other")


async def test_a_worker_that_left_is_not_continued(cluster: Restarts) -> None:
    """A clean stop's left row is not continued: its jobs were stopped before it left."""
    incarnation = await cluster.register("w-1", OLD_RUN)
    assert (await cluster.leave("w-1", incarnation, OLD_RUN)).left
    reply = await cluster.resume("w-1", incarnation)
    assert not reply.resumed
    assert (await cluster.row("w-1"))["state"] == "left"


async def test_a_copy_of_a_continuation_is_answered_again_and_releases_nothing_more(
    cluster: Restarts,
) -> None:
    """A retried copy of an applied continuation (same run, same number) is answered resumed
    with the assignments the first released; an assignment placed on the continued incarnation
    in between is its agent's and stays active. The same key with another capacity is refused."""
    incarnation = await cluster.register("w-1", OLD_RUN)
    kept = await cluster.place(await cluster.submit(), "w-1", incarnation)
    lost = await cluster.place(await cluster.submit(), "w-1", incarnation)
    first = await cluster.resume("w-1", incarnation, kept)
    assert list(first.released_assignment_ids) == [lost]
    placed_since = await cluster.place(await cluster.submit(), "w-1", incarnation)
    again = await cluster.resume("w-1", incarnation, kept)
    assert (again.resumed, again.incarnation, list(again.released_assignment_ids)) == (
        True,
        incarnation,
        [lost],
    )
    assert (await cluster.assignment(placed_since))["state"] == "active"
    with pytest.raises(IdempotencyConflict):
        await cluster.resume("w-1", incarnation, kept, cpu_millis=1000)


async def test_held_assignments_without_an_incarnation_are_refused_and_nothing_is_stored(
    cluster: Restarts,
) -> None:
    """Held ids with no incarnation to continue, or an id out of range: refused naming the
    field, and the worker's row is not touched."""
    incarnation = await cluster.register("w-1", OLD_RUN)
    with pytest.raises(InvalidArgument, match="held_assignment_ids"):
        await cluster.resume("w-1", 0, 5)
    with pytest.raises(InvalidArgument, match=r"held_assignment_ids\[1\]"):
        await cluster.resume("w-1", incarnation, 5, 0)
    assert (await cluster.row("w-1"))["agent_run_id"] == OLD_RUN


async def hold(cluster: Restarts, worker_id: str, incarnation: int, hold_ms: int) -> pb.HeartbeatReply:
    reply: pb.HeartbeatReply = await cluster.cp.call(
        "heartbeat",
        pb.HeartbeatRequest(worker_id=worker_id, incarnation=incarnation, restart_hold_ms=hold_ms),
    )
    return reply


async def test_a_restart_hold_keeps_the_worker_from_being_judged_or_placed_on(cluster: Restarts) -> None:
    """A heartbeat asking for a 60 s restart hold is granted: while it holds, the worker's
    silence does not count (its age is negative, and a declaration with no dead_after at all
    finds nothing), and no placement lands on it; the continuation clears the hold."""
    incarnation = await cluster.register("w-1", OLD_RUN)
    reply = await hold(cluster, "w-1", incarnation, 60_000)
    assert reply.restart_hold_granted and not reply.reregister
    assert (await cluster.row("w-1"))["held"]
    ages = {r["id"]: r["age_s"] for r in await cluster.admin.fetch(queries.HEARTBEAT_AGES)}
    assert ages["w-1"] < 0  # its silence counts from the hold's end, a minute away
    declared = await cluster.admin.fetch(
        queries.DECLARE_DEAD_WORKERS, EPOCH, 0.0, ["w-1"], [incarnation], None
    )
    assert declared == []
    job = await cluster.submit()
    rows = await cluster.admin.fetch(
        queries.COMMIT_PLACEMENTS, [job], ["w-1"], [incarnation], EPOCH, True, [], [], [], [], []
    )
    assert [r["assignment_id"] for r in rows] == [None]
    live = await cluster.admin.fetch(queries.LIVE_WORKERS, 60.0, 5.0)
    assert [r["id"] for r in live] == []
    assert (await cluster.resume("w-1", incarnation)).resumed
    assert not (await cluster.row("w-1"))["held"]
    assert [r["id"] for r in await cluster.admin.fetch(queries.LIVE_WORKERS, 60.0, 5.0)] == ["w-1"]


async def test_a_restart_hold_of_a_dead_incarnation_or_past_the_limit_is_not_recorded(
    cluster: Restarts,
) -> None:
    """A hold asked by an incarnation that is not alive is not granted (register again), and one
    past ten minutes is refused naming the field; neither is stored."""
    old = await cluster.register("w-1", OLD_RUN)
    await cluster.register("w-1", "run-other")
    reply = await hold(cluster, "w-1", old, 5_000)
    assert reply.reregister and not reply.restart_hold_granted
    with pytest.raises(InvalidArgument, match="restart_hold_ms"):
        await hold(cluster, "w-1", old + 1, 600_001)
    assert not (await cluster.row("w-1"))["held"]

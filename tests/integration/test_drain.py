"""Drain and cordon on a real PostgreSQL: the requests through a real ingest (gRPC), the placer's
reads and claim, and a real leader (ledger and reconciler, fenced writes under epoch 1) ending
what a drain's deadline stopped, with a dispatcher that stands in for the worker and
acknowledges every stop it is asked for.

The leader's reconciler runs with a ``dead_after_s`` of an hour: nothing it does here can be a
dead-worker declaration, so what ends the assignments is the drain alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
from serving import ingest_and_leader
from test_fenced_write_size import BATCH, LEDGER, until
from test_leave import NO_DEATHS, Cluster, succeeded

from actors import queries
from actors.ledger import Ledger
from actors.messages import (
    CancelOnWorker,
    DispatcherInbox,
    Elected,
    EpochSuperseded,
    LeaseInbox,
    LedgerInbox,
    QueryRole,
    RoleChange,
)
from actors.placer_store import PgPlacerStore
from actors.reconciler import Reconciler
from actors.reconciler_store import PgReconcilerStore
from actors.role import RoleView
from protocol import pb
from runtime.errors import IdempotencyConflict, InvalidArgument, NotFound

EPOCH = 1


@attrs.define
class DrainLeader:
    """A ledger and a reconciler leading under ``epoch``; the dispatcher acknowledges every
    cancel (the worker stopped the job) and records what it was asked to stop."""

    epoch: int
    stopped: list[tuple[str, tuple[int, ...]]] = attrs.field(factory=list)
    graces_s: list[float] = attrs.field(factory=list)
    """The stop's grace each cancel asked for (0: the worker's own)."""
    superseded: list[EpochSuperseded] = attrs.field(factory=list)

    async def run(self, url: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        lease_send, lease_recv = trio.open_memory_channel[LeaseInbox](64)
        ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](16)
        dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](1024)
        _, roles_recv = trio.open_memory_channel[RoleChange](8)
        ledger = Ledger(
            cp_id="cp-1", database_url=url, settings=LEDGER, inbox=ledger_recv, lease_inbox=lease_send
        )
        store = PgReconcilerStore(database_url=url, application_name="stockade test reconciler")
        reconciler = Reconciler(
            settings=NO_DEATHS,
            store=store,
            role=RoleView(changes=roles_recv, lease_inbox=lease_send),
            ledger=ledger_send,
            dispatcher=dispatch_send,
            max_rows_per_fenced_write=BATCH,
        )

        async def lease_keeper() -> None:
            async for message in lease_recv:
                match message:
                    case QueryRole(reply=reply):
                        reply.set(Elected(seq=1, epoch=self.epoch))
                    case EpochSuperseded():
                        self.superseded.append(message)

        async def worker_side() -> None:
            async for message in dispatch_recv:
                if isinstance(message, CancelOnWorker):
                    self.stopped.append((message.worker.worker_id, message.assignment_ids))
                    self.graces_s.append(message.grace_s)
                    message.reply.set(message.assignment_ids)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lease_keeper)
                nursery.start_soon(worker_side)
                await nursery.start(ledger.run)
                await nursery.start(reconciler.run)
                task_status.started()
        finally:
            await store.close()


@attrs.frozen
class Drains(Cluster):
    """test_leave's cluster (an ingest, a client, an admin connection at epoch 1), with the
    operator's calls and the placer's reads."""

    async def cordon(self, worker_id: str, key: str = "") -> pb.WorkerScheduleReply:
        request = pb.CordonWorkerRequest(worker_id=worker_id, idempotency_key=key)
        reply: pb.WorkerScheduleReply = await self.cp.call("cordon_worker", request)
        return reply

    async def uncordon(self, worker_id: str) -> pb.WorkerScheduleReply:
        reply: pb.WorkerScheduleReply = await self.cp.call(
            "uncordon_worker", pb.UncordonWorkerRequest(worker_id=worker_id)
        )
        return reply

    async def drain(
        self, worker_id: str, deadline_ms: int | None = None, key: str = ""
    ) -> pb.WorkerScheduleReply:
        request = pb.DrainWorkerRequest(
            worker_id=worker_id,
            has_deadline=deadline_ms is not None,
            deadline_ms=deadline_ms or 0,
            idempotency_key=key,
        )
        reply: pb.WorkerScheduleReply = await self.cp.call("drain_worker", request)
        return reply

    async def try_place(self, job_id: int, worker_id: str, incarnation: int) -> int | None:
        """The placer's claim (COMMIT_PLACEMENTS) under epoch 1; the assignment id, or None when
        it claimed nothing."""
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS, [job_id], [worker_id], [incarnation], EPOCH, True, [], [], [], [], []
        )
        return None if rows[0]["assignment_id"] is None else int(rows[0]["assignment_id"])

    async def placer_sees(self) -> dict[str, bool]:
        """worker id -> cordoned, as the placer's round read returns the live workers."""
        store = PgPlacerStore(database_url=self.database_url, application_name="stockade test placer")
        try:
            workers = await store.live_workers(60.0)
            round_workers, _, _ = await store.read_round(60.0, (await store.pending_jobs(10))[1], 10)
        finally:
            await store.close()
        seen = {w.ref.worker_id: w.cordoned for w in workers}
        assert {w.ref.worker_id: w.cordoned for w in round_workers} == seen
        return seen

    async def status_of(self, worker_id: str) -> pb.WorkerInfo:
        status: pb.StatusReply = await self.cp.call("status", pb.StatusRequest())
        return next(w for w in status.workers if w.id == worker_id)

    async def job_row(self, job_id: int) -> dict[str, Any]:
        row = await self.admin.fetchrow(
            "SELECT state, losses, not_before, attempts, reason FROM jobs WHERE id = $1", job_id
        )
        assert row is not None
        return dict(row)


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Drains]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Drains(cp=cp, admin=admin, database_url=database_url)


async def test_a_cordoned_worker_is_not_placed_on_until_it_is_uncordoned(cluster: Drains) -> None:
    """w-1 cordoned: the placer's reads mark it, its claim on w-1 claims nothing and leaves the
    job pending, while w-2 still takes jobs; the cordon outlasts the agent's restart (a
    registration of another run); uncordoned, w-1 is placed on again."""
    w1, w2 = await cluster.register("w-1"), await cluster.register("w-2")
    reply = await cluster.cordon("w-1")
    assert (reply.worker_id, reply.cordoned, reply.draining, reply.drained) == ("w-1", True, False, False)
    assert await cluster.placer_sees() == {"w-1": True, "w-2": False}

    job = await cluster.submit()
    assert await cluster.try_place(job, "w-1", w1) is None
    assert (await cluster.job_row(job))["state"] == "pending"
    assert await cluster.try_place(job, "w-2", w2) is not None

    w1 = await cluster.register("w-1", "run-b")  # the agent restarted: a new incarnation
    assert (await cluster.placer_sees())["w-1"] is True
    assert (await cluster.status_of("w-1")).cordoned
    other = await cluster.submit()
    assert await cluster.try_place(other, "w-1", w1) is None

    reply = await cluster.uncordon("w-1")
    assert (reply.cordoned, reply.draining, reply.drained) == (False, False, False)
    assert (await cluster.placer_sees())["w-1"] is False
    assert await cluster.try_place(other, "w-1", w1) is not None


async def test_a_drains_deadline_stops_and_requeues_its_jobs_without_spending_a_loss(cluster: Drains) -> None:
    """w-1 runs three jobs; one ends on its own (succeeded); drained with a deadline of 0 the
    other two are stopped on it by the leader and, once acknowledged, end as stopped
    ('drained', under epoch 1) with their jobs pending again at once: no loss, no backoff,
    attempts as they were. w-1 is then drained, and takes no placement."""
    incarnation = await cluster.register("w-1")
    jobs = [await cluster.submit() for _ in range(3)]
    aids = [await cluster.place(job, "w-1", incarnation) for job in jobs]
    await cluster.heartbeat("w-1", incarnation, *aids)  # confirmed: running
    await cluster.cp.call(
        "heartbeat",
        pb.HeartbeatRequest(
            worker_id="w-1",
            incarnation=incarnation,
            running_assignment_ids=aids[1:],
            finished=[succeeded(aids[0], jobs[0])],
        ),
    )

    reply = await cluster.drain("w-1", deadline_ms=0)
    assert (reply.cordoned, reply.draining, reply.drained) == (True, True, False)
    assert list(reply.job_ids) == jobs[1:] and reply.drain_deadline_unix_s > 0
    info = await cluster.status_of("w-1")
    assert (info.cordoned, info.draining, info.drained) == (True, True, False)

    leader = DrainLeader(epoch=EPOCH)
    async with trio.open_nursery() as nursery:
        await nursery.start(leader.run, cluster.database_url)
        await until(
            lambda: cluster.admin.fetchval("SELECT count(*) = 0 FROM assignments WHERE state = 'active'")
        )
        nursery.cancel_scope.cancel()

    assert sorted(aid for _, ids in leader.stopped for aid in ids) == aids[1:]
    assert {worker_id for worker_id, _ in leader.stopped} == {"w-1"}
    assert await cluster.assignment(aids[0]) == {
        "state": "finished",
        "end_reason": "succeeded",
        "ended_epoch": None,
    }
    for aid, job in zip(aids[1:], jobs[1:], strict=True):
        assert await cluster.assignment(aid) == {
            "state": "stopped",
            "end_reason": "drained",
            "ended_epoch": EPOCH,
        }
        assert await cluster.job_row(job) == {
            "state": "pending",
            "losses": 0,
            "not_before": None,
            "attempts": 1,
            "reason": "",
        }
    assert (await cluster.job_row(jobs[0]))["state"] == "succeeded"
    assert leader.superseded == []
    info = await cluster.status_of("w-1")
    assert (info.cordoned, info.draining, info.drained, list(info.job_ids)) == (True, False, True, [])
    assert await cluster.try_place(jobs[1], "w-1", incarnation) is None
    assert await cluster.count("SELECT count(*) FROM worker_deaths") == 0


async def test_a_drain_without_a_deadline_stops_nothing_and_is_drained_when_its_jobs_end(
    cluster: Drains,
) -> None:
    """Drained without a deadline, the leader stops none of w-1's jobs; once the job ends on
    its own (reported by a heartbeat), w-1 is drained."""
    incarnation = await cluster.register("w-1")
    job = await cluster.submit()
    aid = await cluster.place(job, "w-1", incarnation)
    await cluster.heartbeat("w-1", incarnation, aid)
    reply = await cluster.drain("w-1")
    assert (reply.draining, reply.drained, reply.drain_deadline_unix_s) == (True, False, 0.0)

    leader = DrainLeader(epoch=EPOCH)
    async with trio.open_nursery() as nursery:
        await nursery.start(leader.run, cluster.database_url)
        await trio.sleep(1.0)  # four passes
        assert leader.stopped == []
        assert (await cluster.assignment(aid))["state"] == "active"
        await cluster.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(worker_id="w-1", incarnation=incarnation, finished=[succeeded(aid, job)]),
        )
        nursery.cancel_scope.cancel()
    info = await cluster.status_of("w-1")
    assert (info.cordoned, info.draining, info.drained) == (True, False, True)
    assert (await cluster.job_row(job))["state"] == "succeeded"


async def test_bad_requests_are_refused_naming_what_is_wrong_and_store_nothing(cluster: Drains) -> None:
    """An unknown worker id is NOT_FOUND naming it; a deadline over a week is refused naming
    deadline_ms, the value and the limit; neither stores a cordon or an idempotency key."""
    await cluster.register("w-1")
    keys_before = await cluster.count("SELECT count(*) FROM idempotency_keys")
    for call in (cluster.cordon("w-9"), cluster.drain("w-9", 1000), cluster.uncordon("w-9")):
        with pytest.raises(NotFound, match="worker_id 'w-9' not found"):
            await call
    with pytest.raises(InvalidArgument, match=r"deadline_ms must be between 0 and 604800000, got 604800001"):
        await cluster.drain("w-1", 604_800_001)
    assert await cluster.count("SELECT count(*) FROM workers WHERE cordoned_at IS NOT NULL") == 0
    assert await cluster.count("SELECT count(*) FROM idempotency_keys") == keys_before


async def test_a_retried_drain_is_answered_once_and_a_key_reused_for_another_request_is_refused(
    cluster: Drains,
) -> None:
    """The same drain sent twice with one key is carried out once (the deadline is the first
    one's); the key sent with a cordon of another worker is refused, naming what it did."""
    await cluster.register("w-1")
    await cluster.register("w-2")
    first = await cluster.drain("w-1", 60_000, key="drain-w-1")
    await trio.sleep(0.05)
    again = await cluster.drain("w-1", 60_000, key="drain-w-1")
    assert again.drain_deadline_unix_s == first.drain_deadline_unix_s
    with pytest.raises(IdempotencyConflict, match="it drained worker w-1"):
        await cluster.cordon("w-2", key="drain-w-1")
    assert not (await cluster.status_of("w-2")).cordoned

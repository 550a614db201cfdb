"""The reconciler's dead-worker judgment and repair pass, on trio's mock clock.

The store reports heartbeat ages as the database would (ages from the mock clock); the ledger
and dispatcher are the test itself, holding the other ends of the reconciler's channels.
"""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from actors.messages import (
    CancelOnWorker,
    CommittedAssignment,
    DeclareDeadWorkers,
    Dispatch,
    DispatcherInbox,
    Elected,
    EndAssignments,
    JobPayload,
    LeaseInbox,
    LedgerInbox,
    QueryRole,
    ReconcileResult,
    RoleChange,
    WorkerRef,
)
from actors.reconciler import Delivery, HeartbeatAge, Reconciler, dead_workers
from actors.role import RoleView
from runtime.settings import ReconcilerSettings

SETTINGS = ReconcilerSettings(
    reconcile_interval_s=1.0, dead_after_s=5.0, redispatch_after_s=1.0, cancel_unconfirmed_after_s=30.0
)
PAYLOAD = JobPayload(name="j", cpu_millis=100, memory_mb=10, priority=0, sleep_ms=1000, argv=None)


@attrs.define
class FakeStore:
    """Heartbeats recorded at mock-clock times; unconfirmed assignments with commit times."""

    last_heartbeat: dict[str, float] = attrs.field(factory=dict)
    unconfirmed_at: dict[int, tuple[WorkerRef, float]] = attrs.field(factory=dict)

    async def heartbeat_ages(self) -> list[HeartbeatAge]:
        now = trio.current_time()
        return [
            HeartbeatAge(worker_id=w, incarnation=1, age_s=now - t) for w, t in self.last_heartbeat.items()
        ]

    async def unconfirmed(self) -> list[Delivery]:
        now = trio.current_time()
        return [
            Delivery(
                assignment=CommittedAssignment(
                    assignment_id=aid,
                    job_id=aid,
                    worker_id=ref.worker_id,
                    incarnation=ref.incarnation,
                    epoch=1,
                    payload=PAYLOAD,
                ),
                worker=ref,
                age_s=now - at,
            )
            for aid, (ref, at) in self.unconfirmed_at.items()
        ]

    async def cancel_requested(self) -> list[Delivery]:
        return []


@attrs.define
class Harness:
    reconciler: Reconciler
    lease: trio.MemoryReceiveChannel[LeaseInbox]
    ledger: trio.MemoryReceiveChannel[LedgerInbox]
    dispatcher: trio.MemoryReceiveChannel[DispatcherInbox]
    roles: trio.MemorySendChannel[RoleChange]


def make_harness(store: FakeStore) -> Harness:
    lease_send, lease_recv = trio.open_memory_channel[LeaseInbox](8)
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](64)
    roles_send, roles_recv = trio.open_memory_channel[RoleChange](8)
    reconciler = Reconciler(
        settings=SETTINGS,
        store=store,
        role=RoleView(changes=roles_recv, lease_inbox=lease_send),
        ledger=ledger_send,
        dispatcher=dispatch_send,
    )
    return Harness(reconciler, lease_recv, ledger_recv, dispatch_recv, roles_send)


async def answer_role(lease: trio.MemoryReceiveChannel[LeaseInbox], epoch: int) -> None:
    message = await lease.receive()
    assert isinstance(message, QueryRole)
    message.reply.set(Elected(seq=1, epoch=epoch))


async def test_declares_a_worker_dead_after_dead_after_and_not_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """w-2's last heartbeat is at t=1; passes run each second; it is first named at t=7, the
    first pass where its age (6 s) exceeds dead_after (5 s). w-1 keeps heartbeating and is
    never named."""
    store = FakeStore(last_heartbeat={"w-1": 0.0, "w-2": 0.0})
    h = make_harness(store)
    named: list[tuple[float, tuple[tuple[str, int], ...]]] = []

    async def heartbeats() -> None:
        while True:
            store.last_heartbeat["w-1"] = trio.current_time()
            if trio.current_time() <= 1.0:
                store.last_heartbeat["w-2"] = trio.current_time()
            await trio.sleep(0.5)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeats)
        nursery.start_soon(answer_role, h.lease, 3)
        await nursery.start(h.reconciler.run)
        while len(named) < 10:
            message = await h.ledger.receive()
            assert isinstance(message, DeclareDeadWorkers)
            assert message.epoch == 3 and message.dead_after_s == 5.0
            named.append((trio.current_time(), message.workers))
            message.reply.set(
                ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
            )
        nursery.cancel_scope.cancel()
    times = [t for t, _ in named]
    assert times == pytest.approx([float(k) for k in range(10)])
    for t, workers in named:
        assert workers == ((("w-2", 1),) if t >= 7.0 else ())


async def test_first_pass_after_election_resends_every_unconfirmed_assignment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A new leader re-sends assignments its predecessor committed but may never have sent,
    then re-sends only those unconfirmed for redispatch_after_s."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 0.0}, unconfirmed_at={7: (w1, 0.0)})
    h = make_harness(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        message = await h.ledger.receive()
        assert isinstance(message, DeclareDeadWorkers)
        message.reply.set(
            ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
        )
        sent = await h.dispatcher.receive()
        assert isinstance(sent, Dispatch)
        assert trio.current_time() == 0.0
        assert [a.assignment_id for a in sent.assignments] == [7] and sent.epoch == 2
        nursery.cancel_scope.cancel()


async def test_withdraws_long_unconfirmed_assignments_only_after_the_worker_acknowledges(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An assignment unconfirmed for 30 s is cancelled on its worker; only the acknowledged id
    is ended (and requeued) by a fenced EndAssignments."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 0.0}, unconfirmed_at={7: (w1, -31.0), 8: (w1, -31.0)})
    h = make_harness(store)
    store.last_heartbeat["w-1"] = 0.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers)
        declare.reply.set(
            ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
        )
        cancel = await h.dispatcher.receive()
        assert isinstance(cancel, CancelOnWorker)
        assert cancel.assignment_ids == (7, 8)
        cancel.reply.set((7,))
        end = await h.ledger.receive()
        assert isinstance(end, EndAssignments)
        assert end.assignment_ids == (7,) and end.requeue and end.epoch == 2
        end.reply.set((7,))
        nursery.cancel_scope.cancel()


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.floats(0, 20)), max_size=8),
    st.floats(0.1, 10),
)
def test_dead_workers_are_exactly_those_silent_longer_than_dead_after(
    ages: list[tuple[str, float]], dead_after_s: float
) -> None:
    """dead_workers names every worker whose age exceeds dead_after_s, and no other."""
    beats = [HeartbeatAge(worker_id=w, incarnation=i, age_s=a) for i, (w, a) in enumerate(ages)]
    dead = dead_workers(beats, dead_after_s)
    assert set(dead) == {(b.worker_id, b.incarnation) for b in beats if b.age_s > dead_after_s}

"""The placer frozen between deciding and committing, while another epoch takes over.

The ledger's side is scripted by the test: it refuses the late commit as the real ledger's
``SELECT epoch ... FOR KEY SHARE`` check does (tests/integration/test_fencing.py shows the real
one). Nothing may reach the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest
import trio
import trio.testing

from actors.fair_share import AccountShare
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    Connect,
    Deposed,
    Dispatch,
    DispatcherInbox,
    Elected,
    LeaseInbox,
    LedgerInbox,
    QueryRole,
    RoleChange,
    WorkerRef,
)
from actors.pending_queue import PendingJob
from actors.placer import Placer
from actors.placer_store import LiveWorker, PendingMark, WaitingJob
from actors.preemption import Running, Shares
from actors.quotas import AccountQuota
from actors.role import RoleView
from actors.rooms import WorkerRoom
from runtime import faults
from runtime.errors import StaleEpoch
from runtime.jobs import JobSpec, SleepRuntime
from runtime.settings.leader import PlacerSettings


@attrs.define
class FakeStore:
    workers: list[LiveWorker]
    jobs: list[WaitingJob]
    quotas: dict[str, AccountQuota] = attrs.field(factory=dict)
    with_account_use: bool = False
    account_use: dict[str, AccountShare] | None = None

    async def live_workers(self, fresh_s: float) -> list[LiveWorker]:
        return self.workers

    async def pending_jobs(self, limit: int) -> tuple[list[WaitingJob], PendingMark]:
        return self.jobs[:limit], PendingMark()

    async def no_longer_pending(self, job_ids: list[int]) -> list[int]:
        return []

    async def preemptible(
        self, priority: int, cooldown_s: float, workers: Sequence[WorkerRef]
    ) -> tuple[list[Running], Shares]:
        raise AssertionError("preemption is off: nothing is read for it")

    async def account_shares(self, half_life_s: float, *, with_past: bool) -> dict[str, AccountShare]:
        return {}

    async def read_round(
        self, fresh_s: float, mark: PendingMark, limit: int
    ) -> tuple[list[LiveWorker], list[WaitingJob], PendingMark]:
        return self.workers, [], mark

    async def close(self) -> None:
        pass


def store() -> FakeStore:
    ref = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    return FakeStore(
        workers=[LiveWorker(ref=ref, room=WorkerRoom(worker_id="w-1", cpu_millis=4000, memory_mb=4096))],
        jobs=[
            WaitingJob(job=PendingJob(job_id=i, cpu_millis=1000, memory_mb=100), reason="") for i in (1, 2)
        ],
    )


@attrs.define
class Harness:
    placer: Placer
    lease: trio.MemoryReceiveChannel[LeaseInbox]
    ledger: trio.MemoryReceiveChannel[LedgerInbox]
    dispatcher: trio.MemoryReceiveChannel[DispatcherInbox]
    roles: trio.MemorySendChannel[RoleChange]


def make_harness() -> Harness:
    lease_send, lease_recv = trio.open_memory_channel[LeaseInbox](8)
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](64)
    roles_send, roles_recv = trio.open_memory_channel[RoleChange](8)
    placer = Placer(
        settings=PlacerSettings(round_interval_s=0.1),
        store=store(),
        role=RoleView(changes=roles_recv, lease_inbox=lease_send),
        ledger=ledger_send,
        dispatcher=dispatch_send,
    )
    return Harness(placer, lease_recv, ledger_recv, dispatch_recv, roles_send)


async def elect(h: Harness, epoch: int) -> None:
    message = await h.lease.receive()
    assert isinstance(message, QueryRole)
    message.reply.set(Elected(seq=1, epoch=epoch))


def assignments_sent(channel: trio.MemoryReceiveChannel[DispatcherInbox]) -> list[DispatcherInbox]:
    """What reached the dispatcher so far, but for the connections opened ahead (which carry
    no assignment)."""
    sent = []
    while True:
        try:
            message = channel.receive_nowait()
        except trio.WouldBlock:
            return sent
        if not isinstance(message, Connect):
            sent.append(message)


async def test_the_leader_connects_to_each_live_worker_ahead_once_per_epoch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Before any assignment, the dispatcher is told to open connections to the live workers:
    once for each worker under one epoch, again under the next."""
    h = make_harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(elect, h, 1)
        await nursery.start(h.placer.run)
        first = await h.dispatcher.receive()
        assert isinstance(first, Connect)
        assert [w.worker_id for w in first.workers] == [w.ref.worker_id for w in h.placer.store.workers]
        await trio.sleep(1.0)  # ten more rounds
        assert not any(isinstance(m, Connect) for m in drain(h.dispatcher))
        nursery.cancel_scope.cancel()
    h.placer._connect_ahead(2, h.placer.store.workers)
    again = h.dispatcher.receive_nowait()
    assert isinstance(again, Connect) and again.workers == first.workers


def drain(channel: trio.MemoryReceiveChannel[DispatcherInbox]) -> list[DispatcherInbox]:
    """Everything the channel holds now."""
    out = []
    while True:
        try:
            out.append(channel.receive_nowait())
        except trio.WouldBlock:
            return out


async def test_frozen_placer_commit_is_refused_and_nothing_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Frozen 5 s (past the 2 s lease) between deciding and committing; epoch 2 took over
    meanwhile; the ledger refuses the epoch-1 commit and no batch reaches any worker."""
    h = make_harness()
    frozen_until: list[float] = []

    async def freeze() -> None:
        await trio.sleep(5.0)
        frozen_until.append(trio.current_time())

    async with faults.installed("placer.before_commit", freeze), trio.open_nursery() as nursery:
        nursery.start_soon(elect, h, 1)
        await nursery.start(h.placer.run)
        commit = await h.ledger.receive()
        assert isinstance(commit, CommitPlacements)
        assert trio.current_time() == pytest.approx(5.0)
        assert commit.epoch == 1 and [p.job_id for p in commit.placements] == [1, 2]
        commit.reply.fail(StaleEpoch(epoch=1, epoch_seen=2))
        await h.roles.send(Deposed(seq=2, epoch=1, reason="lease taken by another replica"))
        await trio.sleep(3.0)
        assert assignments_sent(h.dispatcher) == []
        with pytest.raises(trio.WouldBlock):
            h.ledger.receive_nowait()  # deposed: no further rounds
        nursery.cancel_scope.cancel()
    assert frozen_until == [5.0]


async def test_committed_placements_are_dispatched_after_the_commit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without a freeze the commit's assignments reach the dispatcher, only after the reply."""
    h = make_harness()
    spec = JobSpec(name="j", cpu_millis=1000, memory_mb=100, runtime=SleepRuntime(duration_ms=10))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(elect, h, 1)
        await nursery.start(h.placer.run)
        commit = await h.ledger.receive()
        assert isinstance(commit, CommitPlacements)
        await trio.sleep(1.0)
        assert assignments_sent(h.dispatcher) == []
        commit.reply.set(
            tuple(
                CommittedAssignment(
                    assignment_id=10 + p.job_id,
                    job_id=p.job_id,
                    worker_id=p.worker_id,
                    incarnation=1,
                    epoch=1,
                    spec=spec,
                )
                for p in commit.placements
            )
        )
        sent = await h.dispatcher.receive()
        while isinstance(sent, Connect):  # connections opened ahead carry no assignment
            sent = await h.dispatcher.receive()
        assert isinstance(sent, Dispatch)
        assert sent.epoch == 1 and [a.assignment_id for a in sent.assignments] == [11, 12]
        nursery.cancel_scope.cancel()

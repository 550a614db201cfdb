"""The placer's pending queue: read in full at election, then only what became pending since;
a job whose transaction commits late is read by the first round after its commit; an unchanged
cluster decides nothing; a job waiting out its requeue backoff is committed only after it; a
worker gets no more than its send window allows."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio
import trio.testing

from actors.fair_share import AccountShare
from actors.gang_queue import GangTask
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    Connect,
    Dispatch,
    DispatcherInbox,
    LeaseInbox,
    LedgerInbox,
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
from actors.write_size import WriteSize
from runtime.errors import DatabaseBusy
from runtime.jobs import JobSpec, SleepRuntime
from runtime.settings.leader import PlacerSettings


def waiting(job_id: int, xid: int, cpu: int = 1000, wait_s: float = 0.0, reason: str = "") -> WaitingJob:
    """A pending job; ``xid`` is the key of the store's dicts (the job's transaction), not kept."""
    return WaitingJob(
        job=PendingJob(job_id=job_id, cpu_millis=cpu, memory_mb=100),
        reason=reason,
        wait_s=wait_s,
    )


@attrs.define
class FakeStore:
    """Pending jobs as the database holds them, each made pending by a transaction of its own,
    keyed by that transaction's id (its one job has pending_seq 1): ``visible`` committed,
    ``running`` not yet (invisible, and in every read's snapshot as in progress). Records
    which reads the placer made."""

    visible: dict[int, WaitingJob] = attrs.field(factory=dict)
    running: dict[int, WaitingJob] = attrs.field(factory=dict)
    free_cpu: int = 0
    reads: list[tuple[str, int, tuple[int, ...]]] = attrs.field(factory=list)
    gone: set[int] = attrs.field(factory=set)
    unconfirmed: int = 0
    confirmed: int = 0
    quotas: dict[str, AccountQuota] = attrs.field(factory=dict)
    with_account_use: bool = False
    account_use: dict[str, AccountShare] | None = None
    shares: dict[str, AccountShare] = attrs.field(factory=dict)

    def commit(self, xid: int) -> None:
        """The running transaction ``xid`` commits: its job becomes visible."""
        self.visible[xid] = self.running.pop(xid)

    def _after(self, mark: PendingMark, last_read: tuple[int, int] | None) -> PendingMark:
        xmax = max([*self.visible, *self.running], default=0) + 1
        return mark.after_read(last_read=last_read, snapshot_xmax=xmax, snapshot_xip=sorted(self.running))

    async def live_workers(self, fresh_s: float) -> list[LiveWorker]:
        ref = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
        room = WorkerRoom(
            worker_id="w-1", cpu_millis=8000, memory_mb=8000, cpu_allocated_millis=8000 - self.free_cpu
        )
        return [LiveWorker(ref=ref, room=room, unconfirmed=self.unconfirmed, confirmed=self.confirmed)]

    async def pending_jobs(self, limit: int) -> tuple[list[WaitingJob], PendingMark]:
        self.reads.append(("all", 0, ()))
        jobs = sorted(self.visible.values(), key=lambda w: w.job.job_id)
        return jobs, self._after(PendingMark(), None)

    async def no_longer_pending(self, job_ids: list[int]) -> list[int]:
        self.reads.append(("gone", 0, tuple(job_ids)))
        return [j for j in job_ids if j in self.gone]

    async def preemptible(
        self, priority: int, cooldown_s: float, workers: Sequence[WorkerRef]
    ) -> tuple[list[Running], Shares]:
        raise AssertionError("preemption is off: nothing is read for it")

    async def account_shares(self, half_life_s: float, *, with_past: bool) -> dict[str, AccountShare]:
        self.reads.append(("shares", 0, ()))
        return dict(self.shares)

    async def read_round(
        self, fresh_s: float, mark: PendingMark, limit: int
    ) -> tuple[list[LiveWorker], list[WaitingJob], PendingMark]:
        self.reads.append(("since", mark.xid, mark.in_flight))
        if self.with_account_use:
            self.reads.append(("use", 0, ()))
        self.account_use = dict(self.shares) if self.with_account_use else None
        above = [x for x in sorted(self.visible) if (x, 1) > (mark.xid, mark.seq)][:limit]
        late = [x for x in sorted(self.visible) if x in mark.in_flight and (x, 1) <= (mark.xid, mark.seq)]
        last_read = (above[-1], 1) if len(above) >= limit else None
        jobs = [self.visible[x] for x in above + late]
        return await self.live_workers(fresh_s), jobs, self._after(mark, last_read)

    async def close(self) -> None:
        pass


def make_placer(
    store: FakeStore,
    settings: PlacerSettings | None = None,
    dispatch: trio.MemorySendChannel[DispatcherInbox] | None = None,
) -> tuple[Placer, trio.MemoryReceiveChannel[LedgerInbox]]:
    lease_send, _ = trio.open_memory_channel[LeaseInbox](8)
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    dispatch_send = dispatch or trio.open_memory_channel[DispatcherInbox](64)[0]
    _, roles_recv = trio.open_memory_channel[RoleChange](8)
    placer = Placer(
        settings=settings or PlacerSettings(),
        store=store,
        role=RoleView(changes=roles_recv, lease_inbox=lease_send),
        ledger=ledger_send,
        dispatcher=dispatch_send,
    )
    return placer, ledger_recv


async def test_reads_everything_once_then_only_what_is_new(autojump_clock: trio.testing.MockClock) -> None:
    """The first round reads every pending job; the next reads only what its transaction
    committed since (above the mark the first read left: its snapshot's xmax)."""
    store = FakeStore(visible={1: waiting(1, 1), 2: waiting(2, 2)})
    placer, _ = make_placer(store)
    await placer.round(epoch=1)
    store.visible[3] = waiting(3, 3)
    await placer.round(epoch=1)
    assert store.reads == [("all", 0, ()), ("since", 3, ())]
    assert [j.job_id for j in placer.queue.jobs()] == [1, 2, 3]


async def test_a_job_whose_transaction_commits_late_is_read_by_the_next_round_however_late(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Transaction 4 is still running while 3 and then 5 commit and are read; the rounds keep
    asking for transaction 4's jobs (it was in progress in their snapshots), for 60 s of rounds
    (past any resync of old), and the first round after it commits reads its job; then it is
    no longer asked for."""
    store = FakeStore(visible={3: waiting(3, 3)}, running={4: waiting(4, 4)})
    placer, _ = make_placer(store)
    placer.settings = attrs.evolve(placer.settings, resync_interval_s=3600.0)
    await placer.round(epoch=1)
    store.visible[5] = waiting(5, 5)
    await placer.round(epoch=1)
    for _ in range(600):
        await trio.sleep(0.1)
        await placer.round(epoch=1)
    assert [j.job_id for j in placer.queue.jobs()] == [3, 5]
    store.commit(4)  # the slower transaction commits now
    await placer.round(epoch=1)
    assert [j.job_id for j in placer.queue.jobs()] == [3, 4, 5]
    await placer.round(epoch=1)
    reads = [r for r in store.reads if r[0] != "gone"]  # not the reservation's checks
    assert reads[:3] == [("all", 0, ()), ("since", 5, (4,)), ("since", 6, (4,))]
    assert reads[-2:] == [("since", 6, (4,)), ("since", 6, ())]


async def test_an_unchanged_full_cluster_decides_nothing_and_commits_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No room and no new job: no commit; room appears: the waiting job is committed."""
    store = FakeStore(visible={1: waiting(1, 1)}, free_cpu=0)
    placer, ledger = make_placer(store)
    for _ in range(3):
        assert await placer.round(epoch=1) == ()
    try:
        ledger.receive_nowait()
        raise AssertionError("nothing should have been committed")
    except trio.WouldBlock:
        pass
    store.free_cpu = 1000

    async def answer() -> None:
        commit = await ledger.receive()
        assert isinstance(commit, CommitPlacements) and [p.job_id for p in commit.placements] == [1]
        commit.reply.set(())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        await placer.round(epoch=1)
    assert len(placer.queue) == 0  # the reply was empty (claimed elsewhere): dropped all the same


async def test_a_cancelled_job_gives_up_its_reservation_at_the_next_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 4000-millicore job waits on the one worker (2000 free) past reserve_after_s and
    reserves it when room next changes (while nothing changes a round decides nothing, and
    nothing could be placed anyway); once it is cancelled, the next round asks, drops it and
    reserves nothing."""
    store = FakeStore(visible={1: waiting(1, 1, cpu=4000)}, free_cpu=2000)
    placer, _ = make_placer(store)
    await placer.round(epoch=1)
    await trio.sleep(placer.settings.reserve_after_s)
    store.free_cpu = 2500
    await placer.round(epoch=1)
    assert 1 in placer.queue and placer._reserving == [1]
    store.gone.add(1)
    await placer.round(epoch=1)
    assert ("gone", 0, (1,)) in store.reads
    assert 1 not in placer.queue and placer._reserving == []


async def answer_commits(
    ledger: trio.MemoryReceiveChannel[LedgerInbox], commits: list[tuple[float, CommitPlacements]]
) -> None:
    """Stand in for the ledger: record each commit with its time; commit nothing."""
    async for message in ledger:
        assert isinstance(message, CommitPlacements)
        commits.append((trio.current_time(), message))
        message.reply.set(())


async def test_a_job_in_backoff_is_committed_only_once_its_wait_has_passed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Job 1 was requeued with 1.5 s to wait (read at t=0), job 2 has none: the first round
    commits job 2 and leaves job 1's backoff reason alone; rounds every 0.1 s commit nothing
    until the first one at or after t=1.5, which commits job 1."""
    reason = "backoff: placed again after 12:00:01.500 UTC"
    store = FakeStore(visible={1: waiting(1, 1, wait_s=1.5, reason=reason), 2: waiting(2, 2)}, free_cpu=8000)
    placer, ledger = make_placer(store)
    commits: list[tuple[float, CommitPlacements]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_commits, ledger, commits)
        for _ in range(20):
            await placer.round(epoch=1)
            await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    placed = [(round(t, 6), [p.job_id for p in c.placements]) for t, c in commits if c.placements]
    assert placed == [(0.0, [2]), (1.5, [1])]
    assert all(job_id != 1 for _, c in commits for job_id, _ in c.reasons)


async def test_a_worker_gets_no_more_than_its_send_window_per_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Twenty small jobs, one worker with room for all, an initial window of 8: with nothing
    confirmed it gets the initial window (8); holding 8 unconfirmed it gets nothing; once those
    8 are confirmed its window is 16 and it gets 16 (the store's counters stand for the
    database's)."""
    store = FakeStore(visible={n: waiting(n, n, cpu=100) for n in range(1, 21)}, free_cpu=8000)
    placer, ledger = make_placer(store, PlacerSettings(initial_window=8))
    commits: list[tuple[float, CommitPlacements]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_commits, ledger, commits)
        await placer.round(epoch=1)
        store.visible = {n: waiting(n, n, cpu=100) for n in range(21, 41)}
        store.unconfirmed = 8
        await placer.round(epoch=1)
        store.unconfirmed, store.confirmed = 0, 8
        await placer.round(epoch=1)
        nursery.cancel_scope.cancel()
    assert [len(c.placements) for _, c in commits] == [8, 16]


async def test_a_workers_batch_is_sent_in_placement_order_whatever_order_the_commit_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The placement statement returns its rows in no set order (here: reversed); the batch
    sent to the worker is in the order the jobs were placed (priority, then submission), which
    is the order the worker starts them in."""
    store = FakeStore(visible={n: waiting(n, n, cpu=100) for n in range(1, 11)}, free_cpu=8000)
    dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](8)
    placer, ledger = make_placer(store, dispatch=dispatch_send)

    async def commit_in_reverse() -> None:
        async for message in ledger:
            assert isinstance(message, CommitPlacements)
            message.reply.set(
                tuple(
                    CommittedAssignment(
                        assignment_id=100 + p.job_id,
                        job_id=p.job_id,
                        worker_id=p.worker_id,
                        incarnation=p.incarnation,
                        epoch=1,
                        spec=JobSpec(
                            name="", cpu_millis=100, memory_mb=100, runtime=SleepRuntime(duration_ms=1000)
                        ),
                    )
                    for p in reversed(message.placements)
                )
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit_in_reverse)
        await placer.round(epoch=1)
        nursery.cancel_scope.cancel()
    sent = dispatch_recv.receive_nowait()
    while isinstance(sent, Connect):  # connections opened ahead carry no assignment
        sent = dispatch_recv.receive_nowait()
    assert isinstance(sent, Dispatch)
    assert [a.job_id for a in sent.assignments] == list(range(1, 11))


async def test_a_round_the_server_cancelled_is_followed_by_a_smaller_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With at most 8 rows per fenced write and room for all ten pending jobs, the first round
    commits 8 placements and the server cancels it (DatabaseBusy); the next round commits 4,
    and the one after 5 (an eighth of the ceiling more)."""
    store = FakeStore(visible={s: waiting(s, s, cpu=100) for s in range(1, 11)}, free_cpu=8000)
    placer, ledger = make_placer(store, PlacerSettings(initial_window=64, max_unconfirmed_per_worker=64))
    placer.max_rows_per_fenced_write = 8
    sizes: list[int] = []

    async def answer() -> None:
        first = True
        async for commit in ledger:
            assert isinstance(commit, CommitPlacements)
            sizes.append(len(commit.placements) + len(commit.reasons))
            if first:
                commit.reply.fail(DatabaseBusy("database busy: canceling statement due to statement timeout"))
                first = False
            else:
                commit.reply.set(())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        try:
            await placer.round(epoch=1)
            raise AssertionError("the first round should have failed")
        except DatabaseBusy:
            pass
        await placer.round(epoch=1)
        await placer.round(epoch=1)
        nursery.cancel_scope.cancel()
    assert sizes == [8, 4, 5]
    assert placer.write_size() == WriteSize(6, 8)


async def test_with_two_accounts_queued_every_round_reads_what_each_holds_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Fair share reads the accounts' use in every round whose queue holds two accounts' jobs
    (a use read a moment old handed the room freed by one account's ended jobs to the other), and
    orders by it: alice holds 7,000 of the 8,000 cpu_millis, so bob's job takes the one free slot
    though it came later. One account alone: no read."""
    alone = FakeStore(visible={1: waiting(1, 1)}, free_cpu=0)
    placer, _ = make_placer(alone)
    await placer.round(epoch=1)
    assert ("shares", 0, ()) not in alone.reads

    jobs = {
        1: attrs.evolve(
            waiting(1, 1, cpu=1000), job=PendingJob(job_id=1, cpu_millis=1000, memory_mb=100, owner="alice")
        ),
        2: attrs.evolve(
            waiting(2, 2, cpu=1000), job=PendingJob(job_id=2, cpu_millis=1000, memory_mb=100, owner="bob")
        ),
    }
    store = FakeStore(visible=jobs, free_cpu=0, shares={"alice": AccountShare(used_cpu_millis=7000)})
    placer, ledger = make_placer(store)
    for _ in range(3):
        await placer.round(epoch=1)
        await trio.sleep(0.1)
    # The first round's full read, then each round's own read carries the use.
    assert [r[0] for r in store.reads if r[0] in ("shares", "use")] == ["shares", "use", "use"]
    store.free_cpu = 1000

    async def answer() -> None:
        commit = await ledger.receive()
        assert isinstance(commit, CommitPlacements) and [p.job_id for p in commit.placements] == [2]
        commit.reply.set(())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        await placer.round(epoch=1)


async def test_gangs_of_two_accounts_alone_read_what_each_holds_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Fair share orders gangs too: with only gangs pending, of alice and of bob, every round
    reads the accounts' use as it does for single jobs of two accounts (it read none, and gangs
    went by id)."""
    jobs = {
        xid: WaitingJob(
            job=PendingJob(job_id=xid, cpu_millis=1000, memory_mb=100, owner=owner),
            reason="gang: waiting for room for all 2 tasks at once",  # stored: nothing to commit
            gang=GangTask(gang_id=gang_id, rank=xid - gang_id, size=2),
        )
        for xid, gang_id, owner in ((1, 1, "alice"), (2, 1, "alice"), (3, 3, "bob"), (4, 3, "bob"))
    }
    store = FakeStore(visible=jobs, free_cpu=0, shares={"alice": AccountShare(used_cpu_millis=7000)})
    placer, _ = make_placer(store)
    for _ in range(3):
        await placer.round(epoch=1)
        await trio.sleep(0.1)
    assert [r[0] for r in store.reads if r[0] in ("shares", "use")] == ["shares", "use", "use"]

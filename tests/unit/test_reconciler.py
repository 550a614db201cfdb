"""The reconciler's dead-worker judgment and repair pass, on trio's mock clock.

The store reports heartbeat ages as the database would (ages from the mock clock); the ledger
and dispatcher are the test itself, holding the other ends of the reconciler's channels.

It is one file because it is the one specification of one actor, :mod:`actors.reconciler`: its
sections (dead workers, requeue backoff, the death limiter, re-sending unconfirmed work, fenced
writes in batches) share the store and harness above, and each test states one behaviour.
"""

from __future__ import annotations

import math

import attrs
import pytest
import structlog
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from actors.cancellations import ending_message
from actors.deaths import SilenceFloor, TokenBucket, contact_gap_for_s, judge_deaths
from actors.deliveries import resend_due
from actors.dependencies import WaitingJob
from actors.health import Run, WorkerRuns
from actors.heartbeat_policy import HeartbeatPolicy
from actors.messages import (
    CancelOnWorker,
    CommittedAssignment,
    DeclareDeadWorkers,
    Deposed,
    Dispatch,
    DispatcherInbox,
    Elected,
    EndAssignments,
    EndDrainedAssignments,
    EndOrphanedAssignments,
    EndPreemptedAssignments,
    LeaseInbox,
    LedgerInbox,
    QueryRole,
    ReconcileResult,
    RecordWorkerHealth,
    RoleChange,
    WorkerRef,
)
from actors.reconciler import TIMEOUT_MARGIN_S, Reconciler, backoff_caps_s
from actors.reconciler_store import Delivery, HeartbeatAge, PolicyInputs, SilenceReading
from actors.role import RoleView
from runtime import metrics
from runtime.errors import DatabaseBusy, DatabaseUnavailable, InvalidArgument, StaleEpoch
from runtime.jobs import JobSpec, SleepRuntime
from runtime.reply import Reply
from runtime.settings.leader import ReconcilerSettings

SETTINGS = ReconcilerSettings(
    reconcile_interval_s=1.0, dead_after_s=5.0, redispatch_after_s=1.0, cancel_unconfirmed_after_s=30.0
)
SPEC = JobSpec(name="j", cpu_millis=100, memory_mb=10, runtime=SleepRuntime(duration_ms=1000))


def _delivery(assignment_id: int, worker: WorkerRef, age_s: float) -> Delivery:
    """An active assignment of job ``assignment_id`` (same number) on ``worker``, committed
    ``age_s`` ago under epoch 1."""
    return Delivery(
        assignment=CommittedAssignment(
            assignment_id=assignment_id,
            job_id=assignment_id,
            worker_id=worker.worker_id,
            incarnation=worker.incarnation,
            epoch=1,
            spec=SPEC,
        ),
        worker=worker,
        age_s=age_s,
    )


@attrs.define
class FakeStore:
    """Heartbeats recorded at mock-clock times; unconfirmed assignments with commit times."""

    last_heartbeat: dict[str, float] = attrs.field(factory=dict)
    unconfirmed_at: dict[int, tuple[WorkerRef, float]] = attrs.field(factory=dict)
    overdue_ids: dict[int, WorkerRef] = attrs.field(factory=dict)
    """Assignments past their job's timeout by the margin (their confirmed runs)."""
    margins_s: list[float] = attrs.field(factory=list)
    waiting: list[WaitingJob] = attrs.field(factory=list)
    drain_due_on: dict[int, WorkerRef] = attrs.field(factory=dict)
    preempt_due_on: dict[int, WorkerRef] = attrs.field(factory=dict)
    """Assignments whose worker's drain deadline has passed, and that worker."""
    cancel_requested_on: dict[int, WorkerRef] = attrs.field(factory=dict)
    """Assignments whose job a user cancelled, and their worker."""
    runs: list[WorkerRuns] = attrs.field(factory=list)
    """What the health step reads: every alive worker and its judged runs."""
    health_reads: list[tuple[float, int, float]] = attrs.field(factory=list)
    """(mock time, most, window_s) of every health read."""
    policy: HeartbeatPolicy | None = None
    """The heartbeat policy in force, as the leader's writes left it."""
    costs_us: tuple[float, ...] = (300.0,)
    """The control planes' measured heartbeat costs (µs): by default one replica's, small
    enough that these clusters keep the shortest interval (no policy write)."""
    waits_ms: tuple[float, ...] = ()
    """The 99th percentile of the heartbeats' waits at each control plane (ms): none said."""

    async def heartbeat_ages(self) -> SilenceReading:
        now = trio.current_time()
        return SilenceReading(
            now_unix_s=now,
            ages=[
                HeartbeatAge(worker_id=w, incarnation=1, age_s=now - t)
                for w, t in self.last_heartbeat.items()
            ],
        )

    async def unconfirmed(self) -> list[Delivery]:
        now = trio.current_time()
        return [_delivery(aid, ref, now - at) for aid, (ref, at) in self.unconfirmed_at.items()]

    async def cancel_requested(self) -> list[Delivery]:
        return [_delivery(aid, ref, 60.0) for aid, ref in self.cancel_requested_on.items()]

    async def overdue(self, margin_s: float) -> list[Delivery]:
        self.margins_s.append(margin_s)
        return [_delivery(aid, ref, 100.0) for aid, ref in self.overdue_ids.items()]

    async def waiting_jobs(self, limit: int) -> list[WaitingJob]:
        return self.waiting[:limit]

    async def drain_due(self) -> list[Delivery]:
        return [_delivery(aid, ref, 60.0) for aid, ref in self.drain_due_on.items()]

    async def preempt_due(self) -> list[Delivery]:
        return [_delivery(aid, ref, 60.0) for aid, ref in self.preempt_due_on.items()]

    async def heartbeat_policy_inputs(self, seen_within_s: float) -> PolicyInputs:
        return PolicyInputs(current=self.policy, costs_us=self.costs_us, waits_ms=self.waits_ms)

    async def worker_runs(self, most: int, window_s: float) -> list[WorkerRuns]:
        self.health_reads.append((trio.current_time(), most, window_s))
        return list(self.runs)

    async def close(self) -> None:
        pass


@attrs.define
class Harness:
    reconciler: Reconciler
    lease: trio.MemoryReceiveChannel[LeaseInbox]
    ledger: trio.MemoryReceiveChannel[LedgerInbox]
    dispatcher: trio.MemoryReceiveChannel[DispatcherInbox]
    roles: trio.MemorySendChannel[RoleChange]


def make_harness(store: FakeStore, settings: ReconcilerSettings | None = None) -> Harness:
    lease_send, lease_recv = trio.open_memory_channel[LeaseInbox](8)
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](64)
    roles_send, roles_recv = trio.open_memory_channel[RoleChange](8)
    reconciler = Reconciler(
        settings=settings or SETTINGS,
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


async def test_a_run_past_its_timeout_is_stopped_and_ended_as_timed_out_once_acknowledged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An overdue run (its job outlived timeout_s by the margin) is cancelled on its worker;
    only the acknowledged id is ended, by a fenced EndAssignments marked timed out."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 0.0}, overdue_ids={5: w1, 6: w1})
    h = make_harness(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers)
        declare.reply.set(
            ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
        )
        cancel = await h.dispatcher.receive()
        assert isinstance(cancel, CancelOnWorker) and cancel.assignment_ids == (5, 6)
        cancel.reply.set((5,))  # 6 had ended on its own: its outcome comes with a heartbeat
        end = await h.ledger.receive()
        assert isinstance(end, EndAssignments)
        assert end.assignment_ids == (5,) and end.timed_out and not end.requeue and end.reason == "timeout"
        end.reply.set((5,))
        nursery.cancel_scope.cancel()
    assert store.margins_s[0] == TIMEOUT_MARGIN_S


# ---------------------------------------------------------------- requeue backoff


@given(st.floats(0.001, 10), st.floats(0, 1000), st.integers(1, 200))
def test_the_requeue_backoffs_caps_double_per_loss_up_to_the_max(
    base_s: float, extra_s: float, losses: int
) -> None:
    """The cap after the k-th loss is min(max, base * 2**(k-1)); it never shrinks as losses
    grow, and the last one is the max (the wait drawn below it is the database's:
    tests/integration/test_leader_pacing.py)."""
    max_s = base_s + extra_s
    caps = backoff_caps_s(base_s=base_s, max_s=max_s)
    cap = caps[min(losses, len(caps)) - 1]
    assert cap == pytest.approx(min(max_s, base_s * 2.0 ** min(losses - 1, 100)))
    assert list(caps) == sorted(caps) and caps[-1] == max_s


def test_the_default_backoff_moves_a_single_loss_within_an_eighth_of_a_second() -> None:
    """With the defaults (0.125 s, 30 s) the caps double from an eighth of a second to 30 s: a
    job lost once waits below 0.125 s, one lost nine times or more below 30 s."""
    settings = ReconcilerSettings()
    caps = backoff_caps_s(base_s=settings.requeue_backoff_base_s, max_s=settings.requeue_backoff_max_s)
    assert caps == (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    with pytest.raises(ValueError, match="max_s must be >= base_s = 2, got 1"):
        backoff_caps_s(base_s=2, max_s=1)
    with pytest.raises(InvalidArgument, match="requeue_backoff_max_s must be >= requeue_backoff_base_s"):
        ReconcilerSettings(requeue_backoff_base_s=2.0, requeue_backoff_max_s=1.0)


# ---------------------------------------------------------------- the death limiter

LIMITED = ReconcilerSettings(
    reconcile_interval_s=0.25,
    dead_after_s=5.0,
    death_burst=3,
    deaths_per_s=1.0,
    mass_silence_fraction=0.5,
    mass_silence_min_workers=3,
)


@given(st.floats(0, 10), st.floats(0, 100), st.integers(1, 5), st.floats(0.1, 10))
def test_the_token_bucket_refills_at_its_rate_up_to_its_burst(
    tokens: float, elapsed_s: float, burst: int, rate_per_s: float
) -> None:
    """Refilled after elapsed_s, the bucket holds min(burst, tokens + rate * elapsed); taking
    never goes below zero; whole counts the declarations it allows."""
    bucket = TokenBucket(min(tokens, burst), 0.0).refilled(elapsed_s, rate_per_s=rate_per_s, burst=burst)
    assert bucket.tokens == pytest.approx(min(burst, min(tokens, burst) + elapsed_s * rate_per_s))
    assert 0 <= bucket.whole <= burst and bucket.at == elapsed_s
    assert bucket.take(burst + 1).tokens == 0.0


ages_st = st.lists(st.floats(0, 20), max_size=12)


@given(ages_st, st.floats(0, 3))
def test_judge_deaths_names_the_longest_silent_within_the_bucket_and_none_on_mass_silence(
    ages: list[float], tokens: float
) -> None:
    """Named and held together are exactly the silent workers; on mass silence (more than half
    of the alive, and at least 3, silent past suspect_after_s) none is named; otherwise as many
    as the bucket allows, the longest silent first."""
    beats = [HeartbeatAge(worker_id=f"w-{n:02d}", incarnation=1, age_s=a) for n, a in enumerate(ages)]
    verdict = judge_deaths(beats, LIMITED, TokenBucket(tokens, 0.0), 0.0)
    silent = [b for b in beats if b.age_s > LIMITED.dead_after_s]
    assert set(verdict.declare) | set(verdict.held) == {(b.worker_id, 1) for b in silent}
    assert not set(verdict.declare) & set(verdict.held)
    suspects = [b for b in beats if b.age_s > LIMITED.suspect_s]
    mass = len(suspects) >= 3 and len(suspects) > 0.5 * len(beats)
    assert verdict.mass_silence == mass and verdict.alive == len(beats)
    if mass:
        assert verdict.declare == ()
    else:
        assert len(verdict.declare) == min(len(silent), int(tokens + 1e-9))
        age = {b.worker_id: b.age_s for b in beats}
        named = [age[w] for w, _ in verdict.declare]
        assert all(a >= age[w] for a in named for w, _ in verdict.held)


async def run_passes(
    store: FakeStore,
    settings: ReconcilerSettings,
    passes: int,
    silent_at: dict[float, set[str]] | None = None,
) -> list[tuple[float, tuple[str, ...]]]:
    """Run the reconciler for ``passes`` passes as leader of epoch 1; the ledger declares every
    named worker dead (they stop being alive). Returns (time, named worker ids) per pass."""
    lease_send, lease_recv = trio.open_memory_channel[LeaseInbox](8)
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    dispatch_send, _ = trio.open_memory_channel[DispatcherInbox](64)
    _, roles_recv = trio.open_memory_channel[RoleChange](8)
    reconciler = Reconciler(
        settings=settings,
        store=store,
        role=RoleView(changes=roles_recv, lease_inbox=lease_send),
        ledger=ledger_send,
        dispatcher=dispatch_send,
    )
    named: list[tuple[float, tuple[str, ...]]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, lease_recv, 1)
        await nursery.start(reconciler.run)
        while len(named) < passes:
            message = await ledger_recv.receive()
            assert isinstance(message, DeclareDeadWorkers)
            assert message.requeue_backoff_caps_s == backoff_caps_s(
                base_s=settings.requeue_backoff_base_s, max_s=settings.requeue_backoff_max_s
            )
            ids = tuple(w for w, _ in message.workers)
            named.append((trio.current_time(), ids))
            for worker_id in ids:
                del store.last_heartbeat[worker_id]
            message.reply.set(
                ReconcileResult(dead_worker_ids=ids, requeued_job_ids=(), orphaned_assignment_ids=())
            )
        nursery.cancel_scope.cancel()
    return named


async def test_declares_at_most_the_buckets_worth_per_pass_longest_silent_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Six of twenty workers went silent after the takeover at t=0 (w-0 at 0.5, each next one
    0.1 s later); passes every 0.25 s, burst 3, one per second: the three past dead_after_s at
    t=5.75 are named then, then one at t=6.75, 7.75 and 8.75, the longest silent first, and
    none in the passes between."""
    store = FakeStore(last_heartbeat={f"w-{n}": 10.0**6 for n in range(6, 20)})
    store.last_heartbeat.update({f"w-{n}": 0.5 + n * 0.1 for n in range(6)})

    async def heartbeats() -> None:
        while True:
            for n in range(6, 20):
                store.last_heartbeat[f"w-{n}"] = trio.current_time()
            await trio.sleep(0.25)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeats)
        named = await run_passes(store, LIMITED, passes=36)
        nursery.cancel_scope.cancel()
    assert [(t, ids) for t, ids in named if ids] == [
        (5.75, ("w-0", "w-1", "w-2")),
        (6.75, ("w-3",)),
        (7.75, ("w-4",)),
        (8.75, ("w-5",)),
    ]
    assert [t for t, _ in named] == [0.25 * k for k in range(36)]


async def test_names_none_while_most_workers_are_silent_and_counts_anew_when_they_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Twelve of twenty workers fall silent at t=1 (a fault on the control planes' side): past
    t=6 each is silent for longer than dead_after_s, but none is named; at t=8 nine heartbeat
    again, leaving 3 of 20 silent: the mass silence has ended, and their silence counts anew
    from then, so they are named dead_after_s later (at the first pass past t=13), all three at
    once (the bucket is full)."""
    store = FakeStore()

    async def heartbeats() -> None:
        while True:
            now = trio.current_time()
            for n in range(20):
                if n >= 12 or now < 1.0 or (now >= 7.95 and n >= 3):
                    store.last_heartbeat[f"w-{n:02d}"] = now
            await trio.sleep(0.1)

    held_before = metrics.DEATHS_HELD.labels("mass_silence")._value.get()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeats)
        await trio.sleep(0.01)
        named = await run_passes(store, LIMITED, passes=60)
        nursery.cancel_scope.cancel()
    assert [(t, ids) for t, ids in named if ids] == [(13.26, ("w-00", "w-01", "w-02"))]
    held = metrics.DEATHS_HELD.labels("mass_silence")._value.get() - held_before
    assert held == 12 * 8  # the passes at 6.26 .. 8.01, each holding the twelve


def test_silence_counts_from_the_floor_after_a_takeover_a_gap_or_a_mass_silence() -> None:
    """The floor moves to the database's time on a new epoch, after a read gap longer than
    contact_gap_s, and when a mass silence ends; ages are capped at the time since it."""
    floor = SilenceFloor()
    assert floor.read(epoch=1, now_unix_s=100.0, now=0.0, gap_s=1.0)
    assert not floor.read(epoch=1, now_unix_s=100.5, now=0.5, gap_s=1.0)
    assert floor.read(epoch=1, now_unix_s=110.0, now=10.0, gap_s=1.0)  # 9.5 s without a read
    assert floor.floor_unix_s == 110.0
    assert floor.read(epoch=2, now_unix_s=110.2, now=10.2, gap_s=1.0)
    ages = [
        HeartbeatAge(worker_id="a", incarnation=1, age_s=30.0),
        HeartbeatAge(worker_id="b", incarnation=1, age_s=0.1),
    ]
    assert [a.age_s for a in floor.floored(ages, 112.2)] == pytest.approx([2.0, 0.1])
    assert not floor.mass_silence_seen(True, 113.0)
    assert floor.mass_silence_seen(False, 115.0)
    assert floor.floor_unix_s == 115.0


# ---------------------------------------------------------------- re-sending unconfirmed work


@given(st.lists(st.floats(0, 100), min_size=1, max_size=30), st.floats(0.1, 5))
def test_an_unconfirmed_assignment_is_resent_once_per_doubling_of_its_age(
    ages: list[float], first_after_s: float
) -> None:
    """Looked at by passes at any increasing ages, an assignment is re-sent by exactly those
    passes since whose predecessor its age passed first_after_s * 2**k for some k."""
    ages = sorted(set(ages))
    previous = -math.inf
    thresholds = [first_after_s * 2.0**k for k in range(12)]
    for age in ages:
        due = resend_due(age, first_after_s=first_after_s, interval_s=age - previous)
        assert due == any(previous < t <= age for t in thresholds), (previous, age)
        previous = age


async def test_an_unconfirmed_assignment_is_resent_at_one_two_four_and_eight_seconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Committed at t=0 to a worker that never confirms it, with passes every 0.25 s: sent
    again by the first pass (a new leader), then at ages 1, 2, 4 and 8 s, not every pass."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 10.0**6}, unconfirmed_at={7: (w1, 0.0)})
    h = make_harness(store)
    h.reconciler.settings = attrs.evolve(SETTINGS, reconcile_interval_s=0.25)
    sent: list[float] = []

    async def ledger() -> None:
        async for message in h.ledger:
            assert isinstance(message, DeclareDeadWorkers)
            message.reply.set(
                ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        nursery.start_soon(ledger)
        await nursery.start(h.reconciler.run)
        with trio.move_on_after(10.0):
            async for message in h.dispatcher:
                assert isinstance(message, Dispatch)
                sent.append(trio.current_time())
        nursery.cancel_scope.cancel()
    assert sent == [0.0, 1.0, 2.0, 4.0, 8.0]


# ---------------------------------------------------------------- fenced writes in batches


def orphans(*ids: int, more: bool, dead: tuple[str, ...] = ()) -> ReconcileResult:
    """A batch's answer: ``ids`` ended (their jobs, the same ids, requeued)."""
    return ReconcileResult(
        dead_worker_ids=dead, requeued_job_ids=ids, orphaned_assignment_ids=ids, more_orphans=more
    )


async def test_a_pass_ends_orphans_batch_by_batch_until_a_batch_is_short(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """w-2 is silent; with at most 3 rows per fenced write, the pass at t=0 declares it dead with
    the first 3 endings, then asks for one more batch of 3 while a batch comes back full, each
    a fenced write of its own under the same epoch, all at t=0; the next pass is at t=1."""
    store = FakeStore(last_heartbeat={"w-1": 10.0**6, "w-2": -10.0})
    h = make_harness(store)
    h.reconciler.max_rows_per_fenced_write = 3
    answers = [
        orphans(1, 2, 3, more=True, dead=("w-2",)),
        orphans(4, 5, 6, more=True),
        orphans(7, more=False),
    ]
    asked: list[tuple[float, str, int, int]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 4)
        await nursery.start(h.reconciler.run)
        while len(asked) < 4:
            message = await h.ledger.receive()
            assert isinstance(message, DeclareDeadWorkers | EndOrphanedAssignments)
            asked.append((trio.current_time(), type(message).__name__, message.epoch, message.max_ended))
            message.reply.set(answers.pop(0) if answers else orphans(more=False))
        nursery.cancel_scope.cancel()
    assert asked == [
        (0.0, "DeclareDeadWorkers", 4, 3),
        (0.0, "EndOrphanedAssignments", 4, 3),
        (0.0, "EndOrphanedAssignments", 4, 3),
        (1.0, "DeclareDeadWorkers", 4, 3),
    ]


async def test_a_pass_whose_batch_is_refused_sends_no_further_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The second batch of endings at t=0 is refused (StaleEpoch): the pass stops there, sending
    no third batch and not re-sending the unconfirmed assignment either; the next pass, at
    t=1, starts again with the declaration and, still a first pass under this epoch, re-sends
    the assignment."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 10.0**6}, unconfirmed_at={7: (w1, 0.0)})
    h = make_harness(store)
    h.reconciler.max_rows_per_fenced_write = 2
    asked: list[tuple[float, str]] = []
    sent: list[float] = []

    async def dispatcher() -> None:
        async for message in h.dispatcher:
            assert isinstance(message, Dispatch)
            sent.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 4)
        nursery.start_soon(dispatcher)
        await nursery.start(h.reconciler.run)
        for answer in (orphans(1, 2, more=True), orphans(3, 4, more=True), StaleEpoch(4, 5)):
            message = await h.ledger.receive()
            assert isinstance(message, DeclareDeadWorkers | EndOrphanedAssignments)
            asked.append((trio.current_time(), type(message).__name__))
            if isinstance(answer, StaleEpoch):
                message.reply.fail(answer)
            else:
                message.reply.set(answer)
        message = await h.ledger.receive()
        assert isinstance(message, DeclareDeadWorkers)
        asked.append((trio.current_time(), type(message).__name__))
        message.reply.set(orphans(more=False))
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert asked == [
        (0.0, "DeclareDeadWorkers"),
        (0.0, "EndOrphanedAssignments"),
        (0.0, "EndOrphanedAssignments"),
        (1.0, "DeclareDeadWorkers"),
    ]
    assert sent == [1.0]


async def test_acknowledged_cancellations_end_in_fenced_writes_of_at_most_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Seven assignments unconfirmed for 30 s are cancelled on their worker in one call; with at
    most 3 rows per fenced write, the acknowledged ones end in writes of 3, 3 and 1."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 10.0**6}, unconfirmed_at={i: (w1, -31.0) for i in range(1, 8)})
    h = make_harness(store)
    h.reconciler.max_rows_per_fenced_write = 3
    ended: list[tuple[int, ...]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers)
        declare.reply.set(orphans(more=False))
        cancel = await h.dispatcher.receive()
        assert isinstance(cancel, CancelOnWorker) and cancel.assignment_ids == tuple(range(1, 8))
        cancel.reply.set(cancel.assignment_ids)
        while len(ended) < 3:
            end = await h.ledger.receive()
            assert isinstance(end, EndAssignments) and end.requeue and trio.current_time() == 0.0
            ended.append(end.assignment_ids)
            end.reply.set(end.assignment_ids)
        nursery.cancel_scope.cancel()
    assert ended == [(1, 2, 3), (4, 5, 6), (7,)]


async def test_refused_endings_of_cancellations_are_logged_and_the_passes_go_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Unconfirmed assignments on two workers are cancelled in parallel; the replica was deposed
    meanwhile, so both fenced endings are refused (StaleEpoch). The refusals stay in their
    background tasks: the actor keeps running, no pass is counted deposed, and the next pass,
    at t=1, declares again and asks the workers again."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    w2 = WorkerRef(worker_id="w-2", address="127.0.0.1:2", incarnation=1)
    store = FakeStore(
        last_heartbeat={"w-1": 10.0**6, "w-2": 10.0**6}, unconfirmed_at={1: (w1, -31.0), 2: (w2, -31.0)}
    )
    h = make_harness(store)
    deposed_before = (
        REGISTRY.get_sample_value("stockade_reconcile_passes_total", {"outcome": "deposed"}) or 0.0
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 4)
        await nursery.start(h.reconciler.run)
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers)
        declare.reply.set(orphans(more=False))
        for _ in range(2):
            cancel = await h.dispatcher.receive()
            assert isinstance(cancel, CancelOnWorker)
            cancel.reply.set(cancel.assignment_ids)
        for _ in range(2):
            end = await h.ledger.receive()
            assert isinstance(end, EndAssignments) and trio.current_time() == 0.0
            end.reply.fail(StaleEpoch(4, 5))
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers) and trio.current_time() == 1.0
        declare.reply.set(orphans(more=False))
        again = {(await h.dispatcher.receive()).worker.worker_id for _ in range(2)}  # type: ignore[union-attr]
        assert again == {"w-1", "w-2"} and trio.current_time() == 1.0
        nursery.cancel_scope.cancel()
    assert (
        REGISTRY.get_sample_value("stockade_reconcile_passes_total", {"outcome": "deposed"}) or 0.0
    ) == deposed_before


async def test_a_worker_that_never_answers_a_cancellation_holds_up_no_pass(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """w-1 never answers the cancellation of its long-unconfirmed assignment 7. The passes go on
    every second regardless (the silence of other workers keeps counting: w-2, silent from
    t=0, is declared dead at t=6), and none asks w-1 again while the first call is in flight."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 10.0**6, "w-2": 0.0}, unconfirmed_at={7: (w1, -31.0)})
    h = make_harness(store)
    declared: list[tuple[float, tuple[tuple[str, int], ...]]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        while len(declared) < 8:
            declare = await h.ledger.receive()
            assert isinstance(declare, DeclareDeadWorkers)
            declared.append((trio.current_time(), declare.workers))
            declare.reply.set(orphans(more=False))
            if len(declared) == 1:
                cancel = await h.dispatcher.receive()
                assert isinstance(cancel, CancelOnWorker) and cancel.assignment_ids == (7,)
        with pytest.raises(trio.WouldBlock):
            h.dispatcher.receive_nowait()
        nursery.cancel_scope.cancel()
    assert [t for t, _ in declared] == [float(k) for k in range(8)]
    assert [t for t, workers in declared if workers == (("w-2", 1),)] == [6.0, 7.0]


async def test_an_assignment_in_two_lists_of_one_pass_is_cancelled_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Assignment 7's job was cancelled by its user and its worker's drain deadline has passed:
    the pass asks the worker once (as the user's cancel), and no later pass asks again while
    that call is unanswered."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 10.0**6}, cancel_requested_on={7: w1}, drain_due_on={7: w1})
    h = make_harness(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        for _ in range(3):
            declare = await h.ledger.receive()
            assert isinstance(declare, DeclareDeadWorkers)
            declare.reply.set(orphans(more=False))
        cancel = h.dispatcher.receive_nowait()
        assert isinstance(cancel, CancelOnWorker) and cancel.assignment_ids == (7,)
        with pytest.raises(trio.WouldBlock):
            h.dispatcher.receive_nowait()
        nursery.cancel_scope.cancel()


@attrs.define
class FailingSettleStore(FakeStore):
    """The waiting-jobs read fails ``failures`` times (the database went away mid-pass)."""

    failures: int = 0

    async def waiting_jobs(self, limit: int) -> list[WaitingJob]:
        if self.failures:
            self.failures -= 1
            raise DatabaseUnavailable("connection lost")
        return await super().waiting_jobs(limit)


async def test_a_pass_that_fails_after_starting_a_cancellation_leaves_it_to_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A term's first pass withdraws assignment 7 and then fails (a read after the
    cancellations). Its worker acknowledges 1.5 s later, after a heartbeat confirmed 7 (no
    later pass would withdraw it again): the term is the same, so the acknowledgement is still
    ended, under its epoch."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FailingSettleStore(last_heartbeat={"w-1": 10.0**6}, unconfirmed_at={7: (w1, -31.0)}, failures=1)
    h = make_harness(store)
    ended: list[EndAssignments] = []
    async with trio.open_nursery() as nursery:

        async def worker() -> None:
            async for message in h.dispatcher:
                if isinstance(message, CancelOnWorker):
                    await trio.sleep(1.5)
                    message.reply.set(message.assignment_ids)

        async def ledger() -> None:
            async for message in h.ledger:
                if isinstance(message, EndAssignments):
                    ended.append(message)
                    message.reply.set(message.assignment_ids)
                else:
                    assert isinstance(message, DeclareDeadWorkers)
                    message.reply.set(orphans(more=False))

        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        nursery.start_soon(worker)
        nursery.start_soon(ledger)
        await trio.sleep(0.5)
        del store.unconfirmed_at[7]  # a heartbeat confirmed it
        await trio.sleep(5.0)
        nursery.cancel_scope.cancel()
    assert [(e.epoch, e.assignment_ids) for e in ended] == [(2, (7,))]


async def test_a_cancellation_the_dispatcher_never_answers_is_asked_again_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The dispatcher loses the reply of the cancellation of assignment 7 (it restarted): the
    passes do not ask again while it waits, and after CANCEL_REPLY_WAIT_S the next pass asks
    the worker again, under the same term."""
    from actors.cancellations import CANCEL_REPLY_WAIT_S

    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 10.0**6}, unconfirmed_at={7: (w1, -31.0)})
    h = make_harness(store)
    asked: list[tuple[float, int]] = []
    async with trio.open_nursery() as nursery:

        async def ledger() -> None:
            async for message in h.ledger:
                assert isinstance(message, DeclareDeadWorkers)
                message.reply.set(orphans(more=False))

        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        nursery.start_soon(ledger)
        for _ in range(2):
            cancel = await h.dispatcher.receive()
            assert isinstance(cancel, CancelOnWorker)
            asked.append((trio.current_time(), cancel.epoch))
        nursery.cancel_scope.cancel()
    assert asked[0] == (0.0, 2) and asked[1][1] == 2
    assert CANCEL_REPLY_WAIT_S <= asked[1][0] <= CANCEL_REPLY_WAIT_S + 1.0


async def test_a_new_term_drops_the_cancellations_of_the_last(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancellation asked under epoch 2 is still unanswered when the replica is deposed and
    elected again under epoch 3: the new term asks the worker again under its own epoch, and
    the old call's late acknowledgement ends nothing (only the new term's EndAssignments)."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 10.0**6}, unconfirmed_at={7: (w1, -31.0)})
    h = make_harness(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers) and declare.epoch == 2
        declare.reply.set(orphans(more=False))
        old = await h.dispatcher.receive()
        assert isinstance(old, CancelOnWorker) and old.epoch == 2
        await h.roles.send(Deposed(seq=2, epoch=2, reason="lost"))
        await h.roles.send(Elected(seq=3, epoch=3))
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers) and declare.epoch == 3
        declare.reply.set(orphans(more=False))
        new = await h.dispatcher.receive()
        assert isinstance(new, CancelOnWorker) and new.epoch == 3 and new.assignment_ids == (7,)
        old.reply.set((7,))
        new.reply.set((7,))
        end = await h.ledger.receive()
        assert isinstance(end, EndAssignments) and end.epoch == 3 and end.assignment_ids == (7,)
        end.reply.set((7,))
        await trio.sleep(0.5)
        with pytest.raises(trio.WouldBlock):
            h.ledger.receive_nowait()
        nursery.cancel_scope.cancel()


async def test_a_full_dispatcher_inbox_holds_up_no_pass(autojump_clock: trio.testing.MockClock) -> None:
    """A new leader re-sends the unconfirmed assignments of 70 workers, but the dispatcher (64
    places in its inbox here) takes none: the pass hands over what fits and goes on, and the
    passes at t=1 and t=2 come on time."""
    workers = [WorkerRef(worker_id=f"w-{n}", address=f"127.0.0.1:{n + 1}", incarnation=1) for n in range(70)]
    store = FakeStore(
        last_heartbeat={w.worker_id: 10.0**6 for w in workers},
        unconfirmed_at={n: (w, 0.0) for n, w in enumerate(workers)},
    )
    h = make_harness(store)
    passes: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        while len(passes) < 3:
            declare = await h.ledger.receive()
            assert isinstance(declare, DeclareDeadWorkers)
            passes.append(trio.current_time())
            declare.reply.set(orphans(more=False))
        nursery.cancel_scope.cancel()
    assert passes == [0.0, 1.0, 2.0]
    assert h.dispatcher.statistics().current_buffer_used == 64


@attrs.define
class SlowHealthStore(FakeStore):
    """The health read takes ``health_read_s`` of mock time."""

    health_read_s: float = 0.0

    async def worker_runs(self, most: int, window_s: float) -> list[WorkerRuns]:
        await trio.sleep(self.health_read_s)
        return await super().worker_runs(most, window_s)


async def test_a_pass_longer_than_half_the_contact_gap_is_logged_with_its_steps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first pass's health read takes 0.8 s, more than half the 1 s contact gap: the pass is
    logged as slow, naming the step that took the time; the next pass judges no health and is
    fast, and is not logged."""
    store = SlowHealthStore(last_heartbeat={"w-1": 10.0**6}, health_read_s=0.8)
    with structlog.testing.capture_logs() as logs:
        h = make_harness(store)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_role, h.lease, 2)
            await nursery.start(h.reconciler.run)
            for _ in range(2):
                declare = await h.ledger.receive()
                assert isinstance(declare, DeclareDeadWorkers)
                declare.reply.set(orphans(more=False))
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
    slow = [entry for entry in logs if entry["event"] == "slow reconcile pass"]
    assert len(slow) == 1
    assert slow[0]["took_s"] == pytest.approx(0.8, abs=0.01) and slow[0]["contact_gap_s"] == 1.0
    assert slow[0]["steps_s"]["health"] == pytest.approx(0.8, abs=0.01)
    assert slow[0]["steps_s"]["ages"] == 0.0


async def test_a_batch_the_server_cancelled_is_retried_smaller_and_grows_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With at most 8 rows per fenced write, the server cancels the pass's first write at t=0
    (too slow: DatabaseBusy); the pass at t=1 asks for 4, then 5 and 6 as its batches go
    through, and the pass at t=2 starts at 7."""
    store = FakeStore(last_heartbeat={"w-1": 10.0**6})
    h = make_harness(store)
    h.reconciler.max_rows_per_fenced_write = 8
    answers: list[ReconcileResult | DatabaseBusy] = [
        DatabaseBusy("database busy: canceling statement due to statement timeout"),
        orphans(1, 2, 3, 4, more=True),
        orphans(5, 6, 7, 8, 9, more=True),
        orphans(10, more=False),
        orphans(more=False),
    ]
    asked: list[tuple[float, int]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 2)
        await nursery.start(h.reconciler.run)
        for answer in answers:
            message = await h.ledger.receive()
            assert isinstance(message, DeclareDeadWorkers | EndOrphanedAssignments)
            asked.append((trio.current_time(), message.max_ended))
            if isinstance(answer, DatabaseBusy):
                message.reply.fail(answer)
            else:
                message.reply.set(answer)
        nursery.cancel_scope.cancel()
    assert asked == [(0.0, 8), (1.0, 4), (1.0, 5), (1.0, 6), (2.0, 7)]


async def test_a_mass_silence_holds_declarations_only_for_mass_silence_max_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Three of five workers die at t=1 and never answer again: the mass silence holds their
    declarations, but only for mass_silence_max_s (20 s here) from when it began (t=3.5, half of
    dead_after_s after the last heartbeats); then they are named, at the rate limit's pace."""
    store = FakeStore()
    settings = attrs.evolve(LIMITED, mass_silence_max_s=20.0)

    async def heartbeats() -> None:
        while True:
            now = trio.current_time()
            for n in range(5):
                if n >= 3 or now < 1.0:
                    store.last_heartbeat[f"w-{n}"] = now
            await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeats)
        await trio.sleep(0.01)
        named = await run_passes(store, settings, passes=110)
        nursery.cancel_scope.cancel()
    declared = [(t, ids) for t, ids in named if ids]
    assert declared and declared[0][0] > 3.5 + 20.0 > declared[0][0] - 0.5
    assert sorted(w for _, ids in declared for w in ids) == ["w-0", "w-1", "w-2"]


async def test_a_pass_settles_waiting_jobs_in_a_fenced_write_and_again_after_cancellations(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Waiting jobs that can be settled are released and cancelled by SettleWaitingJobs under
    the pass's epoch; after a write that cancelled jobs the pass reads again (their dependants
    follow in the same pass) and stops when nothing is left to settle."""
    from actors.messages import SettledJobs, SettleWaitingJobs

    store = FakeStore(waiting=[WaitingJob(job_id=5), WaitingJob(job_id=6, after=((1, "failed"),))])
    h = make_harness(store)
    seen: list[SettleWaitingJobs] = []
    async with trio.open_nursery() as nursery:

        async def ledger() -> None:
            async for message in h.ledger:
                if isinstance(message, SettleWaitingJobs):
                    seen.append(message)
                    store.waiting = (
                        [WaitingJob(job_id=7, after=((6, "cancelled"),))] if len(seen) == 1 else []
                    )
                    message.reply.set(
                        SettledJobs(
                            released_job_ids=message.release,
                            cancelled_job_ids=tuple(j for j, _ in message.cancel),
                        )
                    )
                else:
                    assert isinstance(message, DeclareDeadWorkers)
                    message.reply.set(
                        ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
                    )

        nursery.start_soon(ledger)
        settled = await h.reconciler.settle_waiting(4)
        nursery.cancel_scope.cancel()
    assert [(m.epoch, m.release, m.cancel) for m in seen] == [(4, (5,), ((6, 1),)), (4, (), ((7, 6),))]
    assert settled == SettledJobs(released_job_ids=(5,), cancelled_job_ids=(6, 7))


async def test_a_pass_with_nothing_to_settle_writes_nothing() -> None:
    """No waiting job can be settled: no fenced write is asked for."""
    h = make_harness(FakeStore(waiting=[WaitingJob(job_id=5, after=((1, "running"),))]))
    settled = await h.reconciler.settle_waiting(4)
    assert settled.released_job_ids == settled.cancelled_job_ids == ()
    with pytest.raises(trio.WouldBlock):
        h.ledger.receive_nowait()


# ---------------------------------------------------------------- drains


async def test_a_drains_deadline_stops_its_jobs_and_requeues_only_what_the_worker_acknowledged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two assignments of a worker whose drain deadline has passed are cancelled on it; only
    the one it acknowledged is ended, by a fenced EndDrainedAssignments under the pass's epoch
    (a requeue with no loss and no backoff), never by EndAssignments (which counts a loss)."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 0.0}, drain_due_on={7: w1, 8: w1})
    h = make_harness(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 4)
        await nursery.start(h.reconciler.run)
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers)
        declare.reply.set(
            ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
        )
        cancel = await h.dispatcher.receive()
        assert isinstance(cancel, CancelOnWorker)
        assert (cancel.worker, cancel.assignment_ids, cancel.epoch) == (w1, (7, 8), 4)
        cancel.reply.set((7,))
        end = await h.ledger.receive()
        assert isinstance(end, EndDrainedAssignments)
        assert (end.assignment_ids, end.epoch) == ((7,), 4)
        end.reply.set((7,))
        nursery.cancel_scope.cancel()


async def test_a_drain_whose_worker_acknowledges_nothing_ends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker that does not answer the drain's stop (the dispatcher answers no id) has none
    of its assignments ended: the next pass asks again (invariant 6)."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 0.0}, drain_due_on={7: w1})
    h = make_harness(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 4)
        await nursery.start(h.reconciler.run)
        for second in range(2):
            declare = await h.ledger.receive()
            assert isinstance(declare, DeclareDeadWorkers)
            assert trio.current_time() == float(second)
            declare.reply.set(
                ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
            )
            cancel = await h.dispatcher.receive()
            assert isinstance(cancel, CancelOnWorker) and cancel.assignment_ids == (7,)
            cancel.reply.set(())
        nursery.cancel_scope.cancel()


async def test_a_preemption_stops_with_its_grace_and_ends_what_the_worker_acknowledged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An assignment marked to be preempted is cancelled on its worker with the preemption's
    grace; once acknowledged it is ended by a fenced EndPreemptedAssignments under the pass's
    epoch (no attempt spent), never by EndAssignments."""
    w1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=1)
    store = FakeStore(last_heartbeat={"w-1": 0.0}, preempt_due_on={7: w1})
    h = make_harness(store, settings=attrs.evolve(SETTINGS, preempt_grace_s=3.5))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 4)
        await nursery.start(h.reconciler.run)
        declare = await h.ledger.receive()
        assert isinstance(declare, DeclareDeadWorkers)
        declare.reply.set(
            ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
        )
        cancel = await h.dispatcher.receive()
        assert isinstance(cancel, CancelOnWorker)
        assert (cancel.assignment_ids, cancel.epoch, cancel.grace_s) == ((7,), 4, 3.5)
        cancel.reply.set((7,))
        end = await h.ledger.receive()
        assert isinstance(end, EndPreemptedAssignments)
        assert (end.assignment_ids, end.epoch) == ((7,), 4)
        end.reply.set((7,))
        nursery.cancel_scope.cancel()


def test_only_a_drains_ending_requeues_without_a_loss() -> None:
    """The ending of acknowledged cancels is EndDrainedAssignments for a drain, and
    EndAssignments (a loss with the backoff's caps when it requeues) for anything else."""
    reply: Reply[tuple[int, ...]] = Reply()
    drained = ending_message(
        2, (5,), requeue=True, reason="drained", requeue_backoff_caps_s=(1.0,), reply=reply
    )
    assert drained == EndDrainedAssignments(epoch=2, assignment_ids=(5,), reply=reply)
    withdrawn = ending_message(
        2, (5,), requeue=True, reason="unconfirmed", requeue_backoff_caps_s=(1.0,), reply=reply
    )
    assert isinstance(withdrawn, EndAssignments)
    assert (withdrawn.requeue, withdrawn.reason, withdrawn.requeue_backoff_caps_s) == (
        True,
        "unconfirmed",
        (1.0,),
    )


# ---------------------------------------------------------------- worker health


def _failing(worker_id: str, jobs: range, *, version: int = 0, unhealthy: bool = False) -> WorkerRuns:
    """``worker_id`` whose judged runs are one failed run of each of ``jobs``, newest first, each
    a job that succeeded on another worker."""
    return WorkerRuns(
        worker_id=worker_id,
        version=version,
        unhealthy=unhealthy,
        runs=tuple(
            Run(job_id=j, failed=True, detail="exit code 2", succeeded_elsewhere=True) for j in reversed(jobs)
        ),
    )


def _fine(worker_id: str, jobs: range) -> WorkerRuns:
    return WorkerRuns(worker_id=worker_id, version=0, runs=tuple(Run(job_id=j, failed=False) for j in jobs))


async def test_the_health_step_marks_a_failing_worker_in_one_fenced_write_every_health_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Passes run every 0.25 s; the workers' health is read at once after the election, then
    every health_interval_s (1 s); the worker whose every run fails is marked by one
    RecordWorkerHealth under the pass's epoch (its version, the probe's wait), and the gauge
    counts it; a judgement that changes nothing writes nothing."""
    settings = attrs.evolve(SETTINGS, reconcile_interval_s=0.25, health_probe_after_s=60.0)
    store = FakeStore(
        last_heartbeat={}, runs=[_failing("w-1", range(1, 5), version=7), _fine("w-2", range(5, 9))]
    )
    h = make_harness(store)
    h.reconciler.settings = settings
    written: list[tuple[float, RecordWorkerHealth]] = []
    async with trio.open_nursery() as nursery:

        async def ledger() -> None:
            async for message in h.ledger:
                if isinstance(message, RecordWorkerHealth):
                    written.append((trio.current_time(), message))
                    store.runs = [attrs.evolve(store.runs[0], unhealthy=True, version=8), store.runs[1]]
                    message.reply.set(tuple((w, u) for w, _, u, _ in message.changes))
                else:
                    assert isinstance(message, DeclareDeadWorkers)
                    message.reply.set(
                        ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
                    )

        nursery.start_soon(ledger)
        nursery.start_soon(answer_role, h.lease, 4)
        await nursery.start(h.reconciler.run)
        await trio.sleep(2.6)
        nursery.cancel_scope.cancel()
    assert [t for t, _, _ in store.health_reads] == [0.0, 1.0, 2.0]
    assert {(most, window_s) for _, most, window_s in store.health_reads} == {(10, 600.0)}
    ((at, message),) = written
    assert (at, message.epoch, message.probe_after_s) == (0.0, 4, 60.0)
    assert message.changes == (
        (
            "w-1",
            7,
            True,
            "unhealthy: 4 of the last 4 runs failed (other workers meanwhile: 0 of 4; 4 of those jobs "
            "succeeded elsewhere), last: exit code 2",
        ),
    )
    assert metrics.UNHEALTHY_WORKERS._value.get() == 1


async def test_a_standby_shows_no_unhealthy_workers() -> None:
    """On a step-down the unhealthy-workers gauge goes back to 0: the leader's is the cluster's."""
    metrics.UNHEALTHY_WORKERS.set(3)
    h = make_harness(FakeStore())
    async with trio.open_nursery() as nursery:

        async def standby() -> None:
            message = await h.lease.receive()
            assert isinstance(message, QueryRole)
            message.reply.set(Deposed(seq=1, epoch=2, reason="test"))

        nursery.start_soon(standby)
        await nursery.start(h.reconciler.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert metrics.UNHEALTHY_WORKERS._value.get() == 0


def test_the_contact_gap_grows_with_the_dead_after_the_workers_are_judged_by() -> None:
    """1 s of 2.5 s by default; workers all judged by 35.2 s (2,000 workers at an 8.8 s
    interval) allow 14.08 s between the leader's reads before silence counts anew (a leader
    merely busy, its reads 1 to 2 s apart, kept moving the floor and never declared a dead
    worker); the shortest judged dead_after rules; never below contact_gap_s."""
    settings = ReconcilerSettings(dead_after_s=2.5, contact_gap_s=1.0)

    def age(dead_after_s: float | None) -> HeartbeatAge:
        return HeartbeatAge(worker_id="w", incarnation=1, age_s=0.0, dead_after_s=dead_after_s)

    assert contact_gap_for_s([], settings) == 1.0
    assert contact_gap_for_s([age(None), age(2.5)], settings) == 1.0
    assert contact_gap_for_s([age(35.2)] * 3, settings) == pytest.approx(14.08)
    assert contact_gap_for_s([age(35.2), age(10.0)], settings) == pytest.approx(4.0)
    assert contact_gap_for_s([age(1.0)], settings) == 1.0

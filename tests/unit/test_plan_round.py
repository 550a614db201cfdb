"""The placer's round decision as a pure function (:func:`actors.round_plan.plan_round`): never over
a worker's free room, never one job twice, never past a worker's send window or the round's
rows, never a job still backing off; an unchanged cluster decides nothing; what committed is
dispatched once, per worker, in placement order."""

from __future__ import annotations

from collections import Counter

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.messages import CommittedAssignment, WorkerRef
from actors.pending_queue import PendingJob, PendingQueue
from actors.placer_store import LiveWorker
from actors.rooms import WorkerRoom, placement_limit
from actors.round_plan import RoundPlan, plan_round
from runtime.jobs import JobSpec, SleepRuntime
from runtime.settings.leader import (
    PLACEMENT_POLICIES,
    PlacerSettings,
)

NOW = 100.0


@st.composite
def live_workers(draw: st.DrawFn) -> list[LiveWorker]:
    count = draw(st.integers(0, 6))
    workers = []
    for index in range(count):
        cpu = draw(st.integers(1, 8000))
        memory = draw(st.integers(1, 8000))
        worker_id = f"w-{index}"
        workers.append(
            LiveWorker(
                ref=WorkerRef(worker_id=worker_id, address=f"127.0.0.1:{index + 1}", incarnation=index + 1),
                room=WorkerRoom(
                    worker_id=worker_id,
                    cpu_millis=cpu,
                    memory_mb=memory,
                    cpu_allocated_millis=draw(st.integers(0, cpu)),
                    memory_allocated_mb=draw(st.integers(0, memory)),
                ),
                unconfirmed=draw(st.integers(0, 20)),
                confirmed=draw(st.integers(0, 20)),
            )
        )
    return workers


@st.composite
def queues(draw: st.DrawFn) -> PendingQueue:
    ids = draw(st.lists(st.integers(1, 10_000), max_size=40, unique=True))
    jobs = [
        PendingJob(
            job_id=job_id,
            cpu_millis=draw(st.integers(1, 9000)),
            memory_mb=draw(st.integers(1, 9000)),
            priority=draw(st.integers(0, 3)),
        )
        for job_id in ids
    ]
    backing_off = draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
    stored = draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
    queue = PendingQueue()
    queue.replace(
        jobs,
        {job_id: "unschedulable: stored earlier" for job_id in stored},
        now=draw(st.floats(0, NOW)),
        not_before={job_id: NOW + 1 for job_id in backing_off},
    )
    return queue


placer_settings = st.builds(
    lambda policy, max_placements, window, extra, reservations, reserve_after_s: PlacerSettings(
        policy=policy,
        max_placements_per_round=max_placements,
        initial_window=window,
        max_unconfirmed_per_worker=window + extra,
        max_reservations=reservations,
        reserve_after_s=reserve_after_s,
    ),
    st.sampled_from(PLACEMENT_POLICIES),
    st.integers(1, 50),
    st.integers(1, 8),
    st.integers(0, 8),
    st.integers(0, 3),
    st.sampled_from([0.0, 10.0, 1000.0]),
)


def plan_of(queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, max_rows: int) -> RoundPlan:
    return plan_round(queue, workers, s, max_rows=max_rows, now=NOW)


@settings(max_examples=examples(300), deadline=None)
@given(queue=queues(), workers=live_workers(), s=placer_settings, max_rows=st.integers(1, 60))
def test_a_plan_never_fills_a_worker_past_its_free_room(
    queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, max_rows: int
) -> None:
    """What a plan places on a worker fits in what its capacity leaves after its allocation."""
    plan = plan_of(queue, workers, s, max_rows)
    for w in workers:
        mine = [p for p in plan.placements if p.worker_id == w.ref.worker_id]
        assert w.room.cpu_allocated_millis + sum(p.cpu_millis for p in mine) <= w.room.cpu_millis
        assert w.room.memory_allocated_mb + sum(p.memory_mb for p in mine) <= w.room.memory_mb


@settings(max_examples=examples(300), deadline=None)
@given(queue=queues(), workers=live_workers(), s=placer_settings, max_rows=st.integers(1, 60))
def test_a_plan_places_each_queued_job_at_most_once_and_none_backing_off(
    queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, max_rows: int
) -> None:
    """Every placed job is a queued one, placed once, with its own size, on the worker's
    current incarnation, and none whose requeue backoff has not passed."""
    plan = plan_of(queue, workers, s, max_rows)
    jobs = {j.job_id: j for j in queue.jobs()}
    incarnations = {w.ref.worker_id: w.ref.incarnation for w in workers}
    placed = [p.job_id for p in plan.placements]
    assert len(placed) == len(set(placed))
    for p in plan.placements:
        assert (p.cpu_millis, p.memory_mb) == (jobs[p.job_id].cpu_millis, jobs[p.job_id].memory_mb)
        assert p.incarnation == incarnations[p.worker_id]
        assert p.job_id not in plan.backing_off
    assert plan.backing_off == queue.waiting_for_backoff(NOW)


@settings(max_examples=examples(300), deadline=None)
@given(queue=queues(), workers=live_workers(), s=placer_settings, max_rows=st.integers(1, 60))
def test_a_plan_respects_each_workers_send_window_and_the_rounds_rows(
    queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, max_rows: int
) -> None:
    """A worker gets at most its send window's room (placement_limit); the round places at most
    max_placements_per_round, and its placements and reasons fit max_rows."""
    plan = plan_of(queue, workers, s, max_rows)
    per_worker = Counter(p.worker_id for p in plan.placements)
    for w in workers:
        limit = placement_limit(
            w.confirmed,
            w.unconfirmed,
            initial_window=s.initial_window,
            max_unconfirmed=s.max_unconfirmed_per_worker,
        )
        assert per_worker[w.ref.worker_id] <= limit
    assert len(plan.placements) <= min(s.max_placements_per_round, max_rows)
    assert len(plan.placements) + len(plan.reasons) <= max_rows


@settings(max_examples=examples(300), deadline=None)
@given(queue=queues(), workers=live_workers(), s=placer_settings, max_rows=st.integers(1, 60))
def test_a_plan_writes_only_reasons_that_change_and_none_for_a_placed_job(
    queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, max_rows: int
) -> None:
    """Each reason differs from the one stored, is for a queued job not placed in this round,
    and names a job once; a cleared reason (empty) was stored before."""
    plan = plan_of(queue, workers, s, max_rows)
    placed = {p.job_id for p in plan.placements}
    reason_ids = [job_id for job_id, _ in plan.reasons]
    assert len(reason_ids) == len(set(reason_ids))
    for job_id, reason in plan.reasons:
        assert job_id in queue
        assert job_id not in placed
        assert queue.reasons.get(job_id, "") != reason
        if not reason:
            assert job_id in queue.reasons


@settings(max_examples=examples(200), deadline=None)
@given(queue=queues(), workers=live_workers(), s=placer_settings, max_rows=st.integers(1, 60))
def test_a_plan_changes_nothing_it_was_given(
    queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, max_rows: int
) -> None:
    """Planning leaves the queue (its version, jobs and reasons) as it was."""
    version, jobs, reasons = queue.version, queue.jobs(), dict(queue.reasons)
    plan_of(queue, workers, s, max_rows)
    assert (queue.version, queue.jobs(), queue.reasons) == (version, jobs, reasons)


@settings(max_examples=examples(200), deadline=None)
@given(queue=queues(), workers=live_workers(), s=placer_settings, max_rows=st.integers(1, 60))
def test_a_round_after_one_that_found_nothing_to_do_decides_nothing_while_nothing_changed(
    queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, max_rows: int
) -> None:
    """Given the fingerprint of a round with nothing to write, the same inputs plan nothing."""
    first = plan_of(queue, workers, s, max_rows)
    again = plan_round(queue, workers, s, max_rows=max_rows, now=NOW, idle_fingerprint=first.fingerprint)
    assert again.outcome == "unchanged"
    assert (again.placements, again.reasons, again.reservations) == ((), (), ())
    assert (first.outcome == "commit") == bool(first.placements or first.reasons)


def committed_of(plan: RoundPlan, skip: frozenset[int]) -> tuple[CommittedAssignment, ...]:
    """What the ledger answers for ``plan``, in reverse order, without the jobs in ``skip``
    (cancelled or claimed meanwhile)."""
    payload = JobSpec(name="j", cpu_millis=1, memory_mb=1, priority=0, runtime=SleepRuntime(duration_ms=1))
    return tuple(
        CommittedAssignment(
            assignment_id=1000 + i,
            job_id=p.job_id,
            worker_id=p.worker_id,
            incarnation=p.incarnation,
            epoch=7,
            spec=payload,
        )
        for i, p in reversed(list(enumerate(plan.placements)))
        if p.job_id not in skip
    )


@settings(max_examples=examples(200), deadline=None)
@given(
    queue=queues(),
    workers=live_workers(),
    s=placer_settings,
    max_rows=st.integers(1, 60),
    data=st.data(),
)
def test_what_committed_is_dispatched_once_per_worker_in_placement_order(
    queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, max_rows: int, data: st.DataObject
) -> None:
    """Each committed assignment goes once, to its worker's address and incarnation, in one
    batch per worker, in the order the plan placed them; nothing that did not commit is sent."""
    plan = plan_of(queue, workers, s, max_rows)
    placed = [p.job_id for p in plan.placements]
    skip = frozenset(data.draw(st.lists(st.sampled_from(placed), unique=True)) if placed else [])
    committed = committed_of(plan, skip)
    dispatches = plan.dispatches(7, committed)
    sent = [a for d in dispatches for a in d.assignments]
    assert sorted(a.assignment_id for a in sent) == sorted(a.assignment_id for a in committed)
    assert len({d.worker.worker_id for d in dispatches}) == len(dispatches)
    refs = {w.ref.worker_id: w.ref for w in workers}
    order = {job_id: i for i, job_id in enumerate(placed)}
    for d in dispatches:
        assert d.epoch == 7
        assert d.worker == refs[d.worker.worker_id]
        assert all(a.worker_id == d.worker.worker_id for a in d.assignments)
        ranks = [order[a.job_id] for a in d.assignments]
        assert ranks == sorted(ranks)


def test_a_round_places_by_best_fit_within_the_send_window() -> None:
    """Two 1000-millicore jobs and a worker whose window has room for one: the job first in
    queue order goes to the tighter of two workers, and the other waits."""
    queue = PendingQueue()
    queue.replace([PendingJob(job_id=i, cpu_millis=1000, memory_mb=100) for i in (1, 2)])
    tight = LiveWorker(
        ref=WorkerRef(worker_id="w-a", address="127.0.0.1:1", incarnation=3),
        room=WorkerRoom(worker_id="w-a", cpu_millis=2000, memory_mb=1000),
        unconfirmed=1,
    )
    roomy = attrs.evolve(
        tight,
        ref=WorkerRef(worker_id="w-b", address="127.0.0.1:2", incarnation=4),
        room=WorkerRoom(worker_id="w-b", cpu_millis=8000, memory_mb=1000),
        unconfirmed=2,
    )
    s = PlacerSettings(initial_window=2, max_unconfirmed_per_worker=2)
    plan = plan_round(queue, [roomy, tight], s, max_rows=10, now=0.0)
    assert plan.outcome == "commit"
    assert [(p.job_id, p.worker_id, p.incarnation) for p in plan.placements] == [(1, "w-a", 3)]

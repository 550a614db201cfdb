"""Placement as a pure function, checked with hypothesis.

It is one file because it is the one specification of :mod:`actors.placement`: best fit,
reservations and pacing are one decision, share the strategies below, and each test states one
behaviour."""

from __future__ import annotations

from collections import Counter

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.pending_queue import PendingJob, PendingQueue
from actors.placement import Plan, place, place_queue, place_queue_steps
from actors.rooms import WorkerRoom, fits_some_room, placement_limit, send_window
from runtime.errors import InvalidArgument
from runtime.settings.leader import PlacerSettings

workers_st = st.lists(
    st.builds(
        lambda i, cpu, mem, used_cpu, used_mem: WorkerRoom(
            worker_id=f"w-{i:02d}",
            cpu_millis=cpu,
            memory_mb=mem,
            cpu_allocated_millis=min(used_cpu, cpu),
            memory_allocated_mb=min(used_mem, mem),
        ),
        st.integers(0, 99),
        st.integers(1000, 16000),
        st.integers(1024, 32768),
        st.integers(0, 16000),
        st.integers(0, 32768),
    ),
    max_size=8,
    unique_by=lambda w: w.worker_id,
)
jobs_st = st.lists(
    st.builds(
        PendingJob,
        job_id=st.integers(1, 10_000),
        cpu_millis=st.integers(1, 20000),
        memory_mb=st.integers(1, 40000),
        priority=st.integers(-2, 2),
    ),
    max_size=40,
    unique_by=lambda j: j.job_id,
)


def replay(jobs: list[PendingJob], workers: list[WorkerRoom], plan: Plan) -> dict[str, list[int]]:
    """Free (cpu, memory) per worker after applying the plan in order."""
    free = {
        w.worker_id: [w.cpu_millis - w.cpu_allocated_millis, w.memory_mb - w.memory_allocated_mb]
        for w in workers
    }
    size = {j.job_id: j for j in jobs}
    for job_id, worker_id in plan.placements:
        free[worker_id][0] -= size[job_id].cpu_millis
        free[worker_id][1] -= size[job_id].memory_mb
    return free


@given(jobs_st, workers_st, st.sampled_from(["best_fit", "first_fit", "worst_fit"]))
@settings(max_examples=examples(300))
def test_never_over_commits_a_worker(jobs: list[PendingJob], workers: list[WorkerRoom], policy: str) -> None:
    """After every placement, no worker's allocation exceeds its CPU or memory capacity."""
    plan = place(jobs, workers, policy=policy)
    for cpu, mem in replay(jobs, workers, plan).values():
        assert cpu >= 0 and mem >= 0
    assert len({job_id for job_id, _ in plan.placements}) == len(plan.placements)


@given(jobs_st, workers_st)
@settings(max_examples=examples(300))
def test_best_fit_always_picks_the_tightest_fit(jobs: list[PendingJob], workers: list[WorkerRoom]) -> None:
    """Each job goes, in priority then id order, to the worker with room whose normalised
    leftover is smallest (ties: smallest worker id); a job with no room anywhere is skipped."""
    plan = place(jobs, workers, policy="best_fit")
    chosen = dict(plan.placements)
    cap = {w.worker_id: (w.cpu_millis, w.memory_mb) for w in workers}
    free = {
        w.worker_id: [w.cpu_millis - w.cpu_allocated_millis, w.memory_mb - w.memory_allocated_mb]
        for w in workers
    }
    for job in sorted(jobs, key=lambda j: (-j.priority, j.job_id)):
        fits = [
            ((free[w][0] - job.cpu_millis) / cap[w][0] + (free[w][1] - job.memory_mb) / cap[w][1], w)
            for w in sorted(free)
            if free[w][0] >= job.cpu_millis and free[w][1] >= job.memory_mb
        ]
        if not fits:
            assert job.job_id not in chosen
            continue
        best_score = min(score for score, _ in fits)
        expected = min(w for score, w in fits if abs(score - best_score) < 1e-12)
        assert chosen.get(job.job_id) == expected
        free[expected][0] -= job.cpu_millis
        free[expected][1] -= job.memory_mb


@given(jobs_st, workers_st)
def test_unplaceable_jobs_stay_pending_with_a_reason(
    jobs: list[PendingJob], workers: list[WorkerRoom]
) -> None:
    """A job larger than every worker's whole capacity is not placed and carries a reason
    naming what it needs; a job that fits some worker never gets such a reason."""
    plan = place(jobs, workers)
    placed = dict(plan.placements)
    for job in jobs:
        fits_somewhere = any(job.cpu_millis <= w.cpu_millis and job.memory_mb <= w.memory_mb for w in workers)
        if fits_somewhere:
            assert job.job_id not in plan.unschedulable
        else:
            assert job.job_id not in placed
            assert plan.unschedulable[job.job_id].startswith("unschedulable: ")


def test_a_huge_job_does_not_block_smaller_jobs_behind_it() -> None:
    """The operator's example: 64000 cpu_millis on 16000-millicore workers waits with a
    reason, and the small jobs submitted after it are placed in the same round."""
    workers = [
        WorkerRoom(worker_id="w-1", cpu_millis=16000, memory_mb=32768),
        WorkerRoom(worker_id="w-2", cpu_millis=4000, memory_mb=8192),
    ]
    jobs = [
        PendingJob(job_id=1, cpu_millis=64000, memory_mb=1024, priority=5),
        PendingJob(job_id=2, cpu_millis=1000, memory_mb=256),
        PendingJob(job_id=3, cpu_millis=3000, memory_mb=256),
    ]
    plan = place(jobs, workers)
    assert plan.unschedulable == {1: "unschedulable: needs 64000 cpu_millis, largest worker has 16000"}
    assert dict(plan.placements) == {2: "w-2", 3: "w-2"}


def test_best_fit_keeps_the_big_gap_open() -> None:
    """A small job goes to the fuller worker so a later big job still fits on the emptier one."""
    workers = [
        WorkerRoom(worker_id="a", cpu_millis=8000, memory_mb=8000),
        WorkerRoom(
            worker_id="b",
            cpu_millis=8000,
            memory_mb=8000,
            cpu_allocated_millis=6000,
            memory_allocated_mb=6000,
        ),
    ]
    jobs = [
        PendingJob(job_id=1, cpu_millis=1000, memory_mb=1000),
        PendingJob(job_id=2, cpu_millis=8000, memory_mb=8000),
    ]
    assert dict(place(jobs, workers).placements) == {1: "b", 2: "a"}
    assert dict(place(jobs, workers, policy="worst_fit").placements) == {1: "a"}


def test_the_pending_queue_keeps_placement_order_and_tracks_changes() -> None:
    """Jobs come out by priority then id, whatever order they were added in; adding a job
    already held changes nothing; removing bumps the version."""
    queue = PendingQueue()
    queue.replace([PendingJob(job_id=5, cpu_millis=1, memory_mb=1)])
    version = queue.version
    added = queue.add(
        [
            PendingJob(job_id=3, cpu_millis=1, memory_mb=1),
            PendingJob(job_id=9, cpu_millis=1, memory_mb=1, priority=2),
            PendingJob(job_id=5, cpu_millis=1, memory_mb=1),
        ]
    )
    assert added == 2 and queue.version > version
    assert [j.job_id for j in queue.jobs()] == [9, 3, 5]
    queue.remove([3, 42])
    assert [j.job_id for j in queue.jobs()] == [9, 5] and 3 not in queue


def test_a_split_busy_cluster_places_what_fits_one_worker() -> None:
    """One worker has CPU left but no memory, the others the reverse: a job that fits each
    dimension on a different worker is not placed, one that fits a single worker is."""
    workers = [
        WorkerRoom(
            worker_id="a",
            cpu_millis=4000,
            memory_mb=4000,
            cpu_allocated_millis=3000,
            memory_allocated_mb=3950,
        ),
        WorkerRoom(
            worker_id="b",
            cpu_millis=4000,
            memory_mb=4000,
            cpu_allocated_millis=3900,
            memory_allocated_mb=3000,
        ),
    ]
    queue = PendingQueue()
    queue.replace(
        [
            PendingJob(job_id=1, cpu_millis=500, memory_mb=500),
            PendingJob(job_id=2, cpu_millis=50, memory_mb=500),
        ]
    )
    assert dict(place_queue(queue, workers).placements) == {2: "b"}


rooms_st = st.lists(st.tuples(st.integers(-5, 40), st.integers(-5, 40)), max_size=12)
sizes_st = st.lists(st.tuples(st.integers(0, 45), st.integers(0, 45)), max_size=30)


@given(rooms_st, sizes_st)
@settings(max_examples=examples(500))
def test_the_frontier_test_agrees_with_trying_every_room(
    rooms: list[tuple[int, int]], sizes: list[tuple[int, int]]
) -> None:
    """A job fits some room exactly when it fits one of the rooms' Pareto frontier (rooms with
    nothing left, even negative, included)."""
    room_cpu = np.array([c for c, _ in rooms], dtype=np.int64)
    room_mem = np.array([m for _, m in rooms], dtype=np.int64)
    cpu = np.array([c for c, _ in sizes], dtype=np.int64)
    mem = np.array([m for _, m in sizes], dtype=np.int64)
    expected = [any(c <= rc and m <= rm for rc, rm in rooms) for c, m in sizes]
    assert fits_some_room(cpu, mem, room_cpu, room_mem).tolist() == expected


@given(jobs_st, workers_st, st.sampled_from(["best_fit", "first_fit", "worst_fit"]), st.integers(0, 4))
@settings(max_examples=examples(300))
def test_reservations_never_over_commit_and_keep_reserved_workers_free(
    jobs: list[PendingJob], workers: list[WorkerRoom], policy: str, max_reservations: int
) -> None:
    """With reservations, still no worker is over-committed and no job placed twice; at most
    max_reservations workers are reserved, each for a job that fits its capacity but was not
    placed, and a reserved worker takes no job that comes after its job in the queue."""
    plan = place(jobs, workers, policy=policy, max_reservations=max_reservations)
    for cpu, mem in replay(jobs, workers, plan).values():
        assert cpu >= 0 and mem >= 0
    assert len({job_id for job_id, _ in plan.placements}) == len(plan.placements)
    assert len(plan.reservations) <= max_reservations
    order = {j.job_id: n for n, j in enumerate(sorted(jobs, key=lambda j: (-j.priority, j.job_id)))}
    by_id = {j.job_id: j for j in jobs}
    capacity = {w.worker_id: (w.cpu_millis, w.memory_mb) for w in workers}
    placed = dict(plan.placements)
    for worker_id, job_id in plan.reservations.items():
        assert job_id not in placed
        job = by_id[job_id]
        assert job.cpu_millis <= capacity[worker_id][0] and job.memory_mb <= capacity[worker_id][1]
        later = [j for j, w in plan.placements if w == worker_id and order[j] > order[job_id]]
        assert later == []


def busy(worker_id: str, free_cpu: int) -> WorkerRoom:
    return WorkerRoom(
        worker_id=worker_id, cpu_millis=8000, memory_mb=8192, cpu_allocated_millis=8000 - free_cpu
    )


def test_a_reservation_keeps_the_closest_worker_for_a_large_job() -> None:
    """A 4000-millicore job fits neither worker now (2000 and 1000 free): it reserves a (which
    lacks the least), so the small jobs behind it go to b only, and a drains for it; without
    reservations the small jobs take both rooms and the large job keeps waiting."""
    workers = [busy("a", 2000), busy("b", 1000)]
    jobs = [PendingJob(job_id=1, cpu_millis=4000, memory_mb=100)] + [
        PendingJob(job_id=n, cpu_millis=1000, memory_mb=100) for n in (2, 3, 4)
    ]
    plan = place(jobs, workers, max_reservations=1)
    assert plan.reservations == {"a": 1}
    assert dict(plan.placements) == {2: "b"}
    assert dict(place(jobs, workers).placements) == {2: "b", 3: "a", 4: "a"}
    # Once a has drained enough, the job is placed there and nothing is reserved.
    drained = place(jobs, [busy("a", 4000), busy("b", 0)], max_reservations=1)
    assert (dict(drained.placements), drained.reservations) == ({1: "a"}, {})


def test_negative_reservations_are_refused() -> None:
    with pytest.raises(ValueError, match="max_reservations must be at least 0, got -1"):
        place([], [], max_reservations=-1)
    with pytest.raises(InvalidArgument, match="max_reservations"):
        PlacerSettings(max_reservations=-1)


def test_only_a_job_queued_long_enough_reserves_and_replace_keeps_its_time() -> None:
    """The large job joined at t=0: at t=5 (reserve_after_s 10) it reserves nothing and the
    small jobs take the rooms; at t=10 it reserves a. A resync (replace) at t=8 keeps its t=0,
    and a job first seen then counts from 8."""
    workers = [busy("a", 2000), busy("b", 1000)]
    queue = PendingQueue()
    queue.replace([PendingJob(job_id=1, cpu_millis=4000, memory_mb=100)], now=0.0)
    queue.add([PendingJob(job_id=n, cpu_millis=1000, memory_mb=100) for n in (2, 3)], now=5.0)
    early = place_queue(queue, workers, max_reservations=1, reserve_after_s=10.0, now=5.0)
    assert (early.reservations, dict(early.placements)) == ({}, {2: "b", 3: "a"})
    queue.replace([*queue.jobs(), PendingJob(job_id=4, cpu_millis=4000, memory_mb=100)], now=8.0)
    assert queue.since.tolist() == [0.0, 5.0, 5.0, 8.0]
    late = place_queue(queue, workers, max_reservations=2, reserve_after_s=10.0, now=10.0)
    assert (late.reservations, dict(late.placements)) == ({"a": 1}, {2: "b"})


def replay_stream(max_reservations: int, seconds: int = 60) -> int | None:
    """Two 4000-millicore workers kept full by a stream of 1000-millicore jobs (3 a second,
    each running 3 s, ids in arrival order); a 4000-millicore job arrives at t=1. Replays one
    round a second and returns when the large job was placed, or None."""
    running: list[tuple[int, str, int]] = []  # (ends at, worker, cpu)
    allocated = {"a": 0, "b": 0}
    queue = PendingQueue()
    next_id = 1
    for t in range(seconds):
        for ends_at, worker, cpu in [r for r in running if r[0] <= t]:
            running.remove((ends_at, worker, cpu))
            allocated[worker] -= cpu
        arriving = [PendingJob(job_id=next_id + n, cpu_millis=1000, memory_mb=1) for n in range(3)]
        next_id += 3
        if t == 1:
            arriving.insert(0, PendingJob(job_id=next_id, cpu_millis=4000, memory_mb=1))
            large_id, next_id = next_id, next_id + 1
        queue.add(arriving, now=float(t))
        rooms = [
            WorkerRoom(worker_id=w, cpu_millis=4000, memory_mb=4000, cpu_allocated_millis=allocated[w])
            for w in ("a", "b")
        ]
        plan = place_queue(queue, rooms, max_reservations=max_reservations, reserve_after_s=5.0, now=float(t))
        for job_id, worker in plan.placements:
            cpu = plan.sizes[job_id][0]
            allocated[worker] += cpu
            running.append((t + 3, worker, cpu))
            if t >= 1 and job_id == large_id:
                return t
        queue.remove(job_id for job_id, _ in plan.placements)
    return None


def test_a_worker_sized_job_behind_a_stream_of_small_jobs_starts_only_with_reservations() -> None:
    """Without reservations the small jobs take every room as it frees and the large job waits
    for ever; with one, once it has waited 5 s a worker drains for it and it starts."""
    assert replay_stream(max_reservations=0) is None
    started = replay_stream(max_reservations=1)
    assert started is not None and 6 <= started <= 10


# ---------------------------------------------------------------- pacing and backoff


@given(st.integers(0, 500), st.integers(0, 200), st.integers(1, 32), st.integers(1, 128))
def test_the_send_window_starts_small_grows_with_confirmations_and_stops_at_its_ceiling(
    confirmed: int, unconfirmed: int, initial: int, ceiling: int
) -> None:
    """window = min(ceiling, initial + confirmed); the limit is what the window leaves after the
    unconfirmed assignments, never negative, never more with more unconfirmed, never less with
    more confirmed."""
    window = send_window(confirmed, initial_window=initial, max_unconfirmed=ceiling)
    assert window == min(ceiling, initial + confirmed)
    limit = placement_limit(confirmed, unconfirmed, initial_window=initial, max_unconfirmed=ceiling)
    assert limit == max(0, window - unconfirmed)
    assert unconfirmed + limit <= max(window, unconfirmed)
    more_confirmed = placement_limit(
        confirmed + 1, unconfirmed, initial_window=initial, max_unconfirmed=ceiling
    )
    more_unconfirmed = placement_limit(
        confirmed, unconfirmed + 1, initial_window=initial, max_unconfirmed=ceiling
    )
    assert more_confirmed >= limit >= more_unconfirmed


def test_slow_start_doubles_the_window_per_round_trip_while_every_job_is_confirmed() -> None:
    """A worker that confirms everything it gets receives 8, 16, 32, 64, 64 jobs in successive
    round trips (initial 8, ceiling 64); one that confirms nothing gets 8 and then nothing."""
    confirmed, sent = 0, []
    for _ in range(5):
        batch = placement_limit(confirmed, 0, initial_window=8, max_unconfirmed=64)
        sent.append(batch)
        confirmed += batch
    assert sent == [8, 16, 32, 64, 64]
    assert placement_limit(0, 8, initial_window=8, max_unconfirmed=64) == 0


limits_st = st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=8, max_size=8)


def with_limits(workers: list[WorkerRoom], limits: list[int | None]) -> list[WorkerRoom]:
    return [attrs.evolve(w, placement_limit=limit) for w, limit in zip(workers, limits, strict=False)]


@given(
    jobs_st, workers_st, limits_st, st.sampled_from(["best_fit", "first_fit", "worst_fit"]), st.integers(0, 3)
)
@settings(max_examples=examples(300))
def test_no_worker_gets_more_than_its_placement_limit(
    jobs: list[PendingJob],
    workers: list[WorkerRoom],
    limits: list[int | None],
    policy: str,
    max_reservations: int,
) -> None:
    """Whatever the policy and reservations, a worker with a placement limit receives at most
    that many jobs in the round, and no worker is over-committed."""
    limited = with_limits(workers, limits)
    plan = place(jobs, limited, policy=policy, max_reservations=max_reservations)
    for w in limited:
        received = sum(1 for _, worker_id in plan.placements if worker_id == w.worker_id)
        assert w.placement_limit is None or received <= w.placement_limit
    for cpu, mem in replay(jobs, limited, plan).values():
        assert cpu >= 0 and mem >= 0


@given(jobs_st, workers_st, st.sampled_from(["best_fit", "first_fit", "worst_fit"]), st.integers(0, 3))
@settings(max_examples=examples(300))
def test_limits_as_large_as_the_queue_change_nothing(
    jobs: list[PendingJob], workers: list[WorkerRoom], policy: str, max_reservations: int
) -> None:
    """With every worker's limit at least the number of jobs, the plan is the plan without
    limits: placements, reservations and reasons."""
    large = [attrs.evolve(w, placement_limit=len(jobs) + k) for k, w in enumerate(workers)]
    assert place(jobs, large, policy=policy, max_reservations=max_reservations) == place(
        jobs, workers, policy=policy, max_reservations=max_reservations
    )


@given(jobs_st, workers_st, limits_st)
@settings(max_examples=examples(300))
def test_best_fit_with_limits_picks_the_tightest_worker_that_may_still_take_a_job(
    jobs: list[PendingJob], workers: list[WorkerRoom], limits: list[int | None]
) -> None:
    """Each job goes, in queue order, to the worker with room and placements left whose
    normalised leftover is smallest (ties: smallest id); with none, it is skipped."""
    limited = with_limits(workers, limits)
    chosen = dict(place(jobs, limited).placements)
    cap = {w.worker_id: (w.cpu_millis, w.memory_mb) for w in limited}
    free = {
        w.worker_id: [w.cpu_millis - w.cpu_allocated_millis, w.memory_mb - w.memory_allocated_mb]
        for w in limited
    }
    left = {w.worker_id: len(jobs) if w.placement_limit is None else w.placement_limit for w in limited}
    for job in sorted(jobs, key=lambda j: (-j.priority, j.job_id)):
        fits = [
            ((free[w][0] - job.cpu_millis) / cap[w][0] + (free[w][1] - job.memory_mb) / cap[w][1], w)
            for w in sorted(free)
            if free[w][0] >= job.cpu_millis and free[w][1] >= job.memory_mb and left[w] > 0
        ]
        if not fits:
            assert job.job_id not in chosen
            continue
        best_score = min(score for score, _ in fits)
        expected = min(w for score, w in fits if abs(score - best_score) < 1e-12)
        assert chosen.get(job.job_id) == expected
        free[expected][0] -= job.cpu_millis
        free[expected][1] -= job.memory_mb
        left[expected] -= 1


def test_eighty_tiny_jobs_are_spread_by_the_window_instead_of_landing_on_one_worker() -> None:
    """The issue's example: 80 tiny jobs, best fit would put all on the tightest worker; with
    three fresh workers limited to 8 each, the round places 8 on each and leaves 56 pending."""
    tiny = [PendingJob(job_id=n, cpu_millis=10, memory_mb=10) for n in range(1, 81)]
    workers = [busy("a", 4000), busy("b", 6000), busy("c", 8000)]
    assert {w for _, w in place(tiny, workers).placements} == {"a"}
    plan = place(tiny, [attrs.evolve(w, placement_limit=8) for w in workers])
    by_worker = Counter(w for _, w in plan.placements)
    assert by_worker == {"a": 8, "b": 8, "c": 8}
    assert [j for j, _ in plan.placements] == list(range(1, 25))  # still in queue order


not_before_st = st.lists(st.one_of(st.none(), st.floats(-5, 5)), min_size=40, max_size=40)


@given(jobs_st, workers_st, not_before_st, st.integers(0, 3))
@settings(max_examples=examples(300))
def test_a_job_waiting_out_its_backoff_is_as_if_it_were_not_queued(
    jobs: list[PendingJob], workers: list[WorkerRoom], not_before: list[float | None], max_reservations: int
) -> None:
    """At time 0, jobs whose not_before is later neither get placed nor reserve a worker: the
    plan's placements and reservations are those of the queue without them."""
    backoff = {j.job_id: t for j, t in zip(jobs, not_before, strict=False) if t is not None}
    queue = PendingQueue()
    queue.replace(jobs, now=-10.0, not_before=backoff)
    plan = place_queue(queue, workers, max_reservations=max_reservations, reserve_after_s=5.0, now=0.0)
    waiting = {job_id for job_id, t in backoff.items() if t > 0}
    assert queue.waiting_for_backoff(0.0) == waiting
    others = PendingQueue()
    others.replace([j for j in jobs if j.job_id not in waiting], now=-10.0)
    expected = place_queue(others, workers, max_reservations=max_reservations, reserve_after_s=5.0, now=0.0)
    assert (plan.placements, plan.reservations) == (expected.placements, expected.reservations)


def test_the_queue_keeps_a_jobs_not_before_until_it_is_removed() -> None:
    """add keeps the not_before of jobs already held and takes the new jobs'; replace takes
    only what it is given (the database's word); remove drops it with the job."""
    queue = PendingQueue()
    queue.add([PendingJob(job_id=1, cpu_millis=1, memory_mb=1)], not_before={1: 5.0})
    queue.add([PendingJob(job_id=2, cpu_millis=1, memory_mb=1)], not_before={2: 7.0})
    assert queue.not_before.tolist() == [5.0, 7.0] and queue.waiting_for_backoff(6.0) == {2}
    queue.remove([1])
    assert queue.not_before.tolist() == [7.0]
    queue.replace(queue.jobs())
    assert queue.waiting_for_backoff(0.0) == set()


@given(jobs_st, workers_st, limits_st, st.integers(1, 5), st.integers(0, 2))
@settings(max_examples=examples(200))
def test_deciding_in_slices_gives_the_same_plan_and_yields_as_it_goes(
    jobs: list[PendingJob],
    workers: list[WorkerRoom],
    limits: list[int | None],
    step: int,
    max_reservations: int,
) -> None:
    """place_queue_steps returns place_queue's plan, having yielded once per step_visits jobs
    it considered (at least one yield per step_visits placements)."""
    limited = with_limits(workers, limits)
    queue = PendingQueue()
    queue.replace(jobs)
    steps = place_queue_steps(queue, limited, max_reservations=max_reservations, step_visits=step)
    yields = 0
    while True:
        try:
            next(steps)
            yields += 1
        except StopIteration as done:
            plan = done.value
            break
    assert plan == place_queue(queue, limited, max_reservations=max_reservations)
    assert yields >= len(plan.placements) // step


@pytest.mark.parametrize("policy", ["best_fit", "first_fit", "worst_fit"])
@pytest.mark.parametrize("max_reservations", [0, 4])
def test_a_worker_allocated_past_its_capacity_gets_nothing_new(policy: str, max_reservations: int) -> None:
    """A worker whose agent restarted with less capacity than its kept jobs use (allocation
    above capacity: its free room is negative) is placed nothing, not even a small job, until
    its jobs have drained below its capacity (it may be kept free for a large job meanwhile);
    the other worker takes what fits it."""
    shrunk = WorkerRoom(
        worker_id="w-1", cpu_millis=2000, memory_mb=2048, cpu_allocated_millis=3000, memory_allocated_mb=512
    )
    other = WorkerRoom(worker_id="w-2", cpu_millis=1000, memory_mb=1024)
    jobs = [PendingJob(job_id=i, cpu_millis=100, memory_mb=10) for i in range(1, 20)]
    jobs.append(PendingJob(job_id=99, cpu_millis=1800, memory_mb=10))
    plan = place(jobs, [shrunk, other], policy=policy, max_reservations=max_reservations)
    assert {worker for _, worker in plan.placements} == {"w-2"}

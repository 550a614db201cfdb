"""Gangs in the placer's round (actors/round_plan.py, one call of actors/gangs.py's place_gangs):
a whole gang goes into the round's placements with each worker's incarnation, the single jobs get
what it leaves, and the workers a waiting gang reserves take no single job."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.gangs import GangQueue, GangTask
from actors.messages import WorkerRef
from actors.pending_queue import PendingJob, PendingQueue
from actors.placer_store import LiveWorker
from actors.rooms import WorkerRoom
from actors.round_plan import plan_round
from runtime.settings.leader import PlacerSettings

NOW = 100.0


def _worker(index: int, cpu: int, allocated: int = 0) -> LiveWorker:
    worker_id = f"w-{index}"
    return LiveWorker(
        ref=WorkerRef(worker_id=worker_id, address=f"10.0.0.{index}:1", incarnation=10 + index),
        room=WorkerRoom(worker_id=worker_id, cpu_millis=cpu, memory_mb=8192, cpu_allocated_millis=allocated),
        confirmed=50,
    )


def _gangs(gang_id: int, size: int, cpu: int, *, spread: bool = False) -> GangQueue:
    queue = GangQueue()
    queue.add(
        [
            (
                PendingJob(job_id=gang_id + rank, cpu_millis=cpu, memory_mb=64),
                GangTask(gang_id=gang_id, rank=rank, size=size, spread=spread),
                "",
            )
            for rank in range(size)
        ],
        now=0.0,
        not_before={},
    )
    return queue


def _singles(*sizes: int) -> PendingQueue:
    queue = PendingQueue()
    queue.replace([PendingJob(job_id=1 + k, cpu_millis=cpu, memory_mb=64) for k, cpu in enumerate(sizes)])
    return queue


def test_a_whole_gang_is_placed_before_the_single_jobs() -> None:
    """A spread gang of 3 takes one worker each, with their incarnations; the single job fits
    into what is left."""
    workers = [_worker(i, 4000) for i in range(1, 4)]
    plan = plan_round(
        _singles(2000),
        workers,
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, 3, 3000, spread=True).whole(),
    )
    gang = [(p.job_id, p.worker_id, p.incarnation) for p in plan.placements if p.job_id >= 100]
    assert sorted(gang) == [(100, "w-1", 11), (101, "w-2", 12), (102, "w-3", 13)]
    assert [p.job_id for p in plan.placements if p.job_id < 100] == []  # 1000 cpu_millis left on each


def test_a_reserved_worker_takes_no_single_job() -> None:
    """A gang of 2 of 4000 cpu_millis that has waited keeps the two workers it lacks least for;
    a small single job goes to neither."""
    workers = [_worker(1, 4000, 1000), _worker(2, 4000, 1000), _worker(3, 4000, 3000)]
    settings_ = PlacerSettings(max_reservations=1, reserve_after_s=0.0)
    plan = plan_round(
        _singles(500), workers, settings_, max_rows=100, now=NOW, gangs=_gangs(100, 2, 4000).whole()
    )
    assert not [p for p in plan.placements if p.job_id >= 100]
    assert [(p.job_id, p.worker_id) for p in plan.placements] == [(1, "w-3")]
    assert {job_id for job_id, _ in plan.reasons if job_id >= 100} == {100, 101}


@given(
    st.integers(1, 6), st.integers(500, 5000), st.booleans(), st.lists(st.integers(100, 4000), max_size=10)
)
@settings(max_examples=examples(100))
def test_a_round_places_a_gang_whole_or_not_at_all(
    size: int, cpu: int, spread: bool, singles: list[int]
) -> None:
    """Whatever the single jobs, a round holds all of a gang's tasks or none, and never more
    than a worker's free room."""
    workers = [_worker(i, 4000, 500 * i) for i in range(1, 5)]
    plan = plan_round(
        _singles(*singles),
        workers,
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, size, cpu, spread=spread).whole(),
    )
    placed = {p.job_id for p in plan.placements if p.job_id >= 100}
    assert placed in (set(), set(range(100, 100 + size)))
    used = {w.ref.worker_id: w.room.cpu_allocated_millis for w in workers}
    for p in plan.placements:
        used[p.worker_id] += p.cpu_millis
    assert all(cpu_used <= 4000 for cpu_used in used.values())


def test_a_round_never_carries_more_placements_than_its_rows() -> None:
    """Gangs and single jobs together stay within the round's rows."""
    workers = [_worker(i, 16000) for i in range(1, 5)]
    plan = plan_round(
        _singles(*[100] * 20),
        workers,
        PlacerSettings(),
        max_rows=6,
        now=NOW,
        gangs=_gangs(100, 4, 100).whole(),
    )
    assert len(plan.placements) <= 6
    assert {p.job_id for p in plan.placements if p.job_id >= 100} == {100, 101, 102, 103}

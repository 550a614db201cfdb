"""Countable devices in placement (docs/devices.md), as a pure function checked with hypothesis:
a job gets exactly its count of free units of its worker, lowest ids first; no unit goes to two
jobs, nor to one while an active assignment holds it; best fit keeps the big device gaps for big
asks; a job asking a resource no worker offers waits with a reason."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.pending_queue import PendingJob, PendingQueue
from actors.placement import place
from actors.preemption import candidates
from actors.rooms import WorkerRoom, unit_order

GPUS = ("0", "1", "2", "3", "4", "5", "6", "7")


@st.composite
def device_workers(draw: st.DrawFn) -> list[WorkerRoom]:
    """Up to 6 workers, each offering 0 to 8 gpu (some in use) and maybe a few fpga."""
    workers = []
    for i in range(draw(st.integers(0, 6))):
        gpus = GPUS[: draw(st.integers(0, 8))]
        in_use = draw(st.sets(st.sampled_from(gpus))) if gpus else set()
        resources = {"gpu": gpus} if gpus else {}
        if draw(st.booleans()):
            resources["fpga"] = ("a", "b")
        workers.append(
            WorkerRoom(
                worker_id=f"w-{i}",
                cpu_millis=draw(st.integers(2000, 16000)),
                memory_mb=16384,
                resources=resources,
                units_in_use=frozenset(("gpu", u) for u in in_use),
            )
        )
    return workers


device_jobs = st.lists(
    st.builds(
        PendingJob,
        job_id=st.integers(1, 10_000),
        cpu_millis=st.integers(1, 4000),
        memory_mb=st.integers(1, 4096),
        priority=st.integers(-1, 1),
        resources=st.sampled_from(
            [(), (("gpu", 1),), (("gpu", 2),), (("gpu", 4),), (("fpga", 1), ("gpu", 1))]
        ),
    ),
    max_size=40,
    unique_by=lambda j: j.job_id,
)


@given(device_jobs, device_workers())
@settings(max_examples=examples(300))
def test_each_job_gets_its_count_of_free_units_and_no_unit_goes_twice(
    jobs: list[PendingJob], workers: list[WorkerRoom]
) -> None:
    """Every placed job holds exactly the units it asked, of each name, all offered by its
    worker and free before the round; no (worker, name, unit) is given to two jobs."""
    plan = place(jobs, workers)
    by_id = {w.worker_id: w for w in workers}
    asked = {j.job_id: dict(j.resources) for j in jobs}
    given_out: Counter[tuple[str, str, str]] = Counter()
    for job_id, worker_id in plan.placements:
        room = by_id[worker_id]
        units = dict(plan.units.get(job_id, ()))
        assert {name: len(ids) for name, ids in units.items()} == asked[job_id]
        for name, ids in units.items():
            for unit in ids:
                assert unit in room.resources[name]
                assert (name, unit) not in room.units_in_use
                given_out[(worker_id, name, unit)] += 1
    assert all(count == 1 for count in given_out.values())


@given(device_jobs, device_workers())
@settings(max_examples=examples(200))
def test_a_worker_gives_its_lowest_free_units_first(
    jobs: list[PendingJob], workers: list[WorkerRoom]
) -> None:
    """The units a worker gives out in a round are, in placement order, its free units from the
    lowest id up (the choice is deterministic)."""
    plan = place(jobs, workers)
    by_id = {w.worker_id: w for w in workers}
    given_by: dict[tuple[str, str], list[str]] = {}
    for job_id, worker_id in plan.placements:
        for name, ids in plan.units.get(job_id, ()):
            given_by.setdefault((worker_id, name), []).extend(ids)
    for (worker_id, name), ids in given_by.items():
        free = by_id[worker_id].free_units(name)
        assert ids == free[: len(ids)]
    assert place(jobs, workers).units == plan.units


def test_units_sort_by_number_then_by_text() -> None:
    """Numeric unit ids sort by value, others after them as text."""
    assert sorted(["10", "2", "GPU-b", "0", "GPU-a"], key=unit_order) == ["0", "2", "10", "GPU-a", "GPU-b"]


def test_best_fit_keeps_the_big_device_gap_for_the_big_ask() -> None:
    """A 1-gpu job goes to the worker with 2 free gpu rather than to the one with 8 free, so a
    later 8-gpu job still fits."""
    workers = [
        WorkerRoom(worker_id="w-big", cpu_millis=8000, memory_mb=8192, resources={"gpu": GPUS}),
        WorkerRoom(worker_id="w-small", cpu_millis=8000, memory_mb=8192, resources={"gpu": ("0", "1")}),
    ]
    jobs = [
        PendingJob(job_id=1, cpu_millis=100, memory_mb=10, resources=(("gpu", 1),)),
        PendingJob(job_id=2, cpu_millis=100, memory_mb=10, resources=(("gpu", 8),)),
    ]
    plan = place(jobs, workers)
    assert dict(plan.placements) == {1: "w-small", 2: "w-big"}
    assert plan.units[2] == (("gpu", GPUS),)


def test_a_job_asking_an_unoffered_resource_waits_with_a_reason() -> None:
    """A job asking gpu where no worker offers gpu, or more gpu than any worker offers, is not
    placed and says why; a job asking none beside it is placed."""
    workers = [WorkerRoom(worker_id="w-1", cpu_millis=8000, memory_mb=8192, resources={"fpga": ("a",)})]
    jobs = [
        PendingJob(job_id=1, cpu_millis=100, memory_mb=10, resources=(("gpu", 2),)),
        PendingJob(job_id=2, cpu_millis=100, memory_mb=10, resources=(("fpga", 2),)),
        PendingJob(job_id=3, cpu_millis=100, memory_mb=10),
    ]
    plan = place(jobs, workers)
    assert dict(plan.placements) == {3: "w-1"}
    assert dict(plan.unschedulable) == {
        1: "unschedulable: needs 2 gpu, no worker offers gpu",
        2: "unschedulable: needs 2 fpga, largest worker offers 1",
    }


def test_a_job_waits_while_its_units_are_in_use_without_a_reason() -> None:
    """A job asking more gpu than are free now (but no more than the worker offers) waits for
    them: not placed, and not called unschedulable."""
    workers = [
        WorkerRoom(
            worker_id="w-1",
            cpu_millis=8000,
            memory_mb=8192,
            resources={"gpu": ("0", "1")},
            units_in_use=frozenset({("gpu", "0")}),
        )
    ]
    plan = place([PendingJob(job_id=1, cpu_millis=100, memory_mb=10, resources=(("gpu", 2),))], workers)
    assert plan.placements == () and 1 not in plan.unschedulable


def test_a_job_asking_devices_is_no_preemption_candidate() -> None:
    """Of two high-priority jobs that fit no free room, the one asking gpu is not a preemption
    candidate (what a preemption frees is judged without units); the other is."""
    queue = PendingQueue()
    queue.replace(
        [
            PendingJob(job_id=1, cpu_millis=4000, memory_mb=10, priority=10, resources=(("gpu", 1),)),
            PendingJob(job_id=2, cpu_millis=4000, memory_mb=10, priority=10),
        ]
    )
    full = WorkerRoom(
        worker_id="w-1",
        cpu_millis=4000,
        memory_mb=8192,
        cpu_allocated_millis=4000,
        resources={"gpu": ("0",)},
    )
    assert [c.job_id for c in candidates(queue, [full], skip=(), limit=5)] == [2]

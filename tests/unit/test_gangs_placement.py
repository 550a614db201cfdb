"""Gang placement as a pure function (actors/gangs.py), checked with hypothesis: all of a gang's
tasks or none, never past a room, spread gangs on distinct workers."""

from __future__ import annotations

from collections import Counter

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.gang_queue import GangQueue, GangTask, PendingGang
from actors.gangs import place_gangs
from actors.pending_queue import PendingJob
from actors.rooms import WorkerRoom

rooms_st = st.lists(
    st.builds(
        lambda i, cpu, mem, used_cpu, used_mem, limit: WorkerRoom(
            worker_id=f"w-{i:02d}",
            cpu_millis=cpu,
            memory_mb=mem,
            cpu_allocated_millis=min(used_cpu, cpu),
            memory_allocated_mb=min(used_mem, mem),
            placement_limit=limit,
        ),
        st.integers(0, 99),
        st.integers(1000, 16000),
        st.integers(1024, 32768),
        st.integers(0, 16000),
        st.integers(0, 32768),
        st.none() | st.integers(0, 4),
    ),
    max_size=10,
    unique_by=lambda r: r.worker_id,
)


def _gang(gang_id: int, size: int, cpu: int, mem: int, spread: bool, priority: int = 0) -> PendingGang:
    task_ids = tuple(gang_id * 100 + rank for rank in range(size))
    job = PendingJob(job_id=task_ids[0], cpu_millis=cpu, memory_mb=mem, priority=priority)
    return PendingGang(gang_id=gang_id, task_ids=task_ids, job=job, spread=spread)


gangs_st = st.lists(
    st.builds(
        _gang,
        st.integers(1, 50),
        st.integers(1, 8),
        st.integers(100, 8000),
        st.integers(64, 16384),
        st.booleans(),
        st.integers(0, 3),
    ),
    max_size=8,
    unique_by=lambda g: g.gang_id,
).map(lambda gs: sorted(gs, key=lambda g: (-g.job.priority, g.gang_id)))


@given(gangs_st, rooms_st)
@settings(max_examples=examples(300))
def test_a_gang_is_placed_whole_or_not_at_all(gangs: list[PendingGang], rooms: list[WorkerRoom]) -> None:
    """Every gang has either all of its tasks placed or none of them."""
    plan = place_gangs(gangs, rooms, now=0.0)
    placed = {job_id for job_id, _ in plan.placements}
    for gang in gangs:
        held = placed & set(gang.task_ids)
        assert held in (set(), set(gang.task_ids))


@given(gangs_st, rooms_st)
@settings(max_examples=examples(300))
def test_placements_never_exceed_a_rooms_free_capacity_or_limit(
    gangs: list[PendingGang], rooms: list[WorkerRoom]
) -> None:
    """What a round places on a worker fits its free CPU and memory and its placement limit."""
    plan = place_gangs(gangs, rooms, now=0.0)
    size = {t: (g.job.cpu_millis, g.job.memory_mb) for g in gangs for t in g.task_ids}
    by_id = {r.worker_id: r for r in rooms}
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for job_id, worker_id in plan.placements:
        cpu[worker_id] += size[job_id][0]
        mem[worker_id] += size[job_id][1]
        count[worker_id] += 1
    for worker_id, room in by_id.items():
        assert cpu[worker_id] <= room.cpu_millis - room.cpu_allocated_millis
        assert mem[worker_id] <= room.memory_mb - room.memory_allocated_mb
        if room.placement_limit is not None:
            assert count[worker_id] <= room.placement_limit


@given(gangs_st, rooms_st)
@settings(max_examples=examples(300))
def test_a_spread_gangs_tasks_never_share_a_worker(gangs: list[PendingGang], rooms: list[WorkerRoom]) -> None:
    """Two tasks of a spread gang are never placed on one worker."""
    plan = place_gangs(gangs, rooms, now=0.0)
    where = dict(plan.placements)
    for gang in gangs:
        if gang.spread:
            workers = [where[t] for t in gang.task_ids if t in where]
            assert len(workers) == len(set(workers))


@given(gangs_st, rooms_st)
@settings(max_examples=examples(200))
def test_a_reserved_worker_takes_no_later_gang(gangs: list[PendingGang], rooms: list[WorkerRoom]) -> None:
    """A worker kept free for a waiting gang is given nothing by the gangs after it."""
    plan = place_gangs(gangs, rooms, now=10.0, max_reservations=2, reserve_after_s=0.0)
    order = {g.gang_id: n for n, g in enumerate(gangs)}
    gang_of = {t: g.gang_id for g in gangs for t in g.task_ids}
    for job_id, worker_id in plan.placements:
        kept_for = plan.reserved.get(worker_id)
        assert kept_for is None or order[gang_of[job_id]] < order[kept_for]


def test_a_gang_that_fits_only_whole_across_workers_is_placed_by_best_fit() -> None:
    """Four tasks of 2000 cpu_millis fill the two fuller workers before the empty one."""
    rooms = [
        WorkerRoom(worker_id="w-1", cpu_millis=8000, memory_mb=8192, cpu_allocated_millis=4000),
        WorkerRoom(worker_id="w-2", cpu_millis=8000, memory_mb=8192, cpu_allocated_millis=4000),
        WorkerRoom(worker_id="w-3", cpu_millis=8000, memory_mb=8192),
    ]
    plan = place_gangs([_gang(1, 4, 2000, 512, False)], rooms, now=0.0)
    assert sorted(w for _, w in plan.placements) == ["w-1", "w-1", "w-2", "w-2"]


def test_a_gang_larger_than_the_cluster_waits_saying_why() -> None:
    """A spread gang of 8 on 5 able workers is unschedulable, and its reason names the numbers."""
    rooms = [WorkerRoom(worker_id=f"w-{i}", cpu_millis=4000, memory_mb=4096) for i in range(5)]
    plan = place_gangs([_gang(1, 8, 2000, 64, True)], rooms, now=0.0)
    assert not plan.placements
    assert {r for _, r in plan.reasons} == {
        "unschedulable: gang of 8 needs 8 workers with room for 2000 cpu_millis, 64 memory_mb;"
        " 5 live workers have it"
    }


def test_a_gang_that_does_not_fit_now_places_nothing_and_waits() -> None:
    """With room for three of four tasks, none is placed; the tasks wait together."""
    rooms = [WorkerRoom(worker_id=f"w-{i}", cpu_millis=2000, memory_mb=4096) for i in range(4)]
    rooms[0] = WorkerRoom(worker_id="w-0", cpu_millis=2000, memory_mb=4096, cpu_allocated_millis=1000)
    plan = place_gangs([_gang(1, 4, 2000, 64, True)], rooms, now=0.0)
    assert not plan.placements
    assert {r for _, r in plan.reasons} == {"gang: waiting for room for all 4 tasks at once"}


def test_a_gang_is_whole_only_once_every_rank_is_held() -> None:
    """The gang queue offers a gang only when it holds all of its tasks, and not after one left."""
    queue = GangQueue()
    tasks = [
        (PendingJob(job_id=10 + r, cpu_millis=100, memory_mb=64), GangTask(gang_id=10, rank=r, size=3), "")
        for r in range(3)
    ]
    queue.add(tasks[:2], now=1.0, not_before={})
    assert queue.whole() == []
    queue.add(tasks[2:], now=2.0, not_before={})
    (gang,) = queue.whole()
    assert (gang.task_ids, gang.since) == ((10, 11, 12), 2.0)
    queue.remove([11])
    assert queue.whole() == []


@given(gangs_st, rooms_st, st.integers(0, 20))
@settings(max_examples=examples(200))
def test_a_round_places_at_most_its_limit_and_only_whole_gangs(
    gangs: list[PendingGang], rooms: list[WorkerRoom], limit: int
) -> None:
    """With a limit on the round's placements, the gangs placed fit it, each one whole."""
    plan = place_gangs(gangs, rooms, now=0.0, max_placements=limit)
    assert len(plan.placements) <= limit
    placed = {job_id for job_id, _ in plan.placements}
    for gang in gangs:
        assert placed & set(gang.task_ids) in (set(), set(gang.task_ids))


def _device_room(i: int, cpu: int, offered: int, held: frozenset[int], limit: int | None) -> WorkerRoom:
    units = tuple(str(u) for u in range(offered))
    return WorkerRoom(
        worker_id=f"w-{i:02d}",
        cpu_millis=cpu,
        memory_mb=16384,
        placement_limit=limit,
        resources={"gpu": units} if offered else {},
        units_in_use=frozenset(("gpu", str(u)) for u in held if u < offered),
    )


device_rooms_st = st.lists(
    st.builds(
        _device_room,
        st.integers(0, 99),
        st.integers(1000, 16000),
        st.integers(0, 8),
        st.frozensets(st.integers(0, 7), max_size=8),
        st.none() | st.integers(0, 4),
    ),
    max_size=8,
    unique_by=lambda r: r.worker_id,
)


def _device_gang(gang_id: int, size: int, cpu: int, gpu: int, spread: bool) -> PendingGang:
    gang = _gang(gang_id, size, cpu, 64, spread)
    return attrs.evolve(gang, job=attrs.evolve(gang.job, resources=(("gpu", gpu),) if gpu else ()))


device_gangs_st = st.lists(
    st.builds(
        _device_gang,
        st.integers(1, 50),
        st.integers(1, 6),
        st.integers(100, 4000),
        st.integers(0, 3),
        st.booleans(),
    ),
    max_size=6,
    unique_by=lambda g: g.gang_id,
)


@given(device_gangs_st, device_rooms_st)
@settings(max_examples=examples(300))
def test_no_device_unit_is_given_twice_and_gangs_asking_devices_are_placed_whole(
    gangs: list[PendingGang], rooms: list[WorkerRoom]
) -> None:
    """Every task asking gpu gets that many units its worker offers and no active assignment
    holds, no unit goes to two tasks, and each gang is placed whole or not at all."""
    plan = place_gangs(gangs, rooms, now=0.0)
    where = dict(plan.placements)
    by_id = {r.worker_id: r for r in rooms}
    given_out: list[tuple[str, str]] = []
    for gang in gangs:
        placed = [t for t in gang.task_ids if t in where]
        assert placed in ([], list(gang.task_ids))
        for t in placed:
            room = by_id[where[t]]
            held = dict(plan.units.get(t, ()))
            assert {name: len(ids) for name, ids in held.items()} == dict(gang.job.resources)
            for unit in held.get("gpu", ()):
                assert unit in room.resources["gpu"]
                assert ("gpu", unit) not in room.units_in_use
                given_out.append((room.worker_id, unit))
    assert len(given_out) == len(set(given_out))
    assert set(plan.units) <= set(where)


def _gpu_room(worker_id: str, offered: int, held: int = 0) -> WorkerRoom:
    return _device_room(int(worker_id[2:]), 16000, offered, frozenset(range(held)), None)


def test_a_gangs_tasks_on_one_worker_get_disjoint_units_lowest_first() -> None:
    """Two tasks asking 2 gpu on a worker with 4 free get 0,1 and 2,3; the next gang waits."""
    rooms = [_gpu_room("w-01", 4)]
    gangs = [_device_gang(1, 2, 1000, 2, False), _device_gang(2, 1, 1000, 1, False)]
    plan = place_gangs(gangs, rooms, now=0.0)
    assert [j for j, _ in plan.placements] == [100, 101]
    assert plan.units == {100: (("gpu", ("0", "1")),), 101: (("gpu", ("2", "3")),)}
    assert dict(plan.reasons) == {200: "gang: waiting for room for all 1 tasks at once"}


def test_a_gang_asking_gpu_goes_by_best_fit_of_its_units() -> None:
    """A spread gang of 2 tasks asking 1 gpu takes the two workers with the fewest free units
    (the score of actors/placement.py), keeping the empty 8-gpu worker whole."""
    rooms = [_gpu_room("w-01", 8), _gpu_room("w-02", 8, held=6), _gpu_room("w-03", 4, held=2)]
    plan = place_gangs([_device_gang(1, 2, 1000, 1, True)], rooms, now=0.0)
    assert sorted(plan.placements) == [(100, "w-02"), (101, "w-03")]
    assert plan.units == {100: (("gpu", ("6",)),), 101: (("gpu", ("2",)),)}


def test_a_gang_needing_more_units_than_the_workers_offer_is_unschedulable_naming_them() -> None:
    """Three tasks of 2 gpu on two workers of 2 gpu: unschedulable, the reason names gpu; on
    workers offering no gpu the reason is a single job's."""
    rooms = [_gpu_room("w-01", 2), _gpu_room("w-02", 2), _gpu_room("w-03", 0)]
    plan = place_gangs([_device_gang(1, 3, 1000, 2, False)], rooms, now=0.0)
    assert not plan.placements
    assert set(dict(plan.reasons).values()) == {
        "unschedulable: gang of 3 needs room for 1000 cpu_millis, 64 memory_mb, 2 gpu for each task;"
        " the 2 live workers with it hold 2 at once"
    }
    none = place_gangs([_device_gang(1, 2, 1000, 1, True)], [_gpu_room("w-01", 0)], now=0.0)
    assert set(dict(none.reasons).values()) == {"unschedulable: needs 1 gpu, no worker offers gpu"}


def test_the_units_of_a_placed_gang_are_in_use_in_the_rooms_it_leaves() -> None:
    """rooms_left marks a placed gang's units in use, so the single jobs after it cannot take them."""
    rooms = [_gpu_room("w-01", 4, held=1)]
    gang = _device_gang(1, 2, 1000, 1, False)
    plan = place_gangs([gang], rooms, now=0.0)
    (left,) = plan.rooms_left(rooms, {t: (1000, 64) for t in gang.task_ids})
    assert left.free_units("gpu") == ["3"]

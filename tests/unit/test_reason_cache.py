"""Unschedulable reasons worked out once per job shape and kept while the workers that take
placements stay the same (:class:`actors.rooms.ReasonCache`): a round decides the same with
the cache as without it, through any sequence of job and worker changes; a round whose reasons
are all stored writes none and works none out again; a change of the workers does."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.messages import WorkerRef
from actors.pending_queue import PendingJob, PendingQueue
from actors.placement import place_queue
from actors.placer_store import LiveWorker
from actors.rooms import ReasonCache, WorkerRoom, unschedulable_reason, workers_key
from actors.round_plan import plan_round
from runtime.constraints import Constraint
from runtime.settings.leader import PlacerSettings

NOW = 100.0
GPU = Constraint(key="gpu", op="=", values=("a100",))
ZONE = Constraint(key="zone", op="=", values=("b",))
CONSTRAINTS = [(), (GPU,), (ZONE,), (GPU, ZONE)]


@st.composite
def live_workers(draw: st.DrawFn) -> list[LiveWorker]:
    workers = []
    for index in range(draw(st.integers(0, 5))):
        cpu = draw(st.sampled_from([1000, 4000, 16000]))
        memory = draw(st.sampled_from([1024, 8192, 32768]))
        labels = {}
        if draw(st.booleans()):
            labels["gpu"] = draw(st.sampled_from(["a100", "t4"]))
        if draw(st.booleans()):
            labels["zone"] = draw(st.sampled_from(["a", "b"]))
        if draw(st.booleans()):
            labels["container"] = "docker"
        unhealthy = draw(st.booleans()) and draw(st.booleans())
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
                    runs_containers=labels.get("container") == "docker",
                    labels=labels,
                ),
                confirmed=draw(st.integers(0, 20)),
                cordoned=draw(st.booleans()) and draw(st.booleans()),
                unhealthy=unhealthy,
                probe_due=unhealthy and draw(st.booleans()),
                trial=draw(st.booleans()),
            )
        )
    return workers


@st.composite
def pending_jobs(draw: st.DrawFn, first_id: int) -> list[PendingJob]:
    count = draw(st.integers(0, 12))
    return [
        PendingJob(
            job_id=first_id + n,
            cpu_millis=draw(st.sampled_from([500, 2000, 8000, 20000])),
            memory_mb=draw(st.sampled_from([512, 4096, 40000])),
            priority=draw(st.integers(0, 2)),
            needs_container=draw(st.booleans()),
            constraints=draw(st.sampled_from(CONSTRAINTS)),
        )
        for n in range(count)
    ]


def rooms_of(workers: list[LiveWorker]) -> list[WorkerRoom]:
    """The rooms of the workers that take placements, as the round judges reasons on them."""
    return [w.room for w in workers if not w.cordoned and not (w.unhealthy and not w.probe_due)]


@settings(max_examples=examples(150), deadline=None)
@given(
    data=st.data(),
    first=live_workers(),
    s=st.sampled_from([PlacerSettings(), PlacerSettings(max_reservations=0)]),
)
def test_rounds_with_the_cache_decide_as_rounds_without_it_through_job_and_worker_changes(
    data: st.DataObject, first: list[LiveWorker], s: PlacerSettings
) -> None:
    """Through a random sequence of rounds, each after jobs arrive, leave or are placed and
    after the workers change or not, a round given the cache kept across them plans exactly
    what a round without it plans, and its reasons are the uncached unschedulable_reason of
    each job on the workers that take placements."""
    queue = PendingQueue()
    cache = ReasonCache()
    workers = first
    next_id = 1
    for _ in range(data.draw(st.integers(1, 6))):
        jobs = data.draw(pending_jobs(next_id))
        next_id += len(jobs) + 1
        if data.draw(st.booleans()):
            queue.replace([*queue.jobs(), *jobs], dict(queue.reasons), now=0.0)
        else:
            queue.add(jobs, now=0.0)
        if len(queue) and data.draw(st.booleans()):
            queue.remove(data.draw(st.lists(st.sampled_from(queue.ids.tolist()), max_size=3)))
        if data.draw(st.booleans()):
            workers = data.draw(live_workers())
        cached = plan_round(queue, workers, s, max_rows=40, now=NOW, reason_cache=cache)
        fresh = plan_round(queue, workers, s, max_rows=40, now=NOW)
        assert attrs.evolve(cached, fingerprint=()) == attrs.evolve(fresh, fingerprint=())
        rooms = rooms_of(workers)
        plan = place_queue(queue, rooms, reserve_after_s=s.reserve_after_s, now=NOW, reason_cache=cache)
        expected = {
            j.job_id: reason for j in queue.jobs() if (reason := unschedulable_reason(j, rooms)) is not None
        }
        assert dict(plan.unschedulable) == expected
        queue.remove(cached.placed_job_ids)
        queue.store_reasons(cached.reasons)


@settings(max_examples=examples(150), deadline=None)
@given(data=st.data())
def test_the_stored_reason_codes_follow_the_stored_reasons(data: st.DataObject) -> None:
    """Whatever replaces, adds, removes and stores reasons, each job's reason code names the
    reason stored for it (none: -1), and code_of finds it."""
    queue = PendingQueue()
    next_id = 1
    for _ in range(data.draw(st.integers(1, 6))):
        jobs = data.draw(pending_jobs(next_id))
        next_id += len(jobs) + 1
        texts = {j.job_id: data.draw(st.sampled_from(["", "a", "b"])) for j in jobs}
        op = data.draw(st.sampled_from(["replace", "add", "remove", "store"]))
        if op == "replace":
            queue.replace([*queue.jobs(), *jobs], {**queue.reasons, **texts})
        elif op == "add":
            queue.add(jobs, texts)
        elif op == "remove" and len(queue):
            queue.remove(data.draw(st.lists(st.sampled_from(queue.ids.tolist()), max_size=4)))
        elif len(queue):
            held = data.draw(st.lists(st.sampled_from(queue.ids.tolist()), max_size=4, unique=True))
            queue.store_reasons([(i, data.draw(st.sampled_from(["", "a", "c"]))) for i in held])
        for job_id, code in zip(queue.ids.tolist(), queue.reason_code.tolist(), strict=True):
            stored = queue.reasons.get(job_id, "")
            assert code == queue.code_of(stored)
            assert (queue.reason_texts[code] if code >= 0 else "") == stored


def worker(worker_id: str, cpu: int, memory: int, **changes: object) -> LiveWorker:
    number = int(worker_id.split("-")[1])
    live = LiveWorker(
        ref=WorkerRef(worker_id=worker_id, address="127.0.0.1:1", incarnation=number),
        room=WorkerRoom(
            worker_id=worker_id,
            cpu_millis=cpu,
            memory_mb=memory,
            cpu_allocated_millis=cpu,
            memory_allocated_mb=memory,
        ),
    )
    return attrs.evolve(live, **changes)  # type: ignore[arg-type]


def many_too_large() -> PendingQueue:
    """1,000 jobs of three shapes no 16000-millicore worker can hold, and one that fits."""
    queue = PendingQueue()
    queue.replace(
        [PendingJob(job_id=i, cpu_millis=20000 + 4000 * (i % 3), memory_mb=1024) for i in range(1, 1001)]
        + [PendingJob(job_id=5000, cpu_millis=1000, memory_mb=1024)]
    )
    return queue


def test_a_round_whose_reasons_are_stored_writes_none_and_works_none_out_again() -> None:
    """Once the unschedulable reasons are stored, a round with the same workers writes no
    reason and takes every reason from the cache; the first round worked out one per shape."""
    queue, cache = many_too_large(), ReasonCache()
    workers = [worker("w-1", 16000, 32768), worker("w-2", 8000, 16384)]
    first = plan_round(queue, workers, PlacerSettings(), max_rows=5000, now=NOW, reason_cache=cache)
    assert len(first.reasons) == 1000 and cache.computed == 3
    assert dict(first.reasons)[1] == "unschedulable: needs 24000 cpu_millis, largest worker has 16000"
    queue.store_reasons(first.reasons)
    again = plan_round(queue, workers, PlacerSettings(), max_rows=5000, now=NOW, reason_cache=cache)
    assert again.reasons == () and cache.computed == 3


def test_a_change_of_the_workers_works_the_reasons_out_again_and_rewrites_those_that_changed() -> None:
    """A larger worker, or a worker cordoned, changes the workers' key: the reasons are worked
    out again, and only the jobs whose reason changed are written."""
    queue, cache = many_too_large(), ReasonCache()
    workers = [worker("w-1", 16000, 32768), worker("w-2", 8000, 16384)]
    queue.store_reasons(
        plan_round(queue, workers, PlacerSettings(), max_rows=5000, now=NOW, reason_cache=cache).reasons
    )
    larger = [*workers, worker("w-3", 24000, 32768)]
    plan = plan_round(queue, larger, PlacerSettings(), max_rows=5000, now=NOW, reason_cache=cache)
    # Jobs of 20000 and 24000 now fit (their reason is cleared): only 28000 is worked out again.
    assert cache.computed == 4
    assert {r for _, r in plan.reasons} == {
        "",
        "unschedulable: needs 28000 cpu_millis, largest worker has 24000",
    }
    queue.store_reasons(plan.reasons)
    cordoned = [*workers, worker("w-3", 24000, 32768, cordoned=True)]
    plan = plan_round(queue, cordoned, PlacerSettings(), max_rows=5000, now=NOW, reason_cache=cache)
    assert dict(plan.reasons)[1] == (
        "unschedulable: needs 24000 cpu_millis, largest worker has 16000 (not counting cordoned w-3)"
    )
    assert len(plan.reasons) == 1000


def test_the_workers_key_reads_capacity_containers_and_labels_only() -> None:
    """Free room and ids do not change the key; capacity, the container label and labels do."""
    room = WorkerRoom(worker_id="w-1", cpu_millis=1000, memory_mb=1000, labels={"gpu": "a100"})
    same = attrs.evolve(room, worker_id="w-2", cpu_allocated_millis=500, placement_limit=0)
    assert workers_key([room]) == workers_key([same]) == workers_key([room, same])
    for changed in (
        attrs.evolve(room, cpu_millis=2000),
        attrs.evolve(room, memory_mb=2000),
        attrs.evolve(room, runs_containers=True),
        attrs.evolve(room, labels={"gpu": "t4"}),
    ):
        assert workers_key([changed]) != workers_key([room])

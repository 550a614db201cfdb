"""Container jobs in placement (:mod:`actors.placement`): only on workers labelled
``container=docker``, with every other rule (best fit, reservations, reasons) unchanged among
them; checked with hypothesis."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.pending_queue import PendingJob, PendingQueue
from actors.placement import place
from actors.rooms import WorkerRoom, unschedulable_reason

workers_st = st.lists(
    st.builds(
        lambda i, cpu, mem, used_cpu, used_mem, containers: WorkerRoom(
            worker_id=f"w-{i:02d}",
            cpu_millis=cpu,
            memory_mb=mem,
            cpu_allocated_millis=min(used_cpu, cpu),
            memory_allocated_mb=min(used_mem, mem),
            runs_containers=containers,
        ),
        st.integers(0, 99),
        st.integers(1000, 16000),
        st.integers(1024, 32768),
        st.integers(0, 16000),
        st.integers(0, 32768),
        st.booleans(),
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
        needs_container=st.booleans(),
    ),
    max_size=40,
    unique_by=lambda j: j.job_id,
)
policies = st.sampled_from(["best_fit", "first_fit", "worst_fit"])


@given(jobs_st, workers_st, policies, st.integers(0, 3))
@settings(max_examples=examples(300))
def test_container_jobs_go_only_to_workers_that_run_containers(
    jobs: list[PendingJob], workers: list[WorkerRoom], policy: str, reservations: int
) -> None:
    """Every container job placed is on a worker labelled container=docker, and only such a
    worker is reserved for one; no worker is over-committed."""
    plan = place(jobs, workers, policy=policy, max_reservations=reservations)
    runs = {w.worker_id: w.runs_containers for w in workers}
    by_id = {j.job_id: j for j in jobs}
    free = {
        w.worker_id: [w.cpu_millis - w.cpu_allocated_millis, w.memory_mb - w.memory_allocated_mb]
        for w in workers
    }
    for job_id, worker_id in plan.placements:
        if by_id[job_id].needs_container:
            assert runs[worker_id]
        free[worker_id][0] -= by_id[job_id].cpu_millis
        free[worker_id][1] -= by_id[job_id].memory_mb
    assert all(cpu >= 0 and mem >= 0 for cpu, mem in free.values())
    for worker_id, job_id in plan.reservations.items():
        if by_id[job_id].needs_container:
            assert runs[worker_id]


@given(jobs_st, workers_st, policies)
@settings(max_examples=examples(300))
def test_container_jobs_are_placed_as_if_only_container_workers_existed(
    jobs: list[PendingJob], workers: list[WorkerRoom], policy: str
) -> None:
    """A queue of container jobs is placed exactly as the same jobs, as plain jobs, on the
    container workers alone: the best-fit rules hold unchanged among them."""
    containers = [attrs.evolve(j, needs_container=True) for j in jobs]
    plain = [attrs.evolve(j, needs_container=False) for j in jobs]
    able = [w for w in workers if w.runs_containers]
    assert (
        place(containers, workers, policy=policy).placements == place(plain, able, policy=policy).placements
    )


@given(jobs_st, workers_st)
def test_plain_jobs_ignore_the_label(jobs: list[PendingJob], workers: list[WorkerRoom]) -> None:
    """Jobs that are not container jobs are placed as if no worker ran containers."""
    plain = [attrs.evolve(j, needs_container=False) for j in jobs]
    unlabelled = [attrs.evolve(w, runs_containers=False) for w in workers]
    assert place(plain, workers).placements == place(plain, unlabelled).placements


def test_a_container_job_with_no_container_worker_stays_pending_saying_so() -> None:
    """With no live worker labelled container=docker a container job is not placed and its
    reason says why; a plain job beside it is placed."""
    workers = [WorkerRoom(worker_id="w-1", cpu_millis=4000, memory_mb=8192)]
    jobs = [
        PendingJob(job_id=1, cpu_millis=500, memory_mb=256, needs_container=True),
        PendingJob(job_id=2, cpu_millis=500, memory_mb=256),
    ]
    plan = place(jobs, workers)
    assert plan.placements == ((2, "w-1"),)
    assert plan.unschedulable == {
        1: "unschedulable: container job, no live worker runs containers (label container=docker)"
    }


def test_a_container_job_larger_than_every_container_worker_names_the_largest() -> None:
    """The size reason of a container job compares it with the container workers only."""
    workers = [
        WorkerRoom(worker_id="big", cpu_millis=16000, memory_mb=65536),
        WorkerRoom(worker_id="small", cpu_millis=2000, memory_mb=4096, runs_containers=True),
    ]
    job = PendingJob(job_id=1, cpu_millis=8000, memory_mb=1024, needs_container=True)
    assert unschedulable_reason(job, workers) == (
        "unschedulable: needs 8000 cpu_millis, largest container worker has 2000"
    )
    plan = place([job], workers)
    assert plan.placements == () and 1 in plan.unschedulable


def test_a_container_job_goes_to_the_tightest_container_worker() -> None:
    """Best fit among the container workers: the tighter plain worker is passed over."""
    workers = [
        WorkerRoom(worker_id="a-tight", cpu_millis=1000, memory_mb=1024),
        WorkerRoom(worker_id="b-loose", cpu_millis=8000, memory_mb=16384, runs_containers=True),
        WorkerRoom(worker_id="c-mid", cpu_millis=2000, memory_mb=2048, runs_containers=True),
    ]
    job = PendingJob(job_id=1, cpu_millis=1000, memory_mb=1024, needs_container=True)
    assert place([job], workers).placements == ((1, "c-mid"),)


def test_the_queue_keeps_which_jobs_are_container_jobs() -> None:
    """The pending queue holds the container flag through replace, add and remove."""
    queue = PendingQueue()
    queue.replace([PendingJob(job_id=2, cpu_millis=1, memory_mb=1, needs_container=True)])
    queue.add([PendingJob(job_id=1, cpu_millis=1, memory_mb=1, priority=1)])
    assert [(j.job_id, j.needs_container) for j in queue.jobs()] == [(1, False), (2, True)]
    queue.remove([1])
    assert [(j.job_id, j.needs_container) for j in queue.jobs()] == [(2, True)]

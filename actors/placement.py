"""Placement as a pure function: pending jobs x free capacity -> placements.

Policies:
- ``best_fit``: the worker with room whose leftover after placing the job is smallest, with
  CPU and memory each normalised by the worker's capacity and summed (the "best fit"
  bin-packing heuristic, Johnson 1974, extended to two resources as in Grandl et al.,
  "Multi-resource packing for cluster schedulers", SIGCOMM 2014). Keeps large gaps open.
- ``first_fit``: the first worker by id with room.
- ``worst_fit``: the worker with the largest leftover (spreads load).
Ties go to the smallest worker id. Jobs are taken by priority (high first), then submission
order. A job larger than every live worker's whole capacity stays pending with a reason; a job
that merely finds no room now stays pending without one, and never blocks smaller jobs.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen(kw_only=True)
class PendingJob:
    """A job waiting for a worker. Sizes in millicores and MiB."""

    job_id: int
    cpu_millis: int
    memory_mb: int
    priority: int = 0


@attrs.frozen(kw_only=True)
class WorkerRoom:
    """One live worker: capacity and what is already allocated on it."""

    worker_id: str
    cpu_millis: int
    memory_mb: int
    cpu_allocated_millis: int = 0
    memory_allocated_mb: int = 0


@attrs.frozen(kw_only=True)
class Plan:
    """The outcome of one round's decision.

    ``placements`` is a tuple of (job_id, worker_id) in decision order; ``unschedulable`` maps
    job ids that no live worker could ever hold to the reason shown to operators.
    """

    placements: tuple[tuple[int, str], ...]
    unschedulable: dict[int, str]

    @property
    def placements_by_job(self) -> dict[int, str]:
        """job_id -> worker_id."""
        return dict(self.placements)


POLICIES = ("best_fit", "first_fit", "worst_fit")


def unschedulable_reason(job: PendingJob, workers: Sequence[WorkerRoom]) -> str | None:
    """Why ``job`` can never be placed on these workers, or None if some worker could hold it.

    Example: ``"unschedulable: needs 64000 cpu_millis, largest worker has 16000"``.
    """
    if not workers:
        return "unschedulable: no live workers"
    if any(job.cpu_millis <= w.cpu_millis and job.memory_mb <= w.memory_mb for w in workers):
        return None
    largest_cpu = max(w.cpu_millis for w in workers)
    largest_mem = max(w.memory_mb for w in workers)
    if job.cpu_millis > largest_cpu:
        return f"unschedulable: needs {job.cpu_millis} cpu_millis, largest worker has {largest_cpu}"
    if job.memory_mb > largest_mem:
        return f"unschedulable: needs {job.memory_mb} memory_mb, largest worker has {largest_mem}"
    return (
        f"unschedulable: needs {job.cpu_millis} cpu_millis and {job.memory_mb} memory_mb, no worker has both"
    )


def place(jobs: Sequence[PendingJob], workers: Sequence[WorkerRoom], *, policy: str = "best_fit") -> Plan:
    """Decide where each job goes.

    Args:
        jobs: pending jobs, in any order (sorted here by priority desc, then job_id).
        workers: live workers with their current allocation.
        policy: ``best_fit``, ``first_fit`` or ``worst_fit``.

    Returns:
        The placements (never over-committing a worker) and the unschedulable reasons.

    Raises:
        ValueError: unknown policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    ids = sorted(range(len(workers)), key=lambda i: workers[i].worker_id)
    names = [workers[i].worker_id for i in ids]
    cap_cpu = [workers[i].cpu_millis for i in ids]
    cap_mem = [workers[i].memory_mb for i in ids]
    free_cpu = [workers[i].cpu_millis - workers[i].cpu_allocated_millis for i in ids]
    free_mem = [workers[i].memory_mb - workers[i].memory_allocated_mb for i in ids]
    inv_cpu = [1.0 / c for c in cap_cpu]
    inv_mem = [1.0 / m for m in cap_mem]
    count = len(ids)
    max_free_cpu = max(free_cpu, default=0)
    max_free_mem = max(free_mem, default=0)

    placements: list[tuple[int, str]] = []
    unschedulable: dict[int, str] = {}
    for job in sorted(jobs, key=lambda j: (-j.priority, j.job_id)):
        cpu, mem = job.cpu_millis, job.memory_mb
        if cpu > max_free_cpu or mem > max_free_mem:
            reason = unschedulable_reason(job, workers)
            if reason is not None:
                unschedulable[job.job_id] = reason
            continue
        chosen = -1
        if policy == "first_fit":
            for k in range(count):
                if free_cpu[k] >= cpu and free_mem[k] >= mem:
                    chosen = k
                    break
        else:
            best_score = 0.0
            worst = policy == "worst_fit"
            for k in range(count):
                left_cpu = free_cpu[k] - cpu
                left_mem = free_mem[k] - mem
                if left_cpu < 0 or left_mem < 0:
                    continue
                score = left_cpu * inv_cpu[k] + left_mem * inv_mem[k]
                if chosen < 0 or (score > best_score if worst else score < best_score):
                    chosen, best_score = k, score
        if chosen < 0:
            reason = unschedulable_reason(job, workers)
            if reason is not None:
                unschedulable[job.job_id] = reason
            continue
        free_cpu[chosen] -= cpu
        free_mem[chosen] -= mem
        placements.append((job.job_id, names[chosen]))
        if free_cpu[chosen] + cpu == max_free_cpu or free_mem[chosen] + mem == max_free_mem:
            max_free_cpu = max(free_cpu, default=0)
            max_free_mem = max(free_mem, default=0)
    return Plan(placements=tuple(placements), unschedulable=unschedulable)

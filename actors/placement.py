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

from collections.abc import Iterable, Sequence

import attrs
import numpy as np


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
    job ids that no live worker could ever hold to the reason shown to operators; ``sizes`` maps
    each placed job id to its (cpu_millis, memory_mb).
    """

    placements: tuple[tuple[int, str], ...]
    unschedulable: dict[int, str]
    sizes: dict[int, tuple[int, int]] = attrs.field(factory=dict)

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


@attrs.define
class PendingQueue:
    """Pending jobs in placement order (priority high first, then job id), as numpy arrays,
    so a round can skip at once every job that cannot fit the largest free room.

    Owned by one placer; :func:`place` builds a throwaway one.
    """

    ids: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    cpu: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    mem: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    prio: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    reasons: dict[int, str] = attrs.field(factory=dict)
    """The reason currently stored for a pending job (absent: none)."""
    version: int = 0
    """Bumped at every change, so a caller can tell that nothing changed."""

    def __len__(self) -> int:
        return int(self.ids.size)

    def __contains__(self, job_id: int) -> bool:
        return bool(np.any(self.ids == job_id))

    def replace(self, jobs: Sequence[PendingJob], reasons: dict[int, str] | None = None) -> None:
        """Hold exactly ``jobs`` (any order)."""
        self._set(list(jobs))
        self.reasons = {k: v for k, v in (reasons or {}).items() if v}

    def add(self, jobs: Sequence[PendingJob], reasons: dict[int, str] | None = None) -> int:
        """Add the jobs not held yet; returns how many were new."""
        held = set(self.ids.tolist())
        new = [j for j in jobs if j.job_id not in held]
        if new:
            self._set([*self.jobs(), *new])
            for job in new:
                reason = (reasons or {}).get(job.job_id)
                if reason:
                    self.reasons[job.job_id] = reason
        return len(new)

    def remove(self, job_ids: Iterable[int]) -> None:
        """Drop these jobs (placed, or no longer pending)."""
        gone = np.fromiter(job_ids, dtype=np.int64)
        if gone.size and self.ids.size:
            keep = ~np.isin(self.ids, gone)
            if not keep.all():
                self.ids, self.cpu, self.mem, self.prio = (
                    a[keep] for a in (self.ids, self.cpu, self.mem, self.prio)
                )
                self.version += 1
            for job_id in gone.tolist():
                self.reasons.pop(job_id, None)

    def jobs(self) -> list[PendingJob]:
        """The jobs, in placement order."""
        return [
            PendingJob(job_id=i, cpu_millis=c, memory_mb=m, priority=p)
            for i, c, m, p in zip(
                self.ids.tolist(), self.cpu.tolist(), self.mem.tolist(), self.prio.tolist(), strict=True
            )
        ]

    def _set(self, jobs: list[PendingJob]) -> None:
        jobs.sort(key=lambda j: (-j.priority, j.job_id))
        self.ids = np.array([j.job_id for j in jobs], dtype=np.int64)
        self.cpu = np.array([j.cpu_millis for j in jobs], dtype=np.int64)
        self.mem = np.array([j.memory_mb for j in jobs], dtype=np.int64)
        self.prio = np.array([j.priority for j in jobs], dtype=np.int64)
        self.version += 1


def place(jobs: Sequence[PendingJob], workers: Sequence[WorkerRoom], *, policy: str = "best_fit") -> Plan:
    """Decide where each job goes.

    Args:
        jobs: pending jobs, in any order (taken by priority desc, then job_id).
        workers: live workers with their current allocation.
        policy: ``best_fit``, ``first_fit`` or ``worst_fit``.

    Returns:
        The placements (never over-committing a worker) and the unschedulable reasons.

    Raises:
        ValueError: unknown policy.
    """
    queue = PendingQueue()
    queue.replace(jobs)
    return place_queue(queue, workers, policy=policy)


def place_queue(
    queue: PendingQueue,
    workers: Sequence[WorkerRoom],
    *,
    policy: str = "best_fit",
    max_placements: int | None = None,
) -> Plan:
    """:func:`place` on a :class:`PendingQueue`, in its order, placing at most ``max_placements``.

    Cost: one vectorised pass over the queue to keep only jobs that fit the largest free room
    (in a full cluster, almost none), then one vectorised pass over the workers per candidate.

    Raises:
        ValueError: unknown policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    ordered = sorted(workers, key=lambda w: w.worker_id)
    names = [w.worker_id for w in ordered]
    cap_cpu = np.array([w.cpu_millis for w in ordered], dtype=np.int64)
    cap_mem = np.array([w.memory_mb for w in ordered], dtype=np.int64)
    free_cpu = cap_cpu - np.array([w.cpu_allocated_millis for w in ordered], dtype=np.int64)
    free_mem = cap_mem - np.array([w.memory_allocated_mb for w in ordered], dtype=np.int64)
    inv_cpu = 1.0 / cap_cpu if ordered else np.empty(0)
    inv_mem = 1.0 / cap_mem if ordered else np.empty(0)

    unschedulable = _unschedulable(queue, ordered, cap_cpu, cap_mem)
    placements: list[tuple[int, str]] = []
    sizes: dict[int, tuple[int, int]] = {}
    limit = len(queue) if max_placements is None else max_placements
    if ordered and limit > 0:
        frontier = _frontier(free_cpu, free_mem)
        position = 0
        while position < len(queue) and len(placements) < limit:
            # The jobs from here on that fit at least one worker's free room, in queue order,
            # tested against the Pareto frontier of the free (cpu, memory) pairs. Rooms only
            # shrink during a round, so the list stays a superset of what fits: it is filtered
            # again only after MISSES_BEFORE_REFILTER jobs in a row no longer fit anywhere.
            window = slice(position, None)
            fitting = np.zeros(len(queue) - position, dtype=bool)
            for room_cpu, room_mem in frontier:
                fitting |= (queue.cpu[window] <= room_cpu) & (queue.mem[window] <= room_mem)
            refilter = False
            misses = 0
            for offset in np.flatnonzero(fitting).tolist():
                index = position + offset
                cpu, mem = int(queue.cpu[index]), int(queue.mem[index])
                fits = (free_cpu >= cpu) & (free_mem >= mem)
                if not fits.any():
                    misses += 1
                    if misses >= MISSES_BEFORE_REFILTER:
                        position, refilter = index + 1, True
                        break
                    continue
                misses = 0
                if policy == "first_fit":
                    chosen = int(np.argmax(fits))
                else:
                    score = (free_cpu - cpu) * inv_cpu + (free_mem - mem) * inv_mem
                    if policy == "worst_fit":
                        chosen = int(np.argmax(np.where(fits, score, -np.inf)))
                    else:
                        chosen = int(np.argmin(np.where(fits, score, np.inf)))
                free_cpu[chosen] -= cpu
                free_mem[chosen] -= mem
                job_id = int(queue.ids[index])
                placements.append((job_id, names[chosen]))
                sizes[job_id] = (cpu, mem)
                if len(placements) >= limit:
                    break
            if not refilter:
                break
            frontier = _frontier(free_cpu, free_mem)
    return Plan(placements=tuple(placements), unschedulable=unschedulable, sizes=sizes)


MISSES_BEFORE_REFILTER = 32
"""Jobs in a row that no longer fit anywhere before the candidates are filtered again."""


def _frontier(free_cpu: np.ndarray, free_mem: np.ndarray) -> set[tuple[int, int]]:
    """The free (cpu, memory) pairs no other worker's pair dominates: a job fits some worker
    exactly when it fits one of these."""
    pairs = sorted(
        {(int(c), int(m)) for c, m in zip(free_cpu.tolist(), free_mem.tolist(), strict=True)}, reverse=True
    )
    frontier: set[tuple[int, int]] = set()
    best_mem = -1
    for cpu, mem in pairs:  # by cpu descending: keep a pair only if it has more memory than all before
        if mem > best_mem and cpu >= 0 and mem >= 0:
            frontier.add((cpu, mem))
            best_mem = mem
    return frontier


def _unschedulable(
    queue: PendingQueue, workers: Sequence[WorkerRoom], cap_cpu: np.ndarray, cap_mem: np.ndarray
) -> dict[int, str]:
    """Reasons for the queued jobs no live worker could ever hold (vectorised over the queue,
    looping only over the distinct worker shapes)."""
    if not len(queue):
        return {}
    fits_any = np.zeros(len(queue), dtype=bool)
    for cpu, mem in {(int(c), int(m)) for c, m in zip(cap_cpu.tolist(), cap_mem.tolist(), strict=True)}:
        fits_any |= (queue.cpu <= cpu) & (queue.mem <= mem)
    reasons: dict[int, str] = {}
    for index in np.flatnonzero(~fits_any).tolist():
        job = PendingJob(
            job_id=int(queue.ids[index]),
            cpu_millis=int(queue.cpu[index]),
            memory_mb=int(queue.mem[index]),
            priority=int(queue.prio[index]),
        )
        reason = unschedulable_reason(job, workers)
        if reason is not None:
            reasons[job.job_id] = reason
    return reasons

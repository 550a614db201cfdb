"""Placement as a pure function: pending jobs x free capacity -> placements.

Policies:
- ``best_fit``: the worker with room whose leftover after placing the job is smallest: a
  two-resource best fit, the leftover CPU and memory each normalised by the worker's capacity
  and summed (cf. the norm-based greedy heuristics for vector bin packing in Panigrahy et al.,
  "Heuristics for Vector Bin Packing", Microsoft Research, 2011). Keeps large gaps open.
- ``first_fit``: the first worker by id with room.
- ``worst_fit``: the worker with the largest leftover (spreads load).
Ties go to the smallest worker id. Jobs are taken by priority (high first), then submission
order. A job larger than every live worker's whole capacity stays pending with a reason; a job
that merely finds no room now stays pending without one.

Reservations (``max_reservations``, 0 = none): without them a large job can wait for ever,
since every room a finishing job frees is taken at once by smaller jobs behind it. So the
first ``max_reservations`` jobs in queue order that have waited ``reserve_after_s`` or more
and fit no free room now, but some worker's capacity, each reserve the unreserved worker that
lacks the least for them (missing CPU and
memory, each over the worker's capacity, summed); jobs after them in the queue are not placed
on a reserved worker, which drains until the job fits. Reservations are worked out again every
round from the queue, the free rooms and how long each job has been queued (by the placer
holding the queue: a new leader counts from its first read, so a job waits at most
``reserve_after_s`` longer after an election): nothing is handed over. This is the node
reservation of Hadoop YARN's schedulers (a node that cannot hold a container request yet is
reserved for it), without its limits per queue.

Pacing (DESIGN.md, "Under overload": work handed to one worker per round is bounded by what it
can start): a worker may carry a ``placement_limit``, the most jobs one round places on it; the
placer sets it from the worker's send window (:func:`send_window`, :func:`placement_limit`).
A job whose requeue backoff has not passed (``PendingQueue.not_before``) is neither placed nor
reserves a worker.

Retries: a job that failed on some workers (``PendingJob.failed_on``) goes only to the others
while one of them could hold it (by its capacity, labels and container rule: it waits for such
a worker to have room rather than go back where it failed), and anywhere it fits when it failed
on every worker that could (a soft preference: Nomad's reschedule prefers a node that no
previous allocation of the job used; Spark does not retry a task on the executor where it
failed, ``spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor``). Its reservation follows
the same rule.

Containers: a container job (``PendingJob.needs_container``) goes only to a worker whose agent
found a Docker engine when it started (``WorkerRoom.runs_containers``, its label
``container=docker``); every rule above holds among those workers alone (best fit, reservations,
the unschedulable reason, which says so when no live worker runs containers). Other jobs go
anywhere.

Constraints: a job with constraints (``PendingJob.constraints``, :mod:`runtime.constraints`)
goes only to a worker whose labels satisfy all of them, with every rule above holding among
those workers alone, as for containers. Jobs with the same constraints share one group
(``PendingQueue.groups``), so a round computes each group's eligible workers once and tests
fit once per group. The unschedulable reason names the constraint no live worker satisfies
(``unschedulable: no live worker has gpu=a100``).

Shapes: jobs of the same CPU, memory, container rule and constraints share a shape
(``PendingQueue.shapes``); fit is tested once per shape and the unschedulable reason worked out
once per shape, and kept across rounds while the workers stay the same (:class:`ReasonCache`;
the argument in docs/design.md, "Placement: many jobs that no worker can hold").

A round's decision can be taken in slices (:func:`place_queue_steps`) so that the placer
yields to the event loop between them; the outcome is the same as in one go.

Why one module of about 630 lines: the policies, the reservations, the pacing and the
container rule are one algorithm over the same numpy columns of the :class:`PendingQueue`, and
its reasoning and sources are kept next to the code that carries them out.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from runtime.constraints import Constraint, satisfied
from runtime.loops import finish
from runtime.settings.leader import PLACEMENT_POLICIES

Shape = tuple[int, int, bool, int]
"""What a job's unschedulable reason depends on: ``(cpu_millis, memory_mb, needs_container,
constraint group)`` (the group: an index into ``PendingQueue.groups``)."""


@attrs.frozen(kw_only=True)
class PendingJob:
    """A job waiting for a worker. Sizes in millicores and MiB."""

    job_id: int
    cpu_millis: int
    memory_mb: int
    priority: int = 0
    needs_container: bool = False
    """True for a container job: only a worker that runs containers may take it."""
    constraints: tuple[Constraint, ...] = ()
    """Rules on the worker's labels, all of which must hold (:mod:`runtime.constraints`)."""
    failed_on: tuple[str, ...] = ()
    """The workers where a run of it failed before: it goes elsewhere when it can."""


CONTAINER_LABEL = "container"
"""The worker label that says whether it runs container jobs (``docker``: yes)."""
CONTAINER_ENGINE = "docker"
"""The value of :data:`CONTAINER_LABEL` on a worker whose agent found a Docker engine."""


@attrs.frozen(kw_only=True)
class WorkerRoom:
    """One live worker: capacity and what is already allocated on it."""

    worker_id: str
    cpu_millis: int
    memory_mb: int
    cpu_allocated_millis: int = 0
    memory_allocated_mb: int = 0
    placement_limit: int | None = None
    """Most jobs one round may place on this worker (None: no limit)."""
    runs_containers: bool = False
    """True when it is labelled ``container=docker`` (it may take container jobs)."""
    labels: Mapping[str, str] = attrs.field(factory=dict)
    """Its labels, which a job's constraints are judged by."""


def send_window(confirmed: int, *, initial_window: int, max_unconfirmed: int) -> int:
    """How many unconfirmed assignments a worker incarnation may hold.

    ``min(max_unconfirmed, initial_window + confirmed)``: a new or re-registered worker gets a
    few jobs, and one more for every assignment a heartbeat has confirmed (listed as running or
    finished) since it registered, so the window doubles per heartbeat round trip while the
    worker keeps up. This is TCP's slow start (RFC 5681, section 3.1: the congestion window
    grows by one segment per acknowledged segment), with ``max_unconfirmed`` in the place of
    the receiver's window and no congestion-avoidance phase.

    Args:
        confirmed: assignments of this incarnation a heartbeat has confirmed so far.
        initial_window: the window before any confirmation.
        max_unconfirmed: the window's ceiling.

    Returns:
        The window, in assignments.
    """
    return min(max_unconfirmed, initial_window + max(0, confirmed))


def placement_limit(confirmed: int, unconfirmed: int, *, initial_window: int, max_unconfirmed: int) -> int:
    """Most jobs one round may place on a worker: its :func:`send_window` minus the assignments
    it holds unconfirmed, and never below 0 (a worker that stopped confirming gets nothing).

    Args:
        confirmed: assignments of the worker's incarnation a heartbeat has confirmed so far.
        unconfirmed: its active assignments no heartbeat has listed yet.
        initial_window: see :func:`send_window`.
        max_unconfirmed: see :func:`send_window`.
    """
    window = send_window(confirmed, initial_window=initial_window, max_unconfirmed=max_unconfirmed)
    return max(0, window - unconfirmed)


class Unschedulable(Mapping[int, str]):
    """job_id -> unschedulable reason of a :class:`Plan`, held as one reason per job shape and
    the jobs' positions in the queue, so that a round with many unschedulable jobs does no
    Python work per job unless something reads them one by one (the dict is built then).

    Attributes:
        at: the jobs' positions in the queue the plan was made from, ascending (int64).
        ids: their job ids (int64), in the same order.
        shapes: their shapes (indices into ``PendingQueue.shapes``, int64), same order.
        by_shape: shape index -> the reason of every job of that shape.
    """

    def __init__(
        self,
        at: np.ndarray | None = None,
        ids: np.ndarray | None = None,
        shapes: np.ndarray | None = None,
        by_shape: Mapping[int, str] | None = None,
    ) -> None:
        empty = np.empty(0, dtype=np.int64)
        self.at = empty if at is None else at
        self.ids = empty if ids is None else ids
        self.shapes = empty if shapes is None else shapes
        self.by_shape: Mapping[int, str] = by_shape or {}
        self._dict: dict[int, str] | None = None

    def _built(self) -> dict[int, str]:
        if self._dict is None:
            self._dict = {
                i: self.by_shape[k] for i, k in zip(self.ids.tolist(), self.shapes.tolist(), strict=True)
            }
        return self._dict

    def __getitem__(self, job_id: int) -> str:
        return self._built()[job_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._built())

    def __len__(self) -> int:
        return int(self.ids.size)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._built()

    def __repr__(self) -> str:
        return f"Unschedulable({self._built()!r})"


@attrs.define
class ReasonCache:
    """Unschedulable reasons by job shape, valid for one set of workers (:func:`workers_key`):
    reading it for another set empties it first. A memo, owned by one placer: a round's
    decision is the same with or without it (a property test holds it to that).

    A reason (:func:`unschedulable_reason`) reads the job's CPU, memory, container rule and
    constraints and, of the workers that take placements, their capacities, whether they run
    containers and their labels; nothing else (not their free room, not where the job failed).
    So those workers' :func:`workers_key` decides when the cached reasons stop holding.
    """

    key: tuple[tuple[int, int, bool, tuple[tuple[str, str], ...]], ...] | None = None
    reasons: dict[tuple[int, int, bool, tuple[Constraint, ...]], str | None] = attrs.field(factory=dict)
    computed: int = 0
    """Reasons worked out (not found in the cache) so far: for tests and the curious."""

    def reason(
        self,
        shape: Shape,
        constraints: tuple[Constraint, ...],
        workers: Sequence[WorkerRoom],
        key: tuple[Any, ...],
    ) -> str | None:
        """:func:`unschedulable_reason` of a job of ``shape`` (its ``constraints`` those of the
        shape's group) on ``workers``, whose :func:`workers_key` is ``key``."""
        if key != self.key:
            self.key, self.reasons = key, {}
        cpu, mem, container, _ = shape
        found = (cpu, mem, container, constraints)
        if found not in self.reasons:
            job = PendingJob(
                job_id=0, cpu_millis=cpu, memory_mb=mem, needs_container=container, constraints=constraints
            )
            self.reasons[found] = unschedulable_reason(job, workers)
            self.computed += 1
        return self.reasons[found]


def workers_key(
    workers: Sequence[WorkerRoom],
) -> tuple[tuple[int, int, bool, tuple[tuple[str, str], ...]], ...]:
    """What :func:`unschedulable_reason` reads of ``workers``: the distinct (cpu_millis,
    memory_mb, runs_containers, labels) among them, sorted. Equal keys give equal reasons."""
    return tuple(
        sorted(
            {(w.cpu_millis, w.memory_mb, w.runs_containers, tuple(sorted(w.labels.items()))) for w in workers}
        )
    )


@attrs.frozen(kw_only=True)
class Plan:
    """The outcome of one round's decision.

    ``placements`` is a tuple of (job_id, worker_id) in decision order; ``unschedulable`` maps
    job ids that no live worker could ever hold to the reason shown to operators; ``sizes`` maps
    each placed job id to its (cpu_millis, memory_mb); ``reservations`` the workers kept free.
    """

    placements: tuple[tuple[int, str], ...]
    unschedulable: Unschedulable
    sizes: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    reservations: dict[str, int] = attrs.field(factory=dict)
    """worker_id -> the job id it was kept free for in this round."""
    held_back: dict[int, tuple[str, ...]] = attrs.field(factory=dict)
    """job_id -> the workers where it failed, for the jobs not placed because only those had
    room for it (it waits for another: :func:`elsewhere`)."""

    @property
    def placements_by_job(self) -> dict[int, str]:
        """job_id -> worker_id."""
        return dict(self.placements)


POLICIES = PLACEMENT_POLICIES
"""The policies :func:`place_queue_steps` knows (:data:`runtime.settings.leader.PLACEMENT_POLICIES`)."""


def unschedulable_reason(job: PendingJob, workers: Sequence[WorkerRoom]) -> str | None:
    """Why ``job`` can never be placed on these workers, or None if some worker could hold it.

    Example: ``"unschedulable: needs 64000 cpu_millis, largest worker has 16000"``. A container
    job is judged against the workers that run containers only (``"unschedulable: container
    job, no live worker runs containers (label container=docker)"`` when there is none).
    """
    if not workers:
        return "unschedulable: no live workers"
    if job.constraints:
        for constraint in job.constraints:
            if not any(constraint.matches(w.labels) for w in workers):
                return f"unschedulable: no live worker has {constraint.describe()}"
        workers = [w for w in workers if satisfied(job.constraints, w.labels)]
        if not workers:
            together = ", ".join(c.describe() for c in job.constraints)
            return f"unschedulable: no live worker satisfies {together} together"
    if job.needs_container:
        workers = [w for w in workers if w.runs_containers]
        if not workers:
            return (
                "unschedulable: container job, no live worker runs containers "
                f"(label {CONTAINER_LABEL}={CONTAINER_ENGINE})"
            )
    if any(job.cpu_millis <= w.cpu_millis and job.memory_mb <= w.memory_mb for w in workers):
        return None
    largest_cpu = max(w.cpu_millis for w in workers)
    largest_mem = max(w.memory_mb for w in workers)
    which = "container worker" if job.needs_container else "worker"
    if job.constraints:
        which = f"eligible {which}"
    if job.cpu_millis > largest_cpu:
        return f"unschedulable: needs {job.cpu_millis} cpu_millis, largest {which} has {largest_cpu}"
    if job.memory_mb > largest_mem:
        return f"unschedulable: needs {job.memory_mb} memory_mb, largest {which} has {largest_mem}"
    return (
        f"unschedulable: needs {job.cpu_millis} cpu_millis and {job.memory_mb} memory_mb, no {which} has both"
    )


_QUEUE_COLUMNS = (
    "ids",
    "cpu",
    "mem",
    "prio",
    "container",
    "group",
    "since",
    "not_before",
    "shape",
    "reason_code",
)
"""The :class:`PendingQueue` columns, one entry per job each, kept in step (same order)."""


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
    container: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=bool))
    """Whether each job is a container job (``PendingJob.needs_container``)."""
    group: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    """Each job's constraint group: an index into :attr:`groups`."""
    groups: list[tuple[Constraint, ...]] = attrs.field(factory=lambda: [()])
    """The distinct constraints of the jobs ever held; group 0 is none. Only grows (a few
    entries: jobs of one kind share their constraints)."""
    _group_of: dict[tuple[Constraint, ...], int] = attrs.field(factory=lambda: {(): 0})
    since: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.float64))
    """When each job joined this queue, in the owner's clock (seconds); kept across
    :meth:`replace` for jobs held before."""
    not_before: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.float64))
    """Before when (the owner's clock, seconds) each job must not be placed: its requeue
    backoff; ``-inf`` for none."""
    shape: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    """Each job's shape: an index into :attr:`shapes`."""
    shapes: list[Shape] = attrs.field(factory=list)
    """The distinct shapes of the jobs held since the last :meth:`replace` (which rebuilds it):
    what an unschedulable reason depends on (:data:`Shape`)."""
    _shape_of: dict[Shape, int] = attrs.field(factory=dict)
    _shape_table: np.ndarray = attrs.field(factory=lambda: np.empty((0, 4), dtype=np.int64))
    reasons: dict[int, str] = attrs.field(factory=dict)
    """The reason currently stored for a pending job (absent: none). Changed only through
    :meth:`replace`, :meth:`add`, :meth:`remove` and :meth:`store_reasons`, which keep
    :attr:`reason_code` in step."""
    reason_code: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    """Each job's stored reason as an index into :attr:`reason_texts` (-1: none), so a round
    compares the reasons of many jobs at once (:meth:`code_of`)."""
    reason_texts: list[str] = attrs.field(factory=list)
    """The distinct stored reasons since the last :meth:`replace` (which rebuilds it)."""
    _code_of: dict[str, int] = attrs.field(factory=dict)
    failed_on: dict[int, tuple[str, ...]] = attrs.field(factory=dict)
    """The workers where a run of a held job failed before (absent: none;
    :attr:`PendingJob.failed_on`)."""
    version: int = 0
    """Bumped at every change, so a caller can tell that nothing changed."""

    def __len__(self) -> int:
        return int(self.ids.size)

    def __contains__(self, job_id: int) -> bool:
        return bool(np.any(self.ids == job_id))

    def replace(
        self,
        jobs: Sequence[PendingJob],
        reasons: dict[int, str] | None = None,
        *,
        now: float = 0.0,
        not_before: Mapping[int, float] | None = None,
    ) -> None:
        """Hold exactly ``jobs`` (any order); those not held before joined at ``now``. A job
        in ``not_before`` may not be placed before that time; any other may be at once."""
        ids, cpu, mem, prio, container = _columns(jobs)
        group = self._groups_of(jobs)
        since = np.full(ids.size, now, dtype=np.float64)
        if self.ids.size and ids.size:
            by_id = np.argsort(self.ids)
            at = np.minimum(np.searchsorted(self.ids, ids, sorter=by_id), self.ids.size - 1)
            held = self.ids[by_id[at]] == ids
            since[held] = self.since[by_id[at[held]]]
        self.shapes, self._shape_of, self._shape_table = [], {}, np.empty((0, 4), dtype=np.int64)
        self.reason_texts, self._code_of = [], {}
        self.reasons = {k: v for k, v in (reasons or {}).items() if v}
        self._store(
            ids,
            cpu,
            mem,
            prio,
            container,
            group,
            since,
            _times(ids, not_before),
            self._shapes_of(cpu, mem, container, group),
            self._codes_of(ids, self.reasons),
        )
        self.failed_on = {j.job_id: j.failed_on for j in jobs if j.failed_on}

    def add(
        self,
        jobs: Sequence[PendingJob],
        reasons: dict[int, str] | None = None,
        *,
        now: float = 0.0,
        not_before: Mapping[int, float] | None = None,
    ) -> int:
        """Add the jobs not held yet (joining at ``now``, not placed before their time in
        ``not_before``); returns how many were new. Vectorised: a round that reads a few new
        jobs into a large queue costs no Python work per queued job."""
        ids, cpu, mem, prio, container = _columns(jobs)
        group = self._groups_of(jobs)
        _, first = np.unique(ids, return_index=True)
        new = np.zeros(ids.size, dtype=bool)
        new[first] = True
        new &= ~np.isin(ids, self.ids)
        if not new.any():
            return 0
        ids, cpu, mem, prio, container = ids[new], cpu[new], mem[new], prio[new], container[new]
        group = group[new]
        failed_on = {j.job_id: j.failed_on for j in jobs if j.failed_on}
        for job_id in ids.tolist():
            reason = (reasons or {}).get(job_id)
            if reason:
                self.reasons[job_id] = reason
            if job_id in failed_on:
                self.failed_on[job_id] = failed_on[job_id]
        self._store(
            np.concatenate((self.ids, ids)),
            np.concatenate((self.cpu, cpu)),
            np.concatenate((self.mem, mem)),
            np.concatenate((self.prio, prio)),
            np.concatenate((self.container, container)),
            np.concatenate((self.group, group)),
            np.concatenate((self.since, np.full(ids.size, now, dtype=np.float64))),
            np.concatenate((self.not_before, _times(ids, not_before))),
            np.concatenate((self.shape, self._shapes_of(cpu, mem, container, group))),
            np.concatenate((self.reason_code, self._codes_of(ids, self.reasons))),
        )
        return int(ids.size)

    def remove(self, job_ids: Iterable[int]) -> None:
        """Drop these jobs (placed, or no longer pending)."""
        gone = np.fromiter(job_ids, dtype=np.int64)
        if gone.size and self.ids.size:
            keep = ~np.isin(self.ids, gone)
            if not keep.all():
                for name in _QUEUE_COLUMNS:
                    setattr(self, name, getattr(self, name)[keep])
                self.version += 1
            for job_id in gone.tolist():
                self.reasons.pop(job_id, None)
                self.failed_on.pop(job_id, None)

    def jobs(self) -> list[PendingJob]:
        """The jobs, in placement order."""
        return [
            PendingJob(
                job_id=i,
                cpu_millis=c,
                memory_mb=m,
                priority=p,
                needs_container=k,
                constraints=self.groups[g],
                failed_on=self.failed_on.get(i, ()),
            )
            for i, c, m, p, k, g in zip(
                self.ids.tolist(),
                self.cpu.tolist(),
                self.mem.tolist(),
                self.prio.tolist(),
                self.container.tolist(),
                self.group.tolist(),
                strict=True,
            )
        ]

    def _groups_of(self, jobs: Sequence[PendingJob]) -> np.ndarray:
        """Each job's constraint group (new constraints get a new group), as an int64 array."""
        if not any(j.constraints for j in jobs):
            return np.zeros(len(jobs), dtype=np.int64)
        found = []
        for job in jobs:
            index = self._group_of.get(job.constraints)
            if index is None:
                index = self._group_of[job.constraints] = len(self.groups)
                self.groups.append(job.constraints)
            found.append(index)
        return np.array(found, dtype=np.int64)

    def waiting_for_backoff(self, now: float) -> set[int]:
        """The jobs whose requeue backoff has not passed at ``now``."""
        return set(self.ids[self.not_before > now].tolist())

    def _store(
        self,
        ids: np.ndarray,
        cpu: np.ndarray,
        mem: np.ndarray,
        prio: np.ndarray,
        container: np.ndarray,
        group: np.ndarray,
        since: np.ndarray,
        not_before: np.ndarray,
        shape: np.ndarray,
        reason_code: np.ndarray,
    ) -> None:
        """Hold these columns, put in placement order (priority high first, then job id)."""
        order = np.lexsort((ids, -prio))
        columns = (ids, cpu, mem, prio, container, group, since, not_before, shape, reason_code)
        for name, column in zip(_QUEUE_COLUMNS, columns, strict=True):
            setattr(self, name, column[order])
        self.version += 1

    def shape_table(self) -> np.ndarray:
        """:attr:`shapes` as an int64 array of shape (len(shapes), 4), one row per shape."""
        if self._shape_table.shape[0] != len(self.shapes):
            self._shape_table = np.array(self.shapes, dtype=np.int64).reshape(-1, 4)
        return self._shape_table

    def store_reasons(self, reasons: Iterable[tuple[int, str]]) -> None:
        """Record that these (job_id, reason) pairs are now stored (an empty reason: none is);
        jobs not held are ignored. Leaves :attr:`version` as it is: the jobs did not change."""
        changed: dict[int, str] = {}
        for job_id, reason in reasons:
            changed[job_id] = reason
            if reason:
                self.reasons[job_id] = reason
            else:
                self.reasons.pop(job_id, None)
        if not changed or not self.ids.size:
            return
        at = np.flatnonzero(np.isin(self.ids, np.fromiter(changed, dtype=np.int64)))
        self.reason_code[at] = [self._code(changed[i]) for i in self.ids[at].tolist()]

    def code_of(self, reason: str) -> int:
        """The :attr:`reason_code` of ``reason``: -1 for none (empty), -2 for one no held job
        has stored (so it matches no job). Changes nothing."""
        return self._code_of.get(reason, -2) if reason else -1

    def _code(self, reason: str) -> int:
        """The :attr:`reason_code` of ``reason``, added to :attr:`reason_texts` if new."""
        if not reason:
            return -1
        code = self._code_of.get(reason)
        if code is None:
            code = self._code_of[reason] = len(self.reason_texts)
            self.reason_texts.append(reason)
        return code

    def _codes_of(self, ids: np.ndarray, reasons: Mapping[int, str]) -> np.ndarray:
        """The :attr:`reason_code` of each of ``ids`` by ``reasons`` (absent: none)."""
        if not reasons:
            return np.full(ids.size, -1, dtype=np.int64)
        return np.array([self._code(reasons.get(i, "")) for i in ids.tolist()], dtype=np.int64)

    def _shapes_of(
        self, cpu: np.ndarray, mem: np.ndarray, container: np.ndarray, group: np.ndarray
    ) -> np.ndarray:
        """Each job's index into :attr:`shapes` (new shapes are added), as an int64 array: one
        Python step per distinct shape, not per job."""
        if not cpu.size:
            return np.empty(0, dtype=np.int64)
        table = np.stack((cpu, mem, container.astype(np.int64), group), axis=1)
        distinct, inverse = np.unique(table, axis=0, return_inverse=True)
        index = np.empty(len(distinct), dtype=np.int64)
        for k, (c, m, box, g) in enumerate(distinct.tolist()):
            key = (c, m, bool(box), g)
            found = self._shape_of.get(key)
            if found is None:
                found = self._shape_of[key] = len(self.shapes)
                self.shapes.append(key)
            index[k] = found
        return index[inverse.reshape(-1)]


def _columns(
    jobs: Sequence[PendingJob],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, cpu_millis, memory_mb, priority) of ``jobs`` as int64 arrays and whether each is
    a container job (bool), in the given order."""
    table = np.array(
        [(j.job_id, j.cpu_millis, j.memory_mb, j.priority, j.needs_container) for j in jobs], dtype=np.int64
    ).reshape(-1, 5)
    return (
        table[:, 0].copy(),
        table[:, 1].copy(),
        table[:, 2].copy(),
        table[:, 3].copy(),
        table[:, 4].astype(bool),
    )


def _times(ids: np.ndarray, times: Mapping[int, float] | None) -> np.ndarray:
    """``times[id]`` for each id, ``-inf`` where absent."""
    if not times:
        return np.full(ids.size, -math.inf, dtype=np.float64)
    return np.array([times.get(i, -math.inf) for i in ids.tolist()], dtype=np.float64)


def place(
    jobs: Sequence[PendingJob],
    workers: Sequence[WorkerRoom],
    *,
    policy: str = PLACEMENT_POLICIES[0],
    max_reservations: int = 0,
) -> Plan:
    """Decide where each job goes (a job may reserve a worker at once: no waiting time).

    Args:
        jobs: pending jobs, in any order (taken by priority desc, then job_id).
        workers: live workers with their current allocation.
        policy: ``best_fit``, ``first_fit`` or ``worst_fit``.
        max_reservations: most workers kept free for jobs that fit no free room yet.

    Returns:
        The placements (never over-committing a worker) and the unschedulable reasons.

    Raises:
        ValueError: unknown policy, or a negative ``max_reservations``.
    """
    queue = PendingQueue()
    queue.replace(jobs)
    return place_queue(queue, workers, policy=policy, max_reservations=max_reservations)


def place_queue(
    queue: PendingQueue,
    workers: Sequence[WorkerRoom],
    *,
    policy: str = PLACEMENT_POLICIES[0],
    max_placements: int | None = None,
    max_reservations: int = 0,
    reserve_after_s: float = 0.0,
    now: float = 0.0,
    reason_cache: ReasonCache | None = None,
) -> Plan:
    """:func:`place` on a :class:`PendingQueue`, in its order, placing at most
    ``max_placements`` and reserving at most ``max_reservations`` workers, each for a job that
    has been in the queue for ``reserve_after_s`` or more at ``now`` (the queue's clock; see
    the module docstring). A worker receives at most its ``placement_limit``; a job whose
    ``not_before`` is after ``now`` is left alone.

    Cost: one vectorised pass over the queue to keep only jobs that fit some free room (tested
    against the Pareto frontier of the free rooms, a binary search per job; in a full cluster
    almost none fit), then one vectorised pass over the workers per candidate.

    Raises:
        ValueError: unknown policy, or a negative ``max_reservations``.
    """
    steps = place_queue_steps(
        queue,
        workers,
        policy=policy,
        max_placements=max_placements,
        max_reservations=max_reservations,
        reserve_after_s=reserve_after_s,
        now=now,
        reason_cache=reason_cache,
    )
    return finish(steps)


STEP_VISITS = 256
"""Jobs :func:`place_queue_steps` considers between two yields: 4 to 6 ms of decision with 100
workers on the (loaded) 2-core development VM."""


def place_queue_steps(
    queue: PendingQueue,
    workers: Sequence[WorkerRoom],
    *,
    policy: str = PLACEMENT_POLICIES[0],
    max_placements: int | None = None,
    max_reservations: int = 0,
    reserve_after_s: float = 0.0,
    now: float = 0.0,
    step_visits: int = STEP_VISITS,
    reason_cache: ReasonCache | None = None,
) -> Generator[None, None, Plan]:
    """:func:`place_queue` in slices: a generator that yields after every ``step_visits`` jobs
    it considered (placed, skipped or given a reason) and returns the :class:`Plan`, the same
    as :func:`place_queue`'s. The caller may let other tasks run at each yield; nothing it
    reads changes meanwhile (the queue and the rooms are the caller's snapshot).

    Raises:
        ValueError: unknown policy, a negative ``max_reservations``, or ``step_visits`` < 1.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if max_reservations < 0:
        raise ValueError(f"max_reservations must be at least 0, got {max_reservations}")
    if step_visits < 1:
        raise ValueError(f"step_visits must be at least 1, got {step_visits}")
    ordered = sorted(workers, key=lambda w: w.worker_id)
    names = [w.worker_id for w in ordered]
    position_of = {name: k for k, name in enumerate(names)}
    cap_cpu = np.array([w.cpu_millis for w in ordered], dtype=np.int64)
    cap_mem = np.array([w.memory_mb for w in ordered], dtype=np.int64)
    free_cpu = cap_cpu - np.array([w.cpu_allocated_millis for w in ordered], dtype=np.int64)
    free_mem = cap_mem - np.array([w.memory_allocated_mb for w in ordered], dtype=np.int64)
    runs_containers = np.array([w.runs_containers for w in ordered], dtype=bool)
    inv_cpu = 1.0 / cap_cpu if ordered else np.empty(0)
    inv_mem = 1.0 / cap_mem if ordered else np.empty(0)
    # Placements each worker may still take this round; a limit as large as the queue is none.
    left = np.array(
        [len(queue) if w.placement_limit is None else max(0, w.placement_limit) for w in ordered],
        dtype=np.int64,
    )
    eligible = queue.not_before <= now  # requeue backoff passed (or none)
    everyone = np.ones(len(ordered), dtype=bool)
    # Each constraint group's eligible workers (group 0, no constraints: all of them), worked
    # out for the groups of the jobs queued now only (the queue's groups only grow).
    group_rooms = [everyone] * len(queue.groups)
    for index in np.flatnonzero(np.bincount(queue.group, minlength=len(queue.groups))).tolist():
        if index:
            group = queue.groups[index]
            group_rooms[index] = np.array([satisfied(group, w.labels) for w in ordered], dtype=bool)
    # Fit is tested once per job shape (a few dozen), then read per job through its shape.
    table = queue.shape_table()
    shape_cpu, shape_mem, shape_group = table[:, 0], table[:, 1], table[:, 3]
    shape_container = table[:, 2].astype(bool)

    def fit_by_shape(
        room_cpu: np.ndarray, room_mem: np.ndarray, among: np.ndarray | None = None
    ) -> np.ndarray:
        return _fits(
            shape_container,
            shape_group,
            shape_cpu,
            shape_mem,
            room_cpu,
            room_mem,
            runs_containers,
            group_rooms,
            among=among,
        )

    holdable = fit_by_shape(cap_cpu, cap_mem)[queue.shape]
    # The reasons, one per shape of the jobs no worker could hold (from the cache while the
    # workers that take placements are the same): no Python work per job.
    cache = ReasonCache() if reason_cache is None else reason_cache
    key = workers_key(ordered)
    stuck = np.flatnonzero(~holdable)
    stuck_shapes = queue.shape[stuck]
    by_shape: dict[int, str] = {}
    present = np.flatnonzero(np.bincount(stuck_shapes, minlength=len(queue.shapes))).tolist()
    for count, k in enumerate(present, start=1):
        shape = queue.shapes[k]
        reason = cache.reason(shape, queue.groups[shape[3]], ordered, key)
        if reason is not None:
            by_shape[k] = reason
        if count % step_visits == 0:
            yield
    if len(by_shape) < len(present):
        keep = np.isin(stuck_shapes, np.fromiter(by_shape, dtype=np.int64))
        stuck, stuck_shapes = stuck[keep], stuck_shapes[keep]
    unschedulable = Unschedulable(stuck, queue.ids[stuck], stuck_shapes, by_shape)
    placements: list[tuple[int, str]] = []
    sizes: dict[int, tuple[int, int]] = {}
    reservations: dict[str, int] = {}
    held_back: dict[int, tuple[str, ...]] = {}
    unreserved = np.ones(len(ordered), dtype=bool)
    limit = len(queue) if max_placements is None else max_placements
    position = 0
    visited = 0
    while ordered and position < len(queue) and len(placements) < limit:
        # The jobs from here on that fit at least one open worker's free room (unreserved, with
        # placements left), in queue order, and the first ones that fit no unreserved worker's
        # free room but some worker's capacity (reservation candidates: a job held back only by
        # a worker's placement limit reserves nothing). Rooms only shrink during a round, so the
        # fitting ones stay a superset of what fits: they are filtered again only after
        # MISSES_BEFORE_REFILTER jobs in a row no longer fit anywhere.
        window = slice(position, None)
        is_open = unreserved & (left > 0)
        shapes = queue.shape[window]
        fitting = eligible[window] & fit_by_shape(free_cpu, free_mem, is_open)[shapes]
        visit = fitting
        wanted = max_reservations - len(reservations)
        if wanted > 0:
            room_fit = (
                fitting
                if bool(np.array_equal(is_open, unreserved))
                else fit_by_shape(free_cpu, free_mem, unreserved)[shapes]
            )
            waited = (now - queue.since[window]) >= reserve_after_s
            blocked = np.flatnonzero(~room_fit & holdable[window] & waited & eligible[window])[:wanted]
            if blocked.size:
                visit = fitting.copy()
                visit[blocked] = True
        refilter = False
        misses = 0
        for offset in np.flatnonzero(visit).tolist():
            visited += 1
            if visited % step_visits == 0:
                yield
            index = position + offset
            job_id = int(queue.ids[index])
            cpu, mem = int(queue.cpu[index]), int(queue.mem[index])
            allowed = group_rooms[int(queue.group[index])]
            if queue.container[index]:
                allowed = allowed & runs_containers
            anywhere = allowed
            failed_on = queue.failed_on.get(job_id)
            if failed_on:
                allowed = elsewhere(allowed, failed_on, position_of, cpu, mem, cap_cpu, cap_mem)
            if not fitting[offset]:
                if len(reservations) < max_reservations:
                    reserved = _reserve(cpu, mem, free_cpu, free_mem, cap_cpu, cap_mem, unreserved & allowed)
                    if reserved is not None:
                        unreserved[reserved] = False
                        reservations[names[reserved]] = int(queue.ids[index])
                continue
            room = (free_cpu >= cpu) & (free_mem >= mem) & unreserved & (left > 0)
            fits = room & allowed
            if not fits.any():
                if failed_on and (room & anywhere).any():
                    held_back[job_id] = failed_on  # only where it failed has room now
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
            left[chosen] -= 1
            placements.append((job_id, names[chosen]))
            sizes[job_id] = (cpu, mem)
            if len(placements) >= limit:
                break
        if not refilter:
            break
    return Plan(
        placements=tuple(placements),
        unschedulable=unschedulable,
        sizes=sizes,
        reservations=reservations,
        held_back=held_back,
    )


MISSES_BEFORE_REFILTER = 32
"""Jobs in a row that no longer fit anywhere before the candidates are filtered again."""


def elsewhere(
    allowed: np.ndarray,
    failed_on: Sequence[str],
    position_of: Mapping[str, int],
    cpu: int,
    mem: int,
    cap_cpu: np.ndarray,
    cap_mem: np.ndarray,
) -> np.ndarray:
    """The workers of ``allowed`` a job of (``cpu``, ``mem``) that failed on the workers named
    ``failed_on`` may go to: those where it did not fail, when one of them could hold it (by its
    capacity: the job waits for such a one to have room rather than go back where it failed);
    else ``allowed`` itself (it failed wherever it could run: a soft preference, as Nomad's
    reschedule prefers a node no previous allocation used). ``position_of`` maps worker ids to
    their index in the arrays."""
    failed = np.zeros(allowed.size, dtype=bool)
    for worker_id in failed_on:
        k = position_of.get(worker_id)
        if k is not None:
            failed[k] = True
    if not failed.any():
        return allowed
    others = allowed & ~failed
    if (others & (cap_cpu >= cpu) & (cap_mem >= mem)).any():
        return others
    return allowed


def _reserve(
    cpu: int,
    mem: int,
    free_cpu: np.ndarray,
    free_mem: np.ndarray,
    cap_cpu: np.ndarray,
    cap_mem: np.ndarray,
    unreserved: np.ndarray,
) -> int | None:
    """The unreserved worker that could hold a (cpu, mem) job once it drains and lacks the
    least for it now (missing CPU and memory, each over the worker's capacity, summed; ties to
    the first), or None."""
    able = unreserved & (cap_cpu >= cpu) & (cap_mem >= mem)
    if not able.any():
        return None
    lacking = np.maximum(cpu - free_cpu, 0) / cap_cpu + np.maximum(mem - free_mem, 0) / cap_mem
    return int(np.argmin(np.where(able, lacking, np.inf)))


def _fits(
    container: np.ndarray,
    group: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    room_cpu: np.ndarray,
    room_mem: np.ndarray,
    runs_containers: np.ndarray,
    group_rooms: Sequence[np.ndarray],
    *,
    among: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`fits_some_room` per job, over the rooms of ``among`` (None: all) that the job may
    use: those of its constraint group (``group_rooms[group[i]]``) and, for a container job
    (``container[i]``), those of ``runs_containers``. One frontier test per kind of job
    present (no constraints and no container: one test), so the cost stays one binary search
    per job."""
    rooms = np.ones(room_cpu.size, dtype=bool) if among is None else among
    if not container.any() and not group.any():
        return fits_some_room(cpu, mem, room_cpu[rooms], room_mem[rooms])
    fits = np.zeros(cpu.size, dtype=bool)
    kinds = np.unique(np.stack((container.astype(np.int64), group)), axis=1)
    for is_container, index in kinds.T.tolist():
        jobs = (container == bool(is_container)) & (group == index)
        allowed = rooms & group_rooms[index]
        if is_container:
            allowed = allowed & runs_containers
        fits[jobs] = fits_some_room(cpu[jobs], mem[jobs], room_cpu[allowed], room_mem[allowed])
    return fits


def fits_some_room(
    cpu: np.ndarray, mem: np.ndarray, room_cpu: np.ndarray, room_mem: np.ndarray
) -> np.ndarray:
    """For each (cpu[i], mem[i]), whether some room (room_cpu[k], room_mem[k]) holds it.

    Tested against the Pareto frontier of the rooms (no other room has as much of both):
    sorted by CPU ascending its memory descends, so among the rooms with CPU >= cpu[i] the
    first has the most memory: one binary search per job.
    """
    if not room_cpu.size or not cpu.size:
        return np.zeros(cpu.size, dtype=bool)
    order = np.lexsort((-room_mem, -room_cpu))  # CPU descending, then memory descending
    by_cpu, by_mem = room_cpu[order], room_mem[order]
    more_memory_than_before = by_mem > np.maximum.accumulate(np.concatenate(([-1], by_mem[:-1])))
    keep = more_memory_than_before & (by_cpu >= 0) & (by_mem >= 0)
    frontier_cpu, frontier_mem = by_cpu[keep][::-1], by_mem[keep][::-1]  # CPU ascending
    if not frontier_cpu.size:
        return np.zeros(cpu.size, dtype=bool)
    first = np.searchsorted(frontier_cpu, cpu, side="left")
    inside = first < frontier_cpu.size
    fits = np.zeros(cpu.size, dtype=bool)
    fits[inside] = frontier_mem[first[inside]] >= mem[inside]
    return fits

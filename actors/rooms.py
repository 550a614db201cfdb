"""Workers' rooms for placement: :class:`WorkerRoom`, the send window that paces a worker
(:func:`send_window`, :func:`placement_limit`), the fit tests over free rooms
(:func:`fits_some_room`, :func:`fits_by_kind`) and the unschedulable reason of a job no live
worker could hold (:func:`unschedulable_reason`, memoised per shape by :class:`ReasonCache`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from actors.pending_queue import DeviceAsk, PendingJob, Shape
from runtime.constraints import Constraint, satisfied

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
    resources: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    """The countable devices it offers: name -> unit ids (docs/devices.md)."""
    units_in_use: frozenset[tuple[str, str]] = frozenset()
    """(name, unit id) of the units its active assignments hold."""

    def free_units(self, name: str) -> list[str]:
        """The units of ``name`` it offers that no active assignment holds, lowest first
        (:func:`unit_order`)."""
        in_use = self.units_in_use
        return [u for u in lowest_first(tuple(self.resources.get(name, ()))) if (name, u) not in in_use]


@functools.lru_cache(maxsize=4096)
def lowest_first(units: tuple[str, ...]) -> tuple[str, ...]:
    """``units`` in :func:`unit_order` (cached: a worker offers the same units round after
    round)."""
    return tuple(sorted(units, key=unit_order))


def unit_order(unit: str) -> tuple[int, int, str]:
    """How unit ids are ordered when the placer picks the lowest free ones: numeric ids by
    value (``2`` before ``10``), then the others as text."""
    return (0, int(unit), "") if unit.isdigit() else (1, 0, unit)


def send_window(confirmed: int, *, initial_window: int, max_unconfirmed: int) -> int:
    """How many unconfirmed assignments a worker incarnation may hold, given the ``confirmed``
    ones so far: ``min(max_unconfirmed, initial_window + confirmed)``, so the window doubles per
    heartbeat round trip while the worker keeps up. This is TCP's slow start (RFC 5681, section
    3.1) with ``max_unconfirmed`` as the receiver's window and no congestion avoidance."""
    return min(max_unconfirmed, initial_window + max(0, confirmed))


def placement_limit(confirmed: int, unconfirmed: int, *, initial_window: int, max_unconfirmed: int) -> int:
    """Most jobs one round may place on a worker: its :func:`send_window` minus the
    ``unconfirmed`` assignments it holds, never below 0."""
    window = send_window(confirmed, initial_window=initial_window, max_unconfirmed=max_unconfirmed)
    return max(0, window - unconfirmed)


@attrs.define
class ReasonCache:
    """Unschedulable reasons by job shape, valid for one set of workers (:func:`workers_key`,
    all that a reason reads of them): reading it for another set empties it first. A memo: a
    round's decision is the same with or without it."""

    key: tuple[Any, ...] | None = None
    reasons: dict[tuple[Any, ...], str | None] = attrs.field(factory=dict)
    computed: int = 0
    """Reasons worked out (not found in the cache) so far: for tests and the curious."""
    gang_key: tuple[Any, ...] | None = None
    gang_reasons: dict[tuple[Any, ...], str | None] = attrs.field(factory=dict)
    """Gang shapes' reasons (:func:`actors.gangs.place_gangs`), valid for the rooms whose
    capacities are :attr:`gang_key` (gangs count workers: one key per room, repeats kept)."""

    _keys: dict[bool, tuple[tuple[Any, ...], list[Any], tuple[Any, ...]]] = attrs.field(factory=dict)
    """``repeats`` -> the identity of the last workers :meth:`key_of` read (capacities and the
    ids of their label and device maps), those maps (kept, so that no other map can take their
    ids meanwhile), and their key."""

    def key_of(self, workers: Sequence[WorkerRoom], *, repeats: bool = False) -> tuple[Any, ...]:
        """:func:`workers_key` of ``workers``, kept while the same workers come back: a round's
        rooms hold the very label and device maps of the last round's for the workers whose rows
        did not change (actors/placer_store.py), so most rounds find it."""
        ident = tuple(
            (w.cpu_millis, w.memory_mb, w.runs_containers, id(w.labels), id(w.resources)) for w in workers
        )
        kept = self._keys.get(repeats)
        if kept is not None and kept[0] == ident:
            return kept[2]
        key = workers_key(workers, repeats=repeats)
        self._keys[repeats] = (ident, [(w.labels, w.resources) for w in workers], key)
        return key

    def for_gangs(self, key: tuple[Any, ...]) -> dict[tuple[Any, ...], str | None]:
        """The gang shapes' reasons for rooms whose capacities are ``key``: emptied first when
        they are other rooms'."""
        if key != self.gang_key:
            self.gang_key, self.gang_reasons = key, {}
        return self.gang_reasons

    def reason(
        self,
        shape: Shape,
        constraints: tuple[Constraint, ...],
        workers: Sequence[WorkerRoom],
        key: tuple[Any, ...],
        asked: DeviceAsk = (),
    ) -> str | None:
        """:func:`unschedulable_reason` of a job of ``shape`` (its ``constraints`` those of the
        shape's group, ``asked`` its device ask) on ``workers``, whose :func:`workers_key` is ``key``."""
        if key != self.key:
            self.key, self.reasons = key, {}
        cpu, mem, container, _, _ = shape
        found = (cpu, mem, container, constraints, asked)
        if found not in self.reasons:
            job = PendingJob(
                job_id=0,
                cpu_millis=cpu,
                memory_mb=mem,
                needs_container=container,
                constraints=constraints,
                resources=asked,
            )
            self.reasons[found] = unschedulable_reason(job, workers)
            self.computed += 1
        return self.reasons[found]


def workers_key(workers: Sequence[WorkerRoom], *, repeats: bool = False) -> tuple[Any, ...]:
    """What :func:`unschedulable_reason` reads of ``workers``: the distinct (cpu_millis,
    memory_mb, runs_containers, labels, device counts offered) among them, sorted. Equal keys
    give equal reasons. With ``repeats``, each worker's, repeats kept: what a gang's reason reads
    (it counts workers, :func:`actors.gangs.place_gangs`). :meth:`ReasonCache.key_of` keeps it
    across rounds."""
    each = (
        (
            w.cpu_millis,
            w.memory_mb,
            w.runs_containers,
            tuple(sorted(w.labels.items())),
            tuple(sorted((name, len(units)) for name, units in w.resources.items())),
        )
        for w in workers
    )
    return tuple(sorted(each if repeats else set(each)))


def unschedulable_reason(job: PendingJob, workers: Sequence[WorkerRoom]) -> str | None:
    """Why ``job`` can never be placed on these workers (``"unschedulable: needs 64000
    cpu_millis, largest worker has 16000"``), or None if some worker could hold it."""
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
    for name, count in job.resources:
        offering = [len(w.resources.get(name, ())) for w in workers]
        if not any(offering):
            return f"unschedulable: needs {count} {name}, no {_which(job)} offers {name}"
        if max(offering) < count:
            return f"unschedulable: needs {count} {name}, largest {_which(job)} offers {max(offering)}"
    if job.resources:
        workers = [w for w in workers if all(len(w.resources.get(n, ())) >= c for n, c in job.resources)]
        if not workers:
            asked = " and ".join(f"{c} {n}" for n, c in job.resources)
            return f"unschedulable: needs {asked}, no {_which(job)} offers them together"
    if any(job.cpu_millis <= w.cpu_millis and job.memory_mb <= w.memory_mb for w in workers):
        return None
    largest_cpu = max(w.cpu_millis for w in workers)
    largest_mem = max(w.memory_mb for w in workers)
    which = _which(job)
    if job.cpu_millis > largest_cpu:
        return f"unschedulable: needs {job.cpu_millis} cpu_millis, largest {which} has {largest_cpu}"
    if job.memory_mb > largest_mem:
        return f"unschedulable: needs {job.memory_mb} memory_mb, largest {which} has {largest_mem}"
    return (
        f"unschedulable: needs {job.cpu_millis} cpu_millis and {job.memory_mb} memory_mb, no {which} has both"
    )


def _which(job: PendingJob) -> str:
    """The workers a reason speaks of: ``worker``, ``container worker``, ``eligible worker``
    (a job with constraints)."""
    which = "container worker" if job.needs_container else "worker"
    return f"eligible {which}" if job.constraints else which


def fits_by_kind(
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
    use: those of its constraint group (``group_rooms[group[i]]``) and, for a container job,
    those of ``runs_containers``. One frontier test per kind of job present."""
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
    """For each (cpu[i], mem[i]), whether some room (room_cpu[k], room_mem[k]) holds it: one
    binary search per job in the rooms' Pareto frontier (by CPU ascending, memory descends)."""
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

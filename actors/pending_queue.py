"""The placer's pending queue: :class:`PendingJob` and :class:`PendingQueue`, the jobs in
placement order as numpy columns, with their constraint groups and shapes (:data:`Shape`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

import attrs
import numpy as np

from runtime.constraints import Constraint

Shape = tuple[int, int, bool, int, int]
"""What a job's unschedulable reason depends on: ``(cpu_millis, memory_mb, needs_container,
constraint group, device ask)`` (the group: an index into ``PendingQueue.groups``; the device ask
an index into ``PendingQueue.asks``, 0 for none)."""

DeviceAsk = tuple[tuple[str, int], ...]
"""The countable devices a job asks: (name, count) pairs sorted by name (docs/devices.md)."""


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
    owner: str = ""
    """Its account (``jobs.owner``), whose quotas it counts against (docs/quotas.md)."""
    resources: DeviceAsk = ()
    """The countable devices it asks (docs/devices.md): whole units of one worker."""


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
    "owner",
    "ask",
)
"""The :class:`PendingQueue` columns, one entry per job each, kept in step (same order)."""


@attrs.define
class PendingQueue:
    """Pending jobs in placement order (priority high first, then job id), as numpy arrays,
    so a round can skip at once every job that cannot fit the largest free room."""

    ids: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    cpu: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    mem: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    prio: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    container: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=bool))
    """Whether each job is a container job (``PendingJob.needs_container``)."""
    group: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    """Each job's constraint group: an index into :attr:`groups`."""
    groups: list[tuple[Constraint, ...]] = attrs.field(factory=lambda: [()])
    """The distinct constraints of the jobs ever held; group 0 is none. Only grows."""
    _group_of: dict[tuple[Constraint, ...], int] = attrs.field(factory=lambda: {(): 0})
    ask: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    """Each job's device ask: an index into :attr:`asks`."""
    asks: list[DeviceAsk] = attrs.field(factory=lambda: [()])
    """The distinct device asks of the jobs ever held; ask 0 is none. Only grows."""
    _ask_of: dict[DeviceAsk, int] = attrs.field(factory=lambda: {(): 0})
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
    _shape_table: np.ndarray = attrs.field(factory=lambda: np.empty((0, 5), dtype=np.int64))
    reasons: dict[int, str] = attrs.field(factory=dict)
    """The reason currently stored for a pending job (absent: none); change it only through the
    methods, which keep :attr:`reason_code` in step."""
    reason_code: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    """Each job's stored reason as an index into :attr:`reason_texts` (-1: none), so a round
    compares the reasons of many jobs at once (:meth:`code_of`)."""
    reason_texts: list[str] = attrs.field(factory=list)
    """The distinct stored reasons since the last :meth:`replace` (which rebuilds it)."""
    _code_of: dict[str, int] = attrs.field(factory=dict)
    owner: np.ndarray = attrs.field(factory=lambda: np.empty(0, dtype=np.int64))
    """Each job's account: an index into :attr:`owners`."""
    owners: list[str] = attrs.field(factory=list)
    """The distinct accounts of the jobs ever held. Only grows."""
    _owner_index: dict[str, int] = attrs.field(factory=dict)
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
        group, owner, ask = self._groups_of(jobs), self._owners_of(jobs), self._asks_of(jobs)
        since = np.full(ids.size, now, dtype=np.float64)
        if self.ids.size and ids.size:
            by_id = np.argsort(self.ids)
            at = np.minimum(np.searchsorted(self.ids, ids, sorter=by_id), self.ids.size - 1)
            held = self.ids[by_id[at]] == ids
            since[held] = self.since[by_id[at[held]]]
        self.shapes, self._shape_of, self._shape_table = [], {}, np.empty((0, 5), dtype=np.int64)
        self.reason_texts, self._code_of = [], {}
        self.reasons = {k: v for k, v in (reasons or {}).items() if v}
        self._store(self._columns(ids, cpu, mem, prio, container, group, since, not_before, owner, ask))
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
        group, owner, ask = self._groups_of(jobs), self._owners_of(jobs), self._asks_of(jobs)
        _, first = np.unique(ids, return_index=True)
        new = np.zeros(ids.size, dtype=bool)
        new[first] = True
        new &= ~np.isin(ids, self.ids)
        if not new.any():
            return 0
        ids, cpu, mem, prio, container = ids[new], cpu[new], mem[new], prio[new], container[new]
        group, owner, ask = group[new], owner[new], ask[new]
        failed_on = {j.job_id: j.failed_on for j in jobs if j.failed_on}
        for job_id in ids.tolist():
            reason = (reasons or {}).get(job_id)
            if reason:
                self.reasons[job_id] = reason
            if job_id in failed_on:
                self.failed_on[job_id] = failed_on[job_id]
        since = np.full(ids.size, now, dtype=np.float64)
        added = self._columns(ids, cpu, mem, prio, container, group, since, not_before, owner, ask)
        self._store(
            [
                np.concatenate((getattr(self, name), new))
                for name, new in zip(_QUEUE_COLUMNS, added, strict=True)
            ]
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
                owner=self.owners[o],
                resources=self.asks[a],
            )
            for i, c, m, p, k, g, o, a in zip(
                *(getattr(self, name).tolist() for name in (*_QUEUE_COLUMNS[:6], "owner", "ask")), strict=True
            )
        ]

    def _groups_of(self, jobs: Sequence[PendingJob]) -> np.ndarray:
        """Each job's constraint group (new constraints get a new group), as an int64 array."""
        if not any(j.constraints for j in jobs):
            return np.zeros(len(jobs), dtype=np.int64)
        return _indexes((j.constraints for j in jobs), self._group_of, self.groups)

    def _asks_of(self, jobs: Sequence[PendingJob]) -> np.ndarray:
        """Each job's index into :attr:`asks` (new asks are added), as an int64 array."""
        if not any(j.resources for j in jobs):
            return np.zeros(len(jobs), dtype=np.int64)
        return _indexes((j.resources for j in jobs), self._ask_of, self.asks)

    def _owners_of(self, jobs: Sequence[PendingJob]) -> np.ndarray:
        """Each job's index into :attr:`owners` (new accounts are added), as an int64 array."""
        return _indexes((j.owner for j in jobs), self._owner_index, self.owners)

    def accounts(self) -> set[str]:
        """The accounts that own the jobs held now."""
        if not self.owner.size:
            return set()
        present = np.flatnonzero(np.bincount(self.owner, minlength=len(self.owners)))
        return {self.owners[k] for k in present.tolist()}

    def waiting_for_backoff(self, now: float) -> set[int]:
        """The jobs whose requeue backoff has not passed at ``now``."""
        return set(self.ids[self.not_before > now].tolist())

    def _columns(
        self,
        ids: np.ndarray,
        cpu: np.ndarray,
        mem: np.ndarray,
        prio: np.ndarray,
        container: np.ndarray,
        group: np.ndarray,
        since: np.ndarray,
        not_before: Mapping[int, float] | None,
        owner: np.ndarray,
        ask: np.ndarray,
    ) -> tuple[np.ndarray, ...]:
        """The :data:`_QUEUE_COLUMNS` of these jobs, their shapes and reason codes added."""
        shapes = self._shapes_of(cpu, mem, container, group, ask)
        codes = self._codes_of(ids, self.reasons)
        return (
            ids,
            cpu,
            mem,
            prio,
            container,
            group,
            since,
            _times(ids, not_before),
            shapes,
            codes,
            owner,
            ask,
        )

    def _store(self, columns: Sequence[np.ndarray]) -> None:
        """Hold these columns (those of :data:`_QUEUE_COLUMNS`, in its order), put in placement
        order (priority high first, then job id)."""
        order = np.lexsort((columns[0], -columns[3]))
        for name, column in zip(_QUEUE_COLUMNS, columns, strict=True):
            setattr(self, name, column[order])
        self.version += 1

    def shape_table(self) -> np.ndarray:
        """:attr:`shapes` as an int64 array of shape (len(shapes), 5), one row per shape."""
        if self._shape_table.shape[0] != len(self.shapes):
            self._shape_table = np.array(self.shapes, dtype=np.int64).reshape(-1, 5)
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
        self, cpu: np.ndarray, mem: np.ndarray, container: np.ndarray, group: np.ndarray, ask: np.ndarray
    ) -> np.ndarray:
        """Each job's index into :attr:`shapes` (new shapes are added), as an int64 array: one
        Python step per distinct shape, not per job."""
        if not cpu.size:
            return np.empty(0, dtype=np.int64)
        table = np.stack((cpu, mem, container.astype(np.int64), group, ask), axis=1)
        distinct, inverse = np.unique(table, axis=0, return_inverse=True)
        index = np.empty(len(distinct), dtype=np.int64)
        for k, (c, m, box, g, a) in enumerate(distinct.tolist()):
            key = (c, m, bool(box), g, a)
            found = self._shape_of.get(key)
            if found is None:
                found = self._shape_of[key] = len(self.shapes)
                self.shapes.append(key)
            index[k] = found
        return index[inverse.reshape(-1)]


def _columns(jobs: Sequence[PendingJob]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, cpu_millis, memory_mb, priority) of ``jobs`` as int64 arrays and whether each is
    a container job (bool), in the given order."""
    rows = [(j.job_id, j.cpu_millis, j.memory_mb, j.priority, j.needs_container) for j in jobs]
    columns = np.array(rows, dtype=np.int64).reshape(-1, 5).T.copy()
    return columns[0], columns[1], columns[2], columns[3], columns[4].astype(bool)


def _times(ids: np.ndarray, times: Mapping[int, float] | None) -> np.ndarray:
    """``times[id]`` for each id, ``-inf`` where absent."""
    if not times:
        return np.full(ids.size, -math.inf, dtype=np.float64)
    return np.array([times.get(i, -math.inf) for i in ids.tolist()], dtype=np.float64)


K = TypeVar("K", bound=Hashable)


def _indexes(keys: Iterable[K], index_of: dict[K, int], held: list[K]) -> np.ndarray:
    """Each key's index into ``held`` (a key not held yet is appended, and ``index_of``, its
    index by key, kept in step), as an int64 array."""
    found = []
    for key in keys:
        index = index_of.get(key)
        if index is None:
            index = index_of[key] = len(held)
            held.append(key)
        found.append(index)
    return np.array(found, dtype=np.int64)

"""The gangs waiting in the placer: :class:`GangQueue`, the pending gangs' tasks as the placer
reads them, held by gang until all of a gang's tasks are (:class:`PendingGang`). docs/gangs.md,
"Placement"; their placement is :func:`actors.gangs.place_gangs`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs
import numpy as np

from actors.pending_queue import PendingJob


@attrs.frozen(kw_only=True)
class GangTask:
    """What makes a pending job a gang's task: its gang's id, its rank and the gang's shape."""

    gang_id: int
    rank: int
    size: int
    spread: bool = False


@attrs.frozen(kw_only=True)
class PendingGang:
    """A gang all of whose tasks are pending: placed whole or not at all.

    Attributes:
        gang_id: the gang's id (its rank 0 task's job id).
        task_ids: its tasks' job ids, by rank.
        job: the spec every task shares (its ``job_id`` is the rank 0 task's), sizes per task.
        spread: its tasks go to distinct workers.
        since: when it became whole in the placer's queue (its clock, seconds).
        not_before: before when it must not be placed (its tasks' latest backoff; -inf: none).
        reasons: task id -> the pending reason stored for it (absent: none).
    """

    gang_id: int
    task_ids: tuple[int, ...]
    job: PendingJob
    spread: bool = False
    since: float = 0.0
    not_before: float = -np.inf
    reasons: Mapping[int, str] = attrs.field(factory=dict)
    reason: str | None = attrs.field(init=False)
    """The reason stored for every one of its tasks ('' for none); None when they differ."""

    @reason.default
    def _common_reason(self) -> str | None:
        stored = {self.reasons.get(t, "") for t in self.task_ids}
        return stored.pop() if len(stored) == 1 else None

    @property
    def size(self) -> int:
        return len(self.task_ids)


@attrs.define
class GangQueue:
    """The pending tasks of gangs, by gang, as the placer has read them; a gang is ready once
    all of its tasks are held (:meth:`whole`). Only the placer's task changes it."""

    _tasks: dict[int, dict[int, tuple[PendingJob, GangTask, str, float]]] = attrs.field(factory=dict)
    _since: dict[int, float] = attrs.field(factory=dict)
    version: int = 0
    """Bumped at every change, so a round can tell that nothing changed."""
    _whole: tuple[int, list[PendingGang]] | None = None
    _accounts: tuple[int, set[str]] | None = None
    _held: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    """Job id -> (gang id, rank) of every task held: what :meth:`remove` looks up."""
    _built: dict[int, PendingGang] = attrs.field(factory=dict)
    """The whole gangs as :meth:`whole` last made them, by id."""
    _dirty: set[int] = attrs.field(factory=set)
    """The gangs changed since: :meth:`whole` makes only these again."""

    def __len__(self) -> int:
        return len(self._held)

    def replace(
        self,
        tasks: Iterable[tuple[PendingJob, GangTask, str]],
        *,
        now: float,
        not_before: Mapping[int, float],
    ) -> None:
        """Hold exactly these (job, gang task, stored reason) triples; a gang held whole before
        keeps when it became whole."""
        since = self._since
        self._tasks, self._since, self._held, self._built, self._dirty = {}, {}, {}, {}, set()
        self._whole = None
        self.add(tasks, now=now, not_before=not_before)
        for gang_id in self._tasks:
            if gang_id in since:
                self._since[gang_id] = since[gang_id]
        self.version += 1

    def add(
        self,
        tasks: Iterable[tuple[PendingJob, GangTask, str]],
        *,
        now: float,
        not_before: Mapping[int, float],
    ) -> None:
        """Hold these (job, gang task, stored reason) triples too (a task held already is
        replaced); a gang that becomes whole becomes whole at ``now``."""
        added = False
        for job, task, reason in tasks:
            held = self._tasks.setdefault(task.gang_id, {})
            held[task.rank] = (job, task, reason, not_before.get(job.job_id, -np.inf))
            self._held[job.job_id] = (task.gang_id, task.rank)
            self._dirty.add(task.gang_id)
            added = True
            if len(held) == task.size:
                self._since.setdefault(task.gang_id, now)
        if added:
            self.version += 1

    def accounts(self) -> set[str]:
        """The accounts that own the gang tasks held now (worked out again only after a change:
        the placer asks twice a round)."""
        if self._accounts is None or self._accounts[0] != self.version:
            owners = {job.owner for held in self._tasks.values() for job, *_ in held.values()}
            self._accounts = (self.version, owners)
        return self._accounts[1]

    def remove(self, job_ids: Iterable[int]) -> None:
        """Drop these tasks (placed, or no longer pending); their gangs are no longer whole."""
        changed = False
        for job_id in job_ids:
            found = self._held.pop(job_id, None)
            if found is None:
                continue
            gang_id, rank = found
            held = self._tasks[gang_id]
            del held[rank]
            self._dirty.add(gang_id)
            changed = True
            self._since.pop(gang_id, None)
            if not held:
                del self._tasks[gang_id]
        if changed:
            self.version += 1

    def store_reasons(self, reasons: Iterable[tuple[int, str]]) -> None:
        """Record the reasons now stored for these tasks (others are ignored)."""
        for job_id, reason in reasons:
            found = self._held.get(job_id)
            if found is None:
                continue
            gang_id, rank = found
            held = self._tasks[gang_id]
            job, task, _reason, wait = held[rank]
            held[rank] = (job, task, reason, wait)
            self._dirty.add(gang_id)

    def whole(self) -> list[PendingGang]:
        """The gangs all of whose tasks are held, by priority (highest first), then gang id
        (worked out again only after a change, and only for the gangs it changed)."""
        if self._whole is not None and self._whole[0] == self.version and not self._dirty:
            return self._whole[1]
        for gang_id in self._dirty:
            gang = self._made(gang_id)
            if gang is None:
                self._built.pop(gang_id, None)
            else:
                self._built[gang_id] = gang
        self._dirty.clear()
        ordered = sorted(self._built.values(), key=lambda g: (-g.job.priority, g.gang_id))
        self._whole = (self.version, ordered)
        return ordered

    def _made(self, gang_id: int) -> PendingGang | None:
        """The gang ``gang_id`` as held now, if all of its tasks are."""
        held = self._tasks.get(gang_id)
        if not held:
            return None
        first = next(iter(held.values()))[1]
        if len(held) != first.size or set(held) != set(range(first.size)):
            return None
        ranked = [held[r] for r in range(first.size)]
        return PendingGang(
            gang_id=gang_id,
            task_ids=tuple(job.job_id for job, *_ in ranked),
            job=ranked[0][0],
            spread=first.spread,
            since=self._since.get(gang_id, 0.0),
            not_before=max(wait for *_, wait in ranked),
            reasons={job.job_id: reason for job, _, reason, _ in ranked if reason},
        )

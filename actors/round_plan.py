"""A placer round's decision as a pure function: :func:`plan_round` (in slices,
:func:`plan_round_steps`) turns the pending queue and the live workers into a :class:`RoundPlan`:
the placements and pending reasons to commit, then the batches to dispatch.
docs/design.md, "The placer's round".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs
import numpy as np

from actors.fair_share import AccountShare
from actors.gang_queue import PendingGang
from actors.gangs import (
    GangPlan,
    gangs_by_priority,
    gangs_in_fair_order,
    joined,
    place_gangs,
    quotas_after,
    task_sizes,
)
from actors.messages import CommittedAssignment, Dispatch, Placement, WorkerRef
from actors.pending_queue import PendingQueue
from actors.placement import Plan, Unschedulable, in_one_go, place_queue_steps
from actors.placer_store import LiveWorker
from actors.quotas import AccountQuota
from actors.rooms import ReasonCache, placement_limit
from runtime.accounts import quota_reason_key
from runtime.settings.leader import PlacerSettings

RoundOutcome = Literal["unchanged", "nothing", "commit"]
"""What a round's plan says: ``unchanged`` (neither the queue nor any worker's room changed
since a round that found nothing to do: nothing decided), ``nothing`` (decided; nothing to
write), ``commit`` (placements or pending reasons to commit, then dispatch)."""


@attrs.frozen(kw_only=True)
class RoundPlan:
    """What one round commits and dispatches, as :func:`plan_round` decides it.

    Attributes:
        outcome: see :data:`RoundOutcome`.
        fingerprint: the round's queue version, jobs backing off and free rooms; the next
            round with the same one as a round that found nothing to do decides nothing.
        backing_off: the queued jobs whose requeue backoff has not passed.
        placements: what to commit, in decision order (priority, then submission).
        reasons: (job_id, pending reason) pairs to store; an empty reason clears a stored one.
        reservations: the job ids holding a reservation in this round, ascending.
        workers: worker_id -> where to send, for every live worker of the round.
    """

    outcome: RoundOutcome
    fingerprint: tuple[Any, ...]
    backing_off: frozenset[int]
    placements: tuple[Placement, ...] = ()
    reasons: tuple[tuple[int, str], ...] = ()
    reservations: tuple[int, ...] = ()
    workers: Mapping[str, WorkerRef] = attrs.field(factory=dict)

    @property
    def placed_job_ids(self) -> tuple[int, ...]:
        """The jobs the plan places; none of them is pending once the commit succeeded."""
        return tuple(p.job_id for p in self.placements)

    def dispatches(self, epoch: int, committed: Iterable[CommittedAssignment]) -> tuple[Dispatch, ...]:
        """One :class:`Dispatch` per worker for what committed (invariant 4: only that), its
        assignments in the order they were placed (the statement's rows do not keep it), workers
        in the order of their first assignment."""
        rank = {p.job_id: i for i, p in enumerate(self.placements)}
        batches: dict[str, list[CommittedAssignment]] = defaultdict(list)
        for assignment in sorted(committed, key=lambda a: rank.get(a.job_id, len(rank))):
            batches[assignment.worker_id].append(assignment)
        return tuple(
            Dispatch(epoch=epoch, worker=self.workers[worker_id], assignments=tuple(batch))
            for worker_id, batch in batches.items()
        )


MAX_CORDONED_NAMED = 3
"""Cordoned workers an unschedulable reason names before it says how many more."""


def _named(ids: Sequence[str]) -> str:
    named = ", ".join(ids[:MAX_CORDONED_NAMED])
    if len(ids) > MAX_CORDONED_NAMED:
        named += f" and {len(ids) - MAX_CORDONED_NAMED} more"
    return named


def not_counting_cordoned(reason: str, cordoned: Sequence[str], unhealthy: Sequence[str] = ()) -> str:
    """An unschedulable ``reason`` naming the live workers it left out as ``cordoned`` (or
    draining) or ``unhealthy``: ``"unschedulable: no live workers (not counting cordoned w-1,
    w-2; unhealthy w-3)"``; ``reason`` itself when none is."""
    left_out = [
        f"{what} {_named(ids)}" for what, ids in (("cordoned", cordoned), ("unhealthy", unhealthy)) if ids
    ]
    if not left_out:
        return reason
    return f"{reason} (not counting {'; '.join(left_out)})"


def probe_limit(worker: LiveWorker, limit: int) -> int:
    """Most jobs a round may place on ``worker`` with a send window of ``limit``: ``limit`` for a
    healthy worker out of trial; one job while it holds none for a worker on trial and for an
    unhealthy one whose probe is due; none for other unhealthy ones. The trial keeps a broken
    worker (always room: its jobs fail at once) from taking a burst before it is judged."""
    if not worker.unhealthy and not worker.trial:
        return limit
    idle = worker.room.cpu_allocated_millis == 0 and worker.unconfirmed == 0
    return min(limit, 1) if idle and (worker.probe_due or not worker.unhealthy) else 0


def _changed_reasons(
    queue: PendingQueue, held: Unschedulable, said: Mapping[int, str], key: Callable[[str], str] = str
) -> list[tuple[int, str]]:
    """(job_id, reason) for the jobs of ``held`` whose stored reason is not their reason
    (``said``, by their key in ``held.shapes``) as ``key`` compares them (by default, as text;
    :func:`runtime.accounts.quota_reason_key` keeps a quota reason while the same cap holds the
    job, whatever its account's use does meanwhile), in queue order; only the changed ones cost
    Python work."""
    if not held.at.size:
        return []
    keys: dict[str, int] = {}
    # By stored reason code; code -1 (none stored) reads the last element, which no reason has.
    stored = np.array([keys.setdefault(key(t), len(keys)) for t in queue.reason_texts] + [-1], dtype=np.int64)
    wanted = np.full(max(said) + 1, -2, dtype=np.int64)
    for k, reason in said.items():
        wanted[k] = keys.get(key(reason), -2)
    changed = stored[queue.reason_code[held.at]] != wanted[held.shapes]
    ids, codes = held.ids[changed].tolist(), held.shapes[changed].tolist()
    return [(job_id, said[k]) for job_id, k in zip(ids, codes, strict=True)]


def plan_round_steps(
    queue: PendingQueue,
    workers: Sequence[LiveWorker],
    settings: PlacerSettings,
    *,
    max_rows: int,
    now: float,
    idle_fingerprint: tuple[Any, ...] | None = None,
    reason_cache: ReasonCache | None = None,
    quotas: Mapping[str, AccountQuota] | None = None,
    shares: Mapping[str, AccountShare] | None = None,
    held: Mapping[str, int] | None = None,
    gangs: Sequence[PendingGang] = (),
) -> Generator[None, None, RoundPlan]:
    """What one round commits and dispatches, decided in slices: a generator that yields
    between slices of :func:`actors.placement.place_queue_steps` and returns the plan. Neither
    the queue nor the workers may change meanwhile; neither is changed.

    A cordoned or draining worker is given nothing, nor an unhealthy one but a due probe; one on
    trial one job at a time while a proven worker takes placements (:func:`probe_limit`). Each
    worker's send window bounds what it is given (:func:`actors.rooms.placement_limit`); the
    pending reasons that changed fill what the placements leave of ``max_rows``.

    Args:
        max_rows: most rows the round's fenced statement may carry (placements and reasons).
        now: the queue's clock at the read (seconds): backoffs and reservation waits end by it.
        idle_fingerprint: the fingerprint of the last round that found nothing to do, if the
            queue has not changed since; a round with the same one decides nothing.
        reason_cache: a memo of unschedulable reasons kept by the caller.
        quotas: the capped accounts' caps and use, by name (docs/quotas.md); a job that would
            take its account past a cap waits (:func:`actors.placement.place_queue_steps`).
        shares: fair share's accounts (weights and use, by name); None: queue order.
        held: worker_id -> the job it is kept for alone (a preemption's freed room).
        gangs: the gangs whose tasks are all pending, by priority then id, each placed whole
            (:func:`actors.gangs.place_gangs`): those of at least the queue's top priority
            before the queue's jobs, the others on what the queue's jobs leave
            (:func:`actors.gangs.gangs_by_priority`); a worker takes gang tasks while its send
            window is open (``open_windows``); gangs count against ``quotas`` and, with
            ``shares``, go in fair share's order within a priority
            (:func:`actors.gangs.gangs_in_fair_order`); the workers a waiting gang reserves
            take no job of the queue this round.

    Raises:
        ValueError: the settings name an unknown policy.
    """
    cordoned = tuple(sorted(w.ref.worker_id for w in workers if w.cordoned))
    unhealthy = tuple(
        sorted(w.ref.worker_id for w in workers if w.unhealthy and not w.cordoned and not w.probe_due)
    )
    workers = [w for w in workers if not w.cordoned and not (w.unhealthy and not w.probe_due)]
    if not any(not w.trial and not w.unhealthy for w in workers):
        workers = [attrs.evolve(w, trial=False) for w in workers]
    windows = [
        placement_limit(
            w.confirmed,
            w.unconfirmed,
            initial_window=settings.initial_window,
            max_unconfirmed=settings.max_unconfirmed_per_worker,
        )
        for w in workers
    ]
    rooms = [
        attrs.evolve(w.room, placement_limit=probe_limit(w, n)) for w, n in zip(workers, windows, strict=True)
    ]
    backing_off = frozenset(queue.waiting_for_backoff(now))
    free = sorted(
        (
            w.ref.worker_id,
            w.ref.incarnation,
            room.cpu_millis - room.cpu_allocated_millis,
            room.memory_mb - room.memory_allocated_mb,
            room.placement_limit,
            len(room.units_in_use),
        )
        for w, room in zip(workers, rooms, strict=True)
    )
    capped = tuple(sorted((name, attrs.astuple(q)) for name, q in (quotas or {}).items()))
    fingerprint = (
        queue.version,
        len(backing_off),
        tuple(free),
        cordoned,
        unhealthy,
        capped,
        tuple(sorted((held or {}).items())),
        tuple((g.gang_id, g.not_before <= now) for g in gangs),
    )
    if fingerprint == idle_fingerprint:
        return RoundPlan(outcome="unchanged", fingerprint=fingerprint, backing_off=backing_off)
    by_id = {w.ref.worker_id: w.ref for w in workers}
    row_budget = min(settings.max_placements_per_round, max_rows)
    # Gangs of at least the queue's top priority go before its jobs; the others after them, on
    # what they leave (docs/gangs.md, "Priority"). Gangs are bounded per worker by whether its
    # send window is open, not by how much of it is left (place_gangs' open_windows).
    if shares and gangs:
        total_cpu = float(sum(r.cpu_millis for r in rooms))
        gangs = gangs_in_fair_order(gangs, shares, total_cpu, float(sum(r.memory_mb for r in rooms)))
    first, after = gangs_by_priority(gangs, queue, now)
    # Workers on trial take gang tasks (a gang waiting for the end of a trial that only single
    # jobs end, and reserving the workers they need, waited forever); unhealthy ones whose probe
    # is due take none and are never reserved (their probe is a single job).
    not_for_gangs = {*(held or {}), *(w.ref.worker_id for w in workers if w.unhealthy)}
    gang_plan = GangPlan()
    if first:
        gang_plan = place_gangs(
            first,
            rooms,
            now=now,
            max_reservations=settings.max_reservations,
            reserve_after_s=settings.reserve_after_s,
            blocked=not_for_gangs,
            max_placements=row_budget,
            quotas=quotas,
            open_windows=True,
            memo=reason_cache,
        )
        if gang_plan.placements:  # most rounds place no gang: nothing to work out per task
            placed_gangs = _placed(gang_plan, first)
            sizes = task_sizes(placed_gangs)
            rooms = gang_plan.rooms_left(rooms, sizes)
            owner = {t: g.job.owner for g in placed_gangs for t in g.task_ids}
            quotas = quotas_after(quotas, ((owner[t], *sizes[t]) for t, _ in gang_plan.placements))
        if gang_plan.reserved:
            first_task = {g.gang_id: g.task_ids[0] for g in first}
            held = {**(held or {}), **{w: first_task[g] for w, g in gang_plan.reserved.items()}}
        yield
    plan: Plan = yield from place_queue_steps(
        queue,
        rooms,
        policy=settings.policy,
        max_placements=row_budget - len(gang_plan.placements),
        max_reservations=settings.max_reservations,
        reserve_after_s=settings.reserve_after_s,
        now=now,
        reason_cache=reason_cache,
        quotas=quotas,
        shares=shares,
        held=held or None,
    )
    if after:
        rooms = GangPlan(placements=plan.placements, units=plan.units).rooms_left(rooms, plan.sizes)
        later = place_gangs(
            after,
            rooms,
            now=now,
            blocked={*not_for_gangs, *(held or {})},
            open_windows=True,
            memo=reason_cache,
            max_placements=row_budget - len(gang_plan.placements) - len(plan.placements),
            quotas=quotas and quotas_after(quotas, _owned(queue, plan)),
        )
        gang_plan = joined(gang_plan, later)
    placed = dict(plan.placements)
    unschedulable = plan.unschedulable
    said = {k: not_counting_cordoned(r, cordoned, unhealthy) for k, r in unschedulable.by_shape.items()}
    reasons = _changed_reasons(queue, unschedulable, said)
    if plan.over_quota is not None:
        quota_reasons = _changed_reasons(queue, plan.over_quota, plan.over_quota.by_shape, quota_reason_key)
        reasons += [(job_id, r) for job_id, r in quota_reasons if job_id not in plan.held_back]
    # A retry that only workers where it failed have room for now.
    waiting = {
        job_id: f"waiting for a worker where it has not failed (failed on {_named(sorted(failed_on))})"
        for job_id, failed_on in plan.held_back.items()
    }
    reasons += [(job_id, r) for job_id, r in waiting.items() if queue.reasons.get(job_id) != r]
    # A stored reason no longer holds once the job is placed or may be (a job waiting out its
    # backoff keeps the reason its requeue wrote). Found among the jobs with a stored reason
    # that are neither unschedulable nor backing off, column by column.
    stored = (queue.reason_code >= 0) & (queue.not_before <= now)
    # A preempted job keeps its reason (preempted by job N) until it is placed again.
    kept = [code for code, text in enumerate(queue.reason_texts) if text.startswith(PREEMPTED_BY)]
    if kept:
        stored &= ~np.isin(queue.reason_code, kept)
    stored[plan.unschedulable.at] = False
    if plan.over_quota is not None:
        stored[plan.over_quota.at] = False
    reasons += [
        (job_id, "")
        for job_id in queue.ids[stored].tolist()
        if job_id not in waiting and job_id not in placed
    ]
    # One fenced statement: reasons fill what the placements leave of its rows; the rest are
    # not recorded as stored, so later rounds send them.
    # A gang's tasks' reasons come first: one gang's are never cut in two.
    reasons[:0] = gang_plan.reasons
    del reasons[max(0, max_rows - len(plan.placements) - len(gang_plan.placements)) :]
    placements = _gang_placements(gang_plan, gangs, by_id) + tuple(
        Placement(
            job_id=job_id,
            worker_id=worker_id,
            incarnation=by_id[worker_id].incarnation,
            cpu_millis=plan.sizes[job_id][0],
            memory_mb=plan.sizes[job_id][1],
            units=plan.units.get(job_id, ()),
        )
        for job_id, worker_id in plan.placements
    )
    return RoundPlan(
        outcome="commit" if placements or reasons else "nothing",
        fingerprint=fingerprint,
        backing_off=backing_off,
        placements=placements,
        reasons=tuple(reasons),
        reservations=tuple(sorted({*plan.reservations.values(), *gang_plan_reserving(gang_plan, gangs)})),
        workers=by_id,
    )


def _owned(queue: PendingQueue, plan: Plan) -> list[tuple[str, int, int]]:
    """(account, cpu_millis, memory_mb) of each job ``plan`` placed from ``queue``."""
    if not plan.placements:
        return []
    owner = dict(zip(queue.ids.tolist(), queue.owner.tolist(), strict=True))
    return [(queue.owners[owner[job_id]], *plan.sizes[job_id]) for job_id, _ in plan.placements]


def _gang_placements(
    gang_plan: GangPlan, gangs: Sequence[PendingGang], by_id: Mapping[str, WorkerRef]
) -> tuple[Placement, ...]:
    """The placements of the gangs ``gang_plan`` placed whole."""
    if not gang_plan.placements:
        return ()
    size = task_sizes(_placed(gang_plan, gangs))
    return tuple(
        Placement(
            job_id=job_id,
            worker_id=worker_id,
            incarnation=by_id[worker_id].incarnation,
            cpu_millis=size[job_id][0],
            memory_mb=size[job_id][1],
            units=gang_plan.units.get(job_id, ()),
        )
        for job_id, worker_id in gang_plan.placements
    )


def _placed(gang_plan: GangPlan, gangs: Sequence[PendingGang]) -> list[PendingGang]:
    """The gangs of ``gangs`` that ``gang_plan`` placed."""
    tasks = {job_id for job_id, _ in gang_plan.placements}
    return [g for g in gangs if g.task_ids[0] in tasks]


def gang_plan_reserving(gang_plan: GangPlan, gangs: Sequence[PendingGang]) -> set[int]:
    """The first task ids of the gangs holding a reservation in ``gang_plan``."""
    if not gang_plan.reserved:
        return set()
    first_task = {g.gang_id: g.task_ids[0] for g in gangs}
    return {first_task[g] for g in gang_plan.reserved.values()}


PREEMPTED_BY = "preempted by job "
"""How the reason of a job a preemption put back to pending begins (actors/ledger.py)."""


plan_round = in_one_go(plan_round_steps)
""":func:`plan_round_steps` run to its end in one go (its parameters, its errors)."""

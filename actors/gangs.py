"""Gangs' placement: :func:`place_gangs`, a pure function that places whole gangs (read from
:class:`actors.gang_queue.GangQueue`) on the free rooms, all of a gang's tasks or none.
docs/gangs.md, "Placement".
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence

import attrs
import numpy as np

from actors.fair_share import AccountShare, dominant_share
from actors.gang_queue import PendingGang
from actors.pending_queue import PendingJob, PendingQueue
from actors.placement import Devices
from actors.quotas import AccountQuota
from actors.rooms import ReasonCache, WorkerRoom
from actors.rooms import unschedulable_reason as job_unschedulable_reason
from runtime.accounts import quota_reason
from runtime.constraints import satisfied


@attrs.frozen(kw_only=True)
class GangPlan:
    """What :func:`place_gangs` decided.

    Attributes:
        placements: (job_id, worker_id) of every task of each gang placed, gang by gang, by rank.
        reasons: (job_id, reason) for the tasks of gangs not placed whose stored reason differs
            ('' clears one), and for placed ones nothing (a commit clears their reasons).
        reserved: worker_id -> the gang id it is kept free for in this round.
        units: job_id -> the device units each placed task asking devices is given on its
            worker, (name, unit ids) pairs sorted by name (docs/devices.md).
    """

    placements: tuple[tuple[int, str], ...] = ()
    reasons: tuple[tuple[int, str], ...] = ()
    reserved: Mapping[str, int] = attrs.field(factory=dict)
    units: Mapping[int, tuple[tuple[str, tuple[str, ...]], ...]] = attrs.field(factory=dict)

    def rooms_left(
        self, rooms: Sequence[WorkerRoom], sizes: Mapping[int, tuple[int, int]]
    ) -> list[WorkerRoom]:
        """``rooms`` with what the placements take (``sizes``: job_id -> (cpu_millis,
        memory_mb)) allocated and counted against their placement limits, and their device units
        in use."""
        taken: dict[str, list[int]] = {}
        held: dict[str, set[tuple[str, str]]] = {}
        for job_id, worker_id in self.placements:
            cpu, mem = sizes[job_id]
            used = taken.setdefault(worker_id, [0, 0, 0])
            used[0] += cpu
            used[1] += mem
            used[2] += 1
            for name, ids in self.units.get(job_id, ()):
                held.setdefault(worker_id, set()).update((name, unit) for unit in ids)
        left = []
        for room in rooms:
            took = taken.get(room.worker_id)
            if took is None:
                left.append(room)
                continue
            left.append(
                attrs.evolve(
                    room,
                    cpu_allocated_millis=room.cpu_allocated_millis + took[0],
                    memory_allocated_mb=room.memory_allocated_mb + took[1],
                    placement_limit=None
                    if room.placement_limit is None
                    else max(0, room.placement_limit - took[2]),
                    units_in_use=room.units_in_use | held.get(room.worker_id, set()),
                )
            )
        return left


def unschedulable_reason(gang: PendingGang, rooms: Sequence[WorkerRoom]) -> str | None:
    """Why ``gang`` can never be placed on these workers as they are (each empty), or None when
    it could be: with spread, fewer than ``size`` eligible workers have the capacity for one
    task; without, the eligible workers' capacities hold fewer than ``size`` tasks at once (the
    units they offer count as capacity: a worker offering 8 gpu holds 4 tasks asking 2). A task
    asking a device no eligible worker offers enough of has a single job's reason
    (:func:`actors.rooms.unschedulable_reason`: ``unschedulable: needs 2 gpu, no worker offers
    gpu``)."""
    cap_cpu = np.array([r.cpu_millis for r in rooms], dtype=np.int64)
    cap_mem = np.array([r.memory_mb for r in rooms], dtype=np.int64)
    devices = Devices.of(rooms, [gang.job.resources])
    return _never(gang, rooms, _eligible(gang.job, rooms), cap_cpu, cap_mem, devices.capacity)


def _eligible(job: PendingJob, rooms: Sequence[WorkerRoom]) -> np.ndarray:
    """Which of ``rooms`` may take ``job`` at all: containers, constraints and the count of
    units it asks of each device (offered, free or not)."""
    return np.array(
        [
            (r.runs_containers or not job.needs_container)
            and satisfied(job.constraints, r.labels)
            and all(len(r.resources.get(name, ())) >= count for name, count in job.resources)
            for r in rooms
        ],
        dtype=bool,
    )


def _never(
    gang: PendingGang,
    rooms: Sequence[WorkerRoom],
    eligible: np.ndarray,
    cap_cpu: np.ndarray,
    cap_mem: np.ndarray,
    cap_units: Mapping[str, np.ndarray],
) -> str | None:
    """:func:`unschedulable_reason` on the workers' capacities and eligibility as arrays
    (``cap_units``: name -> the units each worker offers, for the names the gang asks)."""
    job = gang.job
    if job.resources and not eligible.any():
        reason = job_unschedulable_reason(job, rooms)
        if reason is not None:
            return reason
    holds = np.minimum(cap_cpu // job.cpu_millis, cap_mem // job.memory_mb)
    for name, count in job.resources:
        holds = np.minimum(holds, cap_units[name] // count)
    holds = holds * eligible
    able = int(np.count_nonzero(holds > 0))
    need = f"room for {job.cpu_millis} cpu_millis, {job.memory_mb} memory_mb" + "".join(
        f", {count} {name}" for name, count in job.resources
    )
    if gang.spread:
        if able >= gang.size:
            return None
        return (
            f"unschedulable: gang of {gang.size} needs {gang.size} workers with {need}; "
            f"{able} live workers have it"
        )
    total = int(holds.sum())
    if total >= gang.size:
        return None
    return (
        f"unschedulable: gang of {gang.size} needs {need} for each task; "
        f"the {able} live workers with it hold {total} at once"
    )


@functools.lru_cache(maxsize=64)
def waiting_reason(size: int) -> str:
    """The reason of a gang of ``size`` tasks that could be placed but not now: its tasks wait
    together."""
    return f"gang: waiting for room for all {size} tasks at once"


def place_gangs(
    gangs: Sequence[PendingGang],
    rooms: Sequence[WorkerRoom],
    *,
    now: float,
    max_reservations: int = 0,
    reserve_after_s: float = 0.0,
    blocked: Iterable[str] = (),
    max_placements: int | None = None,
    quotas: Mapping[str, AccountQuota] | None = None,
    open_windows: bool = False,
    memo: ReasonCache | None = None,
) -> GangPlan:
    """Place whole gangs on the free room of ``rooms``, in the given order (priority, then gang
    id): a gang is placed only when all of its tasks fit at once, each task by best fit (the
    worker whose normalised leftover is smallest, ties by worker id) on the rooms as the tasks
    placed before it left them; with spread, on distinct workers. A task asking devices fits
    only a worker with that many free units of each (:meth:`WorkerRoom.free_units`, less what
    the round gave before it), its leftover counts them as a single job's does
    (:class:`actors.placement.Devices`), and it is given the lowest free ids
    (:attr:`GangPlan.units`). A gang whose ``not_before``
    is after ``now`` is left alone. A gang that fits no room now but could fit the workers'
    capacities, queued ``reserve_after_s`` or more, keeps the workers that lack least for it
    free for the round (at most ``max_reservations`` gangs), so that single jobs do not take the
    room it waits for (:attr:`GangPlan.reserved`). ``blocked``: workers that take nothing. At
    most ``max_placements`` tasks are placed in all (None: no limit); a gang past it waits whole.
    A gang whose account (``quotas``: the capped accounts by name) would pass a cap with all of
    its tasks, on top of its use and the gangs placed before it, waits with the quota's reason
    (docs/quotas.md) and reserves nothing. With ``open_windows``, a room's ``placement_limit``
    says only whether its send window is open (above 0: as many tasks as fit; 0: none), not how
    many a round may place there: a gang (at most MAX_GANG_TASKS tasks) larger than what the
    windows let one round place would otherwise wait forever. ``memo`` keeps whether each gang
    shape could ever fit across rounds, while the rooms' capacities stay the same.

    Never more than a room holds, never a partial gang, never two tasks of a spread gang on one
    worker, never one unit to two tasks (tests/unit/test_gangs_placement.py, hypothesis).
    """
    ordered = sorted(rooms, key=lambda r: r.worker_id)
    names = [r.worker_id for r in ordered]
    cap_cpu = np.array([r.cpu_millis for r in ordered], dtype=np.int64)
    cap_mem = np.array([r.memory_mb for r in ordered], dtype=np.int64)
    free_cpu = cap_cpu - np.array([r.cpu_allocated_millis for r in ordered], dtype=np.int64)
    free_mem = cap_mem - np.array([r.memory_allocated_mb for r in ordered], dtype=np.int64)
    unbounded = 1 << 30
    left = np.array(
        [
            unbounded
            if r.placement_limit is None or (open_windows and r.placement_limit > 0)
            else max(0, r.placement_limit)
            for r in ordered
        ],
        dtype=np.int64,
    )
    closed = set(blocked)
    open_ = np.array([r.worker_id not in closed for r in ordered], dtype=bool)
    inv_cpu = 1.0 / np.maximum(cap_cpu, 1)
    inv_mem = 1.0 / np.maximum(cap_mem, 1)
    devices = Devices.of(ordered, [g.job.resources for g in gangs if g.job.resources])
    units: dict[int, tuple[tuple[str, tuple[str, ...]], ...]] = {}
    placements: list[tuple[int, str]] = []
    reasons: list[tuple[int, str]] = []
    reserved: dict[str, int] = {}

    def tell(gang: PendingGang, reason: str) -> None:
        if gang.reason != reason:  # most rounds a waiting gang's tasks have this reason stored
            reasons.extend((t, reason) for t in gang.task_ids if gang.reasons.get(t, "") != reason)

    # Per shape (size, spread, cpu, mem, container, constraints, device ask): whether it can ever
    # fit, worked out once a round; eligibility per (container, constraints, device ask).
    eligible_of: dict[tuple[bool, tuple[object, ...], tuple[object, ...]], np.ndarray] = {}
    never_of = {} if memo is None else memo.for_gangs(memo.key_of(ordered, repeats=True))
    fits_of: dict[tuple[object, ...], int] = {}
    allowed_of: dict[tuple[int, tuple[object, ...]], np.ndarray] = {}
    changes = 0
    reserving = 0  # gangs that reserved workers
    taken: dict[str, tuple[int, int]] = {}
    for gang in gangs:
        if gang.not_before > now:
            continue
        if max_placements is not None and len(placements) + gang.size > max_placements:
            continue
        job = gang.job
        cpu, mem = job.cpu_millis, job.memory_mb
        ask = job.resources
        group = (job.needs_container, job.constraints, ask)
        eligible = eligible_of.get(group)
        if eligible is None:
            eligible = eligible_of[group] = _eligible(job, ordered)
        shape = (gang.size, gang.spread, cpu, mem, group)
        if shape in never_of:
            never = never_of[shape]
        else:
            never = never_of[shape] = _never(gang, ordered, eligible, cap_cpu, cap_mem, devices.capacity)
        if never is not None:
            tell(gang, never)
            continue
        if quotas:
            over = _over_quota(gang, quotas.get(job.owner), taken.get(job.owner, (0, 0)))
            if over is not None:
                tell(gang, over)
                continue
        # The workers that may take it as the round stands: eligible ones neither blocked nor
        # reserved (changed only with the rooms).
        allowed = allowed_of.get((changes, group))
        if allowed is None:
            allowed = allowed_of[changes, group] = eligible & open_
        # Tasks of one size: best fit one by one succeeds exactly when the free rooms hold them
        # all at once (one per worker with spread), so a gang that does not fit costs no loop;
        # how many fit is worked out once per shape until the rooms change.
        key = (changes, gang.spread, cpu, mem, group)
        fits_now = fits_of.get(key)
        if fits_now is None:
            room = np.minimum(np.maximum(free_cpu, 0) // cpu, np.maximum(free_mem, 0) // mem)
            for name, count in ask:
                room = np.minimum(room, devices.free[name] // count)
            room = np.minimum(room, left) * allowed
            fits_now = fits_of[key] = int(np.count_nonzero(room > 0)) if gang.spread else int(room.sum())
        if fits_now < gang.size:
            tell(gang, waiting_reason(gang.size))
            if reserving < max_reservations and now - gang.since >= reserve_after_s:
                kept = _reserve(gang, allowed, free_cpu, free_mem, cap_cpu, cap_mem)
                for k in kept:
                    reserved[names[k]] = gang.gang_id
                    open_[k] = False
                    changes += 1
                reserving += 1 if kept else 0
            continue
        try_cpu, try_mem, try_left = free_cpu.copy(), free_mem.copy(), left.copy()
        try_units = {name: devices.free[name].copy() for name, _ in ask}
        unused = np.ones(len(ordered), dtype=bool)
        chosen: list[int] = []
        for _ in range(gang.size):
            fits = allowed & (try_cpu >= cpu) & (try_mem >= mem) & (try_left > 0)
            if ask:
                fits &= devices.able(ask, try_units)
            if gang.spread:
                fits &= unused
            if not fits.any():
                break
            score = (try_cpu - cpu) * inv_cpu + (try_mem - mem) * inv_mem
            if ask:
                score = score + devices.leftover(ask, try_units)
            k = int(np.argmin(np.where(fits, score, np.inf)))
            try_cpu[k] -= cpu
            try_mem[k] -= mem
            try_left[k] -= 1
            for name, count in ask:
                try_units[name][k] -= count
            unused[k] = False
            chosen.append(k)
        if len(chosen) == gang.size:
            free_cpu, free_mem, left = try_cpu, try_mem, try_left
            changes += 1
            placements.extend((t, names[k]) for t, k in zip(gang.task_ids, chosen, strict=True))
            had = taken.get(job.owner, (0, 0))
            taken[job.owner] = (had[0] + gang.size * cpu, had[1] + gang.size * mem)
            if ask:
                units.update((t, devices.take(ask, k)) for t, k in zip(gang.task_ids, chosen, strict=True))
            continue
        tell(gang, waiting_reason(gang.size))
    return GangPlan(placements=tuple(placements), reasons=tuple(reasons), reserved=reserved, units=units)


def _reserve(
    gang: PendingGang,
    allowed: np.ndarray,
    free_cpu: np.ndarray,
    free_mem: np.ndarray,
    cap_cpu: np.ndarray,
    cap_mem: np.ndarray,
) -> list[int]:
    """The workers of ``allowed`` to keep free for ``gang``: those that lack least for its tasks
    now (missing CPU and memory over capacity, summed; ties by worker order), taken until their
    capacities hold every task (one each with spread); none when they never would."""
    cpu, mem = gang.job.cpu_millis, gang.job.memory_mb
    holds = np.minimum(cap_cpu // cpu, cap_mem // mem) * allowed
    if gang.spread:
        holds = np.minimum(holds, 1)
    lacking = np.maximum(cpu - free_cpu, 0) / np.maximum(cap_cpu, 1) + np.maximum(
        mem - free_mem, 0
    ) / np.maximum(cap_mem, 1)
    kept: list[int] = []
    total = 0
    for k in np.argsort(np.where(holds > 0, lacking, np.inf), kind="stable").tolist():
        if holds[k] <= 0 or total >= gang.size:
            break
        kept.append(k)
        total += int(holds[k])
    return kept if total >= gang.size else []


def _over_quota(gang: PendingGang, quota: AccountQuota | None, taken: tuple[int, int]) -> str | None:
    """The quota reason of ``gang`` when all of its tasks would take its account past a cap
    (``quota``; None: uncapped), on top of its use and ``taken`` (cpu_millis, memory_mb) by the
    gangs placed before it this round; None when they fit."""
    if quota is None:
        return None
    for field, cap, used, size in (
        ("cpu_millis", quota.cpu_millis, quota.used_cpu_millis + taken[0], gang.job.cpu_millis),
        ("memory_mb", quota.memory_mb, quota.used_memory_mb + taken[1], gang.job.memory_mb),
    ):
        if cap is not None and used + gang.size * size > cap:
            return quota_reason(gang.job.owner, field, used, cap)
    return None


def gangs_by_priority(
    gangs: Sequence[PendingGang], queue: PendingQueue, now: float
) -> tuple[list[PendingGang], list[PendingGang]]:
    """``gangs`` split into those a round places before the queue's jobs (priority at least the
    highest of the queue's jobs that may be placed: past their backoff at ``now`` and not
    stored as unschedulable or held by a quota) and those it places after them, each in the
    order given. With equal priorities a gang goes first: it needs all of its room at once,
    which single jobs would otherwise keep taking. A job of high priority that can never run
    does not send every gang behind the queue."""
    stuck = [k for k, text in enumerate(queue.reason_texts) if text.startswith(_STUCK)]
    able = queue.not_before <= now
    if stuck:
        able &= ~np.isin(queue.reason_code, stuck)
    if not able.any():
        return list(gangs), []
    top = int(queue.prio[able].max())
    return [g for g in gangs if g.job.priority >= top], [g for g in gangs if g.job.priority < top]


_STUCK = ("unschedulable", "quota:")
"""How the stored reasons of jobs that no round will place as things are begin."""


def task_sizes(gangs: Iterable[PendingGang]) -> dict[int, tuple[int, int]]:
    """Each task of ``gangs``: job_id -> (cpu_millis, memory_mb)."""
    return {t: (g.job.cpu_millis, g.job.memory_mb) for g in gangs for t in g.task_ids}


def quotas_after(
    quotas: Mapping[str, AccountQuota] | None, placed: Iterable[tuple[str, int, int]]
) -> Mapping[str, AccountQuota] | None:
    """``quotas`` with what a round placed so far counted as used: ``placed`` is (account,
    cpu_millis, memory_mb) per placement; accounts without a quota stay uncapped."""
    if not quotas:
        return quotas
    used = {name: [q.used_cpu_millis, q.used_memory_mb] for name, q in quotas.items()}
    for owner, cpu, mem in placed:
        if owner in used:
            used[owner][0] += cpu
            used[owner][1] += mem
    return {
        name: attrs.evolve(q, used_cpu_millis=used[name][0], used_memory_mb=used[name][1])
        for name, q in quotas.items()
    }


def joined(first: GangPlan, then: GangPlan) -> GangPlan:
    """Two gang plans of one round as one: ``first``'s placements, reasons, reservations and
    units, then ``then``'s."""
    return GangPlan(
        placements=first.placements + then.placements,
        reasons=first.reasons + then.reasons,
        reserved={**first.reserved, **then.reserved},
        units={**first.units, **then.units},
    )


def gangs_in_fair_order(
    gangs: Sequence[PendingGang],
    shares: Mapping[str, AccountShare],
    total_cpu_millis: float,
    total_memory_mb: float,
) -> list[PendingGang]:
    """``gangs`` (by priority, then id) in fair share's order: by priority (high first), then by
    key (low first), then as given. A gang's key is its account's weighted dominant share once
    it and the account's gangs before it were placed, plus the account's decayed past share, as
    :func:`actors.fair_share.fair_order` keys single jobs (docs/fair-share.md); an account absent
    from ``shares`` has weight 1 and no use. Gangs of one account keep the order given."""
    if len({g.job.owner for g in gangs}) < 2:
        return list(gangs)
    held: dict[str, tuple[float, float]] = {}
    keyed = []
    for position, gang in enumerate(gangs):
        owner = gang.job.owner
        share = shares.get(owner, AccountShare())
        cpu, mem = held.get(owner, (share.used_cpu_millis, share.used_memory_mb))
        cpu, mem = cpu + gang.size * gang.job.cpu_millis, mem + gang.size * gang.job.memory_mb
        held[owner] = (cpu, mem)
        past = dominant_share(
            share.decayed_cpu_millis, share.decayed_memory_mb, total_cpu_millis, total_memory_mb
        )
        key = (dominant_share(cpu, mem, total_cpu_millis, total_memory_mb) + past) / share.weight
        keyed.append((-gang.job.priority, key, position))
    return [gangs[position] for *_, position in sorted(keyed)]

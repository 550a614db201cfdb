"""Placement as a pure function: pending jobs x free capacity -> placements.

:func:`place_queue_steps` decides a round in slices (:func:`place_queue` in one go,
:func:`place` on a list of jobs) by one of ``PLACEMENT_POLICIES``. The rules and their sources:
docs/design.md, "Placement: the policies".
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import ParamSpec, TypeVar

import attrs
import numpy as np

from actors.fair_share import AccountShare, fair_order
from actors.pending_queue import DeviceAsk, PendingJob, PendingQueue
from actors.quotas import AccountQuota, QuotaLedger
from actors.rooms import ReasonCache, WorkerRoom, fits_by_kind
from runtime.constraints import satisfied
from runtime.loops import finish
from runtime.settings.leader import PLACEMENT_POLICIES


class Unschedulable(Mapping[int, str]):
    """job_id -> unschedulable reason, held as one reason per job shape so that a round does no
    Python work per unschedulable job unless something reads them one by one.

    Attributes:
        at: the jobs' positions in the queue the plan was made from, ascending (int64).
        ids: their job ids (int64), in the same order.
        shapes: their shapes (indices into ``PendingQueue.shapes``, int64), same order.
        by_shape: shape index -> the reason of every job of that shape.
    """

    def __init__(
        self, at: np.ndarray, ids: np.ndarray, shapes: np.ndarray, by_shape: Mapping[int, str]
    ) -> None:
        self.at, self.ids, self.shapes, self.by_shape = at, ids, shapes, by_shape
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


@attrs.frozen(kw_only=True)
class Plan:
    """One round's decision: ``placements`` (job_id, worker_id) in decision order, the
    ``unschedulable`` reasons of jobs no live worker could ever hold, and ``sizes``: placed
    job_id -> (cpu_millis, memory_mb)."""

    placements: tuple[tuple[int, str], ...]
    unschedulable: Unschedulable
    sizes: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    reservations: dict[str, int] = attrs.field(factory=dict)
    """worker_id -> the job id it was kept free for in this round."""
    held_back: dict[int, tuple[str, ...]] = attrs.field(factory=dict)
    """job_id -> the workers where it failed, for the jobs not placed because only those had
    room for it (it waits for another: :func:`elsewhere`)."""
    over_quota: Unschedulable | None = None
    """The jobs left pending because their account's use, with what the round placed, leaves
    no room for them under its caps, and why (``quota: alice uses 32000 of 32000 cpu_millis``;
    its keys: :meth:`actors.quotas.QuotaLedger.reasons`); None: none."""
    units: dict[int, tuple[tuple[str, tuple[str, ...]], ...]] = attrs.field(factory=dict)
    """Placed job_id -> the device units it was given on its worker, (name, unit ids) pairs
    sorted by name, for the jobs that ask devices (docs/devices.md)."""


@attrs.define
class Devices:
    """The device units of a round's workers (in their placement order), for the names the
    queue's jobs ask: free counts as arrays, free ids as lists taken from the lowest. Shared with
    the gangs' placement (actors/gangs.py), which scores and takes units the same way."""

    capacity: dict[str, np.ndarray]
    """name -> units each worker offers."""
    free: dict[str, np.ndarray]
    """name -> units each worker has free now."""
    free_ids: dict[str, list[list[str]]]
    """name -> each worker's free unit ids, lowest first."""

    @classmethod
    def of(cls, workers: Sequence[WorkerRoom], asks: Sequence[DeviceAsk]) -> Devices:
        names = sorted({name for ask in asks for name, _ in ask})
        free_ids = {n: [w.free_units(n) for w in workers] for n in names}
        return cls(
            capacity={
                n: np.array([len(w.resources.get(n, ())) for w in workers], dtype=np.int64) for n in names
            },
            free={n: np.array([len(i) for i in ids], dtype=np.int64) for n, ids in free_ids.items()},
            free_ids=free_ids,
        )

    def able(self, ask: DeviceAsk, counts: Mapping[str, np.ndarray] | None = None) -> np.ndarray | bool:
        """Which workers have ``ask``'s units (free ones; ``counts``: those counts instead)."""
        counts = self.free if counts is None else counts
        able: np.ndarray | bool = True
        for name, count in ask:
            able = able & (counts[name] >= count)
        return able

    def leftover(self, ask: DeviceAsk, counts: Mapping[str, np.ndarray] | None = None) -> np.ndarray | float:
        """Each worker's free units left after ``ask``, over its capacity, summed over the names
        asked (a worker offering none of a name scores as full: it is not eligible anyway);
        ``counts``: those free counts instead."""
        counts = self.free if counts is None else counts
        score: np.ndarray | float = 0.0
        for name, count in ask:
            capacity = self.capacity[name]
            score = score + (counts[name] - count) / np.maximum(capacity, 1)
        return score

    def take(self, ask: DeviceAsk, worker: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Give ``ask``'s units of ``worker``, the lowest free ids of each name."""
        taken = []
        for name, count in ask:
            ids = self.free_ids[name][worker]
            taken.append((name, tuple(ids[:count])))
            del ids[:count]
            self.free[name][worker] -= count
        return tuple(taken)


def place(
    jobs: Sequence[PendingJob],
    workers: Sequence[WorkerRoom],
    *,
    policy: str = PLACEMENT_POLICIES[0],
    max_reservations: int = 0,
) -> Plan:
    """:func:`place_queue` on ``jobs`` in any order (taken by priority desc, then job_id); a job
    may reserve a worker at once."""
    queue = PendingQueue()
    queue.replace(jobs)
    return place_queue(queue, workers, policy=policy, max_reservations=max_reservations)


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
    quotas: Mapping[str, AccountQuota] | None = None,
    shares: Mapping[str, AccountShare] | None = None,
    held: Mapping[str, int] | None = None,
) -> Generator[None, None, Plan]:
    """Decide a round in slices: a generator that yields after every ``step_visits`` jobs it
    considered and returns the :class:`Plan`. It places at most ``max_placements`` and reserves
    at most ``max_reservations`` workers, each for a job queued ``reserve_after_s`` or more
    before ``now`` (the queue's clock). A worker receives at most its ``placement_limit``; a job
    whose ``not_before`` is after ``now`` is left alone. A job whose account (``quotas``: the
    capped accounts by name; others have no cap) would pass a cap with it, on top of what the
    account uses and what the round placed for it before, is neither placed nor reserves a
    worker: it waits with the reason :attr:`Plan.over_quota` gives, and the jobs after it are
    placed past it.

    With ``shares`` (fair share: the accounts' weights and use, by name; docs/fair-share.md),
    the jobs of several accounts are considered in :func:`actors.fair_share.fair_order`, by
    priority and then by weighted dominant share, instead of queue order; without it, or with
    one account, in queue order. ``held`` (worker_id -> job_id) keeps each of those workers for
    that job alone: nothing else is placed on it or reserves it, and the job is placed on it
    when it fits there (a preemption's freed room; actors/preemption.py).

    Raises:
        ValueError: unknown policy, a negative ``max_reservations``, or ``step_visits`` < 1.
    """
    if policy not in PLACEMENT_POLICIES:
        raise ValueError(f"policy must be one of {', '.join(PLACEMENT_POLICIES)}, got {policy!r}")
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
    ledger = QuotaLedger.of(queue.owners, quotas or {})
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
    # Device asks: a shape asking devices fits where a room also has its units (one test per
    # such shape over all workers); jobs asking none cost nothing more.
    shape_ask = table[:, 4]
    device_shapes = np.flatnonzero(shape_ask).tolist()
    devices = Devices.of(ordered, [queue.asks[a] for a in set(shape_ask[device_shapes].tolist())])

    def fit_by_shape(
        room_cpu: np.ndarray,
        room_mem: np.ndarray,
        among: np.ndarray | None = None,
        units: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        shapes = (shape_container, shape_group, shape_cpu, shape_mem)
        fits = fits_by_kind(*shapes, room_cpu, room_mem, runs_containers, group_rooms, among=among)
        for k in device_shapes:
            rooms = (room_cpu >= shape_cpu[k]) & (room_mem >= shape_mem[k]) & group_rooms[shape_group[k]]
            if among is not None:
                rooms &= among
            if shape_container[k]:
                rooms &= runs_containers
            fits[k] = bool((rooms & devices.able(queue.asks[shape_ask[k]], units)).any())
        return fits

    holdable = fit_by_shape(cap_cpu, cap_mem, units=devices.capacity)[queue.shape]
    # The reasons, one per shape of the jobs no worker could hold (from the cache while the
    # workers that take placements are the same): no Python work per job.
    cache = ReasonCache() if reason_cache is None else reason_cache
    key = cache.key_of(ordered)
    stuck = np.flatnonzero(~holdable)
    stuck_shapes = queue.shape[stuck]
    by_shape: dict[int, str] = {}
    present = np.flatnonzero(np.bincount(stuck_shapes, minlength=len(queue.shapes))).tolist()
    for count, k in enumerate(present, start=1):
        shape = queue.shapes[k]
        reason = cache.reason(shape, queue.groups[shape[3]], ordered, key, queue.asks[shape[4]])
        if reason is not None:
            by_shape[k] = reason
        if count % step_visits == 0:
            yield
    if len(by_shape) < len(present):
        keep = np.isin(stuck_shapes, np.fromiter(by_shape, dtype=np.int64))
        stuck, stuck_shapes = stuck[keep], stuck_shapes[keep]
    unschedulable = Unschedulable(stuck, queue.ids[stuck], stuck_shapes, by_shape)
    plan = Plan(placements=(), unschedulable=unschedulable)
    order = (
        None
        if shares is None
        else fair_order(
            owner=queue.owner,
            cpu=queue.cpu,
            mem=queue.mem,
            prio=queue.prio,
            candidate=(
                eligible & holdable
                if ledger is None
                else eligible & holdable & ledger.within(queue.owner, queue.cpu, queue.mem)
            ),
            owners=queue.owners,
            shares=shares,
            total_cpu_millis=float(cap_cpu.sum()),
            total_memory_mb=float(cap_mem.sum()),
        )
    )
    if order is None:
        q_ids, q_cpu, q_mem, q_owner, q_shape = queue.ids, queue.cpu, queue.mem, queue.owner, queue.shape
        q_group, q_container, q_since, q_eligible, q_holdable, q_ask = (
            queue.group,
            queue.container,
            queue.since,
            eligible,
            holdable,
            queue.ask,
        )
    else:
        q_ids, q_cpu, q_mem, q_owner, q_shape = (
            queue.ids[order],
            queue.cpu[order],
            queue.mem[order],
            queue.owner[order],
            queue.shape[order],
        )
        q_group, q_container, q_since, q_eligible, q_holdable, q_ask = (
            queue.group[order],
            queue.container[order],
            queue.since[order],
            eligible[order],
            holdable[order],
            queue.ask[order],
        )
    placements: list[tuple[int, str]] = []
    sizes, reservations, held_back, units = plan.sizes, plan.reservations, plan.held_back, plan.units
    unreserved = np.ones(len(ordered), dtype=bool)
    # Held workers: closed to every job but the one each is held for (its worker index).
    held_at: dict[int, int] = {}
    for worker_id, held_job in (held or {}).items():
        kept = position_of.get(worker_id)
        if kept is not None:
            unreserved[kept] = False
            held_at[int(held_job)] = kept
    held_positions = (
        np.flatnonzero(np.isin(q_ids, np.fromiter(held_at, dtype=np.int64)))
        if held_at
        else np.empty(0, np.int64)
    )
    limit = len(queue) if max_placements is None else max_placements
    position = visited = 0
    while ordered and position < len(queue) and len(placements) < limit:
        # The jobs from here on that fit at least one open worker's free room (unreserved, with
        # placements left), in queue order, and the first ones that fit no unreserved worker's
        # free room but some worker's capacity (reservation candidates: a job held back only by
        # a worker's placement limit reserves nothing). Rooms only shrink during a round, so the
        # fitting ones stay a superset of what fits: they are filtered again only after
        # MISSES_BEFORE_REFILTER jobs in a row no longer fit anywhere.
        window = slice(position, None)
        is_open = unreserved & (left > 0)
        shapes = q_shape[window]
        fitting = q_eligible[window] & fit_by_shape(free_cpu, free_mem, is_open)[shapes]
        within = None if ledger is None else ledger.within(q_owner[window], q_cpu[window], q_mem[window])
        if within is not None:
            fitting &= within  # use only grows in a round: a job over its caps stays so
        visit = fitting
        held_here = held_positions[held_positions >= position] - position
        if held_here.size:
            visit = fitting.copy()
            visit[held_here] = q_eligible[window][held_here]
        wanted = max_reservations - len(reservations)
        if wanted > 0:
            room_fit = (
                fitting
                if bool(np.array_equal(is_open, unreserved))
                else fit_by_shape(free_cpu, free_mem, unreserved)[shapes]
            )
            waited = (now - q_since[window]) >= reserve_after_s
            candidates = ~room_fit & q_holdable[window] & waited & q_eligible[window]
            blocked = np.flatnonzero(candidates if within is None else candidates & within)[:wanted]
            if blocked.size:
                visit = visit.copy()
                visit[blocked] = True
        refilter, misses = False, 0
        for offset in np.flatnonzero(visit).tolist():
            visited += 1
            if visited % step_visits == 0:
                yield
            index = position + offset
            job_id = int(q_ids[index])
            cpu, mem = int(q_cpu[index]), int(q_mem[index])
            owner = int(q_owner[index])
            if ledger is not None and not ledger.fits(owner, cpu, mem):
                continue  # over its caps now: waits (Plan.over_quota), reserving nothing
            allowed = group_rooms[int(q_group[index])]
            if q_container[index]:
                allowed = allowed & runs_containers
            ask = queue.asks[int(q_ask[index])]
            if ask:
                allowed = allowed & devices.able(ask, devices.capacity)
            anywhere = allowed
            failed_on = queue.failed_on.get(job_id)
            if failed_on:
                allowed = elsewhere(allowed, failed_on, position_of, cpu, mem, cap_cpu, cap_mem)
            held_on = held_at.get(job_id)
            opened = unreserved
            if held_on is not None:
                opened = unreserved.copy()
                opened[held_on] = True
            elif not fitting[offset]:
                if len(reservations) < max_reservations:
                    reserved = _reserve(cpu, mem, free_cpu, free_mem, cap_cpu, cap_mem, unreserved & allowed)
                    if reserved is not None:
                        unreserved[reserved] = False
                        reservations[names[reserved]] = job_id
                continue
            room = (free_cpu >= cpu) & (free_mem >= mem) & opened & (left > 0)
            if ask:
                room &= devices.able(ask)
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
                if ask:
                    score = score + devices.leftover(ask)
                if policy == "worst_fit":
                    chosen = int(np.argmax(np.where(fits, score, -np.inf)))
                else:
                    chosen = int(np.argmin(np.where(fits, score, np.inf)))
            free_cpu[chosen] -= cpu
            free_mem[chosen] -= mem
            left[chosen] -= 1
            placements.append((job_id, names[chosen]))
            sizes[job_id] = (cpu, mem)
            if ask:
                units[job_id] = devices.take(ask, chosen)
            if ledger is not None:
                ledger.take(owner, cpu, mem)
            if len(placements) >= limit:
                break
        if not refilter:
            break
    over_quota = None if ledger is None else _over_quota(queue, ledger, eligible, sizes, unschedulable)
    return attrs.evolve(plan, placements=tuple(placements), over_quota=over_quota)


def _over_quota(
    queue: PendingQueue,
    ledger: QuotaLedger,
    eligible: np.ndarray,
    sizes: Mapping[int, tuple[int, int]],
    unschedulable: Unschedulable,
) -> Unschedulable:
    """The jobs of the queue left over their account's caps as the round leaves them, with
    their reasons: neither placed, nor backing off, nor unschedulable (that reason wins)."""
    candidates = eligible.copy()
    candidates[unschedulable.at] = False
    if sizes:
        candidates &= ~np.isin(queue.ids, np.fromiter(sizes, dtype=np.int64))
    positions = np.flatnonzero(candidates)
    found, keys, said = ledger.reasons(queue.owner[positions], queue.cpu[positions], queue.mem[positions])
    at = positions[found]
    return Unschedulable(at, queue.ids[at], keys, said)


P = ParamSpec("P")
T = TypeVar("T")


def in_one_go(steps: Callable[P, Generator[None, None, T]]) -> Callable[P, T]:
    """The sliced computation ``steps`` as a function that runs it to its end at once
    (:func:`runtime.loops.finish`), with the same parameters."""

    def whole(*args: P.args, **kwargs: P.kwargs) -> T:
        return finish(steps(*args, **kwargs))

    return whole


place_queue = in_one_go(place_queue_steps)
""":func:`place_queue_steps` run to its end in one go (its parameters, its errors)."""


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
    """The workers of ``allowed`` a job of (``cpu``, ``mem``) that failed on ``failed_on`` may go
    to: those where it did not fail, when one of them could hold it by capacity; else ``allowed``
    (a soft preference, as Nomad's reschedule prefers a node no previous allocation used).
    ``position_of`` maps worker ids to their index in the arrays."""
    failed = np.zeros(allowed.size, dtype=bool)
    for worker_id in failed_on:
        k = position_of.get(worker_id)
        if k is not None:
            failed[k] = True
    if not failed.any():
        return allowed
    others = allowed & ~failed
    return others if (others & (cap_cpu >= cpu) & (cap_mem >= mem)).any() else allowed


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

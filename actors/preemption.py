"""Preemption's decision as a pure function: :func:`plan_preemptions` turns the pending jobs that
fit no free room (:class:`Candidate`), the running assignments they may stop (:class:`Running`)
and the accounts' shares (:class:`Shares`) into :class:`Preemption` decisions, each a worker and
the victims to stop there. docs/preemption.md.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs
import numpy as np

from actors.pending_queue import PendingQueue
from actors.quotas import AccountQuota
from actors.rooms import WorkerRoom
from runtime.constraints import satisfied

MAX_SCANNED = 256
"""Most queued jobs, from the head of the queue, :func:`candidates` looks at in one round."""


@attrs.frozen(kw_only=True)
class Candidate:
    """A pending job that fits some eligible worker's capacity but no free room now.

    Attributes:
        job_id: the job.
        priority: its priority; only running jobs of a lower one may be stopped for it.
        cpu_millis, memory_mb: its size (millicores, MiB).
        account: its owner (``jobs.owner``).
        worker_ids: the live workers it may run on whose whole capacity holds it (its
            constraints, container rule and retry rule already applied).
    """

    job_id: int
    priority: int
    cpu_millis: int
    memory_mb: int
    account: str
    worker_ids: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Running:
    """A running assignment that may be preempted: active, on a live worker, its job not in
    its cooldown nor already being preempted (the read filters those).

    Attributes:
        started_at_s: when its run started (or, not started yet, was placed), database time in
            unix seconds: the larger, the younger.
    """

    assignment_id: int
    job_id: int
    worker_id: str
    cpu_millis: int
    memory_mb: int
    priority: int
    account: str
    started_at_s: float


@attrs.frozen(kw_only=True)
class Shares:
    """What weighted dominant resource fairness (DRF: A. Ghodsi et al., "Dominant Resource
    Fairness: Fair Allocation of Multiple Resource Types", NSDI 2011) needs: the cluster's
    capacity, each account's use (cpu_millis, memory_mb of its assigned and running jobs) and
    the weights of the accounts with running or pending jobs (an account absent has weight 1).

    An account's dominant share is ``max(cpu used / cluster cpu, memory used / cluster
    memory)``; its fair share is its weight over the sum of the weights of the accounts with
    running or pending jobs (:attr:`active`).
    """

    cluster_cpu_millis: int
    cluster_memory_mb: int
    used: Mapping[str, tuple[int, int]]
    weights: Mapping[str, float] = attrs.field(factory=dict)
    active: frozenset[str] = frozenset()
    """The accounts with running or pending jobs (those of ``used`` count too)."""

    def fair_share(self, account: str) -> float:
        """``account``'s fair share of the cluster: its weight over the active accounts' sum."""
        accounts = self.active | set(self.used) | {account}
        total = sum(self.weights.get(a, 1.0) for a in accounts)
        return self.weights.get(account, 1.0) / total

    def dominant_share(self, cpu_millis: int, memory_mb: int) -> float:
        """The dominant share of a use of ``cpu_millis`` and ``memory_mb`` (0 to 1 and more)."""
        cpu = cpu_millis / self.cluster_cpu_millis if self.cluster_cpu_millis > 0 else 0.0
        memory = memory_mb / self.cluster_memory_mb if self.cluster_memory_mb > 0 else 0.0
        return max(cpu, memory)


@attrs.frozen(kw_only=True)
class Preemption:
    """A decision: stop ``victims`` on ``worker_id`` so that ``job_id`` fits there."""

    job_id: int
    worker_id: str
    victims: tuple[Running, ...]

    @property
    def assignment_ids(self) -> tuple[int, ...]:
        return tuple(v.assignment_id for v in self.victims)


def candidates(
    queue: PendingQueue,
    rooms: Sequence[WorkerRoom],
    *,
    skip: Collection[int],
    quotas: Mapping[str, AccountQuota] | None = None,
    limit: int,
    scanned: int = MAX_SCANNED,
) -> list[Candidate]:
    """The preemption candidates of a round, in queue order (highest priority first): of the
    first ``scanned`` queued jobs not in ``skip`` (placed this round, backing off, holding a
    worker already), at most ``limit`` that some room may take (its container rule and
    constraints) whose whole capacity holds them, but whose free room none holds now, and whose
    account's caps leave room for them; never a job asking devices.

    Args:
        rooms: the workers that take placements (not cordoned, not unhealthy), with their
            capacity and allocation.
        quotas: the capped accounts' caps and use (docs/quotas.md).
    """
    if not rooms or limit <= 0:
        return []
    cap_cpu = np.array([r.cpu_millis for r in rooms], dtype=np.int64)
    cap_mem = np.array([r.memory_mb for r in rooms], dtype=np.int64)
    free_cpu = cap_cpu - np.array([r.cpu_allocated_millis for r in rooms], dtype=np.int64)
    free_mem = cap_mem - np.array([r.memory_allocated_mb for r in rooms], dtype=np.int64)
    containers = np.array([r.runs_containers for r in rooms], dtype=bool)
    found: list[Candidate] = []
    for at in range(min(len(queue), scanned)):
        job_id = int(queue.ids[at])
        if job_id in skip or queue.ask[at]:
            # A job asking devices preempts nothing: what a preemption frees is judged by CPU and
            # memory alone, not by units (docs/devices.md).
            continue
        cpu, memory = int(queue.cpu[at]), int(queue.mem[at])
        account = queue.owners[int(queue.owner[at])]
        quota = (quotas or {}).get(account)
        if quota is not None and (
            (quota.cpu_millis is not None and quota.used_cpu_millis + cpu > quota.cpu_millis)
            or (quota.memory_mb is not None and quota.used_memory_mb + memory > quota.memory_mb)
        ):
            continue
        allowed = (cap_cpu >= cpu) & (cap_mem >= memory)
        if queue.container[at]:
            allowed &= containers
        constraints = queue.groups[int(queue.group[at])]
        if constraints:
            allowed &= np.array([satisfied(constraints, r.labels) for r in rooms], dtype=bool)
        if not allowed.any() or ((free_cpu >= cpu) & (free_mem >= memory) & allowed).any():
            continue
        found.append(
            Candidate(
                job_id=job_id,
                priority=int(queue.prio[at]),
                cpu_millis=cpu,
                memory_mb=memory,
                account=account,
                worker_ids=tuple(r.worker_id for r, ok in zip(rooms, allowed.tolist(), strict=True) if ok),
            )
        )
        if len(found) >= limit:
            break
    return found


def victim_order(victim: Running) -> tuple[int, float, int]:
    """The order victims are taken on a worker: lowest priority first, then youngest first
    (latest start), then the newest assignment."""
    return (victim.priority, -victim.started_at_s, -victim.assignment_id)


def plan_preemptions(
    candidates: Sequence[Candidate],
    free: Mapping[str, tuple[int, int]],
    running: Iterable[Running],
    shares: Shares,
    *,
    max_preemptions: int,
) -> tuple[Preemption, ...]:
    """The preemptions of one round: for each candidate in order (highest priority first), at
    most ``max_preemptions`` of them, one worker and the victims to stop there.

    On each of a candidate's workers not chosen earlier in the round, the running jobs of lower
    priority not taken yet are taken in :func:`victim_order` until the worker's free room and
    what they hold fit the candidate; the worker needing the fewest victims is chosen (ties: the
    lowest priority among the victims' highest, then the youngest youngest victim, then the
    worker id). A candidate no worker can make room for is skipped. Fair share: a victim of
    another account than the candidate's is taken only while that account's dominant share
    without it (and without the victims taken before it) stays at or above its fair share
    (:class:`Shares`); such a victim is passed over, and the next in order tried.

    Args:
        candidates: the jobs to make room for, highest priority first.
        free: worker_id -> its free room now, (cpu_millis, memory_mb).
        running: the preemptible running assignments.
        shares: the accounts' use and weights, and the cluster's capacity.
        max_preemptions: most candidates preempted for.

    Returns:
        The decisions, in candidate order; each victim in at most one, each worker in at most one.

    Raises:
        ValueError: ``max_preemptions`` is below 0.
    """
    if max_preemptions < 0:
        raise ValueError(f"max_preemptions must be >= 0, got {max_preemptions}")
    on_worker: dict[str, list[Running]] = {}
    for victim in running:
        on_worker.setdefault(victim.worker_id, []).append(victim)
    for on_one in on_worker.values():
        on_one.sort(key=victim_order)
    used = {account: (cpu, memory) for account, (cpu, memory) in shares.used.items()}
    taken: set[int] = set()
    chosen_workers: set[str] = set()
    decisions: list[Preemption] = []
    for candidate in candidates:
        if len(decisions) >= max_preemptions:
            break
        best: tuple[tuple[int, int, float, str], str, list[Running]] | None = None
        for worker_id in sorted(set(candidate.worker_ids)):
            if worker_id in chosen_workers or worker_id not in free:
                continue
            needed = _victims_on(
                candidate, free[worker_id], on_worker.get(worker_id, ()), taken, used, shares
            )
            if not needed:
                continue
            key = (
                len(needed),
                max(v.priority for v in needed),
                -max(v.started_at_s for v in needed),
                worker_id,
            )
            if best is None or key < best[0]:
                best = (key, worker_id, needed)
        if best is None:
            continue
        _, worker_id, victims = best
        chosen_workers.add(worker_id)
        for victim in victims:
            taken.add(victim.assignment_id)
            cpu, memory = used.get(victim.account, (0, 0))
            used[victim.account] = (cpu - victim.cpu_millis, memory - victim.memory_mb)
        decisions.append(Preemption(job_id=candidate.job_id, worker_id=worker_id, victims=tuple(victims)))
    return tuple(decisions)


def _victims_on(
    candidate: Candidate,
    room: tuple[int, int],
    victims: Iterable[Running],
    taken: set[int],
    used: Mapping[str, tuple[int, int]],
    shares: Shares,
) -> list[Running] | None:
    """The victims to stop on one worker for ``candidate``, in :func:`victim_order`; None when
    those it may take do not make room. An empty list: it fits already (nothing to preempt)."""
    cpu_free, memory_free = room
    chosen: list[Running] = []
    lost: dict[str, tuple[int, int]] = {}
    for victim in victims:
        if cpu_free >= candidate.cpu_millis and memory_free >= candidate.memory_mb:
            break
        if victim.assignment_id in taken or victim.priority >= candidate.priority:
            continue
        if victim.account != candidate.account:
            cpu_lost, memory_lost = lost.get(victim.account, (0, 0))
            cpu_used, memory_used = used.get(victim.account, (0, 0))
            after = shares.dominant_share(
                cpu_used - cpu_lost - victim.cpu_millis, memory_used - memory_lost - victim.memory_mb
            )
            if after < shares.fair_share(victim.account):
                continue  # the account would fall below its fair share
            lost[victim.account] = (cpu_lost + victim.cpu_millis, memory_lost + victim.memory_mb)
        chosen.append(victim)
        cpu_free += victim.cpu_millis
        memory_free += victim.memory_mb
    if cpu_free >= candidate.cpu_millis and memory_free >= candidate.memory_mb:
        return chosen
    return None

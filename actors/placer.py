"""The placer: every round (100 ms), pending jobs x free capacity -> best fit -> fenced commit -> dispatch.

A round reads the live workers (allocation included, kept exact by the database's triggers),
brings its in-memory pending queue up to date, decides with :func:`actors.placement.place_queue`,
asks the ledger to commit all placements in one fenced transaction, and only then hands each
worker its batch to the dispatcher (invariant 4: nothing is sent before it is committed). A
refused commit (StaleEpoch) or a failed one sends nothing; a commit whose outcome is unknown
(connection lost at COMMIT) sends nothing either, and the reconciler re-sends what did commit
once it finds it unconfirmed.

The pending queue is read in full when the replica becomes leader, after a failed read or
commit, and every ``resync_interval_s``; in between a round reads only the jobs that became
pending since its previous read, and no job waits for a resync because transactions commit out
of order (see :class:`actors.placer_store.PendingMark`): a job is read by the first round whose
read begins after the transaction that made it pending committed. The resync only repairs what a read left out
by design (beyond ``max_jobs_per_round``) and rows written before ``jobs.pending_xid``
existed. A job the queue misses is only placed later; the claim in the commit (pending jobs
only) keeps a stale queue from ever placing a job twice. When neither the queue nor any worker's
free room changed since a round that found nothing to do, the decision is skipped.

Under overload (DESIGN.md): a round places on a worker at most what its send window allows
(:func:`actors.placement.placement_limit`, from the counters the database keeps in the worker's
row), so a new, re-registered or stalled worker is not flooded; a requeued job waits out its
backoff (``jobs.not_before``, read as a wait in seconds by database time and kept in the queue
in trio time) before it is placed again, and its pending reason says so; and the decision runs
in slices with a checkpoint between them, so a large round does not hold the event loop.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs
import numpy as np
import trio

from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    Connect,
    Dispatch,
    DispatcherInbox,
    LedgerInbox,
    Placement,
    WorkerRef,
)
from actors.placement import (
    PendingQueue,
    Plan,
    ReasonCache,
    Unschedulable,
    place_queue_steps,
    placement_limit,
)
from actors.placer_store import LiveWorker, PendingMark, PlacerStore, WaitingJob
from actors.placer_store import PgPlacerStore as PgPlacerStore  # ops.benchpack imports it from here
from actors.role import RoleView
from actors.write_size import WriteSize
from runtime import faults, log, metrics
from runtime.errors import DatabaseBusy, DatabaseUnavailable, StaleEpoch
from runtime.loops import finish, finish_in_slices
from runtime.reply import Reply
from runtime.settings.leader import (
    DEFAULT_MAX_ROWS_PER_FENCED_WRITE,
    PlacerSettings,
)


def _not_before(waiting: list[WaitingJob]) -> dict[int, float]:
    """job_id -> trio time before which it must not be placed, for the jobs read with a backoff
    wait. Counted from now, after the read returned: never earlier than the database's
    ``not_before``, whose wait was computed when the read began."""
    now = trio.current_time()
    return {w.job.job_id: now + w.wait_s for w in waiting if w.wait_s > 0}


RoundOutcome = Literal["unchanged", "nothing", "commit"]
"""What a round's plan says: ``unchanged`` (neither the queue nor any worker's room changed
since a round that found nothing to do: nothing decided), ``nothing`` (decided; nothing to
write), ``commit`` (placements or pending reasons to commit, then dispatch)."""


@attrs.frozen(kw_only=True)
class RoundPlan:
    """What one round commits and dispatches, as :func:`plan_round` decides it.

    Attributes:
        outcome: see :data:`RoundOutcome`.
        fingerprint: the round's queue version, jobs backing off and free rooms; a round that
            finds nothing to do keeps it, and the next round with the same one decides nothing.
        backing_off: the queued jobs whose requeue backoff has not passed.
        placements: what to commit, in decision order (priority, then submission).
        reasons: (job_id, pending reason) pairs to store with the placements; an empty reason
            clears a stored one. No more than the rows the placements leave of the write.
        reservations: the job ids holding a reservation in this round, ascending (empty when
            the outcome is ``unchanged``: nothing was decided).
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
        assignments in the order they were placed (priority, then submission), which the
        statement's rows do not keep: a worker starts a batch's jobs in the order it receives
        them. Workers in the order of their first assignment."""
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
    """An unschedulable ``reason``, judged on the workers that take placements, saying which
    live workers it left out because they are cordoned or draining (``cordoned``, their ids)
    or marked unhealthy (``unhealthy``): ``"unschedulable: no live workers (not counting
    cordoned w-1, w-2; unhealthy w-3)"``; ``reason`` itself when none is. Without it, a job that
    only such a worker could hold would read as too large for the cluster, or a cluster whose
    every worker is cordoned as having none."""
    left_out = [
        f"{what} {_named(ids)}" for what, ids in (("cordoned", cordoned), ("unhealthy", unhealthy)) if ids
    ]
    if not left_out:
        return reason
    return f"{reason} (not counting {'; '.join(left_out)})"


def waiting_elsewhere(failed_on: Sequence[str]) -> str:
    """The pending reason of a retry that only workers where it failed have room for now:
    ``"waiting for a worker where it has not failed (failed on w-3)"``."""
    return f"waiting for a worker where it has not failed (failed on {_named(sorted(failed_on))})"


def probe_limit(worker: LiveWorker, limit: int) -> int:
    """Most jobs a round may place on ``worker`` with a send window of ``limit``: ``limit`` for a
    healthy worker out of trial; one job while it holds none for a worker on trial (newly
    registered, or its mark cleared, and nothing there succeeded since) and for an unhealthy
    one whose probe is due (its probe: :mod:`actors.health`), none for other unhealthy ones.
    Like the probe, the trial keeps a broken worker, whose jobs fail at once and so leave it
    always room, from taking a burst of jobs before its failures are judged."""
    if not worker.unhealthy and not worker.trial:
        return limit
    idle = worker.room.cpu_allocated_millis == 0 and worker.unconfirmed == 0
    return min(limit, 1) if idle and (worker.probe_due or not worker.unhealthy) else 0


def _changed_unschedulable(
    queue: PendingQueue, unschedulable: Unschedulable, cordoned: Sequence[str], unhealthy: Sequence[str]
) -> list[tuple[int, str]]:
    """(job_id, reason) for the unschedulable jobs whose reason (:func:`not_counting_cordoned`)
    is not the one stored, in queue order: worked out once per shape and compared with the
    stored ones column by column, so only the changed ones cost Python work."""
    if not unschedulable.at.size:
        return []
    said = {k: not_counting_cordoned(r, cordoned, unhealthy) for k, r in unschedulable.by_shape.items()}
    wanted = np.full(len(queue.shapes), -2, dtype=np.int64)
    for k, reason in said.items():
        wanted[k] = queue.code_of(reason)
    changed = queue.reason_code[unschedulable.at] != wanted[unschedulable.shapes]
    return [
        (job_id, said[k])
        for job_id, k in zip(
            unschedulable.ids[changed].tolist(), unschedulable.shapes[changed].tolist(), strict=True
        )
    ]


def plan_round_steps(
    queue: PendingQueue,
    workers: Sequence[LiveWorker],
    settings: PlacerSettings,
    *,
    max_rows: int,
    now: float,
    idle_fingerprint: tuple[Any, ...] | None = None,
    reason_cache: ReasonCache | None = None,
) -> Generator[None, None, RoundPlan]:
    """:func:`plan_round` in slices: yields between slices of the decision
    (:func:`actors.placement.place_queue_steps`) and returns the same plan. Neither the queue
    nor the workers may change meanwhile; neither is changed (``reason_cache``, a memo, may be)."""
    # A cordoned (or draining) worker takes no placement, nor an unhealthy one whose probe is not
    # due: it is not a room at all, so it is neither placed on nor reserved; the reasons name it
    # (not_counting_cordoned). An unhealthy one whose probe is due takes one job at a time, as
    # does one on trial (probe_limit) while a proven worker takes placements: a cluster whose
    # workers are all new (or all just re-admitted) has nowhere better to send its jobs.
    cordoned = tuple(sorted(w.ref.worker_id for w in workers if w.cordoned))
    unhealthy = tuple(
        sorted(w.ref.worker_id for w in workers if w.unhealthy and not w.cordoned and not w.probe_due)
    )
    workers = [w for w in workers if not w.cordoned and not (w.unhealthy and not w.probe_due)]
    if not any(not w.trial and not w.unhealthy for w in workers):
        workers = [attrs.evolve(w, trial=False) for w in workers]
    rooms = [
        attrs.evolve(
            w.room,
            placement_limit=probe_limit(
                w,
                placement_limit(
                    w.confirmed,
                    w.unconfirmed,
                    initial_window=settings.initial_window,
                    max_unconfirmed=settings.max_unconfirmed_per_worker,
                ),
            ),
        )
        for w in workers
    ]
    backing_off = frozenset(queue.waiting_for_backoff(now))
    fingerprint = (
        queue.version,
        len(backing_off),
        tuple(
            sorted(
                (
                    w.ref.worker_id,
                    w.ref.incarnation,
                    room.cpu_millis - room.cpu_allocated_millis,
                    room.memory_mb - room.memory_allocated_mb,
                    room.placement_limit,
                )
                for w, room in zip(workers, rooms, strict=True)
            )
        ),
        cordoned,
        unhealthy,
    )
    if fingerprint == idle_fingerprint:
        return RoundPlan(outcome="unchanged", fingerprint=fingerprint, backing_off=backing_off)
    by_id = {w.ref.worker_id: w.ref for w in workers}
    plan: Plan = yield from place_queue_steps(
        queue,
        rooms,
        policy=settings.policy,
        max_placements=min(settings.max_placements_per_round, max_rows),
        max_reservations=settings.max_reservations,
        reserve_after_s=settings.reserve_after_s,
        now=now,
        reason_cache=reason_cache,
    )
    placed = plan.placements_by_job
    reasons = _changed_unschedulable(queue, plan.unschedulable, cordoned, unhealthy)
    waiting = {job_id: waiting_elsewhere(failed_on) for job_id, failed_on in plan.held_back.items()}
    reasons += [(job_id, r) for job_id, r in waiting.items() if queue.reasons.get(job_id) != r]
    # A stored reason no longer holds once the job is placed or may be (a job waiting out its
    # backoff keeps the reason its requeue wrote). Found among the jobs with a stored reason
    # that are neither unschedulable nor backing off, column by column.
    stored = (queue.reason_code >= 0) & (queue.not_before <= now)
    stored[plan.unschedulable.at] = False
    reasons += [
        (job_id, "")
        for job_id in queue.ids[stored].tolist()
        if job_id not in waiting and job_id not in placed
    ]
    # One fenced statement: reasons fill what the placements leave of its rows; the rest are
    # not recorded as stored, so later rounds send them.
    del reasons[max(0, max_rows - len(plan.placements)) :]
    placements = tuple(
        Placement(
            job_id=job_id,
            worker_id=worker_id,
            incarnation=by_id[worker_id].incarnation,
            cpu_millis=plan.sizes[job_id][0],
            memory_mb=plan.sizes[job_id][1],
        )
        for job_id, worker_id in plan.placements
    )
    return RoundPlan(
        outcome="commit" if placements or reasons else "nothing",
        fingerprint=fingerprint,
        backing_off=backing_off,
        placements=placements,
        reasons=tuple(reasons),
        reservations=tuple(sorted(plan.reservations.values())),
        workers=by_id,
    )


def plan_round(
    queue: PendingQueue,
    workers: Sequence[LiveWorker],
    settings: PlacerSettings,
    *,
    max_rows: int,
    now: float,
    idle_fingerprint: tuple[Any, ...] | None = None,
    reason_cache: ReasonCache | None = None,
) -> RoundPlan:
    """What one round commits and dispatches: a pure function of the round's inputs.

    A cordoned or draining worker is given nothing, nor an unhealthy one but a probe when it is
    due (:func:`probe_limit`; the unschedulable reasons name them: :func:`not_counting_cordoned`);
    one on trial is given one job at a time while another worker that takes placements is out
    of trial (:func:`probe_limit`);
    a retry goes elsewhere than where it failed when it can (:func:`actors.placement.elsewhere`).
    Each worker's send window bounds what it is given
    (:func:`actors.placement.placement_limit` from its confirmed and unconfirmed assignments);
    jobs waiting out their requeue backoff at
    ``now`` are neither placed nor reserve a worker; the placements are decided by
    :func:`actors.placement.place_queue_steps` (never over a worker's free room, never a job
    twice); the pending reasons that changed fill what the placements leave of ``max_rows``.

    Args:
        queue: the pending jobs (not changed).
        workers: the live workers, with their allocation and send-window counters.
        settings: the policy, the bounds per round and per worker, the reservations.
        max_rows: most rows the round's fenced statement may carry (placements and reasons).
        now: the queue's clock at the read (seconds): backoffs and reservation waits end by it.
        idle_fingerprint: the fingerprint of the last round that found nothing to do, if the
            queue has not changed since; a round with the same one decides nothing.
        reason_cache: the unschedulable reasons by job shape from earlier rounds (a memo, kept by
            the caller; :class:`actors.placement.ReasonCache`): the plan is the same without it.

    Returns:
        The :class:`RoundPlan`.

    Raises:
        ValueError: the settings name an unknown policy.
    """
    steps = plan_round_steps(
        queue,
        workers,
        settings,
        max_rows=max_rows,
        now=now,
        idle_fingerprint=idle_fingerprint,
        reason_cache=reason_cache,
    )
    return finish(steps)


def packing(workers: Sequence[LiveWorker]) -> tuple[int, int, int, int, int]:
    """``(workers, cpu_millis, cpu_allocated_millis, memory_mb, memory_allocated_mb)`` of the
    live workers a round read: their count and their capacity and allocation, summed."""
    cpu = cpu_allocated = memory = memory_allocated = 0
    for worker in workers:
        room = worker.room
        cpu += room.cpu_millis
        cpu_allocated += room.cpu_allocated_millis
        memory += room.memory_mb
        memory_allocated += room.memory_allocated_mb
    return len(workers), cpu, cpu_allocated, memory, memory_allocated


def _show_packing(workers: Sequence[LiveWorker]) -> None:
    """Show what a round read in the cluster packing gauges (one pass over the workers)."""
    count, cpu, cpu_allocated, memory, memory_allocated = packing(workers)
    metrics.set_cluster_packing(
        workers=count,
        cpu_millis=cpu,
        cpu_allocated_millis=cpu_allocated,
        memory_mb=memory,
        memory_allocated_mb=memory_allocated,
    )


def _forget_packing() -> None:
    """A standby shows no packing: the leader's gauges are the cluster's."""
    metrics.set_cluster_packing(
        workers=0, cpu_millis=0, cpu_allocated_millis=0, memory_mb=0, memory_allocated_mb=0
    )


@attrs.define
class RoundStats:
    """Recent rounds while jobs were pending (trio clock seconds), newest last."""

    durations_s: deque[float] = attrs.field(factory=lambda: deque(maxlen=10_000))
    pending_counts: deque[int] = attrs.field(factory=lambda: deque(maxlen=10_000))
    placements: int = 0
    max_s: float = 0.0


@attrs.define
class Placer:
    """The actor."""

    settings: PlacerSettings
    store: PlacerStore
    role: RoleView
    ledger: trio.MemorySendChannel[LedgerInbox]
    dispatcher: trio.MemorySendChannel[DispatcherInbox]
    stats: RoundStats = attrs.field(factory=RoundStats)
    queue: PendingQueue = attrs.field(factory=PendingQueue)
    max_rows_per_fenced_write: int = DEFAULT_MAX_ROWS_PER_FENCED_WRITE
    """Most placements and pending reasons one round's fenced statement may write (the
    ledger's ``max_rows_per_fenced_write``): reasons beyond what the placements leave wait for
    later rounds. While the database is slow, rounds write fewer (:mod:`actors.write_size`)."""
    _write_size: WriteSize | None = None
    _synced_epoch: int | None = None
    _failed_rounds: int = 0
    """Rounds failed in a row (the database unreachable); logged at the first and the end."""
    _synced_at: float = -math.inf
    _connect_epoch: int | None = None
    _connected: set[tuple[str, str]] = attrs.field(factory=set)
    """(worker_id, address) the dispatcher was told to connect to under ``_connect_epoch``."""
    _mark: PendingMark = attrs.field(factory=PendingMark)
    _idle_fingerprint: tuple[Any, ...] | None = None
    _reserving: list[int] = attrs.field(factory=list)
    """Jobs that held reservations in the last deciding round."""
    _reasons: ReasonCache = attrs.field(factory=ReasonCache)
    """Unschedulable reasons by job shape while the workers stay the same (a memo)."""
    _reserving_checked_at: float = -math.inf
    _log: Any = attrs.field(factory=lambda: log.get("placer"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run rounds every ``round_interval_s`` while leader, until cancelled."""
        await self.role.every_interval_while_leader(
            self.settings.round_interval_s,
            self._logged_round,
            on_standby=_forget_packing,
            task_status=task_status,
        )

    async def _logged_round(self, epoch: int) -> None:
        """:meth:`round`, its refusal or failure logged (the queue is read in full next)."""
        try:
            await self.round(epoch)
            if self._failed_rounds:
                self._log.info("rounds succeed again", failed_rounds=self._failed_rounds)
                self._failed_rounds = 0
        except StaleEpoch as exc:
            self._log.info("round refused: deposed", epoch=exc.epoch, epoch_seen=exc.epoch_seen)
            self._synced_epoch = None
        except DatabaseUnavailable as exc:
            # Once per streak of failures, not once per round (the database is away).
            if not self._failed_rounds:
                self._log.warning("round failed", error=str(exc))
            self._failed_rounds += 1
            self._synced_epoch = None

    async def _read(self, epoch: int) -> list[LiveWorker]:
        """The live workers, with the pending queue brought up to date: in full, or what
        became pending since (both in one round trip)."""
        s = self.settings
        now = trio.current_time()
        if self._synced_epoch != epoch or now - self._synced_at >= s.resync_interval_s:
            workers = await self.store.live_workers(s.worker_fresh_s)
            waiting, self._mark = await self.store.pending_jobs(s.max_jobs_per_round)
            self.queue.replace(
                [w.job for w in waiting],
                {w.job.job_id: w.reason for w in waiting},
                now=now,
                not_before=_not_before(waiting),
            )
            self._synced_epoch, self._synced_at = epoch, now
            return workers
        workers, waiting, self._mark = await self.store.read_round(
            s.worker_fresh_s, self._mark, s.max_jobs_per_round
        )
        if waiting:
            self.queue.add(
                [w.job for w in waiting],
                {w.job.job_id: w.reason for w in waiting},
                now=now,
                not_before=_not_before(waiting),
            )
        return workers

    async def round(self, epoch: int) -> tuple[CommittedAssignment, ...]:
        """One round under ``epoch``: read, decide (:func:`plan_round`), commit, dispatch.
        Returns what committed.

        Raises:
            StaleEpoch: the ledger refused the commit; nothing was sent.
            DatabaseUnavailable: reading or committing failed; nothing was sent.
        """
        started = trio.current_time()
        s = self.settings
        workers = await self._read(epoch)
        _show_packing(workers)
        self._connect_ahead(epoch, workers)
        if self._reserving and trio.current_time() - self._reserving_checked_at >= s.reserving_recheck_s:
            # A job keeps a worker free only while it is pending: drop one cancelled since
            # (asked at most once every reserving_recheck_s, not on every round of a backlog).
            self.queue.remove(await self.store.no_longer_pending(self._reserving))
            self._reserving_checked_at = trio.current_time()
            self._reserving = []
        read_done = trio.current_time()
        metrics.PLACER_PENDING_JOBS.set(len(self.queue))
        if not len(self.queue):
            metrics.ROUNDS.labels("empty").inc()
            return ()
        plan = await self._plan(workers, now=read_done)
        metrics.PLACER_BACKOFF_JOBS.set(len(plan.backing_off))
        metrics.PLACER_PHASE_SECONDS.labels("read").observe(read_done - started)
        if plan.outcome == "unchanged":
            self._observe(started, 0, "unchanged")
            return ()
        metrics.PLACER_RESERVATIONS.set(len(plan.reservations))
        self._reserving = list(plan.reservations)
        if plan.outcome == "nothing":
            self._idle_fingerprint = plan.fingerprint
            self._observe(started, 0, "nothing")
            return ()
        decided = trio.current_time()
        metrics.PLACER_PHASE_SECONDS.labels("decide").observe(decided - read_done)
        await faults.hit("placer.before_commit")
        reply: Reply[tuple[CommittedAssignment, ...]] = Reply()
        await self.ledger.send(
            CommitPlacements(epoch=epoch, placements=plan.placements, reasons=plan.reasons, reply=reply)
        )
        try:
            committed = await reply.wait()
        except DatabaseBusy:
            self._write_size = self.write_size().after_cancel()
            raise
        self._write_size = self.write_size().after_success()
        commit_done = trio.current_time()
        metrics.PLACER_PHASE_SECONDS.labels("commit").observe(commit_done - decided)
        # Placed or not (a job cancelled or claimed meanwhile), none of them is pending any more.
        self.queue.remove(plan.placed_job_ids)
        self.queue.store_reasons(plan.reasons)
        self._idle_fingerprint = None
        for dispatch in plan.dispatches(epoch, committed):
            try:
                self.dispatcher.send_nowait(dispatch)  # no checkpoint: the round does not yield here
            except trio.WouldBlock:
                await self.dispatcher.send(dispatch)
        metrics.PLACER_PHASE_SECONDS.labels("dispatch").observe(trio.current_time() - commit_done)
        self.stats.placements += len(committed)
        metrics.PLACEMENTS.inc(len(committed))
        if committed:
            # One line per round that placed, its ids as parallel lists (runtime/log.py): a round
            # of 500 placements costs one line, not 500.
            self._log.info(
                "placed",
                epoch=epoch,
                count=len(committed),
                job_ids=[c.job_id for c in committed],
                assignment_ids=[c.assignment_id for c in committed],
                worker_ids=[c.worker_id for c in committed],
            )
        self._observe(started, len(committed), "placed" if committed else "reasons")
        return committed

    def _connect_ahead(self, epoch: int, workers: Sequence[LiveWorker]) -> None:
        """Have the dispatcher open connections to live workers it has not been told of under
        ``epoch``, so a new leader's first assignments (and a fresh cluster's) do not wait for
        a hundred connection set-ups (TLS handshakes) on this loop. Best effort: when the
        dispatcher's inbox is full, the workers are told of in a later round."""
        if epoch != self._connect_epoch:
            self._connect_epoch, self._connected = epoch, set()
        new = tuple(w.ref for w in workers if (w.ref.worker_id, w.ref.address) not in self._connected)
        if not new:
            return
        try:
            self.dispatcher.send_nowait(Connect(workers=new))
        except trio.WouldBlock:
            return
        self._connected.update((ref.worker_id, ref.address) for ref in new)

    def write_size(self) -> WriteSize:
        """How many rows the next round's fenced statement may carry (see
        :mod:`actors.write_size`)."""
        if self._write_size is None or self._write_size.most != self.max_rows_per_fenced_write:
            self._write_size = WriteSize.full(self.max_rows_per_fenced_write)
        return self._write_size

    async def _plan(self, workers: list[LiveWorker], *, now: float) -> RoundPlan:
        """The round's :class:`RoundPlan`, decided in slices with a checkpoint between them, so
        a large queue does not hold the event loop (see :func:`plan_round_steps`). The queue is
        not changed meanwhile: only this task changes it."""
        steps = plan_round_steps(
            self.queue,
            workers,
            self.settings,
            max_rows=self.write_size().rows,
            now=now,
            idle_fingerprint=self._idle_fingerprint,
            reason_cache=self._reasons,
        )
        return await finish_in_slices(steps)

    def _observe(self, started: float, placed: int, outcome: str) -> None:
        elapsed = trio.current_time() - started
        self.stats.durations_s.append(elapsed)
        self.stats.pending_counts.append(len(self.queue) + placed)
        metrics.PLACER_ROUND_SECONDS.observe(elapsed)
        if elapsed > self.stats.max_s:
            self.stats.max_s = elapsed
            metrics.PLACER_ROUND_MAX_SECONDS.set(elapsed)
        metrics.ROUNDS.labels(outcome).inc()
        if placed:
            self._log.debug(
                "round", placed=placed, pending=len(self.queue), elapsed_ms=round(elapsed * 1000, 2)
            )

"""The placer: every round (100 ms), pending jobs x free capacity -> best fit -> fenced commit -> dispatch.

A round reads the live workers and brings its in-memory pending queue up to date
(:mod:`actors.placer_store`), decides (:func:`actors.round_plan.plan_round`), asks the ledger to
commit all placements in one fenced transaction, and only then hands each worker its batch to
the dispatcher (invariant 4). docs/design.md, "The placer's round".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from actors.fair_share import AccountShare
from actors.gang_queue import GangQueue
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    Connect,
    DispatcherInbox,
    PreemptAssignments,
)
from actors.pending_queue import PendingQueue
from actors.placer_store import LiveWorker, PendingMark, PlacerStore, WaitingJob
from actors.preemption import Preemption, candidates, plan_preemptions
from actors.role import RoleView
from actors.rooms import ReasonCache
from actors.round_plan import RoundPlan, plan_round_steps
from actors.write_size import FencedWrites
from runtime import faults, log, metrics
from runtime.errors import DatabaseUnavailable, StaleEpoch
from runtime.loops import finish_in_slices
from runtime.settings.leader import PREEMPT_HOLD_MARGIN_S, PlacerSettings

PREEMPT_RECHECK_S = 1.0
"""While the same jobs are preemption candidates, the placer reads what they may preempt at
most this often (seconds): a round with nothing to preempt for costs no read."""

FAIR_SHARE_PAST_REFRESH_S = 30.0
"""How often the placer reads the accounts' decayed past use (a scan of the runs of the last
10 half-lives: queries.ACCOUNT_PAST_USE), in seconds."""


def _not_before(waiting: list[WaitingJob]) -> dict[int, float]:
    """job_id -> trio time before which it must not be placed, for the jobs read with a backoff
    wait (counted from after the read: never earlier than the database's ``not_before``)."""
    now = trio.current_time()
    return {w.job.job_id: now + w.wait_s for w in waiting if w.wait_s > 0}


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
    """Show what a round read in the cluster packing gauges (none: a standby's, all zero)."""
    count, cpu, cpu_allocated, memory, memory_allocated = packing(workers)
    metrics.set_cluster_packing(
        workers=count,
        cpu_millis=cpu,
        cpu_allocated_millis=cpu_allocated,
        memory_mb=memory,
        memory_allocated_mb=memory_allocated,
    )


@attrs.define
class RoundStats:
    """Recent rounds while jobs were pending (trio clock seconds), newest last."""

    durations_s: deque[float] = attrs.field(factory=lambda: deque(maxlen=10_000))
    pending_counts: deque[int] = attrs.field(factory=lambda: deque(maxlen=10_000))
    placements: int = 0
    max_s: float = 0.0


@attrs.define
class Placer(FencedWrites):
    """The actor; its rounds' commits are fenced writes of at most :meth:`write_size` rows."""

    settings: PlacerSettings
    store: PlacerStore
    role: RoleView
    dispatcher: trio.MemorySendChannel[DispatcherInbox]
    stats: RoundStats = attrs.field(factory=RoundStats)
    queue: PendingQueue = attrs.field(factory=PendingQueue)
    gangs: GangQueue = attrs.field(factory=GangQueue)
    """The pending gangs' tasks, placed only whole (docs/gangs.md)."""
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
    _holds_until: dict[str, tuple[int, float]] = attrs.field(factory=dict)
    """worker_id -> (the job it is kept for alone, until when: trio time): the room its
    preemption frees goes to that job (docs/preemption.md). Kept for the term that preempted."""
    _held_epoch: int | None = None
    _preempt_checked: tuple[tuple[int, ...], float] = ((), -math.inf)
    """The candidates of the last preemption read, and when it was (trio time)."""
    _shares: dict[str, AccountShare] = attrs.field(factory=dict)
    """Fair share's accounts as last read."""
    _past_read_at: float = -math.inf
    _past: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    """Account -> its decayed past use (cpu_millis, memory_mb) as last read."""
    held: dict[str, int] = attrs.field(factory=dict)
    """worker_id -> the job it is kept for alone this round (a preemption's freed room): the
    holds of ``_holds_until`` still in force, worked out at each round's start (:meth:`_holds`)."""
    _log: Any = attrs.field(factory=lambda: log.get("placer"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run rounds every ``round_interval_s`` while leader, until cancelled."""
        await self.role.every_interval_while_leader(
            self.settings.round_interval_s,
            self._logged_round,
            on_standby=lambda: _show_packing(()),
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
        full = self._synced_epoch != epoch or now - self._synced_at >= s.resync_interval_s
        if full:
            workers = await self.store.live_workers(s.worker_fresh_s)
            waiting, self._mark = await self.store.pending_jobs(s.max_jobs_per_round)
            self._synced_epoch, self._synced_at = epoch, now
        else:
            # Fair share's use of each account, in the same round trip, when the single jobs and
            # gangs held are two accounts' or more (else it scans nothing).
            self.store.with_account_use = s.fair_share and self._accounts_waiting() > 1
            workers, waiting, self._mark = await self.store.read_round(
                s.worker_fresh_s, self._mark, s.max_jobs_per_round
            )
        if full or waiting:
            # A gang's tasks wait in the gang queue, placed only whole (actors/gang_queue.py).
            tasks = [(w.job, w.gang, w.reason) for w in waiting if w.gang is not None]
            if tasks or full:
                (self.gangs.replace if full else self.gangs.add)(
                    tasks, now=now, not_before=_not_before([w for w in waiting if w.gang is not None])
                )
                waiting = [w for w in waiting if w.gang is None]
            jobs, reasons = [w.job for w in waiting], {w.job.job_id: w.reason for w in waiting}
            (self.queue.replace if full else self.queue.add)(
                jobs, reasons, now=now, not_before=_not_before(waiting)
            )
        return workers

    def _accounts_waiting(self) -> int:
        """How many accounts own the single jobs and gang tasks held (fair share orders both)."""
        return len(self.queue.accounts() | self.gangs.accounts())

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
            gone = await self.store.no_longer_pending(self._reserving)
            self.queue.remove(gone)
            self.gangs.remove(gone)
            self._reserving_checked_at = trio.current_time()
            self._reserving = []
        if s.fair_share and self._accounts_waiting() > 1:
            await self._read_shares(self.store.account_use)
        read_done = trio.current_time()
        metrics.PLACER_PENDING_JOBS.set(len(self.queue))
        self.held = self._holds(epoch, read_done, {w.ref.worker_id for w in workers})
        if not len(self.queue) and not len(self.gangs):
            metrics.ROUNDS.labels("empty").inc()
            return ()
        steps = plan_round_steps(
            self.queue,
            workers,
            self.settings,
            max_rows=self.write_size().rows,
            now=read_done,
            idle_fingerprint=self._idle_fingerprint,
            reason_cache=self._reasons,
            quotas=self.store.quotas,
            shares=self._shares if s.fair_share else None,
            held=self.held or None,
            gangs=self.gangs.whole() if len(self.gangs) else (),
        )
        plan = await finish_in_slices(steps)  # a checkpoint between slices; only this task changes the queue
        if s.preemption:
            await self._preempt(epoch, workers, plan, self.held)
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
        committed: tuple[CommittedAssignment, ...] = await self.write(
            lambda reply: CommitPlacements(
                epoch=epoch, placements=plan.placements, reasons=plan.reasons, reply=reply
            )
        )
        commit_done = trio.current_time()
        metrics.PLACER_PHASE_SECONDS.labels("commit").observe(commit_done - decided)
        # Placed or not (a job cancelled or claimed meanwhile), none of them is pending any more.
        self.queue.remove(plan.placed_job_ids)
        self.queue.store_reasons(plan.reasons)
        self.gangs.remove(plan.placed_job_ids)
        self.gangs.store_reasons(plan.reasons)
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

    def _holds(self, epoch: int, now: float, live: set[str]) -> dict[str, int]:
        """worker_id -> job_id of the workers kept for a preempting job this round: those of
        this term still live (``live``: the round's live worker ids), whose job is still queued
        and whose hold has not run out."""
        if epoch != self._held_epoch:
            self._held_epoch, self._holds_until = epoch, {}
        self._holds_until = {
            worker_id: (job_id, until)
            for worker_id, (job_id, until) in self._holds_until.items()
            if until > now and job_id in self.queue and worker_id in live
        }
        return {worker_id: job_id for worker_id, (job_id, _) in self._holds_until.items()}

    async def _preempt(
        self, epoch: int, workers: Sequence[LiveWorker], plan: RoundPlan, held: dict[str, int]
    ) -> tuple[Preemption, ...]:
        """After a round's decision: when it leaves candidates (high-priority jobs that fit no
        free room, :func:`actors.preemption.candidates`), read what they may preempt, decide
        (:func:`actors.preemption.plan_preemptions`), mark the victims in a fenced write and
        keep each chosen worker for its job. Returns the preemptions written.

        Raises:
            StaleEpoch: the ledger refused the write; nothing was marked.
            DatabaseUnavailable: the read or the write failed.
        """
        s = self.settings
        now = trio.current_time()
        open_workers = [w for w in workers if not w.cordoned and not (w.unhealthy and not w.probe_due)]
        rooms = [w.room for w in open_workers if w.ref.worker_id not in held]
        skip = {*plan.placed_job_ids, *plan.backing_off, *held.values()}
        found = candidates(
            self.queue, rooms, skip=skip, quotas=self.store.quotas, limit=s.max_preemptions_per_round
        )
        ids = tuple(c.job_id for c in found)
        checked_ids, checked_at = self._preempt_checked
        if not found or (ids == checked_ids and now - checked_at < PREEMPT_RECHECK_S):
            return ()
        self._preempt_checked = (ids, now)
        running, shares = await self.store.preemptible(
            max(c.priority for c in found), s.preempt_cooldown_s, [w.ref for w in open_workers]
        )
        if not running:
            return ()
        shares = attrs.evolve(
            shares,
            cluster_cpu_millis=sum(w.room.cpu_millis for w in workers),
            cluster_memory_mb=sum(w.room.memory_mb for w in workers),
        )
        free = {
            r.worker_id: (r.cpu_millis - r.cpu_allocated_millis, r.memory_mb - r.memory_allocated_mb)
            for r in rooms
        }
        decisions = plan_preemptions(
            found, free, running, shares, max_preemptions=s.max_preemptions_per_round
        )
        rows, kept = self.write_size().rows, []
        for decision in decisions:
            rows -= len(decision.victims)
            if rows < 0:
                break
            kept.append(decision)
        if not kept:
            return ()
        marked = set(
            await self.write(
                lambda reply: PreemptAssignments(
                    epoch=epoch,
                    preemptions=tuple((v.assignment_id, d.job_id) for d in kept for v in d.victims),
                    cooldown_s=s.preempt_cooldown_s,
                    reply=reply,
                )
            )
        )
        until = trio.current_time() + s.preempt_grace_s + PREEMPT_HOLD_MARGIN_S
        written = []
        for decision in kept:
            victims = [v for v in decision.victims if v.assignment_id in marked]
            if not victims:
                continue
            written.append(decision)
            metrics.PREEMPTIONS.inc(len(victims))
            if len(victims) == len(decision.victims):
                self._holds_until[decision.worker_id] = (decision.job_id, until)
            self._log.info(
                "preempting",
                epoch=epoch,
                job_id=decision.job_id,
                worker_id=decision.worker_id,
                job_ids=[v.job_id for v in victims],
                assignment_ids=[v.assignment_id for v in victims],
            )
        return tuple(written)

    async def _read_shares(self, use: dict[str, AccountShare] | None) -> None:
        """Fair share's accounts for this round: ``use`` (each account's use and weight, read with
        the round) or, None, read now (a full read, or a queue that has just come to hold two
        accounts' jobs): a use read a moment old would hand the room freed by one account's
        ended jobs to the other. Their decayed past use is read every
        :data:`FAIR_SHARE_PAST_REFRESH_S`."""
        s = self.settings
        now = trio.current_time()
        with_past = s.fair_share_half_life_s > 0 and now - self._past_read_at >= FAIR_SHARE_PAST_REFRESH_S
        if use is None or with_past:
            shares = await self.store.account_shares(s.fair_share_half_life_s, with_past=with_past)
        else:
            shares = dict(use)
        if with_past:
            self._past = {n: (a.decayed_cpu_millis, a.decayed_memory_mb) for n, a in shares.items()}
            self._past_read_at = now
        else:
            for name, (cpu, mem) in self._past.items():
                share = shares.get(name, AccountShare())
                shares[name] = attrs.evolve(share, decayed_cpu_millis=cpu, decayed_memory_mb=mem)
        self._shares = shares

    def _connect_ahead(self, epoch: int, workers: Sequence[LiveWorker]) -> None:
        """Have the dispatcher open connections to live workers it has not been told of under
        ``epoch``, so a new leader's first assignments do not wait for a hundred TLS handshakes
        (best effort: with its inbox full, a later round tells it)."""
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

"""The reconciler: the leader's repair pass, every ``reconcile_interval_s`` (0.25 s).

Each pass, while leader: dead workers and orphaned assignments (:mod:`actors.deaths`),
unconfirmed assignments (:mod:`actors.deliveries`), cancellations on workers
(:mod:`actors.cancellations`), waiting jobs (:mod:`actors.dependencies`), and now and then the
workers' health and the heartbeat interval. docs/design.md, "The reconciler's pass".
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import trio

from actors.cancellations import DRAINED, PREEMPTED, TIMED_OUT, Cancellations
from actors.deaths import DeathVerdict, SilenceFloor, TokenBucket, contact_gap_for_s, judge_deaths
from actors.deliveries import by_worker, plan_deliveries
from actors.dependencies import CASCADE_STEPS, plan_waiting
from actors.health import judge_health
from actors.heartbeat_policy import (
    HeartbeatPolicy,
    LongestWithin,
    Measured,
    choose_policy,
    default_policy,
    wanted_interval_ms,
)
from actors.messages import (
    DeclareDeadWorkers,
    Dispatch,
    DispatcherInbox,
    EndOrphanedAssignments,
    ReconcileResult,
    RecordWorkerHealth,
    SetHeartbeatPolicy,
    SettledJobs,
    SettleWaitingJobs,
    WorkerRef,
)
from actors.reconciler_store import Delivery, ReconcilerStore
from actors.role import RoleView
from actors.write_size import FencedWrites
from runtime import log, metrics
from runtime.backoff import FullJitterBackoff
from runtime.errors import DatabaseUnavailable, StaleEpoch
from runtime.settings.leader import ReconcilerSettings

TIMEOUT_MARGIN_S = 30.0
"""How long past its ``timeout_s`` (or a tenth of the timeout, when longer) a run may go before
the leader stops it, for a worker whose reaper did not; covers the stop's grace and a slow report."""

MAX_BACKOFF_CAPS = 64
"""Most entries :func:`backoff_caps_s` returns (reached only when max_s / base_s > 2**63)."""


def backoff_caps_s(*, base_s: float, max_s: float) -> tuple[float, ...]:
    """The requeue backoff's caps, in seconds: entry k-1 bounds the wait after a job's k-th
    loss, ``min(max_s, base_s * 2 ** (k - 1))``, up to the first entry that reaches ``max_s``,
    which bounds every later loss too. The database draws the wait uniformly below the cap
    (``full_jitter_s`` in schema.sql): full jitter, as in "Exponential Backoff And Jitter" (Marc
    Brooker, AWS Architecture Blog, 2015).

    Raises:
        ValueError: ``base_s`` is not > 0, or ``max_s`` is below ``base_s``.
    """
    if not base_s > 0:
        raise ValueError(f"base_s must be > 0, got {base_s}")
    if not max_s >= base_s:
        raise ValueError(f"max_s must be >= base_s = {base_s}, got {max_s}")
    schedule = FullJitterBackoff(base_s=base_s, cap_s=max_s)  # the clients' busy backoff's rule
    caps: list[float] = []
    for attempt in range(MAX_BACKOFF_CAPS):
        caps.append(schedule.ceiling_s(attempt))
        if caps[-1] >= max_s:
            break
    return tuple(caps)


POLICY_COSTS_SEEN_WITHIN_S = 10.0
"""The heartbeat costs of control planes seen within this many seconds count (the others are
down: they share no heartbeats)."""


@attrs.define
class Reconciler(FencedWrites):
    """The actor; its decisions are fenced writes of at most :meth:`write_size` rows."""

    settings: ReconcilerSettings
    store: ReconcilerStore
    role: RoleView
    dispatcher: trio.MemorySendChannel[DispatcherInbox]
    _bucket: TokenBucket | None = None
    _unconfirmed_read_at: float = -math.inf
    """When the previous pass read the unconfirmed assignments (trio time)."""
    _silence: SilenceFloor = attrs.field(factory=SilenceFloor)
    _logged_at: dict[str, float] = attrs.field(factory=dict)
    _health_judged_at: float = -math.inf
    """When the last pass judged the workers' health (trio time)."""
    _policy_chosen_at: float = -math.inf
    """When the last pass chose the heartbeat interval (trio time)."""
    _cancels: Cancellations = attrs.field(init=False)
    """The cancellations on workers of the current term."""
    _steps_s: dict[str, float] = attrs.field(factory=dict)
    """Seconds each step of the current (or last) pass took, by step."""
    _gap_s: float = math.inf
    """The contact gap the last pass judged by (:func:`contact_gap_for_s`)."""
    _interval_s: float | None = None
    """The heartbeat interval in force, as the last policy step read or wrote it (None: none
    read yet; the settings' shortest)."""
    _wanted_intervals: LongestWithin = attrs.field(factory=LongestWithin)
    """The intervals the policy steps of this term wanted lately: it shrinks to their longest."""
    _resends_dropped: int = 0
    """Re-sends not handed over since the last log of them: the dispatcher's inbox was full."""
    _log: Any = attrs.field(factory=lambda: log.get("reconciler"))

    def __attrs_post_init__(self) -> None:
        self._cancels = Cancellations(
            dispatcher=self.dispatcher,
            write=self.write,
            rows=lambda: self.write_size().rows,
            preempt_grace_s=self.settings.preempt_grace_s,
        )

    @property
    def requeue_backoff_caps_s(self) -> tuple[float, ...]:
        """The caps of the requeue backoff (see :func:`backoff_caps_s`), from the settings."""
        s = self.settings
        return backoff_caps_s(base_s=s.requeue_backoff_base_s, max_s=s.requeue_backoff_max_s)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run a pass every ``reconcile_interval_s`` while leader, until cancelled."""
        last_epoch: int | None = None

        failed_passes = 0

        async def logged_pass(epoch: int) -> None:
            nonlocal last_epoch, failed_passes
            if epoch != self._cancels.epoch:
                # A new term: the last one's cancellations would end nothing (the fence).
                # Not at every pass after a failed one: a task of this term may have a
                # worker's acknowledgement to write.
                self._cancels.stop()
                self._cancels.epoch = epoch
            began = trio.current_time()
            outcome: str | None = None  # None: cancelled or a bug, not counted
            try:
                await self.reconcile(epoch, background, first_pass=epoch != last_epoch)
                outcome = "done"
                last_epoch = epoch
                if failed_passes:
                    self._log.info("passes succeed again", failed_passes=failed_passes)
                    failed_passes = 0
            except StaleEpoch as exc:
                outcome = "deposed"
                self._log.info("pass refused: deposed", epoch=exc.epoch, epoch_seen=exc.epoch_seen)
            except DatabaseUnavailable as exc:
                outcome = "failed"
                # Once per streak of failures, not once per pass (the database is away).
                if not failed_passes:
                    self._log.warning("pass failed", error=str(exc))
                failed_passes += 1
            finally:
                took_s = trio.current_time() - began
                if outcome is not None:
                    metrics.RECONCILE_PASS_SECONDS.observe(took_s)
                    metrics.RECONCILE_PASSES.labels(outcome).inc()
                self._report_slow_pass(took_s)

        def standby() -> None:
            # A standby shows no unhealthy workers: the leader's gauge is the cluster's.
            metrics.UNHEALTHY_WORKERS.set(0)
            self._health_judged_at = -math.inf
            self._policy_chosen_at = -math.inf
            self._interval_s = None
            self._wanted_intervals = LongestWithin()
            self._cancels.stop()
            self._cancels.epoch = None

        async with trio.open_nursery() as background:
            await self.role.every_interval_while_leader(
                self.settings.reconcile_interval_s, logged_pass, on_standby=standby, task_status=task_status
            )

    def _hand_over(self, dispatches: Sequence[Dispatch]) -> None:
        """Give the dispatcher the re-sends it has room for, without waiting (a pass that waited
        would hold the next read of heartbeat ages back); the rest is re-sent later, or withdrawn."""
        for n, dispatch in enumerate(dispatches):
            try:
                self.dispatcher.send_nowait(dispatch)
            except trio.WouldBlock:
                left = dispatches[n:]
                self._resends_dropped += sum(len(d.assignments) for d in left)
                break
        if self._resends_dropped and self._log_due("resends", trio.current_time()):
            self._log.warning(
                "re-sends left for later: the dispatcher is busy", assignments=self._resends_dropped
            )
            self._resends_dropped = 0

    def _log_due(self, key: str, now: float) -> bool:
        """Whether a line of ``key`` may be logged at ``now``, at most one every
        ``held_log_every_s`` (if so, it counts as logged)."""
        if now - self._logged_at.get(key, -math.inf) < self.settings.held_log_every_s:
            return False
        self._logged_at[key] = now
        return True

    @contextlib.contextmanager
    def _step(self, name: str) -> Iterator[None]:
        """Time one step of a pass into ``stockade_reconcile_step_seconds`` and ``_steps_s``."""
        began = trio.current_time()
        try:
            yield
        finally:
            took_s = trio.current_time() - began
            self._steps_s[name] = round(took_s, 4)
            metrics.RECONCILE_STEP_SECONDS.labels(name).observe(took_s)

    async def reconcile(
        self, epoch: int, background: trio.Nursery, *, first_pass: bool = False
    ) -> ReconcileResult:
        """One pass under ``epoch``, starting its cancellations on workers in ``background``
        without waiting for them. Returns what the fenced dead-worker step changed.

        Raises:
            StaleEpoch: the ledger refused a write; the pass sends none after it.
            DatabaseUnavailable: a read or write failed; the pass sends none after it.
        """
        s = self.settings
        self._steps_s = {}
        with self._step("ages"):
            reading = await self.store.heartbeat_ages()
        now = trio.current_time()
        gap_s = self._gap_s = contact_gap_for_s(reading.ages, s)
        if self._silence.read(epoch, reading.now_unix_s, now, gap_s) and not first_pass:
            self._log.warning("silence counts anew: the leader's reads were interrupted", gap_s=gap_s)
        ages = self._silence.floored(reading.ages, reading.now_unix_s)
        if self._bucket is None:
            self._bucket = TokenBucket(float(s.death_burst), now)
        verdict = judge_deaths(ages, s, self._bucket, now)
        if self._silence.mass_silence_for_s(verdict.mass_silence, now) > s.mass_silence_max_s:
            # Held long enough: the cut-off workers' agents have killed their paused jobs by
            # now, and dead ones never answer. Declare again, at the rate limit's pace.
            verdict = judge_deaths(ages, s, self._bucket, now, hold_on_mass_silence=False)
            if verdict.declare:
                self._log.warning(
                    "mass silence held too long: declaring silent workers dead again",
                    mass_silence_max_s=s.mass_silence_max_s,
                    declaring=[worker_id for worker_id, _ in verdict.declare],
                )
        if self._silence.mass_silence_seen(verdict.mass_silence, reading.now_unix_s):
            self._log.warning("mass silence ended: silence counts anew", alive=verdict.alive)
            verdict = attrs.evolve(verdict, declare=(), held=verdict.declare + verdict.held)
        self._bucket = verdict.bucket
        self._report_held(verdict, now)
        with self._step("declare"):
            result = await self._declare_and_end_orphans(epoch, verdict.declare)

        with self._step("deliveries"):
            unconfirmed = await self.store.unconfirmed()
            read_at = trio.current_time()
            since_last_read_s = read_at - self._unconfirmed_read_at
            self._unconfirmed_read_at = read_at
            if self._interval_s is None:
                # A term's first pass: the policy step has not read the interval yet.
                inputs = await self.store.heartbeat_policy_inputs(POLICY_COSTS_SEEN_WITHIN_S)
                self._interval_s = (inputs.current or default_policy(s)).interval_ms / 1000
            plan = plan_deliveries(
                unconfirmed,
                s,
                first_pass=first_pass,
                since_last_read_s=since_last_read_s,
                heartbeat_interval_s=self._interval_s,
            )
            self._hand_over(plan.dispatches(epoch))
        with self._step("cancels"):
            cancelled = await self.store.cancel_requested()
            # The leader's backing of timeouts: a run its worker let outlive its timeout_s by the
            # margin is stopped by the leader; ended once its worker acknowledged (invariant 6).
            overdue = await self.store.overdue(TIMEOUT_MARGIN_S)
            drained = await self.store.drain_due()
            preempted = await self.store.preempt_due()
            cancellations: list[tuple[WorkerRef, Sequence[Delivery], bool, str]] = [
                *((worker, group, True, "unconfirmed") for worker, group in plan.withdraw),
                *((worker, group, False, "cancelled_by_user") for worker, group in by_worker(cancelled)),
                *((worker, group, False, TIMED_OUT) for worker, group in by_worker(overdue)),
                *((worker, group, True, DRAINED) for worker, group in by_worker(drained)),
                *((worker, group, True, PREEMPTED) for worker, group in by_worker(preempted)),
            ]
            caps = self.requeue_backoff_caps_s
            for worker, group, requeue, reason in cancellations:
                self._cancels.start(background, epoch, worker, group, requeue, reason, caps)
        with self._step("settle"):
            await self.settle_waiting(epoch)
        if first_pass or trio.current_time() - self._health_judged_at >= s.health_interval_s:
            self._health_judged_at = trio.current_time()
            with self._step("health"):
                await self.health_pass(epoch)
        if first_pass or trio.current_time() - self._policy_chosen_at >= s.heartbeat_policy_every_s:
            self._policy_chosen_at = trio.current_time()
            with self._step("policy"):
                await self.heartbeat_policy_pass(epoch, workers=verdict.alive)
        return result

    async def heartbeat_policy_pass(self, epoch: int, *, workers: int) -> HeartbeatPolicy | None:
        """Choose the heartbeat interval for ``workers`` alive workers
        (:func:`actors.heartbeat_policy.choose_policy`), and write it in a fenced write when it
        changed. Returns the policy written, None when none was.

        Raises:
            StaleEpoch, DatabaseUnavailable: the read or the write failed.
        """
        s = self.settings
        inputs = await self.store.heartbeat_policy_inputs(POLICY_COSTS_SEEN_WITHIN_S)
        # No policy row: the control planes tell their defaults, which is what is in force.
        current = inputs.current or default_policy(s)
        costs, waits = inputs.costs_us, inputs.waits_ms
        measured = Measured(workers=workers, costs_us=costs, waits_ms=waits, replicas=inputs.replicas)
        wanted_ms = wanted_interval_ms(**measured, settings=s)
        floor_ms = 0 if wanted_ms is None else self._wanted_intervals.add(trio.current_time(), wanted_ms)
        chosen = choose_policy(**measured, current=current, settings=s, floor_ms=floor_ms)
        if chosen is current:
            self._interval_s = current.interval_ms / 1000
            return None
        await self.write(lambda reply: SetHeartbeatPolicy(epoch=epoch, policy=chosen, reply=reply))
        was = inputs.current
        self._log.info(
            "heartbeat interval chosen",
            epoch=epoch,
            heartbeat_interval_s=chosen.interval_ms / 1000,
            dead_after_s=chosen.dead_after_ms / 1000,
            was_heartbeat_interval_s=None if was is None else was.interval_ms / 1000,
            was_dead_after_s=None if was is None else was.dead_after_ms / 1000,
            why=chosen.reason,
        )
        metrics.HEARTBEAT_INTERVAL_SECONDS.set(chosen.interval_ms / 1000)
        self._interval_s = chosen.interval_ms / 1000
        return chosen

    async def health_pass(self, epoch: int) -> tuple[tuple[str, bool], ...]:
        """Judge the workers' health (:func:`actors.health.judge_health`) and write the marks and
        clears in one fenced write of at most ``write_size().rows`` changes (the rest in the next
        judgement). Returns ``(worker_id, unhealthy)`` for the changes written.

        Raises:
            StaleEpoch, DatabaseUnavailable: the read or the write failed.
        """
        s = self.settings
        workers = await self.store.worker_runs(s.health_window_runs, s.health_window_s)
        verdict = judge_health(workers, s)
        changes = verdict.changes[: self.write_size().rows]
        written: tuple[tuple[str, bool], ...] = ()
        if changes:
            written = await self.write(
                lambda reply: RecordWorkerHealth(
                    epoch=epoch,
                    changes=tuple((c.worker_id, c.version, c.unhealthy, c.reason) for c in changes),
                    probe_after_s=s.health_probe_after_s,
                    reply=reply,
                )
            )
        unhealthy = {w.worker_id for w in workers if w.unhealthy}
        by_id = {c.worker_id: c for c in changes}
        for worker_id, marked in written:
            change = by_id[worker_id]
            if marked:
                unhealthy.add(worker_id)
                kind = "renewed" if change.renewed else "marked"
                self._log.warning(
                    "worker marked unhealthy" if kind == "marked" else "worker still unhealthy",
                    epoch=epoch,
                    worker_id=worker_id,
                    reason=change.reason,
                    probe_after_s=s.health_probe_after_s,
                )
            else:
                unhealthy.discard(worker_id)
                kind = "cleared"
                self._log.info("worker healthy again", epoch=epoch, worker_id=worker_id, why=change.reason)
            metrics.WORKER_HEALTH_CHANGES.labels(kind).inc()
        metrics.UNHEALTHY_WORKERS.set(len(unhealthy))
        return written

    async def settle_waiting(self, epoch: int) -> SettledJobs:
        """Settle the waiting jobs that can be settled now: one fenced write per batch read, again
        while a write cancelled jobs or was full, at most :data:`actors.dependencies.CASCADE_STEPS`
        writes. Returns what all of them changed.

        Raises:
            StaleEpoch, DatabaseUnavailable: a read or write failed; no later write is sent.
        """
        released: list[int] = []
        cancelled: list[int] = []
        for _ in range(CASCADE_STEPS):
            rows = self.write_size().rows
            plan = plan_waiting(await self.store.waiting_jobs(rows), most=rows)
            if not plan:
                break
            settled: SettledJobs = await self.write(
                lambda reply: SettleWaitingJobs(
                    epoch=epoch,
                    release=plan.release,  # noqa: B023 (called at once, in this iteration)
                    cancel=plan.cancel,  # noqa: B023
                    reply=reply,
                )
            )
            released += settled.released_job_ids
            cancelled += settled.cancelled_job_ids
            if not settled.cancelled_job_ids and plan.rows < rows:
                break
        if released or cancelled:
            counts = log.counted("job_ids", released=released, cancelled=cancelled)
            self._log.info("settled waiting jobs", epoch=epoch, **counts)
        return SettledJobs(released_job_ids=tuple(released), cancelled_job_ids=tuple(cancelled))

    async def _declare_and_end_orphans(
        self, epoch: int, declare: tuple[tuple[str, int], ...]
    ) -> ReconcileResult:
        """Declare ``declare`` dead and end the first batch of orphaned assignments in one fenced
        transaction, then one batch per fenced transaction while a batch was full. Returns the
        whole series' changes.

        Raises:
            StaleEpoch, DatabaseUnavailable: a batch failed; no later batch is sent.
        """
        caps = self.requeue_backoff_caps_s
        first = self.write_size().rows
        batch: ReconcileResult = await self.write(
            lambda reply: DeclareDeadWorkers(
                epoch=epoch,
                workers=declare,
                dead_after_s=self.settings.dead_after_s,
                requeue_backoff_caps_s=caps,
                max_ended=first,
                reply=reply,
                silence_floor_unix_s=self._silence.floor_unix_s,
            )
        )
        dead = batch.dead_worker_ids
        assert self._bucket is not None
        self._bucket = self._bucket.take(len(dead))
        metrics.WORKER_DEATHS.inc(len(dead))
        batches = [batch]
        try:
            while batch.more_orphans:
                rows = self.write_size().rows
                batch = await self.write(
                    lambda reply: EndOrphanedAssignments(
                        epoch=epoch,
                        requeue_backoff_caps_s=caps,
                        max_ended=rows,  # noqa: B023 (called at once, in this iteration)
                        reply=reply,
                    )
                )
                batches.append(batch)
        finally:
            requeued = [i for b in batches for i in b.requeued_job_ids]
            ended = [i for b in batches for i in b.orphaned_assignment_ids]
            if dead or ended:
                self._log.warning(
                    "reconciled",
                    epoch=epoch,
                    dead_workers=list(dead),
                    requeued_jobs=len(requeued),
                    ended_assignments=len(ended),
                    transactions=len(batches),
                    assignment_ids=ended,
                    job_ids=[i for b in batches for i in b.orphaned_job_ids],
                    worker_ids=[i for b in batches for i in b.orphaned_worker_ids],
                    requeued_job_ids=requeued,
                )
        return ReconcileResult(
            dead_worker_ids=dead, requeued_job_ids=tuple(requeued), orphaned_assignment_ids=tuple(ended)
        )

    def _report_slow_pass(self, took_s: float) -> None:
        """Say which steps took the time of a pass longer than half the contact gap (past the gap
        silence counts anew)."""
        if took_s <= self._gap_s / 2 or not self._log_due("slow_pass", trio.current_time()):
            return
        self._log.warning(
            "slow reconcile pass", took_s=round(took_s, 3), contact_gap_s=self._gap_s, steps_s=self._steps_s
        )

    def _report_held(self, verdict: DeathVerdict, now: float) -> None:
        """Count the silent workers this pass holds back, and log them."""
        metrics.MASS_SILENCE.set(1 if verdict.mass_silence else 0)
        if not verdict.held:
            return
        reason = "mass_silence" if verdict.mass_silence else "rate_limit"
        metrics.DEATHS_HELD.labels(reason).inc(len(verdict.held))
        if not self._log_due(reason, now):
            return
        s = self.settings
        held = [worker_id for worker_id, _ in verdict.held[:10]]
        if verdict.mass_silence:
            self._log.warning(
                "not declaring workers dead: too many silent at once",
                silent=len(verdict.held),
                alive=verdict.alive,
                mass_silence_fraction=s.mass_silence_fraction,
                dead_after_s=s.dead_after_s,
                first_silent=held,
            )
        else:
            self._log.warning(
                "dead-worker declarations rate-limited",
                declaring=len(verdict.declare),
                held=len(verdict.held),
                death_burst=s.death_burst,
                deaths_per_s=s.deaths_per_s,
                first_held=held,
            )

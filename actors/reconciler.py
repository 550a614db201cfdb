"""The reconciler: the leader's repair pass, every ``reconcile_interval_s`` (0.25 s).

Each pass, while leader:

1. Dead workers: every alive worker whose last recorded heartbeat (by any replica, judged by
   database time, and counted only from the database server's start and from the leader's
   :class:`SilenceFloor` on: its takeover, its reconnection, the end of a mass silence) is
   older than ``dead_after_s`` is declared dead in a fenced transaction that
   re-checks the rule, ends its active assignments as lost and requeues their jobs. The same
   transaction ends assignments addressed to an incarnation that is no longer current (the
   agent restarted or re-registered: its old jobs were stopped), and those of a worker that
   left (its agent stopped cleanly, stopped every job, then said so: the row is ``left``, which
   this step never judges by silence): those end as ``stopped`` and their jobs are placed again
   at once, with no backoff, in the first pass after the leave instead of ``dead_after_s``
   later. A new leader therefore never
   judges from timers of its own: failovers cause no false deaths. One transaction ends at most
   ``max_rows_per_fenced_write`` assignments (fewer while the database is slow:
   :mod:`actors.write_size`); the pass ends the rest in further fenced transactions
   (:class:`EndOrphanedAssignments`) until none is left, and stops at the first one that
   fails (see :mod:`actors.ledger` for why that is as safe as one transaction, and why a large
   one would cost the leader its lease).

   Declarations are rate-limited and paused on mass silence (:func:`judge_deaths`), as
   Kubernetes' node lifecycle controller limits evictions: not declaring a worker dead only
   delays its jobs (it fences itself), while declaring it moves all its work at once.
   A requeued job waits a backoff before it is placed again (:func:`backoff_caps_s`): a job
   lost again and again, as on workers that keep falling over under load, waits longer each
   time instead of being handed straight back.
2. Unconfirmed assignments (committed, not yet listed by a heartbeat): re-sent to their worker
   when their age passes ``redispatch_after_s`` (or two heartbeat intervals, when the cluster's
   interval makes that longer), then twice, four times ... that (at once on the first pass
   after an election: the previous leader may have died between commit and send); the worker
   deduplicates by id. A worker too busy to confirm is not sent the same batch every pass
   (:func:`resend_due`), and a pass hands the dispatcher only the re-sends it has room for,
   never waiting on it. After ``cancel_unconfirmed_after_s`` (at least four intervals) they
   are cancelled on the worker and, once it acknowledges, ended and requeued.
3. Jobs a user cancelled: cancelled on their worker; once acknowledged, ended as cancelled.
4. Waiting jobs (:mod:`actors.dependencies`): made pending once their dependencies succeeded
   (an array's tasks within its limit), cancelled when one failed or was cancelled; read on the
   reconciler's connection, decided by :func:`actors.dependencies.plan_waiting`, written in
   fenced writes of at most ``write_size().rows`` jobs (:class:`SettleWaitingJobs`), which
   re-check each rule; again while a write cancelled jobs (their dependants follow), at most
   :data:`actors.dependencies.CASCADE_STEPS` writes per pass. No write when there is nothing
   to settle.
5. Drains whose deadline has passed (``stockade drain --deadline-s``): the jobs still active on
   the worker are cancelled on it and, once it acknowledges, ended as stopped (``drained``) and
   placed again at once, with no loss counted and no backoff, as a clean leave's are: the
   operator took the worker away, the job did nothing wrong (:class:`EndDrainedAssignments`).
   Those the worker does not acknowledge are asked again every pass until it does, or until it
   is declared dead (then they end as any dead worker's).

6. Worker health (:mod:`actors.health`), every ``health_interval_s`` (and on the first pass of
   a reign): every alive worker's recent runs are read, a worker whose failures are its own
   (the jobs succeed elsewhere) is marked unhealthy (the placer places nothing new on it but a
   probe every ``health_probe_after_s``), and a mark is cleared once a run succeeds there or
   its failures turn out to be the jobs'; one fenced write (:class:`RecordWorkerHealth`), none when nothing
   changes. Each change applies only to the worker's health as it was read: an operator's
   uncordon meanwhile wins.

Acknowledged cancellations, too, are ended in fenced writes of that size.

Cancellations on workers (steps 2, 3 and 5, and runs past their timeout) run as background
tasks of the actor that the pass does not wait for: a worker that answers slowly or not at all
holds up only its own cancellation (for up to the dispatcher's ``rpc_timeout_s``), never the
next pass, so the leader's reads of heartbeat ages stay closer together than the contact gap
and silence keeps counting. An assignment whose cancellation is in flight is not asked again
until that one ends; the tasks of a term are cancelled when the replica steps down or is
elected under a new epoch (their fenced writes would be refused anyway), not when a pass of
the same term fails (a worker's acknowledgement may still be on its way), and a refused or
failed ending is logged and asked again by a later pass; one the dispatcher never answers
frees its assignments after :data:`CANCEL_REPLY_WAIT_S`.

A job is placed again only after its active assignment has ended (invariant 6).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs
import trio

from actors.dependencies import CASCADE_STEPS, plan_waiting
from actors.health import judge_health
from actors.heartbeat_policy import (
    HeartbeatPolicy,
    LongestWithin,
    choose_policy,
    default_policy,
    wanted_interval_ms,
)
from actors.messages import (
    CancelOnWorker,
    DeclareDeadWorkers,
    Dispatch,
    DispatcherInbox,
    EndAssignments,
    EndDrainedAssignments,
    EndOrphanedAssignments,
    LedgerInbox,
    ReconcileResult,
    RecordWorkerHealth,
    SetHeartbeatPolicy,
    SettledJobs,
    SettleWaitingJobs,
    WorkerRef,
)
from actors.reconciler_store import Delivery, HeartbeatAge, ReconcilerStore
from actors.role import RoleView
from actors.write_size import WriteSize
from runtime import log, metrics
from runtime.backoff import FullJitterBackoff
from runtime.errors import DatabaseBusy, DatabaseUnavailable, StaleEpoch
from runtime.reply import Reply
from runtime.settings.leader import (
    DEFAULT_MAX_ROWS_PER_FENCED_WRITE,
    ReconcilerSettings,
)


def judged_dead_after_s(age: HeartbeatAge, dead_after_s: float) -> float:
    """The dead_after (seconds) ``age``'s worker is judged by: the larger of the reconciler's
    ``dead_after_s`` and the one its row records (docs/design.md, "Heartbeat interval")."""
    return dead_after_s if age.dead_after_s is None else max(dead_after_s, age.dead_after_s)


def contact_gap_for_s(ages: Iterable[HeartbeatAge], settings: ReconcilerSettings) -> float:
    """How long the leader's reads may be interrupted before silence counts anew (seconds):
    ``contact_gap_s`` as a share of ``dead_after_s``, applied to the shortest dead_after a
    worker is judged by now (:func:`judged_dead_after_s`), never less than ``contact_gap_s``.

    The gap guards against an outage being taken for the workers' silence; what matters is the
    gap's share of the dead_after, not its length. When the cluster stretches the interval (a
    40 s dead_after at 2,000 workers) a fixed 1 s gap made a leader merely busy, whose passes
    came 1 to 2 s apart, count silence anew at almost every pass, so a dead worker was never
    declared."""
    shortest_s = min(
        (judged_dead_after_s(a, settings.dead_after_s) for a in ages), default=settings.dead_after_s
    )
    return settings.contact_gap_s * max(1.0, shortest_s / settings.dead_after_s)


def resend_due(age_s: float, *, first_after_s: float, interval_s: float) -> bool:
    """Whether a pass re-sends an unconfirmed assignment ``age_s`` seconds after its commit:
    when its age passed ``first_after_s * 2**k`` (some k >= 0) since the previous pass,
    ``interval_s`` earlier. So it is re-sent at 1, 2, 4, 8 ... times ``first_after_s``: a
    retry that backs off exponentially, with no state per assignment (each assignment's commit
    time spreads the re-sends of a batch committed over several rounds).

    Args:
        age_s: seconds since the commit (database time).
        first_after_s: the first re-send's age.
        interval_s: the time since the previous pass looked (a late pass still re-sends what
            passed a threshold meanwhile).
    """
    if age_s < first_after_s:
        return False
    threshold = first_after_s * 2.0 ** math.floor(math.log2(age_s / first_after_s))
    return age_s - interval_s < threshold


Groups = tuple[tuple[WorkerRef, tuple[Delivery, ...]], ...]
"""Deliveries grouped by the worker they go to: one entry per worker, in the order of each
worker's first delivery, the deliveries in their given order."""


def by_worker(deliveries: Iterable[Delivery]) -> Groups:
    """``deliveries`` grouped per worker (see :data:`Groups`)."""
    groups: dict[WorkerRef, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        groups[d.worker].append(d)
    return tuple((worker, tuple(group)) for worker, group in groups.items())


@attrs.frozen(kw_only=True)
class DeliveryPlan:
    """What one pass does with the unconfirmed assignments (:func:`plan_deliveries`)."""

    resend: Groups
    """Sent to their worker again (one batch per worker)."""
    withdraw: Groups
    """Cancelled on their worker, then ended and requeued once it acknowledges."""

    def dispatches(self, epoch: int) -> tuple[Dispatch, ...]:
        """The re-sends as one :class:`Dispatch` per worker."""
        return tuple(
            Dispatch(epoch=epoch, worker=worker, assignments=tuple(d.assignment for d in group))
            for worker, group in self.resend
        )


def plan_deliveries(
    unconfirmed: Iterable[Delivery],
    settings: ReconcilerSettings,
    *,
    first_pass: bool,
    since_last_read_s: float,
    heartbeat_interval_s: float = 0.0,
) -> DeliveryPlan:
    """Which unconfirmed assignments a pass re-sends and which it withdraws: a pure function.

    An assignment unconfirmed for ``cancel_unconfirmed_after_s`` (at least
    :data:`WITHDRAW_AFTER_INTERVALS` heartbeat intervals) or more is withdrawn; a younger one is
    re-sent on the first pass of a leader's reign (the previous leader may have died between
    commit and send) and otherwise when :func:`resend_due` says so (at 1, 2, 4 ... times
    ``redispatch_after_s``, or :data:`RESEND_AFTER_INTERVALS` heartbeat intervals when that is
    longer: a worker confirms with its next heartbeat, so a re-send sooner only adds calls to a
    dispatcher that a large cluster keeps busy); the rest are left alone. No assignment is both.

    Args:
        unconfirmed: the active assignments no heartbeat has confirmed, with their ages
            (seconds since the commit, database time).
        settings: ``redispatch_after_s`` and ``cancel_unconfirmed_after_s``.
        first_pass: whether this is the first pass under the current epoch.
        since_last_read_s: seconds since the previous pass read the unconfirmed assignments
            (trio time; ``inf`` before any).
        heartbeat_interval_s: the workers' heartbeat interval in force (0: not counted).
    """
    first_after_s = max(settings.redispatch_after_s, RESEND_AFTER_INTERVALS * heartbeat_interval_s)
    withdraw_after_s = max(
        settings.cancel_unconfirmed_after_s, WITHDRAW_AFTER_INTERVALS * heartbeat_interval_s
    )
    withdraw: list[Delivery] = []
    resend: list[Delivery] = []
    for d in unconfirmed:
        if d.age_s >= withdraw_after_s:
            withdraw.append(d)
        elif first_pass or resend_due(d.age_s, first_after_s=first_after_s, interval_s=since_last_read_s):
            resend.append(d)
    return DeliveryPlan(resend=by_worker(resend), withdraw=by_worker(withdraw))


CANCEL_REPLY_WAIT_S = 60.0
"""How long a cancellation waits for the dispatcher's reply (its calls end within
``rpc_timeout_s``): one it never sends, lost with a dispatcher that restarted, frees its
assignments for a later pass after this long instead of holding them for the term."""

RESEND_AFTER_INTERVALS = 2.0
"""Heartbeat intervals an assignment goes unconfirmed, at least, before its first re-send."""

WITHDRAW_AFTER_INTERVALS = 4.0
"""Heartbeat intervals an assignment goes unconfirmed, at least, before it is withdrawn."""


TIMED_OUT = "timeout"
"""The reason of the leader's stops of runs past their timeout (and their assignments' end)."""

TIMEOUT_MARGIN_S = 30.0
"""How long past its ``timeout_s`` (or a tenth of the timeout, when longer) a run may go before
the leader stops it: the worker's reaper stops it at the timeout and reports within a heartbeat,
so the leader acts only for a worker that did not (an agent without timeouts, a reaper that
failed); the margin covers the stop's grace and a slow report."""

MAX_BACKOFF_CAPS = 64
"""Most entries :func:`backoff_caps_s` returns (reached only when max_s / base_s > 2**63)."""


def backoff_caps_s(*, base_s: float, max_s: float) -> tuple[float, ...]:
    """The requeue backoff's caps, in seconds: entry k-1 bounds the wait after a job's k-th
    loss, ``min(max_s, base_s * 2 ** (k - 1))``, up to the first entry that reaches ``max_s``,
    which bounds every later loss too.

    The wait itself is drawn uniformly below the cap by the database when it requeues the job
    (``random()``, see ``actors.queries.ledger._REQUEUE_BACKOFF``): capped exponential backoff with full
    jitter, ``sleep = random_between(0, min(cap, base * 2 ** attempt))`` in "Exponential
    Backoff And Jitter" (Marc Brooker, AWS Architecture Blog, 2015), which spreads the jobs of
    one lost worker out instead of handing them all back at the same moment.

    Args:
        base_s: the cap after the first loss.
        max_s: the largest cap.

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


@attrs.frozen
class TokenBucket:
    """Tokens for dead-worker declarations at trio time ``at``: one per declaration, refilled
    at a steady rate up to a burst (the token bucket of Kubernetes' rate limiters,
    k8s.io/client-go/util/flowcontrol, which the node lifecycle controller uses for
    ``--node-eviction-rate``)."""

    tokens: float
    at: float

    def refilled(self, now: float, *, rate_per_s: float, burst: int) -> TokenBucket:
        """The bucket at ``now`` (trio seconds), ``rate_per_s`` tokens added per second since
        ``at``, holding at most ``burst``."""
        elapsed = max(0.0, now - self.at)
        return TokenBucket(min(float(burst), self.tokens + elapsed * rate_per_s), max(self.at, now))

    def take(self, count: int) -> TokenBucket:
        """The bucket after ``count`` declarations (never below 0)."""
        return TokenBucket(max(0.0, self.tokens - count), self.at)

    @property
    def whole(self) -> int:
        """Declarations the bucket allows now."""
        return math.floor(self.tokens + 1e-9)


@attrs.frozen(kw_only=True)
class DeathVerdict:
    """What one pass does about silent workers."""

    declare: tuple[tuple[str, int], ...]
    """(worker_id, incarnation) pairs to name dead now, longest silent first."""
    held: tuple[tuple[str, int], ...]
    """Silent past dead_after_s, but not named in this pass."""
    mass_silence: bool
    """Too many workers are silent at once: none is named."""
    alive: int
    """Alive workers (silent ones included)."""
    bucket: TokenBucket
    """The bucket refilled to this pass; charge it with the declarations that committed."""


POLICY_COSTS_SEEN_WITHIN_S = 10.0
"""The heartbeat costs of control planes seen within this many seconds count (the others are
down: they share no heartbeats)."""


def judge_deaths(
    ages: Sequence[HeartbeatAge],
    settings: ReconcilerSettings,
    bucket: TokenBucket,
    now: float,
    *,
    hold_on_mass_silence: bool = True,
) -> DeathVerdict:
    """Which silent workers to name dead in this pass.

    A worker is silent when its last recorded heartbeat is older than the dead_after it is judged
    by (:func:`judged_dead_after_s`: ``dead_after_s``, or longer when the heartbeat interval the
    cluster told it asks for it). None is
    named while more than ``mass_silence_fraction`` of the alive workers, and at least
    ``mass_silence_min_workers``, have been silent for ``suspect_after_s`` (half of
    ``dead_after_s`` by default) at once: the fault is then more likely on the control plane's
    side (its database, its network, its own load) than on so many workers. Counting from the
    shorter span sees workers cut off together as one event, before the first of them would be
    named (their last heartbeats are up to a heartbeat interval apart).
    Otherwise the longest silent are named, as many as ``bucket`` allows (``death_burst`` at
    once, ``deaths_per_s`` after). Both rules are those of Kubernetes' node lifecycle
    controller (kubernetes.io/docs/concepts/architecture/nodes/#rate-limits-on-eviction:
    ``--node-eviction-rate``; a zone with at least ``--unhealthy-zone-threshold`` of its nodes,
    and no fewer than 3, not ready evicts at a lower rate or, in a small cluster, not at all;
    with every node not ready it evicts nothing). Holding a declaration back is always safe: a
    silent worker fences itself after ``self_fence_after_s``, and the fenced declaration
    re-checks the silence by database time when it is made.

    Args:
        ages: every alive worker incarnation and its heartbeat age (seconds, database time).
        settings: ``dead_after_s``, ``death_burst``, ``deaths_per_s``,
            ``mass_silence_fraction``, ``mass_silence_min_workers``.
        bucket: the declarations' tokens as the previous pass left them.
        now: trio time of this pass (seconds).
        hold_on_mass_silence: False once a mass silence has lasted ``mass_silence_max_s``:
            it is still reported, but no longer holds the declarations.
    """
    silent = sorted(
        (a for a in ages if a.age_s > judged_dead_after_s(a, settings.dead_after_s)),
        key=lambda a: (-a.age_s, a.worker_id, a.incarnation),
    )
    pairs = tuple((a.worker_id, a.incarnation) for a in silent)
    bucket = bucket.refilled(now, rate_per_s=settings.deaths_per_s, burst=settings.death_burst)
    # A worker judged by a longer dead_after is suspect after as large a share of it.
    share = settings.suspect_s / settings.dead_after_s
    suspects = sum(1 for a in ages if a.age_s > share * judged_dead_after_s(a, settings.dead_after_s))
    mass = suspects >= settings.mass_silence_min_workers and suspects > settings.mass_silence_fraction * len(
        ages
    )
    allowed = 0 if mass and hold_on_mass_silence else min(len(pairs), bucket.whole)
    return DeathVerdict(
        declare=pairs[:allowed], held=pairs[allowed:], mass_silence=mass, alive=len(ages), bucket=bucket
    )


@attrs.define
class SilenceFloor:
    """From when (database time) the leader counts workers' silence: the rule that keeps an
    outage from being taken for the death of every worker (DESIGN.md, "Outages").

    A worker's silence counts from the latest of its last recorded heartbeat, the database
    server's start (in the reads' SQL), and this floor, which moves to the database's ``now()``:

    - on the first pass of an epoch (a takeover: the new leader did not watch the time before,
      which may have been an outage, as after a database failover);
    - on the first pass after the leader's reads were interrupted for more than
      ``contact_gap_s`` (its database was unreachable, or it was stalled);
    - when a mass silence ends (Kubernetes' node lifecycle controller, too, gives every node of
      a zone a fresh grace when the zone leaves full disruption).

    Moving the floor only ever delays a declaration, which is safe (the silent worker paused
    or stopped its jobs long before): the fence of invariant 7 does not depend on it.
    """

    floor_unix_s: float | None = None
    contact_at: float = -math.inf
    """trio time of the last successful read."""
    epoch: int | None = None
    mass_silence: bool = False
    mass_since: float | None = None
    """trio time the current mass silence began; None while there is none."""

    def mass_silence_for_s(self, mass: bool, now: float) -> float:
        """How long the mass silence seen at trio time ``now`` has lasted (0 when ``mass`` is
        false, or when it begins now)."""
        if not mass:
            self.mass_since = None
            return 0.0
        if self.mass_since is None:
            self.mass_since = now
        return now - self.mass_since

    def read(self, epoch: int, now_unix_s: float, now: float, gap_s: float) -> bool:
        """Account for a successful read at database time ``now_unix_s`` and trio time ``now``
        under ``epoch``; True when the floor moved."""
        moved = epoch != self.epoch or now - self.contact_at > gap_s
        if moved:
            self.floor_unix_s = now_unix_s
            self.epoch = epoch
        self.contact_at = now
        return moved

    def mass_silence_seen(self, mass: bool, now_unix_s: float) -> bool:
        """Account for a pass's verdict; True (and the floor moved) when a mass silence ended."""
        ended = self.mass_silence and not mass
        self.mass_silence = mass
        if ended:
            self.floor_unix_s = now_unix_s
        return ended

    def floored(self, ages: Iterable[HeartbeatAge], now_unix_s: float) -> list[HeartbeatAge]:
        """``ages`` counted from the floor at the latest."""
        if self.floor_unix_s is None:
            return list(ages)
        most_s = max(0.0, now_unix_s - self.floor_unix_s)
        return [a if a.age_s <= most_s else attrs.evolve(a, age_s=most_s) for a in ages]


DRAINED = "drained"
"""The end reason of an assignment a drain's deadline stopped."""


def ending_message(
    epoch: int,
    assignment_ids: tuple[int, ...],
    *,
    requeue: bool,
    reason: str,
    requeue_backoff_caps_s: tuple[float, ...],
    reply: Reply[tuple[int, ...]],
) -> EndAssignments | EndDrainedAssignments:
    """The fenced write that ends ``assignment_ids``, which their worker acknowledged
    cancelling, for ``reason``: a drain's (:data:`DRAINED`) requeues without a loss or a
    backoff (:class:`EndDrainedAssignments`); any other ends them as cancelled and, with
    ``requeue``, counts a loss and waits the backoff of ``requeue_backoff_caps_s``
    (:class:`EndAssignments`); a timeout's (:data:`TIMED_OUT`) spends an attempt and retries or
    fails the job (:class:`EndAssignments` with ``timed_out``)."""
    if reason == DRAINED:
        return EndDrainedAssignments(epoch=epoch, assignment_ids=assignment_ids, reply=reply)
    return EndAssignments(
        epoch=epoch,
        assignment_ids=assignment_ids,
        requeue=requeue,
        reason=reason,
        requeue_backoff_caps_s=requeue_backoff_caps_s,
        reply=reply,
        timed_out=reason == TIMED_OUT,
    )


@attrs.define
class Reconciler:
    """The actor."""

    settings: ReconcilerSettings
    store: ReconcilerStore
    role: RoleView
    ledger: trio.MemorySendChannel[LedgerInbox]
    dispatcher: trio.MemorySendChannel[DispatcherInbox]
    max_rows_per_fenced_write: int = DEFAULT_MAX_ROWS_PER_FENCED_WRITE
    """Most assignments one fenced write may end (the ledger's ``max_rows_per_fenced_write``)."""
    _write_size: WriteSize | None = None
    _bucket: TokenBucket | None = None
    _unconfirmed_read_at: float = -math.inf
    """When the previous pass read the unconfirmed assignments (trio time)."""
    _silence: SilenceFloor = attrs.field(factory=SilenceFloor)
    _logged_at: dict[str, float] = attrs.field(factory=dict)
    _health_judged_at: float = -math.inf
    """When the last pass judged the workers' health (trio time)."""
    _policy_chosen_at: float = -math.inf
    """When the last pass chose the heartbeat interval (trio time)."""
    _cancelling: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    """Assignment id -> the scope of the background task cancelling it."""
    _cancels_epoch: int | None = None
    """The epoch of the term whose cancellations run (None: none)."""
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
            if epoch != self._cancels_epoch:
                # A new term: the last one's cancellations would end nothing (the fence).
                # Not at every pass after a failed one: a task of this term may have a
                # worker's acknowledgement to write.
                self._stop_cancellations()
                self._cancels_epoch = epoch
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
            self._stop_cancellations()
            self._cancels_epoch = None

        async with trio.open_nursery() as background:
            await self.role.every_interval_while_leader(
                self.settings.reconcile_interval_s, logged_pass, on_standby=standby, task_status=task_status
            )

    def _hand_over(self, dispatches: Sequence[Dispatch]) -> None:
        """Give the dispatcher the re-sends it has room for, without waiting: while it is busy
        (workers that answer slowly hold its calls) a pass that waited for room would hold the
        next read of heartbeat ages back. What is left is re-sent at its next doubling
        (:func:`resend_due`), or withdrawn; counted and logged at most every ``held_log_every_s``."""
        for n, dispatch in enumerate(dispatches):
            try:
                self.dispatcher.send_nowait(dispatch)
            except trio.WouldBlock:
                left = dispatches[n:]
                self._resends_dropped += sum(len(d.assignments) for d in left)
                break
        now = trio.current_time()
        if (
            self._resends_dropped
            and now - self._logged_at.get("resends", -math.inf) >= self.settings.held_log_every_s
        ):
            self._logged_at["resends"] = now
            self._log.warning(
                "re-sends left for later: the dispatcher is busy", assignments=self._resends_dropped
            )
            self._resends_dropped = 0

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

    def _stop_cancellations(self) -> None:
        """Cancel the background cancellations of an earlier term (no checkpoint)."""
        for scope in set(self._cancelling.values()):
            scope.cancel()
        self._cancelling.clear()

    async def _ask_ledger(self, message_of: Any) -> Any:
        reply: Reply[Any] = Reply()
        await self.ledger.send(message_of(reply))
        return await reply.wait()

    def write_size(self) -> WriteSize:
        """How many rows the next fenced write may carry (see :mod:`actors.write_size`)."""
        if self._write_size is None or self._write_size.most != self.max_rows_per_fenced_write:
            self._write_size = WriteSize.full(self.max_rows_per_fenced_write)
        return self._write_size

    async def _write(self, message_of: Callable[[Reply[Any]], LedgerInbox]) -> Any:
        """Ask the ledger for one fenced write, made of at most ``write_size().rows`` rows, and
        size the next one by how this one went.

        Raises:
            StaleEpoch, DatabaseUnavailable: as the ledger answered (DatabaseBusy: the server
                cancelled the write; the next one is half as large).
        """
        try:
            result = await self._ask_ledger(message_of)
        except DatabaseBusy:
            self._write_size = self.write_size().after_cancel()
            raise
        self._write_size = self.write_size().after_success()
        return result

    async def reconcile(
        self, epoch: int, background: trio.Nursery, *, first_pass: bool = False
    ) -> ReconcileResult:
        """One pass under ``epoch``, starting its cancellations on workers in ``background``
        without waiting for them. Returns what the fenced dead-worker step changed (all its
        batches).

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
            interval_s = self._interval_s
            plan = plan_deliveries(
                unconfirmed,
                s,
                first_pass=first_pass,
                since_last_read_s=since_last_read_s,
                heartbeat_interval_s=interval_s,
            )
            self._hand_over(plan.dispatches(epoch))
        with self._step("cancels"):
            cancelled = await self.store.cancel_requested()
            # The leader's backing of timeouts: a run its worker let outlive its timeout_s by the
            # margin is stopped by the leader; ended once its worker acknowledged (invariant 6).
            overdue = await self.store.overdue(TIMEOUT_MARGIN_S)
            drained = await self.store.drain_due()
            cancellations: list[tuple[WorkerRef, Sequence[Delivery], bool, str]] = [
                *((worker, group, True, "unconfirmed") for worker, group in plan.withdraw),
                *((worker, group, False, "cancelled_by_user") for worker, group in by_worker(cancelled)),
                *((worker, group, False, TIMED_OUT) for worker, group in by_worker(overdue)),
                *((worker, group, True, DRAINED) for worker, group in by_worker(drained)),
            ]
            for worker, group, requeue, reason in cancellations:
                group = [d for d in group if d.assignment.assignment_id not in self._cancelling]
                if not group:
                    continue
                if reason == TIMED_OUT:
                    self._log.warning(
                        "stopping runs past their timeout",
                        epoch=epoch,
                        worker_id=worker.worker_id,
                        job_ids=[d.assignment.job_id for d in group],
                        assignment_ids=[d.assignment.assignment_id for d in group],
                    )
                # Marked in flight here, not when the task first runs: the same assignment
                # in two lists of this pass (a drained run a user cancelled) is asked once.
                scope = trio.CancelScope()
                for d in group:
                    self._cancelling[d.assignment.assignment_id] = scope
                background.start_soon(
                    self._cancel_in_background, scope, epoch, worker, group, requeue, reason
                )
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
        (:func:`actors.heartbeat_policy.choose_policy`) from the control planes' measured
        heartbeat costs, and write it in a fenced write when it changed. Returns the policy
        written, None when none was.

        Raises:
            StaleEpoch, DatabaseUnavailable: the read or the write failed.
        """
        s = self.settings
        inputs = await self.store.heartbeat_policy_inputs(POLICY_COSTS_SEEN_WITHIN_S)
        # No policy row: the control planes tell their defaults, which is what is in force.
        current = inputs.current or default_policy(s)
        wanted_ms = wanted_interval_ms(
            workers=workers, costs_us=inputs.costs_us, waits_ms=inputs.waits_ms, settings=s
        )
        chosen = choose_policy(
            workers=workers,
            costs_us=inputs.costs_us,
            waits_ms=inputs.waits_ms,
            current=current,
            settings=s,
            floor_ms=0 if wanted_ms is None else self._wanted_intervals.add(trio.current_time(), wanted_ms),
        )
        if chosen is current:
            self._interval_s = current.interval_ms / 1000
            return None
        await self._write(lambda reply: SetHeartbeatPolicy(epoch=epoch, policy=chosen, reply=reply))
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
        """Step 6 of the module: read every alive worker's judged runs, decide with
        :func:`actors.health.judge_health`, and write the marks and clears in one fenced write
        (none when nothing changes; at most ``write_size().rows`` changes, the rest in the next
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
            written = await self._write(
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
        """Settle the waiting jobs that can be settled now (step 4 of the module): one fenced
        write per batch read, again while a write cancelled jobs or was full, at most
        :data:`actors.dependencies.CASCADE_STEPS` writes. Returns what all of them changed.

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
            settled: SettledJobs = await self._write(
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
            self._log.info(
                "settled waiting jobs",
                epoch=epoch,
                released=len(released),
                cancelled=len(cancelled),
                released_job_ids=released,
                cancelled_job_ids=cancelled,
            )
        return SettledJobs(released_job_ids=tuple(released), cancelled_job_ids=tuple(cancelled))

    async def _declare_and_end_orphans(
        self, epoch: int, declare: tuple[tuple[str, int], ...]
    ) -> ReconcileResult:
        """Declare ``declare`` dead and end the first batch of orphaned assignments in one fenced
        transaction, then one batch per fenced transaction while a batch was full. Returns the
        whole series' changes.

        Raises:
            StaleEpoch, DatabaseUnavailable: a batch failed; no later batch is sent (those that
                committed stay, and the next pass, or the next leader's, ends the rest).
        """
        caps = self.requeue_backoff_caps_s
        first = self.write_size().rows
        batch: ReconcileResult = await self._write(
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
        requeued, ended = list(batch.requeued_job_ids), list(batch.orphaned_assignment_ids)
        ended_jobs, ended_on = list(batch.orphaned_job_ids), list(batch.orphaned_worker_ids)
        transactions = 1
        try:
            while batch.more_orphans:
                rows = self.write_size().rows
                batch = await self._write(
                    lambda reply: EndOrphanedAssignments(
                        epoch=epoch,
                        requeue_backoff_caps_s=caps,
                        max_ended=rows,  # noqa: B023 (called at once, in this iteration)
                        reply=reply,
                    )
                )
                transactions += 1
                requeued += batch.requeued_job_ids
                ended += batch.orphaned_assignment_ids
                ended_jobs += batch.orphaned_job_ids
                ended_on += batch.orphaned_worker_ids
        finally:
            if dead or ended:
                self._log.warning(
                    "reconciled",
                    epoch=epoch,
                    dead_workers=list(dead),
                    requeued_jobs=len(requeued),
                    ended_assignments=len(ended),
                    transactions=transactions,
                    assignment_ids=ended,
                    job_ids=ended_jobs,
                    worker_ids=ended_on,
                    requeued_job_ids=requeued,
                )
        return ReconcileResult(
            dead_worker_ids=dead, requeued_job_ids=tuple(requeued), orphaned_assignment_ids=tuple(ended)
        )

    def _report_slow_pass(self, took_s: float) -> None:
        """Say which steps took the time of a pass longer than half the contact gap (the next
        read of heartbeat ages comes late, and past the gap silence counts anew), at most once
        every ``held_log_every_s``."""
        if took_s <= self._gap_s / 2:
            return
        now = trio.current_time()
        if now - self._logged_at.get("slow_pass", -math.inf) < self.settings.held_log_every_s:
            return
        self._logged_at["slow_pass"] = now
        self._log.warning(
            "slow reconcile pass", took_s=round(took_s, 3), contact_gap_s=self._gap_s, steps_s=self._steps_s
        )

    def _report_held(self, verdict: DeathVerdict, now: float) -> None:
        """Count the silent workers this pass holds back, and say so in the log at most once
        every ``held_log_every_s`` per reason."""
        metrics.MASS_SILENCE.set(1 if verdict.mass_silence else 0)
        if not verdict.held:
            return
        reason = "mass_silence" if verdict.mass_silence else "rate_limit"
        metrics.DEATHS_HELD.labels(reason).inc(len(verdict.held))
        if now - self._logged_at.get(reason, -math.inf) < self.settings.held_log_every_s:
            return
        self._logged_at[reason] = now
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

    async def _cancel_in_background(
        self,
        scope: trio.CancelScope,
        epoch: int,
        worker: WorkerRef,
        group: Sequence[Delivery],
        requeue: bool,
        reason: str,
    ) -> None:
        """:meth:`_cancel` as a task of its own, in ``scope`` (which ``_cancelling`` maps its
        assignments to until it ends); a refused or failed ending is logged (a later pass asks
        again), not raised."""
        ids = [d.assignment.assignment_id for d in group]
        with scope:
            try:
                await self._cancel(epoch, worker, group, requeue, reason)
            except StaleEpoch as exc:
                self._log.info(
                    "cancellation's ending refused: deposed",
                    epoch=exc.epoch,
                    epoch_seen=exc.epoch_seen,
                    worker_id=worker.worker_id,
                    assignment_ids=ids,
                )
            except DatabaseUnavailable as exc:
                self._log.warning(
                    "cancellation's ending failed",
                    epoch=epoch,
                    worker_id=worker.worker_id,
                    assignment_ids=ids,
                    error=str(exc),
                )
            finally:
                for assignment_id in ids:
                    if self._cancelling.get(assignment_id) is scope:
                        del self._cancelling[assignment_id]

    async def _cancel(
        self, epoch: int, worker: WorkerRef, group: Sequence[Delivery], requeue: bool, reason: str
    ) -> None:
        ids = tuple(d.assignment.assignment_id for d in group)
        reply: Reply[tuple[int, ...]] = Reply()
        await self.dispatcher.send(
            CancelOnWorker(
                epoch=epoch,
                worker=worker,
                assignment_ids=ids,
                reply=reply,
                job_ids=tuple(d.assignment.job_id for d in group),
            )
        )
        acknowledged: tuple[int, ...] = ()
        with trio.move_on_after(CANCEL_REPLY_WAIT_S) as waited:
            acknowledged = await reply.wait()
        if waited.cancelled_caught:
            self._log.warning(
                "cancellation unanswered: the dispatcher never replied",
                epoch=epoch,
                worker_id=worker.worker_id,
                waited_s=CANCEL_REPLY_WAIT_S,
                assignment_ids=list(ids),
            )
        if not acknowledged:
            return
        ended: list[int] = []
        remaining = acknowledged
        while remaining:
            rows = self.write_size().rows
            ids, remaining = remaining[:rows], remaining[rows:]
            ended += await self._write(
                lambda reply: ending_message(
                    epoch,
                    ids,  # noqa: B023 (called at once, in this iteration)
                    requeue=requeue,
                    reason=reason,
                    requeue_backoff_caps_s=self.requeue_backoff_caps_s if requeue else (),
                    reply=reply,
                )
            )
        job_of = {d.assignment.assignment_id: d.assignment.job_id for d in group}
        self._log.info(
            "ended assignments",
            epoch=epoch,
            worker_id=worker.worker_id,
            reason=reason,
            count=len(ended),
            job_ids=[job_of[a] for a in ended if a in job_of],
            assignment_ids=list(ended),
        )

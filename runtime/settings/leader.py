"""The settings of the leader's work: :class:`LeaseSettings`, :class:`LedgerSettings`,
:class:`PlacerSettings`, :class:`ReconcilerSettings` (with :func:`fence_margin_refusal`) and
:class:`DispatchSettings`."""

from __future__ import annotations

import math

import attrs

from runtime.errors import InvalidArgument
from runtime.settings.agent import DEFAULT_SELF_FENCE_MARGIN_S, DEFAULT_STOP_GRACE_S
from runtime.settings.fields import (
    DEFAULT_READ_STATEMENT_TIMEOUT_S,
    between,
    between_s,
    check_not_above,
    check_not_below,
    fraction,
    non_negative,
    positive,
    up_to_s,
)

MAX_PREEMPT_GRACE_S = 600.0
"""The longest ``preempt_grace_s`` allowed, in seconds: a preemption's cancel call waits the
grace and more for its answer, and the preempting job keeps its worker held meanwhile."""

MAX_PREEMPT_COOLDOWN_S = 86_400.0
"""The longest ``preempt_cooldown_s`` allowed, in seconds (a day): the database's interval
arithmetic on it must stay in range."""

MAX_FAIR_SHARE_HALF_LIFE_S = 31_536_000.0
"""The longest ``fair_share_half_life_s`` allowed, in seconds (365 days; Slurm's default
PriorityDecayHalfLife is 7 days): the past-use read looks 10 half-lives back."""

PREEMPT_HOLD_MARGIN_S = 10.0
"""How long past ``preempt_grace_s`` a preempting job keeps the worker it preempted on held
for itself (seconds): room for the cancel's answer and the fenced end of the victims."""

PLACEMENT_POLICIES = ("best_fit", "first_fit", "worst_fit")
"""The placement policies :func:`actors.placement.place` knows, the default first."""

DEFAULT_DEAD_AFTER_S = 2.5
"""The default of ``ReconcilerSettings.dead_after_s`` (see there), which the ingest tells
workers at registration."""


@attrs.frozen(kw_only=True)
class LeaseSettings:
    """The lease keeper's timing."""

    lease_ttl_s: float = attrs.field(default=2.0, validator=positive)
    """How long a takeover or renewal holds the lease, by database time."""
    renew_interval_s: float = attrs.field(default=0.5, validator=positive)
    """How often the leader renews (ttl/4 by default)."""
    step_down_margin_s: float = attrs.field(default=0.4, validator=positive)
    """The leader stops deciding once its last renewal was sent more than ttl minus this ago."""
    takeover_poll_s: float = attrs.field(default=0.05, validator=positive)
    """How often a standby checks whether the lease expired or its holder's session is gone."""
    statement_timeout_s: float = attrs.field(default=1.0, validator=positive)
    """Longest a lease query may take before it counts as failed."""
    renew_retry_s: float = attrs.field(default=0.05, validator=positive)
    """Wait after a renewal that failed (database unreachable) before the next try, in seconds;
    never longer than ``renew_interval_s``."""
    max_main_loop_stall_s: float = attrs.field(default=5.0, validator=positive)
    """The leader steps down (and a standby takes nothing over) while the process's main loop,
    where decisions are made, has not run for this long; the lease keeper itself runs on a
    loop of its own."""

    def __attrs_post_init__(self) -> None:
        if self.renew_interval_s >= self.lease_ttl_s - self.step_down_margin_s:
            raise InvalidArgument(
                "renew_interval_s",
                self.renew_interval_s,
                f"must be < lease_ttl_s - step_down_margin_s = "
                f"{self.lease_ttl_s - self.step_down_margin_s:g}",
            )


DEFAULT_MAX_ROWS_PER_FENCED_WRITE = 500
"""The default of ``LedgerSettings.max_rows_per_fenced_write`` (see there)."""

MAX_STATEMENTS_PER_FENCED_WRITE = 2
"""Most writing statements one fenced transaction runs after its fence: a dead-worker
declaration and one batch of endings (a placement is a single statement that carries its own
fence). So a fenced write holds the lease's share lock for at most this many times the ledger's
``statement_timeout_s`` (see :attr:`LedgerSettings.longest_share_lock_hold_s`)."""


@attrs.frozen(kw_only=True)
class LedgerSettings:
    """The fenced connection's session settings, and how large a fenced write may be."""

    idle_in_transaction_timeout_s: float = attrs.field(default=2.0, validator=positive)
    """PostgreSQL ends a session idle inside a transaction this long (a frozen leader's)."""
    statement_timeout_s: float = attrs.field(default=0.2, validator=positive)
    """Longest one statement on the fenced connection may run, waits for row locks included
    (the session's ``statement_timeout`` and ``lock_timeout``), in seconds. The server cancels
    a fenced statement past it, which aborts its transaction and releases the lease's share
    lock: a takeover waiting behind it gets through (the write fails and is tried again)."""
    answer_timeout_s: float = attrs.field(default=6.0, validator=positive)
    """A fenced write still unanswered after this long (a stalled connection, which no server
    timeout ends) drops its connection; its outcome is then unknown."""
    client_check_interval_s: float = attrs.field(default=0.25, validator=positive)
    """How often the server checks that the fenced connection's client is still there while a
    statement runs (the session's ``client_connection_check_interval``), in seconds: a
    statement whose client dropped it (answer deadline, lost connection) ends within this
    long instead of running on to its end."""
    max_rows_per_fenced_write: int = attrs.field(
        default=DEFAULT_MAX_ROWS_PER_FENCED_WRITE, validator=positive
    )
    """Most assignments one fenced write creates or ends, pending reasons included (a
    declaration adds its few workers). Deciders slice larger decisions into several writes,
    and write fewer while the server cancels their writes (:mod:`actors.write_size`); the
    ledger refuses a larger request. 500 rows hold the share lock 10 to 40 ms on 2 cores."""

    @property
    def longest_share_lock_hold_s(self) -> float:
        """The longest a fenced write can hold the lease's share lock, in seconds, while its
        client sends each statement promptly: ``MAX_STATEMENTS_PER_FENCED_WRITE`` statements,
        each cancelled at ``statement_timeout_s`` (a frozen client is bounded by
        ``idle_in_transaction_timeout_s`` instead)."""
        return MAX_STATEMENTS_PER_FENCED_WRITE * self.statement_timeout_s


@attrs.frozen(kw_only=True)
class PlacerSettings:
    """The placer's round."""

    round_interval_s: float = attrs.field(default=0.1, validator=positive)
    """Time between round starts."""
    max_jobs_per_round: int = attrs.field(default=200_000, validator=positive)
    """Most pending jobs the placer holds (read highest priority and oldest first)."""
    max_placements_per_round: int = attrs.field(default=DEFAULT_MAX_ROWS_PER_FENCED_WRITE, validator=positive)
    """Most placements one round commits (one fenced statement): at most the ledger's
    ``max_rows_per_fenced_write``."""
    worker_fresh_s: float = attrs.field(default=1.0, validator=positive)
    """Place only on workers whose last heartbeat is at most this old (database time)."""
    policy: str = attrs.field(default=PLACEMENT_POLICIES[0])
    """One of :data:`PLACEMENT_POLICIES`: best_fit, first_fit or worst_fit."""
    max_reservations: int = attrs.field(default=4, validator=non_negative)
    """Workers a round may keep free for the first jobs that fit no free room yet (0: none; see
    :mod:`actors.placement`)."""
    reserve_after_s: float = attrs.field(default=10.0, validator=non_negative)
    """Only a job queued this long may reserve a worker (seconds)."""
    initial_window: int = attrs.field(default=16, validator=positive)
    """Unconfirmed assignments a worker incarnation may hold before any heartbeat confirmed one
    (the send window's start; it grows by one per confirmed assignment: see
    :func:`actors.placement.send_window`)."""
    max_unconfirmed_per_worker: int = attrs.field(default=64, validator=positive)
    """Most unconfirmed assignments a worker may hold however many it confirmed (the send
    window's ceiling)."""
    trial_run_s: float = attrs.field(default=5.0, validator=non_negative)
    """A worker on trial (newly registered, or whose unhealthy mark was cleared:
    :mod:`actors.health`) takes one job at a time until a run there since then succeeded or
    ran this long, in seconds. 0: no trial."""

    fair_share: bool = True
    """Divide the cluster between accounts that compete for it by weighted Dominant Resource
    Fairness (:mod:`actors.fair_share`, docs/fair-share.md); False: jobs go by priority, then
    submission order, whoever owns them."""
    fair_share_half_life_s: float = attrs.field(default=3600.0, validator=up_to_s(MAX_FAIR_SHARE_HALF_LIFE_S))
    """Fair share counts an account's past use, each run weighted by 2^(-age / this), in
    seconds (Slurm's PriorityDecayHalfLife); 0: only what its jobs hold now counts."""

    resync_interval_s: float = attrs.field(default=30.0, validator=positive)
    """Read the whole pending queue again this often (and at every election), in seconds."""
    reserving_recheck_s: float = attrs.field(default=1.0, validator=positive)
    """How often the placer asks whether the jobs holding reservations are still pending, in
    seconds (not on every round of a backlog)."""
    read_statement_timeout_s: float = attrs.field(
        default=DEFAULT_READ_STATEMENT_TIMEOUT_S, validator=positive
    )
    """Longest one of the placer's reads may run (its connection's ``statement_timeout``), in
    seconds."""
    preemption: bool = False
    """Whether a pending job of higher priority that fits no free room may stop running jobs of
    lower priority (docs/preemption.md). Off by default: a preemption throws away the victims'
    work since their last checkpoint, which only an operator who set priorities for it wants."""
    preempt_grace_s: float = attrs.field(default=5.0, validator=between_s(0.0, MAX_PREEMPT_GRACE_S))
    """A preempted job gets SIGTERM, then SIGKILL this long after (seconds, > 0 and <= 600); the
    preempting job keeps its worker held this long plus :data:`PREEMPT_HOLD_MARGIN_S`."""
    preempt_cooldown_s: float = attrs.field(default=60.0, validator=up_to_s(MAX_PREEMPT_COOLDOWN_S))
    """A job is preempted at most once per this many seconds (database time)."""
    max_preemptions_per_round: int = attrs.field(default=8, validator=between(1, 500))
    """Most pending jobs one round preempts for (1 to 500)."""

    @policy.validator
    def _policy(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in PLACEMENT_POLICIES:
            raise InvalidArgument(
                "policy", value, f"must be {', '.join(PLACEMENT_POLICIES[:-1])} or {PLACEMENT_POLICIES[-1]}"
            )

    def __attrs_post_init__(self) -> None:
        check_not_above(self, "initial_window", "max_unconfirmed_per_worker")


@attrs.frozen(kw_only=True)
class ReconcilerSettings:
    """The reconciler's repair pass."""

    reconcile_interval_s: float = attrs.field(default=0.25, validator=positive)
    """Time between passes."""
    dead_after_s: float = attrs.field(default=DEFAULT_DEAD_AFTER_S, validator=positive)
    """A worker without a recorded heartbeat for this long (database time) is declared dead."""
    redispatch_after_s: float = attrs.field(default=1.0, validator=positive)
    """An assignment no heartbeat has confirmed after this long is sent to its worker again
    (and again at twice, four times ... this age)."""
    cancel_unconfirmed_after_s: float = attrs.field(default=30.0, validator=positive)
    """An assignment still unconfirmed after this long is cancelled on its worker and requeued."""
    requeue_backoff_base_s: float = attrs.field(default=0.125, validator=positive)
    """A job requeued after its first loss (worker dead or registered again, assignment
    withdrawn) waits a random time below this before it is placed again; the bound doubles
    with every further loss (seconds; see :func:`actors.reconciler.backoff_caps_s`)."""
    requeue_backoff_max_s: float = attrs.field(default=30.0, validator=positive)
    """The bound of the requeue backoff never exceeds this (seconds)."""
    death_burst: int = attrs.field(default=3, validator=positive)
    """Most workers declared dead at once (the token bucket's size)."""
    deaths_per_s: float = attrs.field(default=1.0, validator=positive)
    """Dead-worker declarations allowed per second beyond the burst (the bucket's refill rate)."""
    mass_silence_fraction: float = attrs.field(default=0.5, validator=fraction)
    """No worker is declared dead while more than this fraction of the alive workers (and at
    least ``mass_silence_min_workers``) are silent past ``suspect_after_s`` at once; when that
    ends, silence counts anew from then (DESIGN.md, "Outages")."""
    mass_silence_min_workers: int = attrs.field(default=3, validator=positive)
    """Fewer silent workers than this never count as mass silence."""
    mass_silence_max_s: float = attrs.field(default=60.0, validator=positive)
    """A mass silence holds declarations for at most this long (seconds); past it the silent
    workers are declared dead again, as the rate limit allows. Longer than the agents'
    ``db_outage_grace_s`` (45 s): by then a cut-off worker has killed its paused jobs."""
    suspect_after_s: float | None = attrs.field(default=None)
    """A worker silent this long counts toward mass silence (seconds; None: half of
    ``dead_after_s``). Shorter than ``dead_after_s``, so that workers cut off together are
    seen together before the first of them would be declared dead."""
    contact_gap_s: float = attrs.field(default=1.0, validator=positive)
    """When the leader's reads of the workers' silence were interrupted for longer than this,
    silence counts anew from the first read after (seconds; DESIGN.md, "Outages"); it grows
    with a longer dead_after (:func:`actors.reconciler.contact_gap_for_s`)."""
    held_log_every_s: float = attrs.field(default=5.0, validator=positive)
    """At most one log line per this many seconds about held declarations, per reason."""
    read_statement_timeout_s: float = attrs.field(
        default=DEFAULT_READ_STATEMENT_TIMEOUT_S, validator=positive
    )
    """Longest one of the reconciler's reads may run (its connection's ``statement_timeout``),
    in seconds."""
    health_interval_s: float = attrs.field(default=1.0, validator=positive)
    """How often the leader judges the workers' health from their recent runs, in seconds
    (:mod:`actors.health`)."""
    health_window_runs: int = attrs.field(default=10, validator=between(1, 1000))
    """A worker's health is judged on its last this many ended runs (1 to 1000)."""
    health_window_s: float = attrs.field(default=600.0, validator=positive)
    """... that ended within this many seconds (database time)."""
    health_min_failed_jobs: int = attrs.field(default=3, validator=between(1, 1000))
    """A worker is marked unhealthy only when runs of at least this many different jobs failed
    there among its judged runs (one job failing again and again is the job's doing)."""
    health_min_failure_rate: float = attrs.field(default=0.5)
    """... and at least this fraction of its judged runs failed (above 0, at most 1)."""
    health_rate_factor: float = attrs.field(default=3.0)
    """... and that fraction is at least this many times the other workers' over the same span
    of time (at least 1). Failures of jobs that (or whose siblings: same array, same command)
    failed on other workers too are not counted: a batch of jobs that fail everywhere marks no
    worker."""
    health_min_compared_runs: int = attrs.field(default=5, validator=between(1, 1000))
    """The rate is compared only when the other workers ended at least this many runs over the
    same span (1 to 1000); with fewer, a worker is marked only when at least
    ``health_min_failed_jobs`` of the jobs that failed there succeeded on another worker."""
    heartbeat_interval_min_s: float = attrs.field(default=0.25, validator=positive)
    """The shortest heartbeat interval the leader asks of workers, in seconds: what a small
    cluster uses (docs/design.md, "Heartbeat interval"; :mod:`actors.heartbeat_policy`)."""
    heartbeat_interval_max_s: float = attrs.field(default=10.0, validator=positive)
    """The longest heartbeat interval the leader asks of workers, in seconds, however large
    the cluster: it bounds how long a dead worker goes unnoticed (``dead_after_intervals`` of
    it). 10 s, Nomad's shortest heartbeat TTL (docs/scale.md)."""
    heartbeat_cpu_budget: float = attrs.field(default=0.25, validator=fraction)
    """The share of a core each control plane may spend on heartbeats (above 0, below 1): the
    interval grows with the cluster so that the heartbeats' measured cost stays within it."""
    dead_after_intervals: float = attrs.field(default=4.0)
    """A worker is declared dead after this many heartbeat intervals without one, never sooner
    than ``dead_after_s`` (at least 3, room for a late heartbeat before the self-fence)."""
    heartbeat_policy_every_s: float = attrs.field(default=1.0, validator=positive)
    """How often the leader chooses the heartbeat interval again, in seconds."""
    preempt_grace_s: float = attrs.field(default=5.0, validator=between_s(0.0, MAX_PREEMPT_GRACE_S))
    """The stop's grace a preemption's cancel asks of the worker (seconds, > 0 and <= 600):
    SIGTERM, then SIGKILL this long after. The same as ``PlacerSettings.preempt_grace_s``
    (:class:`runtime.settings.ControlPlaneSettings` refuses two different ones)."""
    health_probe_after_s: float = attrs.field(default=300.0, validator=non_negative)
    """This long after a worker was marked unhealthy (or a probe failed there), one job at a
    time may be placed on it again as a probe, whose success clears the mark, in seconds. 0: no
    probes (only a run there succeeding, or ``stockade uncordon``, clears it)."""

    @health_min_failure_rate.validator
    def _rate(self, attribute: attrs.Attribute[float], value: float) -> None:
        if not 0 < value <= 1:
            raise InvalidArgument(attribute.name, value, "must be > 0 and <= 1")

    @dead_after_intervals.validator
    def _intervals(self, attribute: attrs.Attribute[float], value: float) -> None:
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 3):
            raise InvalidArgument(attribute.name, value, "must be a finite number >= 3")

    @health_rate_factor.validator
    def _factor(self, attribute: attrs.Attribute[float], value: float) -> None:
        if not (value >= 1 and math.isfinite(value)):
            raise InvalidArgument(attribute.name, value, "must be a finite number >= 1")

    @property
    def suspect_s(self) -> float:
        """``suspect_after_s``, or half of ``dead_after_s`` when it is None."""
        return self.dead_after_s / 2 if self.suspect_after_s is None else self.suspect_after_s

    def __attrs_post_init__(self) -> None:
        if self.suspect_after_s is not None and not 0 < self.suspect_after_s <= self.dead_after_s:
            raise InvalidArgument(
                "suspect_after_s",
                self.suspect_after_s,
                f"must be > 0 and <= dead_after_s = {self.dead_after_s:g}",
            )
        check_not_below(self, "requeue_backoff_max_s", "requeue_backoff_base_s")
        check_not_below(self, "heartbeat_interval_max_s", "heartbeat_interval_min_s")
        if self.heartbeat_interval_min_s >= self.dead_after_s:
            raise InvalidArgument(
                "heartbeat_interval_min_s",
                self.heartbeat_interval_min_s,
                f"must be below dead_after_s = {self.dead_after_s:g} (a worker fences itself"
                " before dead_after, and must hear back at least once before it does)",
            )
        check_not_above(
            self, "health_min_failed_jobs", "health_window_runs", "the runs a worker is judged on"
        )


def fence_margin_refusal(
    settings: ReconcilerSettings,
    *,
    stop_grace_s: float = DEFAULT_STOP_GRACE_S,
    self_fence_margin_s: float = DEFAULT_SELF_FENCE_MARGIN_S,
) -> str | None:
    """Why a control plane refuses ``settings`` at start, or None: with some heartbeat interval
    it may tell, the dead_after that goes with it (``max(dead_after_s, interval x
    dead_after_intervals)``) leaves an agent a self-fence span (dead_after - ``stop_grace_s`` -
    ``self_fence_margin_s``) no longer than the interval, so its agents would pause at every
    heartbeat. The span less the interval is lowest at an end of the range or where the
    dead_after starts to follow the interval, so those are checked.
    """
    low, high = settings.heartbeat_interval_min_s, settings.heartbeat_interval_max_s
    crossover = settings.dead_after_s / settings.dead_after_intervals
    for interval_s in sorted({low, high, min(high, max(low, crossover))}):
        dead_after_s = max(settings.dead_after_s, interval_s * settings.dead_after_intervals)
        fence_s = dead_after_s - stop_grace_s - self_fence_margin_s
        if fence_s <= interval_s:
            return (
                f"with a heartbeat interval of {interval_s:g} s the dead_after is {dead_after_s:g} s,"
                f" which leaves a self-fence span of {fence_s:g} s (dead_after - stop_grace_s"
                f" {stop_grace_s:g} s - self_fence_margin_s {self_fence_margin_s:g} s of the agents)"
                " not longer than the interval:"
                f" raise dead_after_s or lower heartbeat_interval_min_s = {low:g}"
            )
    return None


@attrs.frozen(kw_only=True)
class DispatchSettings:
    """The leader's calls to workers."""

    rpc_timeout_s: float = attrs.field(default=2.0, validator=positive)
    """Deadline of one Assign or Cancel call."""

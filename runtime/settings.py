"""Settings, grouped per component, with the unit in every name, passed explicitly.

Defaults: lease 2 s (renewed every 0.5 s, standbys probe every 50 ms), placer round 100 ms,
reconcile 0.25 s, heartbeat 0.25 s, dead_after 2.5 s, self-fence 1.5 s with a 0.5 s stop
grace (so a cut-off worker has stopped its jobs 0.5 s before the cluster may move them), to
recover a dead worker's jobs within 3 s (DESIGN.md's "Defaults today"; the README's settings
table lists the current values). Every timing knob and session setting of the actors and the
agent is a field here, with its unit in its name. Every group validates itself at construction and raises
:class:`runtime.errors.InvalidArgument` naming the field, the value and the limit;
:class:`ControlPlaneSettings` checks the rules between groups (the fence rule: a fenced write
never holds the lease's share lock long enough to cost the leader its renewal).

Why one module of about 510 lines: it is the one list of every knob, which the README's
settings table, the CLI's options and :class:`ControlPlaneSettings`'s rules between groups
all read as one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import attrs

from runtime import identifiers
from runtime.checks import check_int_between
from runtime.errors import InvalidArgument
from runtime.jobs import MAX_CPU_MILLIS, MAX_MEMORY_MB
from runtime.oom import DEFAULT_JOB_OOM_SCORE_ADJ, MIN_JOB_OOM_SCORE_ADJ, check_oom_score_adj
from runtime.tls import TlsFiles


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _id(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    identifiers.check_id(value, field=attribute.name)


def _listen_host(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    identifiers.parse_host(value, field=attribute.name)


def _advertise_address(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if value:
        identifiers.parse_address(value, field=attribute.name)


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise InvalidArgument(attribute.name, value, "must be a finite number > 0")


def _between(low: int, high: int) -> Any:
    """A validator: an int from ``low`` to ``high`` (:func:`runtime.checks.check_int_between`)."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
        check_int_between(attribute.name, value, low, high)

    return check


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise InvalidArgument(attribute.name, value, "must be a finite number >= 0")


def _fraction(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0 < value < 1:
        raise InvalidArgument(attribute.name, value, "must be > 0 and < 1")


def session_ms(seconds: float) -> str:
    """A duration as a PostgreSQL session setting's value: whole milliseconds, as text
    (``statement_timeout``, ``lock_timeout``, ``idle_in_transaction_session_timeout``)."""
    return str(int(seconds * 1000))


PLACEMENT_POLICIES = ("best_fit", "first_fit", "worst_fit")
"""The placement policies :func:`actors.placement.place` knows, the default first (the one
list: settings, the placer and the tools take it from here)."""

DEFAULT_READ_STATEMENT_TIMEOUT_S = 5.0
"""The default of the deciders' ``read_statement_timeout_s`` (placer, reconciler)."""

DEFAULT_WIRE_WORK_BURST_S = 0.01
"""The default of ``IngestSettings.wire_work_burst_s`` (see there)."""

DEFAULT_SELF_FENCE_AFTER_S = 1.5
"""The default of ``AgentSettings.self_fence_after_s`` (see there)."""

DEFAULT_LEAVE_TIMEOUT_S = 10.0
"""The default of ``AgentSettings.leave_timeout_s`` (see there)."""

DEFAULT_DB_OUTAGE_GRACE_S = 45.0
"""The default of ``AgentSettings.db_outage_grace_s``: longer than a Patroni failover (its
leader key's ttl is at least 20 s, and a promotion takes 20-30 s), so a failover kills no job."""

DEFAULT_RESTART_HOLD_S = 30.0
"""A planned restart's hold (``AgentSettings.restart_hold_s``): an agent started again within
it keeps every job without pausing it."""
MAX_RESTART_HOLD_S = 600.0
"""The longest restart hold, in seconds (``actors.validation.MAX_RESTART_HOLD_S`` too)."""

DEFAULT_STOP_GRACE_S = 0.5
"""The default of ``AgentSettings.stop_grace_s`` (see there)."""
DEFAULT_SELF_FENCE_MARGIN_S = 0.5
"""The default of ``AgentSettings.self_fence_margin_s`` (see there)."""

DEFAULT_DEAD_AFTER_S = 2.5
"""The default of ``ReconcilerSettings.dead_after_s`` (see there), which the ingest tells
workers at registration."""


@attrs.frozen(kw_only=True)
class LeaseSettings:
    """The lease keeper's timing."""

    lease_ttl_s: float = attrs.field(default=2.0, validator=_positive)
    """How long a takeover or renewal holds the lease, by database time."""
    renew_interval_s: float = attrs.field(default=0.5, validator=_positive)
    """How often the leader renews (ttl/4 by default)."""
    step_down_margin_s: float = attrs.field(default=0.4, validator=_positive)
    """The leader stops deciding once its last renewal was sent more than ttl minus this ago."""
    takeover_poll_s: float = attrs.field(default=0.05, validator=_positive)
    """How often a standby checks whether the lease expired or its holder's session is gone."""
    statement_timeout_s: float = attrs.field(default=1.0, validator=_positive)
    """Longest a lease query may take before it counts as failed."""
    renew_retry_s: float = attrs.field(default=0.05, validator=_positive)
    """Wait after a renewal that failed (database unreachable) before the next try, in seconds;
    never longer than ``renew_interval_s``."""
    max_main_loop_stall_s: float = attrs.field(default=5.0, validator=_positive)
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

    idle_in_transaction_timeout_s: float = attrs.field(default=2.0, validator=_positive)
    """PostgreSQL ends a session idle inside a transaction this long (a frozen leader's)."""
    statement_timeout_s: float = attrs.field(default=0.2, validator=_positive)
    """Longest one statement on the fenced connection may run, waits for row locks included
    (the session's ``statement_timeout`` and ``lock_timeout``), in seconds. The server cancels
    a fenced statement past it, which aborts its transaction and releases the lease's share
    lock: a takeover waiting behind it gets through (the write fails and is tried again)."""
    answer_timeout_s: float = attrs.field(default=6.0, validator=_positive)
    """A fenced write still unanswered after this long (a stalled connection, which no server
    timeout ends) drops its connection; its outcome is then unknown."""
    client_check_interval_s: float = attrs.field(default=0.25, validator=_positive)
    """How often the server checks that the fenced connection's client is still there while a
    statement runs (the session's ``client_connection_check_interval``), in seconds: a
    statement whose client dropped it (answer deadline, lost connection) ends within this
    long instead of running on to its end."""
    max_rows_per_fenced_write: int = attrs.field(
        default=DEFAULT_MAX_ROWS_PER_FENCED_WRITE, validator=_positive
    )
    """Most assignments one fenced write creates or ends, pending reasons included (a
    declaration adds its few workers). Deciders slice larger decisions into several writes,
    each fenced (a dead worker's thousands of assignments end 500 at a time), and write fewer
    while the server cancels their writes (:mod:`actors.write_size`); the ledger refuses a
    larger request. Measured on the 2-core VM (``python -m ops.bench.measure_fence``): 500 rows hold
    the share lock 10 to 40 ms, idle or beside two CPU burners."""

    @property
    def longest_share_lock_hold_s(self) -> float:
        """The longest a fenced write can hold the lease's share lock, in seconds, while its
        client sends each statement promptly: ``MAX_STATEMENTS_PER_FENCED_WRITE`` statements,
        each cancelled at ``statement_timeout_s`` (the fence itself and the COMMIT take no
        time worth counting). A client frozen inside the transaction is bounded by
        ``idle_in_transaction_timeout_s`` instead."""
        return MAX_STATEMENTS_PER_FENCED_WRITE * self.statement_timeout_s


@attrs.frozen(kw_only=True)
class PlacerSettings:
    """The placer's round."""

    round_interval_s: float = attrs.field(default=0.1, validator=_positive)
    """Time between round starts."""
    max_jobs_per_round: int = attrs.field(default=200_000, validator=_positive)
    """Most pending jobs the placer holds (read highest priority and oldest first)."""
    max_placements_per_round: int = attrs.field(
        default=DEFAULT_MAX_ROWS_PER_FENCED_WRITE, validator=_positive
    )
    """Most placements one round commits (one fenced statement): at most the ledger's
    ``max_rows_per_fenced_write``. 2,000 in one statement held the lease's share lock up to
    166 ms on the loaded 2-core VM, 500 up to 39 ms."""
    worker_fresh_s: float = attrs.field(default=1.0, validator=_positive)
    """Place only on workers whose last heartbeat is at most this old (database time)."""
    policy: str = attrs.field(default=PLACEMENT_POLICIES[0])
    """One of :data:`PLACEMENT_POLICIES`: best_fit, first_fit or worst_fit."""
    max_reservations: int = attrs.field(default=4, validator=_non_negative)
    """Workers a round may keep free for the first jobs that fit no free room yet (0: none; see
    :mod:`actors.placement`)."""
    reserve_after_s: float = attrs.field(default=10.0, validator=_non_negative)
    """Only a job queued this long may reserve a worker (seconds)."""
    initial_window: int = attrs.field(default=16, validator=_positive)
    """Unconfirmed assignments a worker incarnation may hold before any heartbeat confirmed one
    (the send window's start; it grows by one per confirmed assignment: see
    :func:`actors.rooms.send_window`)."""
    max_unconfirmed_per_worker: int = attrs.field(default=64, validator=_positive)
    """Most unconfirmed assignments a worker may hold however many it confirmed (the send
    window's ceiling)."""
    trial_run_s: float = attrs.field(default=5.0, validator=_non_negative)
    """A worker on trial (newly registered, or whose unhealthy mark was cleared: see
    :mod:`actors.health`) takes one job at a time until a run there of its incarnation, since
    then, succeeded or ran this long, in seconds: a broken worker cannot swallow a burst of jobs
    before its failures are judged. 0: no trial."""

    resync_interval_s: float = attrs.field(default=30.0, validator=_positive)
    """Read the whole pending queue again this often (and at every election), in seconds."""
    reserving_recheck_s: float = attrs.field(default=1.0, validator=_positive)
    """How often the placer asks whether the jobs holding reservations are still pending, in
    seconds (not on every round of a backlog)."""
    read_statement_timeout_s: float = attrs.field(
        default=DEFAULT_READ_STATEMENT_TIMEOUT_S, validator=_positive
    )
    """Longest one of the placer's reads may run (its connection's ``statement_timeout``), in
    seconds."""

    @policy.validator
    def _policy(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in PLACEMENT_POLICIES:
            raise InvalidArgument(
                "policy", value, f"must be {', '.join(PLACEMENT_POLICIES[:-1])} or {PLACEMENT_POLICIES[-1]}"
            )

    def __attrs_post_init__(self) -> None:
        if self.initial_window > self.max_unconfirmed_per_worker:
            raise InvalidArgument(
                "initial_window",
                self.initial_window,
                f"must be <= max_unconfirmed_per_worker = {self.max_unconfirmed_per_worker}",
            )


@attrs.frozen(kw_only=True)
class ReconcilerSettings:
    """The reconciler's repair pass."""

    reconcile_interval_s: float = attrs.field(default=0.25, validator=_positive)
    """Time between passes."""
    dead_after_s: float = attrs.field(default=DEFAULT_DEAD_AFTER_S, validator=_positive)
    """A worker without a recorded heartbeat for this long (database time) is declared dead."""
    redispatch_after_s: float = attrs.field(default=1.0, validator=_positive)
    """An assignment no heartbeat has confirmed after this long is sent to its worker again
    (and again at twice, four times ... this age)."""
    cancel_unconfirmed_after_s: float = attrs.field(default=30.0, validator=_positive)
    """An assignment still unconfirmed after this long is cancelled on its worker and requeued."""
    requeue_backoff_base_s: float = attrs.field(default=0.125, validator=_positive)
    """A job requeued after its first loss (worker dead or registered again, assignment
    withdrawn) waits a random time below this before it is placed again; the bound doubles
    with every further loss (seconds; see :func:`actors.reconciler.backoff_caps_s`). Short:
    a first loss is the common case, a dead worker, and its jobs should move within a round
    or two; the doubling is what holds back a job lost again and again."""
    requeue_backoff_max_s: float = attrs.field(default=30.0, validator=_positive)
    """The bound of the requeue backoff never exceeds this (seconds)."""
    death_burst: int = attrs.field(default=3, validator=_positive)
    """Most workers declared dead at once (the token bucket's size)."""
    deaths_per_s: float = attrs.field(default=1.0, validator=_positive)
    """Dead-worker declarations allowed per second beyond the burst (the bucket's refill rate)."""
    mass_silence_fraction: float = attrs.field(default=0.5, validator=_fraction)
    """No worker is declared dead while more than this fraction of the alive workers (and at
    least ``mass_silence_min_workers``) are silent past ``suspect_after_s`` at once; when that
    ends, silence counts anew from then (DESIGN.md, "Outages")."""
    mass_silence_min_workers: int = attrs.field(default=3, validator=_positive)
    """Fewer silent workers than this never count as mass silence."""
    mass_silence_max_s: float = attrs.field(default=60.0, validator=_positive)
    """A mass silence holds declarations for at most this long (seconds); past it the silent
    workers are declared dead again, as the rate limit allows. Longer than the agents'
    ``db_outage_grace_s`` (45 s): by then a cut-off worker has killed its paused jobs, so
    holding on would only leave them unplaced (workers that really died stay silent for
    ever)."""
    suspect_after_s: float | None = attrs.field(default=None)
    """A worker silent this long counts toward mass silence (seconds; None: half of
    ``dead_after_s``). Shorter than ``dead_after_s``, so that workers cut off together are
    seen together before the first of them would be declared dead."""
    contact_gap_s: float = attrs.field(default=1.0, validator=_positive)
    """When the leader's reads of the workers' silence were interrupted for longer than this
    (its database was unreachable, or it was stalled), silence counts anew from the first read
    after (seconds; DESIGN.md, "Outages"). It grows in proportion when the workers are judged by
    a longer dead_after than ``dead_after_s`` (:func:`actors.deaths.contact_gap_for_s`)."""
    held_log_every_s: float = attrs.field(default=5.0, validator=_positive)
    """At most one log line per this many seconds about held declarations, per reason."""
    read_statement_timeout_s: float = attrs.field(
        default=DEFAULT_READ_STATEMENT_TIMEOUT_S, validator=_positive
    )
    """Longest one of the reconciler's reads may run (its connection's ``statement_timeout``),
    in seconds."""
    health_interval_s: float = attrs.field(default=1.0, validator=_positive)
    """How often the leader judges the workers' health from their recent runs, in seconds
    (:mod:`actors.health`)."""
    health_window_runs: int = attrs.field(default=10, validator=_between(1, 1000))
    """A worker's health is judged on its last this many ended runs (1 to 1000)."""
    health_window_s: float = attrs.field(default=600.0, validator=_positive)
    """... that ended within this many seconds (database time)."""
    health_min_failed_jobs: int = attrs.field(default=3, validator=_between(1, 1000))
    """A worker is marked unhealthy only when runs of at least this many different jobs failed
    there among its judged runs (one job failing again and again is the job's doing)."""
    health_min_failure_rate: float = attrs.field(default=0.5)
    """... and at least this fraction of its judged runs failed (above 0, at most 1)."""
    health_rate_factor: float = attrs.field(default=3.0)
    """... and that fraction is at least this many times the other workers' over the same span
    of time (at least 1). Failures of jobs that (or whose siblings: same array, same command)
    failed on other workers too are not counted: a batch of jobs that fail everywhere marks no
    worker."""
    health_min_compared_runs: int = attrs.field(default=5, validator=_between(1, 1000))
    """The rate is compared only when the other workers ended at least this many runs over the
    same span (1 to 1000); with fewer, a worker is marked only when at least
    ``health_min_failed_jobs`` of the jobs that failed there succeeded on another worker."""
    heartbeat_interval_min_s: float = attrs.field(default=0.25, validator=_positive)
    """The shortest heartbeat interval the leader asks of workers, in seconds: what a small
    cluster uses (docs/design.md, "Heartbeat interval"; :mod:`actors.heartbeat_policy`)."""
    heartbeat_interval_max_s: float = attrs.field(default=10.0, validator=_positive)
    """The longest heartbeat interval the leader asks of workers, in seconds, however large
    the cluster: it bounds how long a dead worker goes unnoticed (``dead_after_intervals`` of
    it). 10 s, Nomad's shortest heartbeat TTL: a cluster whose heartbeats cost more than
    the budget at this interval is past what its control planes can take (docs/scale.md)."""
    heartbeat_cpu_budget: float = attrs.field(default=0.25, validator=_fraction)
    """The share of a core each control plane may spend on heartbeats (above 0, below 1): the
    interval grows with the cluster so that the heartbeats' measured cost stays within it."""
    dead_after_intervals: float = attrs.field(default=4.0)
    """A worker is declared dead after this many heartbeat intervals without one, never sooner
    than ``dead_after_s`` (at least 3: the self-fence, below it by the agent's stop grace and
    margin, must leave room for a late heartbeat)."""
    heartbeat_policy_every_s: float = attrs.field(default=1.0, validator=_positive)
    """How often the leader chooses the heartbeat interval again, in seconds."""
    health_probe_after_s: float = attrs.field(default=300.0, validator=_non_negative)
    """This long after a worker was marked unhealthy (or a probe failed there), one job at a
    time may be placed on it again as a probe: its success clears the mark, its failure renews
    it, in seconds. 0: no probes (only a run already there succeeding, or ``stockade
    uncordon``, clears it)."""

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
        if self.requeue_backoff_max_s < self.requeue_backoff_base_s:
            raise InvalidArgument(
                "requeue_backoff_max_s",
                self.requeue_backoff_max_s,
                f"must be >= requeue_backoff_base_s = {self.requeue_backoff_base_s:g}",
            )
        if self.heartbeat_interval_max_s < self.heartbeat_interval_min_s:
            raise InvalidArgument(
                "heartbeat_interval_max_s",
                self.heartbeat_interval_max_s,
                f"must be >= heartbeat_interval_min_s = {self.heartbeat_interval_min_s:g}",
            )
        if self.heartbeat_interval_min_s >= self.dead_after_s:
            raise InvalidArgument(
                "heartbeat_interval_min_s",
                self.heartbeat_interval_min_s,
                f"must be below dead_after_s = {self.dead_after_s:g} (a worker fences itself"
                " before dead_after, and must hear back at least once before it does)",
            )
        if self.health_min_failed_jobs > self.health_window_runs:
            raise InvalidArgument(
                "health_min_failed_jobs",
                self.health_min_failed_jobs,
                f"must be <= health_window_runs = {self.health_window_runs} (the runs a worker is judged on)",
            )


def fence_margin_refusal(
    settings: ReconcilerSettings,
    *,
    stop_grace_s: float = DEFAULT_STOP_GRACE_S,
    self_fence_margin_s: float = DEFAULT_SELF_FENCE_MARGIN_S,
) -> str | None:
    """Why a control plane refuses ``settings`` at start, or None: with some heartbeat interval
    it may tell (``heartbeat_interval_min_s`` .. ``heartbeat_interval_max_s``), the dead_after
    that goes with it (``max(dead_after_s, interval x dead_after_intervals)``) leaves an agent a
    self-fence span (dead_after - ``stop_grace_s`` - ``self_fence_margin_s``, the agents'
    defaults unless given) no longer than the interval: its agents would refuse the interval,
    or pause their jobs at every heartbeat. The span less the interval is lowest at an end of
    the range or where the dead_after starts to follow the interval, so those are checked.
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

    rpc_timeout_s: float = attrs.field(default=2.0, validator=_positive)
    """Deadline of one Assign or Cancel call."""


MAX_HEARTBEAT_GROUP_WAIT_S = 0.1
"""The longest :attr:`IngestSettings.heartbeat_group_wait_s`, in seconds: a fifth of an
agent's default heartbeat deadline (0.5 s), which every grouped heartbeat's answer spends it from."""
MAX_HEARTBEAT_GROUP = 5000
"""The most heartbeats :attr:`IngestSettings.heartbeat_group_max` may allow in one group."""


@attrs.frozen(kw_only=True)
class IngestSettings:
    """The ControlPlane gRPC service's database capacity and how it sheds load (see
    :mod:`actors.admission`)."""

    pool_size: int = attrs.field(default=8, validator=_positive)
    """Database connections of the service, all opened at start and kept open."""
    liveness_reserved_connections: int = attrs.field(default=2, validator=_positive)
    """Connections only heartbeats, registrations and the replica's presence may use; every
    other RPC shares the remaining ``pool_size - liveness_reserved_connections``."""
    shed_lag_s: float = attrs.field(default=0.25, validator=_positive)
    """Refuse new work (RESOURCE_EXHAUSTED, "busy") while the ingest loop's worst lag over the
    last second exceeds this, in seconds."""
    max_requests_in_progress: int = attrs.field(default=2, validator=_positive)
    """RPCs other than heartbeats and registrations served at once, each from its admission
    until its reply is encoded (database work and reply building both); the rest wait their
    turn. At most ``pool_size - liveness_reserved_connections`` count, whatever this says."""
    max_waiting_requests: int = attrs.field(default=16, validator=_non_negative)
    """Refuse new work that would wait for its turn behind this many others."""
    max_admission_wait_s: float = attrs.field(default=1.0, validator=_positive)
    """Refuse new work ("busy") that has waited this long for its turn without getting one, in
    seconds (a client's own deadline may end the wait earlier)."""
    max_wire_work_share: float = attrs.field(default=0.25, validator=_positive)
    """Most of the service's event-loop time that building, encoding, decoding and checking
    large messages (in slices of ``wire_step_messages``) may take, as a fraction of wall time
    (0.25: a quarter); past it the slices pause, so heartbeats and the gRPC exchanges get the rest."""
    wire_work_burst_s: float = attrs.field(default=DEFAULT_WIRE_WORK_BURST_S, validator=_non_negative)
    """The most loop time those slices may save up while idle and then spend at once, in
    seconds (:class:`actors.admission.LoopShare`)."""
    wire_step_messages: int = attrs.field(default=32, validator=_positive)
    """Elements of a large reply (a listing's jobs) encoded, or of a large request (a batch's
    jobs) decoded and checked, between two yields to the service's event loop: about 2 ms of
    work at 32 on the 2-core development VM."""
    statement_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    """Longest one statement of the service may run (its connections' ``statement_timeout``),
    in seconds."""
    idle_in_transaction_timeout_s: float = attrs.field(default=0.5, validator=_positive)
    """PostgreSQL ends a service session idle inside a transaction this long (a replica frozen
    in the middle of a registration), so it does not keep a worker's row locked, in seconds."""
    lock_timeout_s: float = attrs.field(default=0.3, validator=_positive)
    """Longest a statement of the service waits for a row lock (the worker then tries the next
    replica), in seconds."""
    liveness_connection_wait_s: float = attrs.field(default=5.0, validator=_positive)
    """Longest liveness work (heartbeats, registrations, presence) waits for a connection, in
    seconds (other work waits at most ``max_admission_wait_s``)."""
    answer_timeout_s: float = attrs.field(default=6.0, validator=_positive)
    """Longest a request's database work may run once started, in seconds. It is not
    cancelled by its client's deadline (its server-side ``statement_timeout_s`` bounds it);
    past this bound, a stalled connection is dropped."""
    shed_log_every_s: float = attrs.field(default=5.0, validator=_positive)
    """At most one log line about refused requests per this many seconds."""
    max_pending_jobs: int = attrs.field(default=20_000, validator=_non_negative)
    """Refuse submissions ("busy") while this many jobs are pending (0: no limit). Soft: a
    replica counts the queue at most every ``pending_count_max_age_s``, and a batch that
    arrives while the queue is under the limit is taken whole. Slurm's ``MaxJobCount``
    (10,000 by default) is the same guard."""
    pending_count_max_age_s: float = attrs.field(default=0.5, validator=_positive)
    """How old the pending count a submission is admitted on may be, in seconds."""
    idempotency_key_retention_s: float = attrs.field(default=86_400.0, validator=_positive)
    """How long a mutating call's idempotency key and answer are kept after its first use, in
    seconds (24 h, as Stripe keeps its keys): a copy of the call that arrives within it gets
    the first answer; one that arrives later is a new call. Keys older than this are deleted
    within ``idempotency_sweep_interval_s`` (see :mod:`actors.idempotency`)."""
    idempotency_sweep_interval_s: float = attrs.field(default=10.0, validator=_positive)
    """How often each replica deletes expired idempotency keys, in seconds."""
    idempotency_sweep_rows: int = attrs.field(default=5_000, validator=_positive)
    """Most keys one delete statement of the sweep removes (a pass runs statements until one
    removes fewer, or the service is busy)."""
    max_log_streams: int = attrs.field(default=64, validator=_positive)
    """Job output streams (ReadJobLogs) one replica relays at once; one more is refused
    ("busy", another replica may take it). Each holds no database connection once it is
    open, only its two gRPC streams."""
    log_open_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    """The longest a replica waits for the first chunk of a job's output from its worker, the
    connection and its TLS handshake included, in seconds; past it the worker counts as
    unreachable (UNAVAILABLE naming it)."""
    log_idle_timeout_s: float = attrs.field(default=20.0, validator=_positive)
    """A relayed output stream whose worker has sent nothing this long, not even a keep-alive
    (a following worker sends one every ``keepalive_s``, 5 s), is ended as unreachable, in
    seconds: the worker froze or its host went away."""
    heartbeat_group_wait_s: float = attrs.field(default=0.005, validator=_non_negative)
    """How long the ingest gathers liveness-only heartbeats before it records them together in
    one statement, in seconds (:mod:`actors.heartbeat_group`; docs/design.md, "Grouped
    heartbeats"): 5 ms, against a heartbeat deadline of hundreds. 0: every heartbeat is its own
    statement, as before groups existed (kept so a benchmark can compare the two). At most
    :data:`MAX_HEARTBEAT_GROUP_WAIT_S`."""
    heartbeat_group_max: int = attrs.field(default=500, validator=_positive)
    """Most heartbeats one group records (a full group is recorded at once, without waiting
    out ``heartbeat_group_wait_s``). At most :data:`MAX_HEARTBEAT_GROUP`."""
    heartbeat_groups_in_flight: int = attrs.field(default=2, validator=_positive)
    """Most group statements one ingest runs at once. A group whose wait ended while that many
    run keeps gathering until one ends, so under load the groups grow (fewer, larger
    statements: about 0.9 ms of database CPU per statement plus 28 µs per heartbeat) instead
    of queueing for connections. At most ``liveness_reserved_connections`` is useful."""

    def __attrs_post_init__(self) -> None:
        if self.max_wire_work_share > 1:
            raise InvalidArgument(
                "max_wire_work_share", self.max_wire_work_share, "must be a fraction in (0, 1]"
            )
        if self.heartbeat_group_wait_s > MAX_HEARTBEAT_GROUP_WAIT_S:
            raise InvalidArgument(
                "heartbeat_group_wait_s",
                self.heartbeat_group_wait_s,
                f"must be at most {MAX_HEARTBEAT_GROUP_WAIT_S:g} s (every heartbeat's answer waits it out)",
            )
        if self.heartbeat_group_max > MAX_HEARTBEAT_GROUP:
            raise InvalidArgument(
                "heartbeat_group_max", self.heartbeat_group_max, f"must be at most {MAX_HEARTBEAT_GROUP}"
            )
        if self.liveness_reserved_connections >= self.pool_size:
            raise InvalidArgument(
                "liveness_reserved_connections",
                self.liveness_reserved_connections,
                f"must be < pool_size = {self.pool_size} (other RPCs need a connection too)",
            )


@attrs.frozen(kw_only=True)
class ConsoleSettings:
    """The read-only web console every replica serves on its ``http_port`` (:mod:`actors.console`)."""

    read_timeout_s: float = attrs.field(default=2.0, validator=_positive)
    """Longest one page's database reads may take, waiting for a connection included, in
    seconds; past it the page says the database does not answer (and since when) instead."""
    output_timeout_s: float = attrs.field(default=2.0, validator=_positive)
    """Longest a job page waits for the tail of the job's output from its worker (through the
    log relay of ``stockade logs``), in seconds; past it the page says the output is out of reach."""
    output_tail_lines: int = attrs.field(default=40, validator=_positive)
    """Lines of each of stdout and stderr a job page shows."""
    output_tail_max_bytes: int = attrs.field(default=32 * 1024, validator=_positive)
    """Most bytes of each output tail a job page shows."""
    refresh_interval_s: float = attrs.field(default=1.0, validator=_positive)
    """How often an open page asks its console for fresh content, in seconds."""
    sample_interval_s: float = attrs.field(default=2.0, validator=_positive)
    """How often the replica samples the cluster's allocated CPU and memory for the packing
    chart, in seconds."""
    history_s: float = attrs.field(default=900.0, validator=_positive)
    """How far back the packing chart reaches, in seconds (the ring holds
    ``history_s / sample_interval_s`` samples; it starts empty when the replica starts)."""
    pool_size: int = attrs.field(default=2, validator=_positive)
    """Database connections of the console (its own pool, apart from the ingest's)."""
    max_token_lifetime_s: float = attrs.field(default=12 * 3600.0, validator=_positive)
    """The longest lifetime of a login token the console accepts, in seconds (12 h)."""

    @property
    def history_samples(self) -> int:
        """How many samples the packing ring keeps."""
        return max(2, math.ceil(self.history_s / self.sample_interval_s))


@attrs.frozen(kw_only=True)
class DatabaseWatchSettings:
    """What every replica watches in the database for what Stockade cannot fix itself, and
    when it warns (:mod:`actors.database_watch`): a transaction left open (by anyone) keeps
    PostgreSQL's vacuum from removing the row versions Stockade's updates leave behind, so the
    tables it updates several times a second (workers, jobs, assignments, lease) grow dead
    rows and slow every read of them."""

    sample_interval_s: float = attrs.field(default=5.0, validator=_positive)
    """How often the replica samples the oldest open transaction and the tables' rows, in
    seconds."""
    statement_timeout_s: float = attrs.field(default=DEFAULT_READ_STATEMENT_TIMEOUT_S, validator=_positive)
    """Longest one sample's read may run, in seconds."""
    oldest_transaction_warn_s: float = attrs.field(default=60.0, validator=_positive)
    """A warning is logged when the oldest transaction open in the database (another session's)
    has been open longer than this, in seconds; once per crossing, and a line again once none is."""
    dead_rows_warn_ratio: float = attrs.field(default=10.0, validator=_positive)
    """A warning is logged when a watched table holds more dead row versions than this many times
    its live rows (and more than ``dead_rows_warn_min``); once per crossing and table. Vacuum
    left to itself keeps dead rows below about a fifth of the live ones plus 50
    (``autovacuum_vacuum_scale_factor`` 0.2, ``autovacuum_vacuum_threshold`` 50)."""
    dead_rows_warn_min: int = attrs.field(default=1000, validator=_positive)
    """Fewer dead rows than this never warn, whatever the ratio: a table of a few live rows (the
    lease's one) counts dozens of dead ones between two vacuums."""


@attrs.frozen(kw_only=True)
class ControlPlaneSettings:
    """Everything one control-plane replica needs."""

    cp_id: str = attrs.field(validator=_id)
    """This replica's id, e.g. ``cp-1`` (an id, :func:`runtime.identifiers.check_id`)."""
    database_url: str = attrs.field(validator=lambda _i, _a, value: identifiers.check_database_url(value))
    """asyncpg URL of the shared database (:func:`runtime.identifiers.check_database_url`)."""
    listen_host: str = attrs.field(default="127.0.0.1", validator=_listen_host)
    """Host to listen on: an IPv4 or IPv6 address or a host name."""
    listen_port: int = 0
    """gRPC port of the ControlPlane service; 0 picks a free one."""
    advertise_address: str = attrs.field(default="", validator=_advertise_address)
    """host:port others should use (:func:`runtime.identifiers.parse_address`); defaults to
    listen_host:actual port."""
    presence_interval_s: float = attrs.field(default=1.0, validator=_positive)
    """How often the replica records that it is up (control_planes.seen_at)."""
    schema_retry_base_s: float = attrs.field(default=0.05, validator=_positive)
    """While the database cannot be reached at start-up, the schema is applied again after a
    random wait below this, then below twice, four times ... this (seconds; capped
    exponential backoff with full jitter, :func:`runtime.loops.retry`), as every connection
    owner reconnects (:data:`runtime.backoff.RECONNECT_BACKOFF`)."""
    schema_retry_max_s: float = attrs.field(default=2.0, validator=_positive)
    """The largest bound of that wait, in seconds: small, so a replica starts within about
    2 s of its database coming up."""
    ingest: IngestSettings = attrs.field(factory=IngestSettings)
    lease: LeaseSettings = attrs.field(factory=LeaseSettings)
    ledger: LedgerSettings = attrs.field(factory=LedgerSettings)
    placer: PlacerSettings = attrs.field(factory=PlacerSettings)
    reconciler: ReconcilerSettings = attrs.field(factory=ReconcilerSettings)
    dispatch: DispatchSettings = attrs.field(factory=DispatchSettings)
    http_port: int | None = attrs.field(default=None)
    """Port of the read-only web console (:mod:`actors.console`), 1 to 65535; None: no console.
    With ``tls`` it serves HTTPS on ``listen_host`` with this replica's certificate and asks
    every request for a login token (``stockade console``); without, plain HTTP on 127.0.0.1
    only, with no login."""
    console: ConsoleSettings = attrs.field(factory=ConsoleSettings)
    database_watch: DatabaseWatchSettings = attrs.field(factory=DatabaseWatchSettings)
    tls: TlsFiles | None = None
    """This replica's mutual-TLS files (the CA, its ``control-plane`` certificate and key):
    it serves the ControlPlane service over mutual TLS and calls workers with that
    certificate. None: plaintext and no identity checks (``--insecure``, for development)."""

    @http_port.validator
    def _http_port(self, attribute: attrs.Attribute[int | None], value: int | None) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
            raise InvalidArgument(
                "http_port", value, "must be a port between 1 and 65535, or None for no console"
            )

    def __attrs_post_init__(self) -> None:
        """The fence rule: a fenced write begun just before the leader stops deciding must have
        ended before its lease can expire, so a takeover never waits for it: the longest hold
        of the lease's share lock (:attr:`LedgerSettings.longest_share_lock_hold_s`, 2 x the
        ledger's statement timeout) must fit in the step-down margin. (The leader's renewal
        does not wait for that lock: fenced writes take it FOR KEY SHARE, which a renewal's
        update of ``expires_at`` does not conflict with; see ``schema.sql``.) A placer round is
        one fenced write, so it is bounded by the rows one may hold.

        Raises:
            InvalidArgument: a setting breaks the rule; the message names both sides.
        """
        hold_s = self.ledger.longest_share_lock_hold_s
        timeout_s = self.ledger.statement_timeout_s
        if hold_s > self.lease.step_down_margin_s:
            raise InvalidArgument(
                "ledger.statement_timeout_s",
                timeout_s,
                f"must be <= lease.step_down_margin_s / {MAX_STATEMENTS_PER_FENCED_WRITE} = "
                f"{self.lease.step_down_margin_s / MAX_STATEMENTS_PER_FENCED_WRITE:g}: a fenced write "
                f"holds the lease's share lock up to {MAX_STATEMENTS_PER_FENCED_WRITE} x it, and one "
                f"begun as the leader steps down must end before its lease expires",
            )
        if self.placer.max_placements_per_round > self.ledger.max_rows_per_fenced_write:
            raise InvalidArgument(
                "placer.max_placements_per_round",
                self.placer.max_placements_per_round,
                f"must be <= ledger.max_rows_per_fenced_write = {self.ledger.max_rows_per_fenced_write} "
                f"(a round's placements are one fenced write)",
            )


@attrs.frozen(kw_only=True)
class JobProcessSettings:
    """How the agent watches a command job's processes (:mod:`agent.runtimes`). The same for
    every worker of a process; the reaper itself (:mod:`agent.reaper`, a program of its own
    that imports nothing of ours to start fast) keeps its poll times next to its code."""

    exit_poll_s: float = attrs.field(default=0.05, validator=_positive)
    """How often the agent looks whether a job's reaper has exited, while waiting for it, in
    seconds."""
    reaper_slack_s: float = attrs.field(default=1.0, validator=_positive)
    """How long past its due time the agent waits for a reaper before it steps in, in seconds."""


JOB_PROCESSES = JobProcessSettings()
"""The :class:`JobProcessSettings` the agent uses."""


MIN_JOB_NICE = 0
MAX_JOB_NICE = 19
"""The range of ``AgentSettings.job_nice`` (19 is the lowest priority Linux knows)."""

MIN_JOB_PIDS = 1
MAX_JOB_PIDS = 4_194_304
"""The range of ``AgentSettings.job_pids_max``: up to ``PID_MAX_LIMIT`` of 64-bit Linux (4 Mi)."""
DEFAULT_JOB_PIDS_MAX = 4096
"""The default of ``AgentSettings.job_pids_max``."""
AUTO = "auto"
"""``AgentSettings.job_resources``: the best way the machine offers (cgroup2, else cgroup1, else
rlimit)."""
JOB_RESOURCES_CHOICES = (AUTO, "cgroup2", "cgroup1", "rlimit")
"""The values of ``AgentSettings.job_resources`` (:class:`agent.resources.Mode`, and ``auto``)."""


_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
"""A system user name ``useradd`` takes (and that cannot pass for one of its options)."""


MAX_OUTPUT_MB = 1_048_576
"""The largest ``max_output_mb`` (1 TiB)."""
DEFAULT_OUTPUT_RETENTION_S = 86_400.0
"""The default of ``OutputSettings.output_retention_s``: a day."""


@attrs.frozen(kw_only=True)
class OutputSettings:
    """How a worker keeps its jobs' output files (``stdout.log``, ``stderr.log`` in each job's
    folder) and serves them (Worker.ReadLogs); see :mod:`agent.output` and :mod:`agent.logs`."""

    max_output_mb: int = attrs.field(default=100)
    """Most MiB of each job's stdout, and of its stderr, the worker keeps on disk: past it the
    oldest part is dropped (from the head of the file, at block multiples), down to seven
    eighths of it, and readers are told how many bytes were dropped."""
    output_retention_s: float = attrs.field(default=DEFAULT_OUTPUT_RETENTION_S, validator=_positive)
    """A job's folder (its output, the reaper's files, a command's working directory) is deleted
    this long after the job ended, in seconds (a day); never while it runs."""
    check_interval_s: float = attrs.field(default=0.25, validator=_positive)
    """The longest time between two checks of a running job's output sizes, in seconds; a job
    that writes fast is checked more often, down to ``min_check_interval_s``."""
    min_check_interval_s: float = attrs.field(default=0.02, validator=_positive)
    """The shortest time between two checks of the output sizes, in seconds: how late the cap
    can be enforced on a job that writes as fast as it can (it bounds by how much a file can
    pass the cap)."""
    sweep_interval_s: float = attrs.field(default=60.0, validator=_positive)
    """Time between two sweeps of the jobs' folders for those past ``output_retention_s``."""
    max_sweep_deletions: int = attrs.field(default=100, validator=_positive)
    """Most job folders one sweep deletes (the rest wait for the next), so a sweep after a long
    stop stays short."""
    follow_poll_s: float = attrs.field(default=0.25, validator=_positive)
    """How often a followed output is looked at for new bytes, in seconds."""
    keepalive_s: float = attrs.field(default=5.0, validator=_positive)
    """A followed stream with nothing new sends an empty chunk after this long, in seconds, so
    its reader can tell a quiet job from a dead worker."""
    read_chunk_bytes: int = attrs.field(default=64 * 1024, validator=_positive)
    """Most bytes read from a file at once (off the agent's event loop) and sent in one chunk."""

    @max_output_mb.validator
    def _max_output_mb(self, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_MB:
            raise InvalidArgument("max_output_mb", value, f"must be an integer between 1 and {MAX_OUTPUT_MB}")

    def __attrs_post_init__(self) -> None:
        if self.min_check_interval_s > self.check_interval_s:
            raise InvalidArgument(
                "min_check_interval_s",
                self.min_check_interval_s,
                f"must be at most check_interval_s = {self.check_interval_s:g}",
            )

    @property
    def max_output_bytes(self) -> int:
        """``max_output_mb`` in bytes."""
        return self.max_output_mb * 1024 * 1024


@attrs.frozen(kw_only=True)
class AgentSettings:
    """Everything one worker agent needs."""

    worker_id: str = attrs.field(validator=_id)
    """Stable id of this worker, e.g. ``w-1`` (an id, :func:`runtime.identifiers.check_id`)."""
    control_planes: tuple[str, ...] = attrs.field(converter=_str_tuple)
    """host:port of every control plane (:func:`runtime.identifiers.parse_address`); heartbeats
    go to the first that answers."""
    cpu_millis: int = attrs.field(validator=_between(1, MAX_CPU_MILLIS))
    """CPU this worker offers, in millicores (1000 = one core), 1 to
    :data:`runtime.jobs.MAX_CPU_MILLIS` (what a registration may offer)."""
    memory_mb: int = attrs.field(validator=_between(1, MAX_MEMORY_MB))
    """Memory this worker offers, in MiB, 1 to :data:`runtime.jobs.MAX_MEMORY_MB`."""
    work_dir: str
    """Folder for the JSON-lines log and the jobs' stdout/stderr files."""
    listen_host: str = attrs.field(default="127.0.0.1", validator=_listen_host)
    """Host to listen on: an IPv4 or IPv6 address or a host name."""
    listen_port: int = 0
    """gRPC port of the Worker service; 0 picks a free one."""
    advertise_address: str = attrs.field(default="", validator=_advertise_address)
    """host:port the leader should call (:func:`runtime.identifiers.parse_address`); defaults
    to listen_host:actual port."""
    labels: dict[str, str] = attrs.field(factory=dict)
    """Sent with every registration (:func:`runtime.identifiers.check_labels`: Kubernetes'
    syntax for keys and values)."""
    heartbeat_interval_s: float = attrs.field(default=0.25, validator=_positive)
    """Time between heartbeats until the cluster tells another interval (in the replies to
    registrations and heartbeats; docs/design.md, "Heartbeat interval"), in seconds; the
    self-fence span grows with a longer told interval in proportion (:func:`agent.fence.fence_after_s`)."""
    heartbeat_interval_min_s: float = attrs.field(default=0.05, validator=_positive)
    """A told heartbeat interval below this is refused (logged; the last good one is kept)."""
    heartbeat_interval_max_s: float = attrs.field(default=10.0, validator=_positive)
    """A told heartbeat interval above this is refused (logged; the last good one is kept)."""
    heartbeat_timeout_s: float = attrs.field(default=0.5, validator=_positive)
    """How long a heartbeat (or registration) waits for one control plane before it is sent
    to the next one too, without giving up on the first (a hedged call, see
    :meth:`runtime.client.ControlPlaneClient.call_hedged`); also the shortest deadline a call
    gets. The call as a whole may wait until shortly before the fence deadline."""
    self_fence_after_s: float = attrs.field(default=DEFAULT_SELF_FENCE_AFTER_S, validator=_positive)
    """Pause every job when no heartbeat sent in the last this-many seconds was acknowledged.
    Must stay below the control planes' dead_after_s by more than stop_grace_s."""
    db_outage_grace_s: float = attrs.field(default=DEFAULT_DB_OUTAGE_GRACE_S, validator=_non_negative)
    """Paused jobs are killed once no heartbeat sent in the last this-many seconds was
    acknowledged (the longest database outage, or cut-off, running work survives); until then
    a heartbeat the database acknowledges resumes those whose assignment is still active
    (DESIGN.md, "Outages"). 0, or anything up to ``self_fence_after_s``: no pause, jobs are
    killed at the fence deadline."""
    stop_grace_s: float = attrs.field(default=DEFAULT_STOP_GRACE_S, validator=_positive)
    """Time between SIGTERM and SIGKILL when stopping a command job."""
    restart_hold_s: float = attrs.field(default=DEFAULT_RESTART_HOLD_S)
    """How long a planned restart (SIGHUP: the agent exits leaving its jobs running) asks the
    control planes to hold the worker, in seconds: no silence of it counts and nothing is placed
    on it for that long, and its jobs pause only that much later than without the hold; a new
    agent process on the same work folder takes them over within it (docs/design.md,
    "Restarts"). 0 to 600; 0: no hold (the restart then has the fence span)."""
    self_fence_margin_s: float = attrs.field(default=DEFAULT_SELF_FENCE_MARGIN_S, validator=_non_negative)
    """A worker's jobs must be stopped at least this long before the cluster may declare it
    dead: the self-fence deadline is lowered to ``dead_after_s - stop_grace_s`` minus this
    when the control planes' ``dead_after_s`` asks for it (:func:`agent.fence.fence_after_s`)."""
    min_self_fence_s: float = attrs.field(default=0.1, validator=_positive)
    """The self-fence deadline is never lowered below this, in seconds."""
    call_deadline_margin_s: float = attrs.field(default=0.1, validator=_non_negative)
    """A heartbeat or registration gives up this long before the fence deadline (an answer
    after it would come too late to keep the jobs), in seconds."""
    register_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    """The longest a new registration waits for an answer, in seconds, where the outage grace
    allows (:meth:`agent.fence.FenceClock.register_deadline_s`): a new incarnation holds no job,
    so a late answer costs nothing, while giving up sends a copy into the queues the first one
    still waits in, and an answer thrown away leaves the cluster waiting for the heartbeats of
    a worker that does not know it registered. Also the longest a paused worker's heartbeat
    waits, after calls that failed (:func:`agent.fence.patient_deadline_s`), for the same
    reasons."""
    register_retry_s: float = attrs.field(default=0.5, validator=_positive)
    """The longest pause after the first failed registration attempt, in seconds: the pauses
    while no control plane answers are drawn uniformly below a ceiling that starts here and
    doubles with each failed attempt up to ``register_retry_max_s`` (full jitter,
    :class:`runtime.backoff.FullJitterBackoff`), so workers that started together, or were
    all refused by an overloaded control plane at once, do not come back at once."""
    register_retry_max_s: float = attrs.field(default=5.0, validator=_positive)
    """The cap of the registration retries' ceiling (see ``register_retry_s``), in seconds."""
    leave_timeout_s: float = attrs.field(default=DEFAULT_LEAVE_TIMEOUT_S, validator=_positive)
    """How long a clean stop keeps trying to have a control plane record that the worker left,
    from its first attempt once every job has ended (attempts no replica answered are tried
    again after a jittered backoff), in seconds; past it the worker is declared dead after
    dead_after_s instead. A launcher waits this long and more before it SIGKILLs an agent."""
    max_concurrent_leaves: int = attrs.field(default=4, validator=_positive)
    """Most leave attempts in flight at once in this process: the workers of a fleet stopping
    together take turns, so their leaves do not reach the control planes all in one instant.
    One limit per process, shared by every worker of a fleet."""
    max_concurrent_starts: int = attrs.field(default=2, validator=_positive)
    """Most command jobs *starting* at once in this process (from the fork of a job's reaper
    until the reaper has exec'd the job, or ended): the rest wait for a start slot, holding
    their capacity. One limit per process, shared by every worker of a fleet."""
    job_nice: int = attrs.field(default=10)
    """How much lower a command job's CPU priority is than the agent's (added to the agent's
    nice value in the job's process just before it execs; the kernel caps it at 19); 0: the
    agent's. The job's reaper keeps the agent's priority."""
    job_oom_score_adj: int = attrs.field(default=DEFAULT_JOB_OOM_SCORE_ADJ)
    """The ``oom_score_adj`` of every command job's processes (set in the job's process just
    before it execs) and of every container job's (the container's), 0..1000: when the whole
    machine runs out of memory the kernel kills the process with the highest score first, and
    1000 makes it a job before anything else (:mod:`runtime.oom`). The agent and its reapers
    keep the process's ``--oom-score-adj`` (-998)."""

    job_pids_max: int = attrs.field(default=DEFAULT_JOB_PIDS_MAX)
    """The most processes (and threads) one command job may have at once, enforced by its
    cgroup (``pids.max``); a fork past it fails (``EAGAIN``). Not enforced in ``rlimit`` mode."""
    job_resources: str = attrs.field(default=AUTO)
    """How command jobs' ``cpu_millis`` and ``memory_mb`` are enforced (:mod:`agent.resources`):
    ``auto`` (cgroup2 where the unified hierarchy offers the cpu, memory and pids controllers,
    else cgroup1, else rlimit), or one of ``cgroup2``, ``cgroup1``, ``rlimit`` (the agent
    refuses to start when the machine cannot do it). Registered as the label ``resources``."""

    job_user: str = attrs.field(default="stockade-job")
    """The system user command jobs run as when the agent runs as root (created as a system
    account without home or login shell on first use); never ``root`` or uid 0. Ignored when
    the agent is not root: jobs then run as the agent's user."""

    output: OutputSettings = attrs.field(factory=OutputSettings)
    """How the jobs' output files are capped, kept and served."""

    tls: TlsFiles | None = None
    """This worker's mutual-TLS files (the CA, its ``worker`` certificate for its id, and the
    key): it serves the Worker service over mutual TLS, accepting only control-plane
    certificates, and calls the control planes with that certificate. None: plaintext and no
    identity checks (``--insecure``, for development)."""

    @job_user.validator
    def _job_user(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value == "root" or (isinstance(value, str) and value.isdigit()):
            raise InvalidArgument("job_user", value, "must name a user other than root (uid 0)")
        if not isinstance(value, str) or not _USER_NAME.fullmatch(value):
            raise InvalidArgument(
                "job_user",
                value,
                "must be a user name: 1 to 32 of A-Z a-z 0-9 _ . -, not starting with - or .",
            )

    @restart_hold_s.validator
    def _hold(self, attribute: attrs.Attribute[float], value: float) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value <= MAX_RESTART_HOLD_S
        ):
            raise InvalidArgument(
                "restart_hold_s", value, f"must be a number of seconds between 0 and {MAX_RESTART_HOLD_S:g}"
            )

    @job_nice.validator
    def _nice(self, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not MIN_JOB_NICE <= value <= MAX_JOB_NICE:
            raise InvalidArgument(
                "job_nice", value, f"must be an integer between {MIN_JOB_NICE} and {MAX_JOB_NICE}"
            )

    @job_oom_score_adj.validator
    def _oom(self, attribute: attrs.Attribute[int], value: int) -> None:
        check_oom_score_adj(value, field="job_oom_score_adj", low=MIN_JOB_OOM_SCORE_ADJ)

    @job_pids_max.validator
    def _pids(self, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not MIN_JOB_PIDS <= value <= MAX_JOB_PIDS:
            raise InvalidArgument(
                "job_pids_max", value, f"must be an integer between {MIN_JOB_PIDS} and {MAX_JOB_PIDS}"
            )

    @job_resources.validator
    def _resources(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in JOB_RESOURCES_CHOICES:
            raise InvalidArgument(
                "job_resources", value, f"must be one of {', '.join(JOB_RESOURCES_CHOICES)}"
            )

    @control_planes.validator
    def _cps(self, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
        if not value:
            raise InvalidArgument("control_planes", value, "must name at least one host:port")
        identifiers.parse_addresses(value, field="control_planes")

    @labels.validator
    def _labels(self, attribute: attrs.Attribute[dict[str, str]], value: dict[str, str]) -> None:
        identifiers.check_labels(value, field="labels")

    def __attrs_post_init__(self) -> None:
        if self.register_retry_max_s < self.register_retry_s:
            raise InvalidArgument(
                "register_retry_max_s",
                self.register_retry_max_s,
                f"must be >= register_retry_s = {self.register_retry_s:g}",
            )
        if self.heartbeat_interval_max_s < self.heartbeat_interval_min_s:
            raise InvalidArgument(
                "heartbeat_interval_max_s",
                self.heartbeat_interval_max_s,
                f"must be >= heartbeat_interval_min_s = {self.heartbeat_interval_min_s:g}",
            )
        if not self.heartbeat_interval_min_s <= self.heartbeat_interval_s <= self.heartbeat_interval_max_s:
            raise InvalidArgument(
                "heartbeat_interval_s",
                self.heartbeat_interval_s,
                f"must be between heartbeat_interval_min_s = {self.heartbeat_interval_min_s:g}"
                f" and heartbeat_interval_max_s = {self.heartbeat_interval_max_s:g}",
            )
        if self.heartbeat_interval_s >= self.self_fence_after_s:
            raise InvalidArgument(
                "heartbeat_interval_s",
                self.heartbeat_interval_s,
                f"must be below self_fence_after_s = {self.self_fence_after_s:g} (a worker must hear back"
                " at least once before it fences itself, or it pauses its jobs at every heartbeat)",
            )

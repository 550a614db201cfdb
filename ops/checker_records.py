"""What the checker reads, as records: the database's history (:class:`History`), a job's runs
from the workers' logs (:class:`Run`), the faults a harness injected (:class:`FaultEvent`), and the
slack each count allows around a fault. docs/design.md, "The checker: what it reads and what it
counts".
"""

from __future__ import annotations

import attrs

from runtime.settings.agent import DEFAULT_SELF_FENCE_AFTER_S

# A fault explains a death when it began at most this long before the last heartbeat the
# database recorded (a kill lands between heartbeats) and before the declaration.
FAULT_SLACK_S = 2.0
REPORT_SLACK_S = 3.0
"""A worker killed within this long after a job of its succeeded may have died before it could
report the success: that success is not counted as lost."""
KILLED_AGENT_RUN_ON_S = DEFAULT_SELF_FENCE_AFTER_S
"""How long after the kill of its agent a command job may still run, in seconds: its reaper
pauses it at the fence deadline the agent last wrote (at most the fence span later)."""
KILL_TAKES_S = 0.5
"""A kill is recorded when the signal is sent; the worker's last records may follow it by this
much (in a container, the agent ends only as the kernel tears down the container's processes)."""


@attrs.frozen(kw_only=True)
class AssignmentRecord:
    """One row of ``assignments``; times in Unix seconds (``ended_at`` None while active)."""

    assignment_id: int
    job_id: int
    worker_id: str
    incarnation: int
    epoch: int
    state: str
    created_at: float
    ended_at: float | None
    end_reason: str | None = None
    outcome: str | None = None
    """The outcome (succeeded, failed) the worker reported for it, also one reported after the
    assignment had been ended as lost (a late report); None if none."""
    units: tuple[tuple[str, str], ...] = ()
    """The device units (resource, unit id) it held on its worker (docs/devices.md)."""
    gang_attempt: int | None = None
    """A gang task's run: the gang's attempt it belongs to (docs/gangs.md); None: not a gang's."""

    @property
    def success_recorded(self) -> bool:
        """True when the database holds a success reported for this assignment."""
        return (self.state == "finished" and self.end_reason == "succeeded") or self.outcome == "succeeded"


@attrs.frozen(kw_only=True)
class ScheduleRecord:
    """One schedule as the checker judges it; times in Unix seconds."""

    schedule_id: int
    name: str
    cron: str
    tz: str
    created_at: float
    slots_through: float
    """Its cursor: every slot at or before it must be recorded."""
    ended_at: float
    """The end of the window judged: its last pause (audit_log), else the database's now."""


@attrs.frozen(kw_only=True)
class SlotRecord:
    """One row of ``schedule_slots``; ``slot_at`` in Unix seconds, ``job_id`` None when skipped."""

    schedule_id: int
    slot_at: float
    outcome: str
    reason: str
    job_id: int | None


SCHEDULE_SLACK_S = 5.0
"""How far a schedule's cursor may lag the end of the judged window (the last pass, a takeover
in progress) before the slots after it count as never recorded."""


@attrs.frozen(kw_only=True)
class DeathRecord:
    """One dead-worker declaration."""

    worker_id: str
    incarnation: int
    epoch: int
    declared_at: float
    last_heartbeat_at: float


@attrs.frozen(kw_only=True)
class GangAttemptRecord:
    """One attempt of a gang as the database holds it: its assignments, in how many transactions
    (distinct ``created_at``: ``now()`` is the transaction's start) and epochs they were
    committed, and whether every one of them ended with a success."""

    gang_id: int
    attempt: int
    size: int
    assignment_ids: tuple[int, ...]
    transactions: int
    epochs: int
    succeeded: bool


@attrs.frozen(kw_only=True)
class History:
    """What the database says happened."""

    assignments: tuple[AssignmentRecord, ...]
    deaths: tuple[DeathRecord, ...] = ()
    job_states: dict[int, str] = attrs.field(factory=dict)
    stale_writes_rejected: int = 0
    elections: int = 0
    """Lease takeovers (rows of ``lease_history``)."""
    leaves: int = 0
    """Clean stops the control planes recorded (rows of ``worker_leaves``)."""
    dependency_cancels: dict[int, int] = attrs.field(factory=dict)
    """Job id -> the dependency its cancel names (``dependency_failed: job N``)."""
    dependency_states: dict[int, str] = attrs.field(factory=dict)
    """Such a dependency -> its state as a dependency (an array's id: the whole array's:
    ``failed`` or ``cancelled`` when a task was); those missing read as the job's own state."""
    job_attempts: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    """Job id -> (attempts it spent, its max_attempts), from ``jobs.failures`` and
    ``jobs.max_attempts`` (a gang's task: its gang's attempts spent, ``gangs.failures``)."""
    schedules: tuple[ScheduleRecord, ...] = ()
    schedule_slots: tuple[SlotRecord, ...] = ()
    policy_jobs: frozenset[int] = frozenset()
    """Jobs that may end failed with attempts left: those with a failure policy
    (``retry_on_exit`` or ``no_retry_on``; schema.sql, retry_refusal), and those whose cancel was
    asked while a run was on (an array's ``max_failed_tasks`` cancelling its running tasks: a
    run that fails meanwhile is not retried; schema.sql, retries)."""
    gang_attempts: tuple[GangAttemptRecord, ...] = ()
    """Every attempt of every gang (its assignments grouped by gang and ``gang_attempt``)."""
    partial_gangs: int = 0
    """Rows of the view ``partial_gangs`` when the history was read (docs/gangs.md)."""


@attrs.frozen(kw_only=True)
class Run:
    """A job's run on a worker, from its start record to its end (``math.inf``: never ended)."""

    worker_id: str
    incarnation: int
    job_id: int
    assignment_id: int
    started_at: float
    ended_at: float
    stop_reason: str | None = None
    """The ``reason`` of its stop record; None when it has none."""
    units: tuple[tuple[str, str], ...] = ()
    """The device units (resource, unit id) its start record says it held (docs/devices.md)."""


FAULT_KINDS = ("kill", "freeze", "partition", "db_outage", "db_failover", "mass_partition")
"""What a harness (or an operator) injects: SIGKILL, SIGSTOP until SIGCONT, a network cut until
healed; and faults of the whole cluster, whose target names no worker (so they explain no
death): the database down, or from the kill of its primary to the standby's promotion (target
``database``), every worker cut off at once (target ``workers``)."""
OUTAGE_KINDS = ("db_outage", "db_failover", "mass_partition")
"""Faults a cluster must ride out without killing running work."""
OUTAGE_SLACK_S = 15.0
"""A run stopped by its worker's fence up to this long after an outage ended counts as killed
by it (the worker registers again, or is told to stop, in the seconds after contact returns)."""
FENCE_REASONS = ("self_fence", "reregister", "stopped_by_control_plane")
"""Stop reasons of runs the cluster (not their job, not a user) ended."""
CLEAN_STOP = "stop"
"""The kind of :class:`FaultEvent` a worker's ``leave`` line stands for (:func:`ops.checker.clean_stops`)."""


@attrs.frozen(kw_only=True)
class FaultEvent:
    """A fault a harness injected: ``kind`` is kill, freeze or partition (or ``stop``, a clean
    stop a worker logged); ``target`` a process id such as ``w-3`` or ``cp-1``; ``at`` and
    ``until`` Unix seconds, ``until`` when a freeze or partition ended (kills: ``at``)."""

    kind: str
    target: str
    at: float
    until: float

"""The typed messages the control-plane actors exchange over trio memory channels.

Each inbox has one union type (``LeaseInbox``, ``LedgerInbox``, ...). A request that wants an
answer carries a :class:`runtime.reply.Reply`. Protobuf types never appear here. A fenced write
(``LedgerInbox``) fails with :class:`runtime.errors.StaleEpoch` when its ``epoch`` is not
current, and with :class:`runtime.errors.InvalidArgument` when it holds more rows than the
ledger's ``max_rows_per_fenced_write`` (nothing is written).
"""

from __future__ import annotations

import datetime as dt

import attrs

from actors.heartbeat_policy import HeartbeatPolicy
from actors.schedule_plan import ScheduleFiring
from runtime.gangs import GangSeat
from runtime.jobs import JobSpec
from runtime.reply import Reply


@attrs.frozen(kw_only=True)
class Elected:
    """This replica now holds the lease under ``epoch``. ``seq`` orders role changes."""

    seq: int
    epoch: int


@attrs.frozen(kw_only=True)
class Deposed:
    """This replica no longer decides (lost, released, or stepped down). ``seq`` orders changes."""

    seq: int
    epoch: int
    reason: str


RoleChange = Elected | Deposed


@attrs.frozen(kw_only=True)
class EpochSuperseded:
    """Someone saw a newer epoch than ours (the ledger's FOR KEY SHARE check, a worker's reply)."""

    epoch: int
    epoch_seen: int


@attrs.frozen(kw_only=True)
class QueryRole:
    """Ask the lease keeper for the current role (an actor that just (re)started)."""

    reply: Reply[RoleChange]


LeaseInbox = EpochSuperseded | QueryRole


@attrs.frozen(kw_only=True)
class Placement:
    """A decision: run ``job_id`` on ``worker_id`` (of ``incarnation``), holding these resources."""

    job_id: int
    worker_id: str
    incarnation: int
    cpu_millis: int
    memory_mb: int
    units: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The device units it holds on the worker: (name, unit ids) pairs (docs/devices.md)."""


@attrs.frozen(kw_only=True)
class CommittedAssignment:
    """A placement the ledger committed under ``epoch``: the assignment, where it goes, and
    what the worker needs to run it."""

    assignment_id: int
    job_id: int
    worker_id: str
    incarnation: int
    epoch: int
    spec: JobSpec
    """The job's spec, as stored at submission."""
    array_index: int | None = None
    """A task of an array: its index (the worker sets ``STOCKADE_ARRAY_INDEX``); None: not a task."""
    array_id: int | None = None
    """A task of an array: the array's id (the worker sets ``STOCKADE_ARRAY_ID``); None: not a task."""
    placed_before: bool = False
    """The job was placed before this assignment (a run lost, stopped or failed): its worker
    reports the start with a heartbeat pulled forward (:func:`agent.fence.early_heartbeat_allowed`)."""
    units: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The device units it holds on the worker: (name, unit ids) pairs (docs/devices.md)."""
    gang: GangSeat | None = None
    """A gang's task: its seat (rank, size, port, peers; docs/gangs.md); None: not a gang's task."""


@attrs.frozen(kw_only=True)
class CommitPlacements:
    """Commit ``placements`` under ``epoch``; claim only jobs still pending (invariant 3).
    ``reasons`` sets ``jobs.reason`` for pending jobs not placed here (``""`` clears it). The
    reply holds the assignments actually created."""

    epoch: int
    placements: tuple[Placement, ...]
    reasons: tuple[tuple[int, str], ...]
    reply: Reply[tuple[CommittedAssignment, ...]]


@attrs.frozen(kw_only=True)
class ReconcileResult:
    """What a fenced reconcile transaction (or a pass's series of them) changed."""

    dead_worker_ids: tuple[str, ...]
    requeued_job_ids: tuple[int, ...]
    orphaned_assignment_ids: tuple[int, ...]
    orphaned_job_ids: tuple[int, ...] = ()
    """The job of each of ``orphaned_assignment_ids``, in its order."""
    orphaned_worker_ids: tuple[str, ...] = ()
    """The worker of each of ``orphaned_assignment_ids``, in its order."""
    more_orphans: bool = False
    """The batch of endings was full: ask for the rest (:class:`EndOrphanedAssignments`)."""


@attrs.frozen(kw_only=True)
class DeclareDeadWorkers:
    """Under ``epoch``: declare dead the listed (worker_id, incarnation) pairs still alive in
    that incarnation and silent for ``dead_after_s`` (re-checked by database time); then end the
    first ``max_ended`` active assignments of dead workers and of incarnations no longer current
    (orphans) as lost, requeueing their jobs with a random wait below their backoff cap (entry k
    of ``requeue_backoff_caps_s`` after the k-th loss, the last after any later one; empty: none).
    Orphans of an incarnation that left end as stopped, requeued with no backoff and no loss."""

    epoch: int
    workers: tuple[tuple[str, int], ...]
    dead_after_s: float
    requeue_backoff_caps_s: tuple[float, ...]
    max_ended: int
    """Most assignments this transaction ends (at most the ledger's max_rows_per_fenced_write)."""
    reply: Reply[ReconcileResult]
    silence_floor_unix_s: float | None = None
    """Silence counts only from this database time on (unix seconds; see
    :class:`actors.deaths.SilenceFloor`); None: from the last heartbeat, or the server's start."""


@attrs.frozen(kw_only=True)
class EndOrphanedAssignments:
    """Under ``epoch``: one more batch of :class:`DeclareDeadWorkers`' endings of orphans, in a
    fenced transaction of its own; the reply's ``dead_worker_ids`` is empty."""

    epoch: int
    requeue_backoff_caps_s: tuple[float, ...]
    max_ended: int
    reply: Reply[ReconcileResult]


@attrs.frozen(kw_only=True)
class EndAssignments:
    """Under ``epoch``: end active assignments that their worker acknowledged cancelling.
    ``requeue`` puts the job back to pending (a loss, with the backoff of
    ``requeue_backoff_caps_s``); else the job is cancelled. The reply lists the ids ended."""

    epoch: int
    assignment_ids: tuple[int, ...]
    requeue: bool
    reason: str
    requeue_backoff_caps_s: tuple[float, ...]
    reply: Reply[tuple[int, ...]]
    timed_out: bool = False
    """The leader stopped these runs past their ``timeout_s``: each spends an attempt, and its
    job is retried after its backoff or ends failed with reason timeout (``requeue`` ignored)."""


@attrs.frozen(kw_only=True)
class SettledJobs:
    """What a :class:`SettleWaitingJobs` changed."""

    released_job_ids: tuple[int, ...]
    """Made pending."""
    cancelled_job_ids: tuple[int, ...]
    """Cancelled: a dependency failed or was cancelled."""


@attrs.frozen(kw_only=True)
class SettleWaitingJobs:
    """Under ``epoch``: make ``release`` pending and cancel each job of ``cancel`` (job id, its
    dependency that failed or was cancelled) as ``dependency_failed: job N``, each only if its
    rule still holds (:mod:`actors.dependencies`)."""

    epoch: int
    release: tuple[int, ...]
    cancel: tuple[tuple[int, int], ...]
    reply: Reply[SettledJobs]


@attrs.frozen(kw_only=True)
class EndDrainedAssignments:
    """Under ``epoch``: end as stopped (``drained``) active assignments a drain's deadline
    stopped and their worker acknowledged, and requeue their jobs at once with no loss or
    backoff (a job whose cancel was asked ends cancelled). The reply lists the ids ended."""

    epoch: int
    assignment_ids: tuple[int, ...]
    reply: Reply[tuple[int, ...]]


@attrs.frozen(kw_only=True)
class PreemptAssignments:
    """Under ``epoch``: mark each ``(assignment_id, preempting job_id)`` of ``preemptions`` to be
    preempted (``assignments.preempted_by``, ``preempt_requested_at``; its job's
    ``preempted_at``), only if the assignment is still active and not marked already, and its
    job has no cancel asked and was not preempted within ``cooldown_s`` (database time). The
    reconciler then stops the runs (docs/preemption.md). The reply lists the ids marked."""

    epoch: int
    preemptions: tuple[tuple[int, int], ...]
    cooldown_s: float
    reply: Reply[tuple[int, ...]]


@attrs.frozen(kw_only=True)
class EndPreemptedAssignments:
    """Under ``epoch``: end as stopped (``preempted``) active assignments marked to be preempted
    that their worker acknowledged stopping, and requeue their jobs at once with no attempt
    spent, no loss and no backoff, with the reason ``preempted by job N`` (a job whose cancel
    was asked ends cancelled). The reply lists the ids ended."""

    epoch: int
    assignment_ids: tuple[int, ...]
    reply: Reply[tuple[int, ...]]


@attrs.frozen(kw_only=True)
class RecordWorkerHealth:
    """Under ``epoch``: mark workers unhealthy or clear their marks, each ``(worker_id,
    health_version judged, unhealthy, reason)`` only if the version is still the one judged; a
    mark lets a probe be placed ``probe_after_s`` later (0: never). The reply lists
    ``(worker_id, unhealthy)`` for the changes written."""

    epoch: int
    changes: tuple[tuple[str, int, bool, str], ...]
    probe_after_s: float
    reply: Reply[tuple[tuple[str, bool], ...]]


@attrs.frozen(kw_only=True)
class SetHeartbeatPolicy:
    """Under ``epoch``: make ``policy`` the heartbeat interval and the dead_after the control
    planes tell workers (:mod:`actors.heartbeat_policy`). The reply is None."""

    epoch: int
    policy: HeartbeatPolicy
    reply: Reply[None]


@attrs.frozen(kw_only=True)
class RecordedSlot:
    """A slot a firing recorded: ``job_id`` the job it fired, None when skipped."""

    schedule_id: int
    slot_at: dt.datetime
    job_id: int | None


@attrs.frozen(kw_only=True)
class FireScheduleSlots:
    """Under ``epoch``: record each firing's slots once, inserting one job per fired slot in the
    same transaction (``queries.FIRE_SCHEDULE_SLOTS``); a firing whose schedule changed since it
    was read records nothing. The reply lists the slots recorded."""

    epoch: int
    firings: tuple[ScheduleFiring, ...]
    reply: Reply[tuple[RecordedSlot, ...]]


LedgerInbox = (
    CommitPlacements
    | DeclareDeadWorkers
    | EndOrphanedAssignments
    | EndAssignments
    | SettleWaitingJobs
    | EndDrainedAssignments
    | PreemptAssignments
    | EndPreemptedAssignments
    | RecordWorkerHealth
    | SetHeartbeatPolicy
    | FireScheduleSlots
)


@attrs.frozen(kw_only=True)
class WorkerRef:
    """Where to reach one worker incarnation."""

    worker_id: str
    address: str
    incarnation: int


@attrs.frozen(kw_only=True)
class Dispatch:
    """Send committed assignments to one worker under ``epoch`` (fire and forget)."""

    epoch: int
    worker: WorkerRef
    assignments: tuple[CommittedAssignment, ...]


@attrs.frozen(kw_only=True)
class CancelOnWorker:
    """Ask a worker to cancel assignments; the reply lists the ids it acknowledged."""

    epoch: int
    worker: WorkerRef
    assignment_ids: tuple[int, ...]
    reply: Reply[tuple[int, ...]]
    job_ids: tuple[int, ...] = ()
    """The jobs of ``assignment_ids``, in their order (for the log lines only)."""
    grace_s: float = 0.0
    """The stop's grace asked of the worker (SIGTERM, then SIGKILL this long after), seconds;
    0: the worker's own ``stop_grace_s``. The call waits this long more for its answer."""


@attrs.frozen(kw_only=True)
class Connect:
    """Open connections to these workers ahead of their first dispatch (best effort)."""

    workers: tuple[WorkerRef, ...]


DispatcherInbox = Dispatch | CancelOnWorker | Connect

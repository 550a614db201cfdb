"""The agent's own typed messages: what the Worker service receives, what the agent reports.

Protobuf types stop at the gRPC boundary (:mod:`agent.service`, :mod:`agent.control_plane`).
Units are in the field names (``*_unix_s``: Unix seconds of the database's clock, ``*_at``: times
of trio's clock).
"""

from __future__ import annotations

from enum import StrEnum

import attrs

from runtime.gangs import GangSeat
from runtime.jobs import JobSpec
from runtime.text import fit_line


class RefusalReason(StrEnum):
    """Why the worker refused an assignment or a cancel (``Refusal.reason`` on the wire)."""

    WRONG_WORKER = "wrong_worker"
    """The request names another worker id."""
    FENCED = "fenced"
    """The worker is self-fenced, not registered yet, (re)registering or shutting down."""
    RESTARTING = "restarting"
    """The agent process is exiting for a planned restart (SIGHUP); its jobs keep running."""
    WRONG_INCARNATION = "wrong_incarnation"
    """The request was meant for another life of this worker."""
    STALE_EPOCH = "stale_epoch"
    """The request's epoch is lower than the newest the worker has seen."""
    IMPLAUSIBLE_EPOCH = "implausible_epoch"
    """The request's epoch is far beyond any the database has confirmed to the worker."""
    CANCELLED = "cancelled"
    """The assignment id was cancelled (or ended by the control plane) on this worker."""
    BAD_SPEC = "bad_spec"
    """No runtime, zero cpu_millis or memory_mb, or a command with an empty argv."""
    NO_ROOM = "no_room"
    """Starting it would exceed the worker's capacity."""
    UNITS_HELD = "units_held"
    """A device unit it holds is held by a job running here (docs/devices.md): refused, never
    given to two jobs at once."""


class JobState(StrEnum):
    """The final state of a job run (``JobOutcome.state`` on the wire)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    NOT_STARTED = "not_started"
    """Accepted, never started, and ended by this worker on its own (its reaper found the fence
    deadline passed): reported so the control plane ends the assignment and places the job
    again (schema.sql, record_outcomes)."""
    FENCED = "fenced"
    """Started, then killed by this worker's fence on its own (its reaper found the kill
    deadline passed before the agent did), while its incarnation may live on: reported so the
    control plane ends the assignment as lost and places the job again (schema.sql,
    record_outcomes); nothing else would end it should a fresh heartbeat resume the worker."""


class StopReason(StrEnum):
    """Why a job stopped, as written in the ``reason`` field of a ``stop`` log record."""

    SUCCEEDED = "succeeded"
    """It ended on its own with exit code 0 (or a sleep job ran its full duration)."""
    FAILED = "failed"
    """It ended on its own with a non-zero exit code, or could not be started."""
    CANCELLED = "cancelled"
    """The leader cancelled it with the Cancel RPC."""
    PREEMPTED = "preempted"
    """The leader stopped it with a Cancel RPC that gave a grace of its own (``grace_ms``, a
    preemption's): SIGTERM at once, killed that long after."""
    STOPPED_BY_CONTROL_PLANE = "stopped_by_control_plane"
    """A heartbeat reply listed it in ``stop_assignment_ids``."""
    SELF_FENCE = "self_fence"
    """No heartbeat was acknowledged for ``self_fence_after_s``."""
    REREGISTER = "reregister"
    """A heartbeat reply asked the worker to register again."""
    SHUTDOWN = "shutdown"
    """The agent was cancelled (SIGTERM, SIGINT, or its nursery ended)."""
    RESTART = "restart"
    """A restarted agent found it running and did not keep it (:mod:`agent.adoption`)."""


@attrs.frozen(kw_only=True)
class JobOrder:
    """One assignment as the leader sent it: the job's spec and where the assignment stands."""

    assignment_id: int
    job_id: int
    spec: JobSpec
    """What to run and what it reserves (``cpu_millis``, ``memory_mb``); its runtime is None
    when the spec as sent named none (refused as ``bad_spec``)."""
    committed_epoch: int = 0
    """The epoch whose leader committed the assignment (informational)."""
    array_index: int | None = None
    """A task of an array: its index; None: not a task."""
    array_id: int | None = None
    """A task of an array: the array's id; None: not a task (or not sent)."""
    placed_before: bool = False
    """The job was placed before (moved, stopped or retried): its start pulls the next heartbeat
    forward."""
    units: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The device units the assignment holds on this worker: (name, unit ids) pairs, given to
    the job alone (docs/devices.md)."""
    gang: GangSeat | None = None
    """A gang's task: its seat in the gang (docs/gangs.md); None: not a gang's task."""


@attrs.frozen(kw_only=True)
class WorkerOrder:
    """What every order of the leader to a worker names, and the acceptance rules check before
    its assignments (:class:`agent.acceptance.Admission`): the epoch it was sent under, and the
    worker and the incarnation (the life of it) it is meant for."""

    epoch: int
    worker_id: str
    incarnation: int


@attrs.frozen(kw_only=True)
class AssignOrder(WorkerOrder):
    """An Assign request: start these assignments on worker ``worker_id``."""

    assignments: tuple[JobOrder, ...]


@attrs.frozen(kw_only=True)
class CancelOrder(WorkerOrder):
    """A Cancel request: stop these assignments, or refuse them forever if not running."""

    assignment_ids: tuple[int, ...]
    grace_ms: int = 0
    """The stop's grace in milliseconds (a preemption's): the running jobs get SIGTERM at once
    and are killed this long after; 0: the worker's own ``stop_grace_s``. At most
    :data:`runtime.validation.MAX_CANCEL_GRACE_MS` (the service checks it)."""


@attrs.frozen(kw_only=True)
class Refusal:
    """One refused assignment (or cancel) and why."""

    assignment_id: int
    reason: RefusalReason


@attrs.frozen(kw_only=True)
class OrderDecision:
    """What the acceptance rules' answer to any :class:`WorkerOrder` says, and its reply too."""

    refused: tuple[Refusal, ...]
    epoch_seen: int
    """The worker's newest seen epoch after this request."""


@attrs.frozen(kw_only=True)
class AssignDecision(OrderDecision):
    """The acceptance rules' answer to one :class:`AssignOrder`."""

    accepted_ids: tuple[int, ...]
    """Every accepted assignment id, new ones and duplicates, in request order."""
    to_start: tuple[JobOrder, ...]
    """The accepted assignments that are new: the agent must start exactly these."""


@attrs.frozen(kw_only=True)
class CancelDecision(OrderDecision):
    """The acceptance rules' answer to one :class:`CancelOrder`."""

    acknowledged_ids: tuple[int, ...]
    """Ids that run nowhere now and never ran to their end: stopped by this cancel, or never
    started (refused forever). The reply may be sent only once those in ``to_stop`` ended."""
    to_stop: tuple[int, ...]
    """The acknowledged ids that are running now: the agent must stop them first."""
    finished_ids: tuple[int, ...] = ()
    """Ids whose job ended on its own (succeeded or failed) before the cancel took effect: not
    acknowledged, since the cancel changed nothing; their outcome travels with heartbeats."""


@attrs.frozen(kw_only=True)
class Registration:
    """A RegisterWorker request."""

    worker_id: str
    address: str
    """host:port of this worker's Worker service."""
    cpu_millis: int
    memory_mb: int
    labels: dict[str, str] = attrs.field(factory=dict)
    finished: tuple[Outcome, ...] = ()
    """Every outcome not yet acknowledged: the control plane records them for the worker's
    previous incarnation before it starts the new one, so a fence never loses them."""
    agent_run_id: str = ""
    """This agent's run (random, fixed for its life); with ``registration_seq`` it makes a
    copy of a registration (a retry, a hedge) get the incarnation the first one created."""
    registration_seq: int = 0
    """The number of this registration in the run: 1, 2, ...; the same for every attempt."""
    resume_incarnation: int = 0
    """A restarted agent's ask to continue this incarnation (0: a new one)."""
    held_assignment_ids: tuple[int, ...] = ()
    """With ``resume_incarnation``: the assignments of it whose jobs this agent runs."""
    resources: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The countable devices this worker offers: (name, unit ids) pairs (docs/devices.md)."""


@attrs.frozen(kw_only=True)
class Registered:
    """A RegisterWorker reply: this life's incarnation, the current epoch, the dead_after (None:
    not said); for a continuation, whether it was continued, the held assignments to stop and
    those the control plane released (ended: refuse them)."""

    incarnation: int
    epoch: int
    dead_after_s: float | None = None
    resumed: bool = False
    stop_assignment_ids: tuple[int, ...] = ()
    released_assignment_ids: tuple[int, ...] = ()
    database_unix_s: float | None = None
    """The database's clock as the registration was recorded; None: not said."""
    heartbeat_interval_s: float | None = None
    """The heartbeat interval the cluster asks for (seconds, unchecked); None: not said."""


MAX_OUTCOME_DETAIL_BYTES = 4096
"""Most UTF-8 bytes of an outcome's ``detail``: the control plane refuses a longer one
(``actors.validation.MAX_DETAIL_BYTES``; a test keeps them equal), and an agent that could not
report an outcome would fence itself for good."""
MAX_OUTCOME_MS = 100 * 365 * 24 * 3600 * 1000
"""Most milliseconds an outcome's ``run_ms`` and ``ended_ago_ms`` say on the wire (the agent caps
them to it, so the control plane never refuses them: ``actors.validation.MAX_OUTCOME_MS``)."""


@attrs.frozen(kw_only=True)
class Outcome:
    """How one assignment ended on this worker (``JobOutcome`` on the wire)."""

    assignment_id: int
    job_id: int
    state: JobState
    exit_code: int | None
    """None when the job had no exit code (a sleep job stopped early, a command not started)."""
    run_s: float
    """How long the run lasted, seconds of this agent's monotonic clock (0: it never started)."""
    ended_at: float
    """Trio time it ended. Neither is a wall-clock time: the wire says how long before its send
    the run ended (``JobOutcome.ended_ago_ms``), and the database dates it by its own clock."""
    stdout_path: str = ""
    """Absolute path, empty for runtimes without output files."""
    stderr_path: str = ""
    detail: str = attrs.field(default="", converter=lambda d: fit_line(d, MAX_OUTCOME_DETAIL_BYTES))
    """Why it ended as it did, cut to :data:`MAX_OUTCOME_DETAIL_BYTES`."""


WORKER_TOTAL = 0
"""The ``assignment_id`` of a usage sample of all the worker's jobs together."""


@attrs.frozen(kw_only=True)
class UsageSample:
    """What one job (or all the worker's jobs) used over the span that ends at its reading; the
    ``UsageSample`` of the protocol."""

    assignment_id: int
    """The job's assignment; :data:`WORKER_TOTAL`: all the worker's jobs together."""
    cpu_millis: int
    """CPU used on average over the span, in millicores (1000 = one core busy all along)."""
    memory_mb: int
    """Memory held at the span's end, in MiB (rounded to the nearest)."""
    span_ms: int
    """The span the CPU is averaged over, in ms."""


@attrs.frozen(kw_only=True)
class HeartbeatReport:
    """A Heartbeat request."""

    worker_id: str
    incarnation: int
    running_assignment_ids: tuple[int, ...]
    finished: tuple[Outcome, ...]
    """Every outcome not yet acknowledged by a heartbeat reply."""
    epoch_seen: int
    restart_hold_ms: int = 0
    """A planned restart's hold (0: none): see ``HeartbeatRequest`` in the protocol."""
    sent_monotonic_us: int = 0
    """When it was sent, on the machine's monotonic clock (µs): see ``HeartbeatRequest``."""
    dead_after_in_use_ms: int = 0
    """The dead_after the self-fence is derived from now (ms; 0: none told yet)."""
    waited_ms: int = 0
    """The previous heartbeat's round trip, when it was sent while live and answered (ms; 0:
    not said): see ``HeartbeatRequest``."""
    usage: tuple[UsageSample, ...] = ()
    """What the running command jobs used lately (none most of the time): see ``UsageSample``."""


@attrs.frozen(kw_only=True)
class HeartbeatAnswer:
    """A Heartbeat reply."""

    epoch: int
    stop_assignment_ids: tuple[int, ...] = ()
    reregister: bool = False
    restart_hold_granted: bool = False
    newer: NewerRegistration | None = None
    """With ``reregister``: the newer registration that holds the worker id now, if alive."""
    database_unix_s: float | None = None
    """The database's clock as the heartbeat was recorded; None: not said."""
    heartbeat_interval_s: float | None = None
    """The heartbeat interval the cluster asks for (seconds, unchecked); None: not said."""
    dead_after_s: float | None = None
    """The dead_after that goes with it (seconds); None: not said."""


@attrs.frozen(kw_only=True)
class NewerRegistration:
    """The registration that replaced an agent's incarnation (``HeartbeatReply.newer_*``)."""

    agent_run_id: str
    address: str
    incarnation: int


@attrs.frozen(kw_only=True)
class Leave:
    """A LeaveWorker request: this worker stopped cleanly, every job of it has ended."""

    worker_id: str
    incarnation: int
    """The life that stopped; a leave of any other changes nothing."""
    agent_run_id: str
    """The agent run that registered ``incarnation``."""
    finished: tuple[Outcome, ...] = ()
    """Every outcome not yet acknowledged, recorded before the worker counts as left."""


@attrs.frozen(kw_only=True)
class LeaveAnswer:
    """A LeaveWorker reply: whether the worker's row is ``left`` now, the current epoch, and
    why the leave changed nothing when it did not."""

    left: bool
    epoch: int
    detail: str = ""

"""What the client's calls return: frozen attrs classes built from the control planes' replies.

The cluster's status (:class:`ClusterStatus` and what it holds) is defined in
:mod:`ops.client.status_results` and re-exported here. A value the wire sends as zero or empty
for "none" (no worker yet, no exit code) is None here (:mod:`ops.client.from_wire`);
times are Unix seconds as floats (``*_unix_s``), durations seconds (``*_s``), CPU millicores
(``cpu_millis``), memory MiB (``memory_mb``). Lists and maps of pairs (counts by state, labels)
are tuples of pairs in the reply's order (labels sorted by key): every result compares by value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ops.client.from_wire import exit_code, from_pb, units
from ops.client.status_results import ClusterStatus as ClusterStatus
from ops.client.status_results import ControlPlane as ControlPlane
from ops.client.status_results import Usage as Usage
from ops.client.status_results import Worker as Worker
from ops.client.status_results import status_from_pb as status_from_pb
from ops.client.status_results import usage_from_pb
from ops.client.status_results import worker_from_pb as worker_from_pb

if TYPE_CHECKING:
    from protocol import pb
    from runtime.jobs import JobSpec

ENDED_STATES = ("succeeded", "failed", "cancelled")
"""The states a job ends in (it never leaves them)."""
OPEN_STATES = ("waiting", "pending", "assigned", "running")
"""The states of a job that has not ended."""


@attrs.frozen(kw_only=True)
class Attempt:
    """One run of a job: an assignment, from its placement to its end."""

    assignment_id: int
    worker_id: str | None
    """The worker it was placed on."""
    epoch: int
    """The epoch of the leader that placed it."""
    state: str
    """``active``, ``finished``, ``cancelled``, ``lost`` or ``stopped``."""
    end_reason: str | None
    """Why it ended (``succeeded``, ``failed``, ``worker_dead``, ``timeout``, ``cancelled``,
    ``drained``, ...); None while it is active."""
    exit_code: int | None
    """The exit code of its process, when it had one."""
    created_unix_s: float | None
    """When it was placed."""
    ended_unix_s: float | None
    """When it ended; None while it is active."""
    detail: str | None
    """What the worker said of its end (``exit code 1``, ``oom_killed: ...``)."""
    counted: bool
    """Whether it spent one of the job's ``max_attempts``."""
    units: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The device units it holds (held, once ended) on its worker, (name, unit ids) sorted by
    name (docs/devices.md); empty: none."""


@attrs.frozen(kw_only=True)
class Job:
    """A job as the cluster reports it (``Client.get``, ``Client.list``, ``Client.wait``)."""

    job_id: int
    """Its id (for an array's first task, also the array's id)."""
    spec: JobSpec | None
    """What was submitted (:class:`runtime.jobs.JobSpec`); None in a reply that left it out."""
    state: str
    """``waiting``, ``pending``, ``assigned``, ``running``, ``succeeded``, ``failed`` or
    ``cancelled``."""
    reason: str | None
    """Why it is in that state (``unschedulable: ...``, ``timeout: ...``,
    ``dependency_failed: job 12``), when the cluster says."""
    worker_id: str | None
    """The worker of its latest assignment (``assignment_id``, made by the leader of ``epoch``)."""
    assignment_id: int | None
    epoch: int | None
    exit_code: int | None
    """The exit code of its last run, when it had one."""
    submitted_unix_s: float | None
    """When it was stored (this and the times below are database time)."""
    started_unix_s: float | None
    """When its latest run started."""
    finished_unix_s: float | None
    """When it ended."""
    not_before_unix_s: float | None
    """A pending job waiting for its retry backoff is not placed before this time."""
    attempts: int
    """How many times it was placed."""
    failures: int
    """Runs spent on ``max_attempts``: failures, and losses when ``count_lost``."""
    array_id: int | None
    """The array it is a task of."""
    array_index: int | None
    """Its index in its array (``STOCKADE_ARRAY_INDEX``)."""
    array_counts: tuple[tuple[str, int], ...]
    """Of a task of an array: how many of the array's tasks are in each state (state, count)."""
    attempt_history: tuple[Attempt, ...]
    """Every run so far, oldest first."""
    stdout_path: str | None
    """Its standard output's file on the worker's machine (``stderr_path``: its error's)."""
    stderr_path: str | None
    read_unix_s: float | None = None
    """When the cluster read it (database time; a backoff has ``not_before_unix_s`` minus this
    left, whatever this machine's clock says); None when the control plane did not say."""
    owner: str | None = None
    """The account that submitted it (docs/accounts.md); None when the control plane did not say."""
    gang: JobGang | None = None
    """A gang's task: its gang and where the gang stands (docs/gangs.md); None: not a task."""
    schedule: str | None = None
    """The schedule that fired it (docs/schedules.md); None: none (or it was removed)."""
    schedule_slot_unix_s: float | None = None
    """The slot of :attr:`schedule` it was fired for (Unix s); None: not fired by a schedule."""
    usage: Usage | None = None
    """What its current run used lately; None: no sample (not running, or not measured)."""

    @property
    def ended(self) -> bool:
        """Whether it has ended (:data:`ENDED_STATES`): it will not run again."""
        return self.state in ENDED_STATES

    @property
    def succeeded(self) -> bool:
        """Whether it ended with success (exit code 0, or a sleep that ran its time)."""
        return self.state == "succeeded"

    def array_count(self, state: str) -> int:
        """How many tasks of its array are in ``state`` (0 when it is no task of an array)."""
        return sum(count for name, count in self.array_counts if name == state)


@attrs.frozen(kw_only=True)
class JobGang:
    """A gang task's gang (``Job.gang``; docs/gangs.md)."""

    gang_id: int
    rank: int
    size: int
    spread: bool
    state: str
    """live, succeeded, failed or cancelled."""
    attempts: int
    """How many times it was placed whole."""
    failures: int
    """Its attempts spent (a task failed or timed out, or was lost with ``count_lost``)."""
    detail: str
    """Why its last attempt broke, or why it failed."""


@attrs.frozen(kw_only=True)
class JobEvent:
    """One event of a job's history (``Client.events``), as the database keeps it.

    ``kind`` says which fields apply; the others are None:

    - ``submitted``: the job was stored (``detail`` of a job a schedule fired: ``fired by
      schedule nightly's slot 2026-12-05T02:30:00Z``).
    - ``waiting``: at submission, for its dependencies (``detail``: ``waiting for job 3, 4``).
    - ``cancel_requested``: a cancel was first asked (``detail`` of a schedule's replace:
      ``replaced by schedule nightly's slot 2026-12-06T02:30:00Z``).
    - ``placed``: ``assignment_id`` on ``worker_id`` (its ``incarnation``), committed by the
      leader of ``epoch`` (``leader``).
    - ``confirmed``: the first heartbeat of ``worker_id`` that listed the assignment as running.
    - ``worker_dead``: ``worker_id`` (``incarnation``) declared dead by the leader of ``epoch``,
      which ended ``assignment_id``; ``detail`` names its last heartbeat.
    - ``ended``: ``assignment_id`` ended: ``state`` (``finished``, ``lost``, ``cancelled``,
      ``stopped``), ``reason`` (``succeeded``, ``failed``, ``worker_dead``, ``timeout``,
      ``cancelled``, ``drained``, ...), the worker's ``outcome`` and ``exit_code``, ``epoch``
      of a fenced end (None: the worker's report ended it), ``detail``.
    - ``requeued``: the job was pending again when ``assignment_id`` ended; ``not_before_unix_s``
      when it waited for a retry or loss backoff (known for the latest such requeue only).
    - ``final``: the job ended: ``state`` (``succeeded``, ``failed``, ``cancelled``),
      ``exit_code``, ``detail``; always the last event, at the latest of the job's
      ``finished_unix_s`` and every other event's time.
    """

    kind: str
    at_unix_s: float | None
    """When (database time); the events are in the order of these times."""
    assignment_id: int | None
    """The run the event is of."""
    worker_id: str | None
    incarnation: int | None
    """The worker's incarnation the run was addressed to (or that was declared dead)."""
    epoch: int | None
    """The fencing epoch of the decision: a placement, a death, a fenced end."""
    leader: str | None
    """The control plane that held the lease at ``epoch``."""
    state: str | None
    """``ended``: the assignment's state; ``final``: the job's."""
    reason: str | None
    """``ended``: why it ended."""
    outcome: str | None
    """``ended``: what the worker reported (``succeeded``, ``failed``), when it did."""
    exit_code: int | None
    """The run's exit code, when it had one."""
    detail: str | None
    """What the worker or the control plane said (``exit code 1``, ``waiting for job 3``)."""
    not_before_unix_s: float | None
    """``requeued``: not placed again before this time."""


@attrs.frozen(kw_only=True)
class JobHistory:
    """A job's history (``Client.events``): what the database keeps of its life, in time order."""

    job_id: int
    state: str
    """Its state now."""
    events: tuple[JobEvent, ...]
    """Oldest first; an ended job's last is its ``final`` event."""


@attrs.frozen(kw_only=True)
class CancelOutcome:
    """What a cancel came to when it was recorded (``Client.cancel``)."""

    job_id: int
    """The job (or array) named."""
    state: str
    """``cancelled`` when it was still pending or waiting; ``cancelling`` when the leader stops
    it on its worker. Of an array: ``cancelling`` when any task is stopped on its worker, else
    ``cancelled`` when any task was cancelled, else the state its tasks had ended in."""
    tasks: int
    """Of an array: how many of its tasks the cancel cancelled or is cancelling; 0 for a job."""


@attrs.frozen(kw_only=True)
class LogChunk:
    """A piece of a job's output (``Client.logs``), in order, as the job wrote it."""

    data: bytes
    """The bytes (not split at line ends)."""
    dropped_bytes: int
    """Bytes the worker dropped before ``data`` (the oldest part of an output over its cap, or
    what it no longer keeps)."""
    job_ended: bool
    """Set on the last chunk of a stream that ended because the job (or the run read) ended."""
    worker_id: str | None
    """The worker the output comes from."""
    assignment_id: int | None
    """The run the output is of (following a retried job, each run in turn)."""
    offset: int = 0
    """Where ``data`` begins in that run's output (the bytes it wrote before, dropped ones
    included)."""
    cut_run: int | None = None
    """Following: a run (assignment id) whose output stopped early, on this empty chunk: it
    ended while its worker (``worker_id``) did not answer, so the rest is kept there only."""


# ---------------------------------------------------------------------------- from the wire


def attempt_from_pb(message: pb.Attempt) -> Attempt:
    """An ``Attempt`` message as an :class:`Attempt`."""
    return from_pb(Attempt, message, exit_code=exit_code(message), units=units(message.units))


def job_from_pb(message: pb.JobInfo) -> Job:
    """A ``JobInfo`` message as a :class:`Job` (its spec read as an agent reads one: a spec
    with two runtimes has none, rather than failing the whole reply)."""
    from runtime.wire_jobs import job_spec_from_pb

    return from_pb(
        Job,
        message,
        spec=None if message.spec is None else job_spec_from_pb(message.spec, strict=False),
        exit_code=exit_code(message),
        array_index=int(message.array_index) if message.array_id else None,
        array_counts=tuple((c.state, int(c.count)) for c in message.array_counts),
        attempt_history=tuple(attempt_from_pb(a) for a in message.attempt_history),
        gang=None if message.gang is None else from_pb(JobGang, message.gang),
        usage=usage_from_pb(message.usage),
    )


def history_from_pb(message: pb.GetJobEventsReply) -> JobHistory:
    """A ``GetJobEventsReply`` as a :class:`JobHistory`."""
    events = tuple(from_pb(JobEvent, e, exit_code=exit_code(e)) for e in message.events)
    return JobHistory(job_id=int(message.job_id), state=message.state, events=events)


def cancel_from_pb(job_id: int, message: pb.CancelJobReply) -> CancelOutcome:
    """A ``CancelJobReply`` to a cancel of ``job_id`` as a :class:`CancelOutcome`."""
    return from_pb(CancelOutcome, message, job_id=job_id)


def chunk_from_pb(message: pb.LogChunk) -> LogChunk:
    """A ``LogChunk`` message as a :class:`LogChunk`."""
    return from_pb(LogChunk, message, cut_run=None)

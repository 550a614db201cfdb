"""The agent: registration, heartbeats, self-fence, and the jobs it runs.

:class:`Agent` owns everything of one worker (several agents can live in one process: there
is no module-level state). Its pieces:

- the acceptance rules (:class:`agent.acceptance.Admission`), applied to Assign and Cancel
  requests with no checkpoint between decision and effect: an accepted job has its capacity
  reserved, is listed as running in heartbeats and has a task at once, but *starts* later;
- paced starts (:mod:`agent.starts`): a command job first waits for one of the process's
  start slots (shared by every agent of a fleet), and only then gets its ``start`` line and
  its reaper, which is forked on the process's spawner thread, never on the trio thread; the
  slot is freed when the reaper says the job has exec'd. A job stopped while it waits never
  starts and gets no line at all. So a large Assign costs the heartbeats nothing: starting
  80 jobs is 40 pairs of reaper start-ups one after the other, not 80 forks in one go;
- a heartbeat loop: register (retrying after a capped, jittered, growing pause while no control
  plane answers: ``register_retry_s``, ``register_retry_max_s``), then
  every ``heartbeat_interval_s`` report running assignments and every not yet acknowledged
  outcome (a moved job's start pulls the next heartbeat forward, at most once every four intervals:
  :func:`agent.fence.early_heartbeat_allowed`); obey the reply (stop ids, re-register).
  Registrations carry the unacknowledged outcomes too, so a job that succeeded just before a
  fence keeps its result. Both calls are hedged
  (:meth:`runtime.client.ControlPlaneClient.call_hedged`), starting at the worker's home
  replica (:func:`runtime.routes.home_index`): the preferred control plane may answer until
  shortly before the fence deadline (a new registration, which holds no job, up to
  ``register_timeout_s``: :meth:`agent.fence.FenceClock.register_deadline_s`), and the next
  one is asked too after ``heartbeat_timeout_s`` of silence. Heartbeats go one at a time: the
  answer to one sent at *t* moves the deadline to *t* + ``self_fence_after_s``, so a control plane that keeps
  answering later than about half of that still fences the worker; sending more heartbeats
  while one is unanswered would only add to the load that makes it slow;
- a fence watcher on its own timer (invariant 7 in DESIGN.md): once
  ``trio.current_time() >= last_acked_send_time + self_fence_after_s`` (the *fence
  deadline*; the send time of the newest heartbeat, or registration, that got a reply) the
  agent *pauses* every job at once (command jobs are held by their reapers, sleep jobs stop
  counting their duration), refuses Assign with ``fenced``, and keeps heartbeating in the same
  incarnation. The first reply to a heartbeat that is still fresh (its own deadline is ahead,
  by the span that reply tells) resumes the jobs whose assignments it did not list as ended,
  after killing those it listed; a reply that says "register again" kills them all. Once
  ``last_acked_send_time + db_outage_grace_s`` has passed too (the *kill deadline*) every
  paused job is killed and the agent self-fences: the first heartbeat that gets through then
  makes it register again (a new incarnation). The argument that this never runs a job in two
  places is in docs/design.md, "Outages". With ``db_outage_grace_s`` 0 the agent kills at the
  fence deadline (no pause). An agent holding no job has nothing to kill: it stays paused in
  its incarnation past either deadline, so a long silence (the registration storm of a large
  cluster) costs no new incarnation;
- a deadman switch that holds while the agent cannot run (SIGSTOP, a stall, a crash): every
  time a heartbeat or registration is acknowledged the agent writes the fence and kill
  deadlines, on the ``CLOCK_MONOTONIC`` clock all processes share, to
  ``<work_dir>/fence_deadline``. Each command job runs under a reaper process
  (:mod:`agent.reaper`) that SIGSTOPs the job once the fence deadline has passed and records
  the time, SIGKILLs it at the kill deadline, and resumes it when the deadlines move on, also
  after the agent died. A frozen (or dead) agent's command jobs thus pause at the deadline, not
  when it thaws;
- restarts that keep jobs (:mod:`agent.adoption`): before it registers, the agent takes over
  what a previous process of its work folder left running (jobs it proves its own by their
  records), stops what it does not keep (and waits until it is gone), and asks the control
  plane to continue their incarnation (:meth:`Agent._keep_taken_over`); only a reply that
  continued it moves the fence deadline on, which resumes jobs that paused meanwhile. Else it
  registers a new incarnation as always, stopping every job first. A planned restart (SIGHUP,
  :meth:`Agent.prepare_restart`) has a heartbeat record a restart hold first, so the next
  process has that long to come back before any job pauses (docs/design.md, "Restarts");
- one task per running job (:mod:`agent.running`), shielded from cancellation: a job ends
  only through its stop event (or its reaper), so its ``stop`` line is written after it has
  really ended, also at shutdown;
- a leave at a clean stop (SIGTERM, SIGINT): once every job has ended, the agent tells a
  control plane that its incarnation left (the worker's row becomes ``left``, and the leader
  requeues its jobs at once instead of declaring it dead after ``dead_after``). Attempts no
  control plane answered are tried again, the workers of a fleet take turns, and a worker
  heartbeats until its leave is recorded, so a stop of many workers at once leaves every one of
  them; a leave not recorded within
  ``leave_timeout_s`` changes nothing: the worker is then declared dead, as a killed one is. A
  left worker started again registers a new incarnation as usual.

The fence deadline is final. An agent that finds it passed (it was frozen or stalled past
it; its fence watcher may not even have run yet) pauses (or, past the kill deadline,
self-fences) *before* it completes or reports anything else: every place that starts a job,
ends one, sends a heartbeat, handles a heartbeat reply or answers a Cancel checks the deadline
first. A heartbeat reply that arrives after the deadline does not move it: the agent pauses,
and only a later, fresh reply resumes. Stop lines then tell when the jobs really stopped
doing work, not when the thawed agent noticed:

- a command job its reaper paused, then killed: the reaper's recorded pause time;
- a sleep job: its duration counts only while it is not paused, and the pause counts from
  the deadline itself, whenever the agent noticed; so one whose duration ran out while the
  agent was frozen past its deadline has not run out yet (it is paused), and one stopped while
  paused ended when the pause began. A sleep job whose duration ran out *before* the
  deadline succeeded then (its stop line carries that time).

Which outcomes go into heartbeats (and registrations): only those of jobs that ended on
their own (succeeded or failed), including a command that could not be started at all. A job
stopped because the control plane ended it (Cancel, ``stop_assignment_ids``, ``reregister``)
or because the worker fenced itself (the agent, or a reaper at the fence deadline) or shut
down is not reported: its assignment is ended by the control plane's own
path (the Cancel acknowledgement, the reregistration, or the dead-worker declaration), which
requeues it where it must be requeued. Reporting such a job as ``cancelled`` could end a job
for good that should run again. A reaper that fenced its job while the agent still counts
itself live (the agent could not update the deadline file) fences the whole agent: the
deadman's verdict stands.

All timing uses trio's clock, so ``trio.testing.MockClock`` drives the agent in unit tests.
The fence state lives in :class:`agent.fence.FenceClock`. Two kinds of time leave the agent,
neither of them its wall clock: the fence-deadline file and the job records hold
``time.monotonic()`` seconds (other processes read them; trio's system clock is
``CLOCK_MONOTONIC``, so the conversion is exact outside tests), and the job log holds the
database's clock as the replies to registrations and heartbeats tell it (:mod:`agent.dbclock`).
Outcomes carry no time at all: how long the run lasted and how long before the report it ended,
which the database turns into its own times.

This module is longer than 500 lines because registration, heartbeats, the self-fence and
the leave are one state machine over the same fields (incarnation, unacknowledged outcomes,
live or fenced); what stands alone is in :mod:`agent.fence` and :mod:`agent.running`.
"""

from __future__ import annotations

import math
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from agent import adoption
from agent.acceptance import Admission
from agent.control_plane import ControlPlane
from agent.dbclock import DatabaseClock
from agent.fence import (
    EARLY_HEARTBEAT_GATHER_S,
    FENCE_DEADLINE_FILE,
    FenceClock,
    early_heartbeat_allowed,
    fence_after_s,
    monotonic_of,
    told_refusal,
)
from agent.joblog import JobLog, LogEvent
from agent.messages import (
    AssignDecision,
    AssignOrder,
    CancelDecision,
    CancelOrder,
    HeartbeatAnswer,
    HeartbeatReport,
    JobOrder,
    Leave,
    LeaveAnswer,
    Outcome,
    Refusal,
    RefusalReason,
    Registration,
    StopReason,
)
from agent.resources import JobResources
from agent.running import RunningJobs
from agent.runtimes import JobRunner, job_runner
from agent.starts import StartLimiter
from runtime import log, metrics
from runtime.backoff import FullJitterBackoff
from runtime.errors import FailedPrecondition, PermissionDenied, StockadeError, TemporaryError
from runtime.jobs import SleepRuntime
from runtime.loops import Periodic
from runtime.os_users import RunAs
from runtime.settings.agent import AgentSettings

T = TypeVar("T")

_LOG_EVERY_FAILURES = 20
"""Log the first failure of a streak, then every this-many (keeps a long outage quiet)."""

LEAVE_BACKOFF = FullJitterBackoff(base_s=0.1, cap_s=1.0)
"""The waits between attempts of a leave no control plane answered (:meth:`Agent._leave`):
jittered, so the workers of a fleet that failed together do not come back together."""


@attrs.define
class _LeaveResult:
    """How a leave went: the answer (None: none came), the attempts made, the last error."""

    error: str
    answer: LeaveAnswer | None = None
    attempts: int = 0


class Agent:
    """One worker's agent. Serve its :meth:`assign`/:meth:`cancel` and run :meth:`run`.

    Args:
        settings: this worker's settings (capacity, timing, work folder).
        control_plane: how to reach the control plane (:class:`agent.control_plane.GrpcControlPlane`
            in production, a scripted stand-in in tests).
        start_limiter: the process's start slots (shared by the agents of a fleet); None: a
            limiter of its own with ``settings.max_concurrent_starts`` slots.
        leave_turns: the process's turns for leave attempts (shared by the agents of a fleet,
            :meth:`_leave`); None: a limiter of its own with ``settings.max_concurrent_leaves``.
        runner: what runs the jobs; None: :func:`agent.runtimes.run_job` forking reapers on
            the calling (trio) thread, for tests. :func:`agent.main.run_agent` passes one
            bound to the process's spawner thread.
        run_as: who command jobs run as; None: this process's user, for tests.
            :func:`agent.main.run_agent` passes ``settings.job_user`` resolved.
        resources: how command jobs' limits are enforced (:mod:`agent.resources`); None: they
            are not, for tests. :func:`agent.main.run_agent` passes the mode found at start.
        rng: draws the pauses between registration attempts; None: a fresh one.
    """

    def __init__(
        self,
        settings: AgentSettings,
        control_plane: ControlPlane,
        *,
        start_limiter: StartLimiter | None = None,
        leave_turns: trio.CapacityLimiter | None = None,
        runner: JobRunner | None = None,
        run_as: RunAs | None = None,
        resources: JobResources | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self._rng = rng or random.Random()
        """Draws the jitter of the registration retries."""
        self._register_backoff = FullJitterBackoff(
            base_s=settings.register_retry_s, cap_s=settings.register_retry_max_s
        )
        self.worker_id = settings.worker_id
        self.address = ""
        """host:port registered with the control plane; set by :meth:`run`."""
        self.work_dir = Path(settings.work_dir).resolve()
        self.jobs_dir = self.work_dir / "jobs"
        self.database_clock = DatabaseClock()
        """The database's clock as the replies tell it: the job log's times (:mod:`agent.dbclock`)."""
        self.joblog = JobLog(
            self.work_dir / "agent.jsonl", worker_id=settings.worker_id, clock=self.database_clock
        )
        self.fence_deadline_path = self.work_dir / FENCE_DEADLINE_FILE
        """Where the fence deadline is published to the reapers (see :mod:`agent.reaper`)."""
        self._logger = log.get("agent").bind(worker_id=settings.worker_id)
        self._cp = control_plane
        self._admission = Admission(
            worker_id=settings.worker_id,
            cpu_capacity_millis=settings.cpu_millis,
            memory_capacity_mb=settings.memory_mb,
        )
        self._fence = FenceClock(settings=settings, path=self.fence_deadline_path, logger=self._logger)
        self._run_id = uuid.uuid4().hex
        """This agent's run, for the control plane to tell copies of one registration apart
        from a new one."""
        self._registrations = 0
        """Registrations begun in this run (the number of the current one)."""
        self._unacked: list[Outcome] = []
        self._leave_turns = leave_turns or trio.CapacityLimiter(settings.max_concurrent_leaves)
        self._jobs = RunningJobs(
            settings=settings,
            joblog=self.joblog,
            jobs_dir=self.jobs_dir,
            runner=runner or job_runner(None),
            start_limiter=start_limiter or StartLimiter(settings.max_concurrent_starts),
            admission=self._admission,
            fence=self._fence,
            outcomes=self._unacked,
            fence_if_due=self._fence_if_due,
            fence_now=self._fence_now,
            run_as=run_as,
            resources=resources,
            logger=self._logger,
        )
        self._registered_once = trio.Event()
        self._takeover: adoption.TakeoverPlan | None = None
        """What this agent found of its previous process (:meth:`_take_over`), until it has
        been kept or stopped."""
        self._continued = trio.Event()
        """Set once the control plane continued the incarnation of the jobs taken over: their
        sleep jobs run on from then."""
        self._restart_hold_s: float | None = None
        """While a planned restart asks for its hold (:meth:`prepare_restart`): how long."""
        self._restart_granted = trio.Event()
        """Set once a heartbeat the database acknowledged recorded the restart hold."""
        self._heartbeat_failures = metrics.AGENT_HEARTBEAT_FAILURES.labels(self.worker_id)
        self.heartbeat_interval_s = settings.heartbeat_interval_s
        """The heartbeat interval in force: the setting until the cluster tells another one
        (docs/design.md, "Heartbeat interval")."""
        self.dead_after_s: float | None = None
        """The control planes' dead_after the self-fence is derived from now (the newest one a
        reply told and the agent accepted); None: none told yet."""
        self._refused_interval_s: float | None = None
        """The last told interval refused: logged once, not at every reply."""
        self._early_heartbeat_at = -math.inf
        """When a job's start last pulled a heartbeat forward (trio time)."""
        self._heartbeat_waited_s = 0.0
        """The round trip of the last heartbeat if it was sent while live and answered, else 0
        (s): the next one says it."""
        self._clock: trio.abc.Clock | None = None
        """The trio clock this agent runs on (set by :meth:`run`): read by the metrics
        server's thread for :meth:`metrics_reading`."""

    # ------------------------------------------------------------------ read-only views

    @property
    def incarnation(self) -> int | None:
        """The current incarnation; None before the first registration."""
        return self._admission.incarnation

    @property
    def max_epoch_seen(self) -> int:
        """The newest epoch this worker has seen."""
        return self._admission.max_epoch_seen

    @property
    def self_fenced(self) -> bool:
        """True from a self-fence until the next registration."""
        return self._fence.self_fenced

    @property
    def running_assignment_ids(self) -> tuple[int, ...]:
        """Assignments whose jobs have started and not ended yet (including those being
        stopped): what heartbeats report as running.

        A job still waiting for a start slot is not listed (it holds its capacity here all the
        same): to the control plane its assignment stays unconfirmed, and the leader hands a
        worker at most a window of unconfirmed assignments (:mod:`actors.placement`), so what
        it gives this worker is paced by what the worker really starts. One that waited past
        the control plane's ``cancel_unconfirmed_after_s`` is cancelled here and placed again.
        """
        return self._jobs.running_assignment_ids

    def active_jobs(self) -> list[tuple[int, int]]:
        """``(job_id, assignment_id)`` of every job accepted here that has not ended yet
        (waiting for a start slot, running, or being stopped): whose folders are in use."""
        return [(order.job_id, order.assignment_id) for order in self._held_orders()]

    def output_jobs(self) -> list[tuple[int, int]]:
        """Those of :meth:`active_jobs` that write output files: every job but a sleep job
        (which has no process), whose folder the output keeper need not look at."""
        return [
            (order.job_id, order.assignment_id)
            for order in self._held_orders()
            if not isinstance(order.spec.runtime, SleepRuntime)
        ]

    def _held_orders(self) -> list[JobOrder]:
        jobs = (self._jobs.get(aid) for aid in self._jobs.ids())
        return [job.order for job in jobs if job is not None]

    def jobs_added(self) -> trio.Event:
        """An event set when the agent next holds a new job (:meth:`RunningJobs.added`)."""
        return self._jobs.added()

    def job_done(self, assignment_id: int) -> trio.Event | None:
        """The event set once the job of ``assignment_id`` has really ended (every process of
        it gone); None when this agent holds no such job (it ended, or never was accepted)."""
        job = self._jobs.get(assignment_id)
        return None if job is None else job.done

    @property
    def unacknowledged_outcomes(self) -> tuple[Outcome, ...]:
        """Outcomes waiting for a heartbeat reply."""
        return tuple(self._unacked)

    def metrics_reading(self) -> metrics.WorkerReading:
        """This worker's scrape-time gauges (:class:`runtime.metrics.WorkerGauges`). Reads only
        plain attributes, so the metrics server's thread may call it while the agent runs."""
        fence = self._fence
        last = fence.last_acked_send_time
        clock = self._clock
        if fence.self_fenced:
            state = "self_fenced"
        elif fence.paused:
            state = "paused"
        elif fence.live.is_set():
            state = "live"
        else:
            state = "registering"
        return metrics.WorkerReading(
            jobs_running=self._jobs.started_count(),
            heartbeat_ack_age_s=None if last is None or clock is None else clock.current_time() - last,
            fence_after_s=fence.fence_after_s,
            state=state,
        )

    async def wait_registered(self) -> None:
        """Return once the agent has registered at least once."""
        await self._registered_once.wait()

    # ------------------------------------------------------------------ Worker service

    def assign(self, order: AssignOrder) -> AssignDecision:
        """Apply the acceptance rules to an Assign request and set off what they accept.

        Synchronous on purpose: the decision and its effect (the reservation, the job's task)
        happen with no checkpoint in between, so concurrent requests cannot both accept one
        assignment or both take the last free capacity. Starting is not: each accepted job's
        task waits for a start slot (command jobs), writes the ``start`` line and starts the
        job after this has returned. A passed fence deadline fences the agent first, so
        nothing is accepted after it.
        """
        self._fence_if_due()
        if self._restart_hold_s is not None:
            self._admission.fenced = True  # a planned restart takes nothing new
            self._admission.restarting = True
        decision = self._admission.assign(order)
        self._count_refusals("assign", decision.refused)
        if len(decision.accepted_ids) > len(decision.to_start):
            metrics.AGENT_DUPLICATE_ASSIGNMENTS.labels(self.worker_id).inc(
                len(decision.accepted_ids) - len(decision.to_start)
            )
        job_of = {a.assignment_id: a.job_id for a in order.assignments}
        for refusal in decision.refused:
            if refusal.reason is RefusalReason.NO_ROOM:
                self._logger.warning(
                    "assignment refused: no room",
                    job_id=job_of.get(refusal.assignment_id),
                    assignment_id=refusal.assignment_id,
                    cpu_used_millis=self._admission.cpu_used_millis,
                    memory_used_mb=self._admission.memory_used_mb,
                    epoch=order.epoch,
                    incarnation=order.incarnation,
                )
        if decision.to_start:
            self._jobs.start(order, decision.to_start)
            # One line per Assign request, its ids listed (runtime/log.py); each job's own lines
            # (started, ended) follow with its keys.
            self._logger.info(
                "assignments accepted",
                epoch=order.epoch,
                incarnation=order.incarnation,
                job_ids=[j.job_id for j in decision.to_start],
                assignment_ids=[j.assignment_id for j in decision.to_start],
            )
        if decision.refused:
            self._logger.info(
                "assignments refused",
                epoch=order.epoch,
                incarnation=order.incarnation,
                job_ids=[job_of.get(r.assignment_id) for r in decision.refused],
                assignment_ids=[r.assignment_id for r in decision.refused],
                reasons=[r.reason.value for r in decision.refused],
            )
        return decision

    async def cancel(self, order: CancelOrder) -> CancelDecision:
        """Apply the cancel rules; stop the running ones and return once they have ended.

        The answer says what happened to each id (:meth:`agent.acceptance.Admission.cancel`):
        a job that ended on its own, before the cancel or while it was being stopped, is
        finished, not acknowledged.
        """
        self._fence_if_due()
        decision = self._admission.cancel(order)
        if decision.to_stop:
            self._logger.info(
                "stopping cancelled jobs",
                epoch=order.epoch,
                incarnation=order.incarnation,
                job_ids=self._job_ids(decision.to_stop),
                assignment_ids=list(decision.to_stop),
            )
        self._count_refusals("cancel", decision.refused)
        await self._jobs.stop(list(decision.to_stop), StopReason.CANCELLED)
        return self._admission.settle_cancel(decision)

    def _job_ids(self, assignment_ids: Iterable[int]) -> list[int | None]:
        """The job of each of ``assignment_ids`` this agent runs (None for one it does not), for
        log lines about a batch (runtime/log.py)."""
        return [None if (job := self._jobs.get(aid)) is None else job.order.job_id for aid in assignment_ids]

    def _count_refusals(self, request: str, refused: tuple[Refusal, ...]) -> None:
        for refusal in refused:
            metrics.AGENT_ASSIGNMENTS_REFUSED.labels(self.worker_id, request, refusal.reason.value).inc()

    # ------------------------------------------------------------------ lifecycle

    async def run(
        self, address: str, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Register as ``address``, heartbeat and run jobs until cancelled.

        Signals ``task_status.started(self)`` at once (before the first registration, which
        waits for a control plane). On cancellation stops every job (shielded), writing a
        ``stop`` line with reason ``shutdown`` for each, then, once all have ended, leaves:
        tells a control plane that this incarnation stopped cleanly (:meth:`_leave`, at most
        ``leave_timeout_s``), and returns by re-raising.

        Raises:
            OSError: the work folder or the log file cannot be created.
            LocalFileError: another agent process runs on the same work folder.
        """
        self.address = address
        self._clock = trio.lowlevel.current_clock()
        self.joblog.open()
        try:
            lock = adoption.lock_work_dir(self.work_dir)
        except BaseException:
            self.joblog.close()
            raise
        stopping_since: float | None = None
        metrics.WORKER_GAUGES.watch(self.worker_id, self.metrics_reading)
        try:
            async with trio.open_nursery() as job_nursery:
                self._jobs.nursery = job_nursery
                try:
                    self._take_over()
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._heartbeat_loop)
                        nursery.start_soon(self._fence_watch)
                        task_status.started(self)
                finally:
                    stopping_since = trio.current_time()
                    self._admission.fenced = True
                    with trio.CancelScope(shield=True):
                        await self._heartbeating(lambda: self._jobs.stop(None, StopReason.SHUTDOWN))
            # Every job's task has returned (the job nursery waited for them): nothing runs.
        finally:
            self._jobs.nursery = None
            try:
                if stopping_since is not None:
                    with trio.CancelScope(shield=True):
                        await self._leave(stopping_since)
            finally:
                metrics.WORKER_GAUGES.forget(self.worker_id, self.metrics_reading)
                self.joblog.close()
                os.close(lock)

    # ------------------------------------------------------------------ leave

    async def _leave(self, stopping_since: float) -> None:
        """Say that this worker stopped cleanly, once every job has ended; never raises a
        StockadeError.

        A control plane that records it makes the worker's row ``left``: it is never declared
        dead, and the leader ends its assignments as stopped and requeues their jobs at once.
        The request names this incarnation and this agent run (a late or foreign leave changes
        nothing there) and carries the outcomes no reply has acknowledged.

        A stop of many workers at once (a fleet, ``stockade down``, an ``up`` that shrinks the
        cluster) sends many leaves at once to control planes that are busy too. So each attempt
        takes one of the process's leave turns (``max_concurrent_leaves``, shared by a fleet's
        workers, held for the attempt only, not while waiting to try again); an attempt is one
        hedged call of at most ``heartbeat_timeout_s * (control planes + 1)``; one that no
        replica answered (unreachable, busy, no database, too slow) is tried again after a
        capped, jittered backoff, until ``leave_timeout_s`` after the first attempt began. A
        copy of a leave that was applied is answered ``left`` again, so a retry is safe.
        Meanwhile, as while its jobs were being stopped, the worker keeps heartbeating
        (:meth:`_heartbeat_while_stopping`), so a leave that takes its time is not overtaken by a
        dead-worker declaration. A
        leave that does not get through in that time (or is answered with a refusal) leaves
        the existing path in charge: the worker is declared dead ``dead_after`` after its last
        heartbeat, which is safe, since it runs nothing. Either way a ``leave`` line records
        the clean stop, at ``stopping_since`` (trio time: when heartbeats stopped), for the
        checker.

        Never called while a job runs: the agent must not be both left and running jobs.
        """
        incarnation = self._admission.incarnation
        if incarnation is None:
            return  # never registered: no row of this life to leave
        if len(self._jobs):
            # run() calls this only after the job nursery has closed; a bug otherwise.
            self._logger.error("not leaving: jobs are still running", jobs=self._jobs.ids())
            return
        request = Leave(
            worker_id=self.worker_id,
            incarnation=incarnation,
            agent_run_id=self._run_id,
            finished=tuple(self._unacked),
        )
        result = await self._send_leave(request)
        answer = result.answer
        left = answer is not None and answer.left
        if answer is not None:
            self._admission.observe_epoch(answer.epoch)
            del self._unacked[: len(request.finished)]
        self.joblog.write(
            LogEvent.LEAVE,
            incarnation=incarnation,
            epoch=self.max_epoch_seen,
            at=stopping_since,
            left=left,
        )
        if left:
            self._logger.info(
                "left the cluster",
                incarnation=incarnation,
                outcomes=len(request.finished),
                attempts=result.attempts,
            )
        else:
            self._logger.warning(
                "leave not recorded: the control planes will declare this worker dead",
                incarnation=incarnation,
                attempts=result.attempts,
                error=result.error if answer is None else answer.detail,
            )

    async def _send_leave(self, request: Leave) -> _LeaveResult:
        """Send ``request`` until a control plane answers it, for at most ``leave_timeout_s``
        from the first attempt (see :meth:`_leave`), heartbeating meanwhile; never raises a
        StockadeError."""
        return await self._heartbeating(lambda: self._leave_attempts(request))

    async def _heartbeating(self, work: Callable[[], Awaitable[T]]) -> T:
        """``await work()`` (a step of a clean stop: stopping the jobs, leaving) while heartbeating
        every ``heartbeat_interval_s`` (:meth:`_heartbeat_while_stopping`); at once when this
        worker never registered."""
        incarnation = self._admission.incarnation
        if incarnation is None:
            return await work()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeat_while_stopping, incarnation)
            result = await work()
            nursery.cancel_scope.cancel()
        return result

    async def _heartbeat_while_stopping(self, incarnation: int) -> None:
        """Heartbeat every ``heartbeat_interval_s`` until cancelled, reporting what still runs
        (jobs being stopped) and no outcome (the leave carries them).

        The heartbeat loop ends when a clean stop begins; without this, a worker whose jobs take
        a while to stop, or whose leave waits for its turn or is tried again, would be declared
        dead ``dead_after`` after its last heartbeat, before its leave arrives, as a killed one
        is. Such a heartbeat keeps the row's last heartbeat fresh and confirms what still runs;
        its answer is not obeyed (a request to register again, to stop assignments: everything
        here is being stopped), but for the epoch and the database's clock it names."""
        settings = self.settings
        beats = Periodic(self.heartbeat_interval_s, last_at=self._fence.last_acked_send_time)
        deadline_s = settings.heartbeat_timeout_s * (len(settings.control_planes) + 1)
        while True:
            await beats.tick()
            sent_at = trio.current_time()
            report = HeartbeatReport(
                worker_id=self.worker_id,
                incarnation=incarnation,
                running_assignment_ids=self.running_assignment_ids,
                finished=(),
                epoch_seen=self.max_epoch_seen,
                **self._told_in_use(sent_at),
            )
            try:
                answer = await self._cp.heartbeat(report, deadline_s=deadline_s)
            except StockadeError:
                continue  # the leave says what fails
            self._admission.observe_epoch(answer.epoch)
            self._clock_told(answer.database_unix_s, sent_at)

    async def _leave_attempts(self, request: Leave) -> _LeaveResult:
        """The attempts of :meth:`_send_leave`, retried with backoff (see :meth:`_leave`)."""
        settings = self.settings
        attempt_s = settings.heartbeat_timeout_s * (len(settings.control_planes) + 1)
        result = _LeaveResult(error=f"no control plane answered within {settings.leave_timeout_s:g} s")
        rng = random.Random()
        deadline = math.inf
        while True:
            async with self._leave_turns:
                if result.attempts == 0:
                    deadline = trio.current_time() + settings.leave_timeout_s
                timeout_s = min(deadline - trio.current_time(), attempt_s)
                if timeout_s <= 0:
                    return result
                result.attempts += 1
                result.error = f"no control plane answered within {timeout_s:.2f} s"
                with trio.move_on_after(timeout_s):
                    try:
                        result.answer = await self._cp.leave(request, deadline_s=timeout_s)
                        return result
                    except TemporaryError as exc:  # unreachable, busy, no database: try again
                        result.error = str(exc)
                    except StockadeError as exc:  # refused for good (a field out of range)
                        result.error = str(exc)
                        return result
            wait_s = LEAVE_BACKOFF.delay_s(result.attempts - 1, rng)
            if trio.current_time() + wait_s >= deadline:
                return result
            await trio.sleep(wait_s)

    # ------------------------------------------------------------------ registration

    def _leave_live(self) -> None:
        """Stop accepting work: fenced for Admission, the fence watcher parks."""
        self._admission.fenced = True
        self._fence.leave_live()

    async def _replaced_if_so(self, answer: HeartbeatAnswer) -> None:
        """When another agent process registered this worker's id since this one did (a newer
        incarnation alive under another agent run), two agents share the id: registering again
        would only take it back, and each would end the other's jobs in turn. The later one
        keeps the id; this one stops every job and ends.

        Raises:
            FailedPrecondition: always, naming the other agent's address and incarnation.
        """
        newer = answer.newer
        if newer is None or newer.agent_run_id == self._run_id:
            return
        self._logger.error(
            "another agent registered this worker's id: stopping",
            other_address=newer.address,
            other_incarnation=newer.incarnation,
            other_agent_run_id=newer.agent_run_id,
        )
        self._leave_live()
        await self._jobs.stop(None, StopReason.REREGISTER)
        raise FailedPrecondition(
            f"another agent registered as worker {self.worker_id} (from {newer.address}, incarnation "
            f"{newer.incarnation}) while this one ran: two agents must not share an id. This one "
            "stopped its jobs and exits; give each agent its own --id"
        )

    def _register_retry_wait_s(self, failures: int) -> float:
        """The pause after the ``failures``-th failed attempt (1, 2, ...) of one registration,
        in seconds: uniform below ``register_retry_s * 2**(failures - 1)``, capped at
        ``register_retry_max_s`` (full jitter, :mod:`runtime.backoff`). A registration no
        replica answered was often queued, not lost: a copy sent again at once, by every worker
        refused together, only lengthens the queue it waits in."""
        return self._register_backoff.delay_s(failures - 1, self._rng)

    async def _register(self, stop_reason: StopReason) -> None:
        """Stop every job, then register until a control plane answers (new incarnation).

        Every registration carries the outcomes no reply has acknowledged yet; those it
        carried are dropped once it succeeded (outcomes that appear meanwhile stay).
        """
        self._leave_live()
        await self._jobs.stop(None, stop_reason)
        # One number for every attempt of this registration: a late copy of an attempt that
        # timed out here, or of a hedged one, gets the incarnation the first applied created.
        self._registrations += 1
        failures = 0
        while True:
            sent_at = trio.current_time()
            finished = tuple(self._unacked)
            try:
                reply = await self._cp.register(
                    Registration(
                        worker_id=self.worker_id,
                        address=self.address,
                        cpu_millis=self.settings.cpu_millis,
                        memory_mb=self.settings.memory_mb,
                        labels=dict(self.settings.labels),
                        finished=finished,
                        agent_run_id=self._run_id,
                        registration_seq=self._registrations,
                    ),
                    deadline_s=self._fence.register_deadline_s(),
                )
            except PermissionDenied as exc:
                # Every replica applies the same rule: retrying cannot help (the certificate
                # names another worker). Stop, saying so, instead of retrying for ever.
                self._logger.error("registration refused", error=str(exc))
                raise PermissionDenied(
                    f"worker {self.worker_id} cannot register: {exc}; start the agent with the "
                    "--id its certificate names, or issue a certificate for this id"
                ) from exc
            except StockadeError as exc:
                failures += 1
                wait_s = self._register_retry_wait_s(failures)
                if failures % _LOG_EVERY_FAILURES == 1:
                    level = "warning" if isinstance(exc, TemporaryError) else "error"
                    getattr(self._logger, level)(
                        "registration failed, retrying",
                        error=str(exc),
                        attempts=failures,
                        retry_in_s=round(wait_s, 3),
                    )
                await trio.sleep(wait_s)
                continue
            break
        self._clock_told(reply.database_unix_s, sent_at)
        # Outcomes are only appended, and nothing else drops any while this runs (heartbeats
        # wait for it): the first len(finished) entries are exactly those it carried.
        del self._unacked[: len(finished)]
        self._adopt_told(reply.heartbeat_interval_s, reply.dead_after_s)
        self._fence.publish(sent_at + self._fence.fence_after_s)  # before any job of this life can start
        self._fence.last_acked_send_time = sent_at
        self._admission.registered(reply.incarnation, reply.epoch)
        self._fence.self_fenced = False
        self._fence.paused = False
        self._fence.fenced_at = None
        self._fence.pauses.clear()  # every job of the previous life has ended
        self.joblog.write(LogEvent.REGISTER, incarnation=reply.incarnation, epoch=self.max_epoch_seen)
        self._logger.info(
            "registered",
            incarnation=reply.incarnation,
            epoch=reply.epoch,
            address=self.address,
            attempts=failures + 1,
        )
        self._fence.live.set()
        self._registered_once.set()

    # ------------------------------------------------------------------ restarts

    def _take_over(self) -> None:
        """Find what the previous agent process of this work folder left running and take it
        over (:mod:`agent.adoption`): jobs that ended meanwhile get their ``stop`` lines and their
        outcomes now, the others a task that watches them, holding their reservations; those
        not to be kept (strays, older incarnations, those that do not fit a smaller capacity,
        all of them when the kill deadline is near) are asked to stop. No checkpoint: called
        before the heartbeat loop, which stops what is not kept and asks the control plane to
        continue the incarnation of the rest (:meth:`_keep_taken_over`)."""
        found = adoption.survey(
            self.jobs_dir, worker_id=self.worker_id, deadline_path=self.fence_deadline_path
        )
        if not found.found and not found.strays:
            return
        plan = adoption.plan_takeover(
            found,
            cpu_millis=self.settings.cpu_millis,
            memory_mb=self.settings.memory_mb,
            now_s=time.monotonic(),
            min_left_s=self._fence.fence_after_s,
            pidfds=hasattr(os, "pidfd_open"),
        )
        pause_at, kill_at = found.deadline if found.deadline is not None else (None, None)
        self._logger.warning(
            "found jobs of the previous agent process",
            running=len(plan.watch),
            ended=len(plan.settle),
            strays=len(plan.strays),
            keep=len(plan.keep),
            incarnation=plan.incarnation,
            job_ids=[item.record.job_id for item in plan.watch],
            assignment_ids=[item.record.assignment_id for item in plan.watch],
            ended_job_ids=[item.record.job_id for item in plan.settle],
            ended_assignment_ids=[item.record.assignment_id for item in plan.settle],
        )
        for item in plan.settle:
            self._jobs.settle_ended(item)
        for item in plan.watch:
            job = self._jobs.adopt(item, go=self._continued, pause_at_s=pause_at, kill_at_s=kill_at)
            aid = item.record.assignment_id
            if job is None:  # its reaper exited since the survey: it ended on its own terms
                self._jobs.settle_ended(attrs.evolve(item, verdict=adoption.Verdict.ENDED))
            elif aid in plan.stop:
                self._logger.warning(
                    "stopping a job of the previous agent process", why=plan.stop[aid], **job.log_keys
                )
                self._jobs.request_stop(job, StopReason.RESTART)
        self._takeover = plan

    async def _keep_taken_over(self) -> bool:
        """Stop what :meth:`_take_over` is not to keep and wait until it is gone, then ask the
        control plane to continue the incarnation of the rest. True when it did: the kept jobs
        run on in it (and this agent accepts work in it); False: register a new incarnation,
        stopping the rest first."""
        plan, self._takeover = self._takeover, None
        if plan is None:
            return False
        await adoption.stop_strays(plan.strays, stop_grace_s=self.settings.stop_grace_s)
        for stray in plan.strays:  # their cgroups were kept for them at start
            await self._jobs.release_cgroup(os.path.basename(stray.cwd))
        await self._jobs.stop(list(plan.stop), StopReason.RESTART)
        if plan.incarnation is None:
            return False
        return await self._continue_incarnation(plan.incarnation, set(plan.keep), plan.kill_at_s)

    async def _continue_incarnation(self, incarnation: int, keep: set[int], kill_at_s: float | None) -> bool:
        """Register asking to continue ``incarnation`` with the jobs of ``keep`` still running
        (retrying while no control plane answers, until their kill deadline ``kill_at_s``,
        ``time.monotonic()``, is less than a fence span ahead). On a
        reply that continued it: remember what the control plane released, stop what it lists
        as ended, and, if the registration's own fence deadline is still ahead, move the
        deadline on (the reapers resume paused jobs on it, as after an acknowledged heartbeat)
        and go live. Returns False when the incarnation was not continued, or the reply came too
        late to resume on: the caller registers anew, stopping every job first."""
        self._registrations += 1
        failures = 0
        while True:
            held = tuple(
                aid
                for aid in self._jobs.ids()
                if aid in keep and (job := self._jobs.get(aid)) is not None and not job.stop.is_set()
            )
            if not held:
                self._logger.info(
                    "nothing left to keep of the previous agent process", incarnation=incarnation
                )
                return False
            if kill_at_s is not None and time.monotonic() > kill_at_s - self._fence.fence_after_s:
                self._logger.warning(
                    "no control plane answered before the jobs' kill deadline: registering anew",
                    incarnation=incarnation,
                    attempts=failures,
                )
                return False
            sent_at = trio.current_time()
            finished = tuple(self._unacked)
            try:
                reply = await self._cp.register(
                    Registration(
                        worker_id=self.worker_id,
                        address=self.address,
                        cpu_millis=self.settings.cpu_millis,
                        memory_mb=self.settings.memory_mb,
                        labels=dict(self.settings.labels),
                        finished=finished,
                        agent_run_id=self._run_id,
                        registration_seq=self._registrations,
                        resume_incarnation=incarnation,
                        held_assignment_ids=held,
                    ),
                    deadline_s=self._fence.call_deadline_s(),
                )
            except PermissionDenied as exc:
                self._logger.error("registration refused", error=str(exc))
                raise
            except StockadeError as exc:
                failures += 1
                wait_s = self._register_retry_wait_s(failures)
                if failures % _LOG_EVERY_FAILURES == 1:
                    self._logger.warning(
                        "continuing the incarnation failed, retrying",
                        error=str(exc),
                        attempts=failures,
                        incarnation=incarnation,
                        retry_in_s=round(wait_s, 3),
                    )
                await trio.sleep(wait_s)
                continue
            break
        self._clock_told(reply.database_unix_s, sent_at)
        del self._unacked[: len(finished)]
        if not reply.resumed:
            self._logger.warning(
                "the control plane did not continue the incarnation (declared dead, or registered "
                "again since): stopping the jobs of the previous agent process",
                incarnation=incarnation,
                jobs=len(held),
            )
            return False
        self._adopt_told(reply.heartbeat_interval_s, reply.dead_after_s)
        fence_s = self._fence.fence_after_s
        self._admission.continued(
            incarnation, reply.epoch, released=reply.released_assignment_ids + reply.stop_assignment_ids
        )
        if reply.stop_assignment_ids:
            self._logger.info(
                "control plane ended kept assignments",
                epoch=reply.epoch,
                incarnation=incarnation,
                job_ids=self._job_ids(reply.stop_assignment_ids),
                assignment_ids=list(reply.stop_assignment_ids),
            )
            await self._jobs.stop(list(reply.stop_assignment_ids), StopReason.STOPPED_BY_CONTROL_PLANE)
        if trio.current_time() >= sent_at + fence_s:
            self._logger.warning("incarnation continued too late to resume on", incarnation=incarnation)
            return False
        self._fence.publish(sent_at + fence_s)  # the reapers resume on it, as after a heartbeat
        self._fence.last_acked_send_time = sent_at
        self._fence.self_fenced = False
        self._fence.paused = False
        self._fence.fenced_at = None
        self._continued.set()
        self.joblog.write(LogEvent.REGISTER, incarnation=incarnation, epoch=self.max_epoch_seen)
        self._logger.info(
            "continued the incarnation of the previous agent process",
            incarnation=incarnation,
            epoch=reply.epoch,
            kept=len(held) - len(reply.stop_assignment_ids),
            released=len(reply.released_assignment_ids),
            attempts=failures + 1,
            job_ids=self._job_ids(a for a in held if a not in reply.stop_assignment_ids),
            assignment_ids=[a for a in held if a not in reply.stop_assignment_ids],
            released_assignment_ids=list(reply.released_assignment_ids),
        )
        self._fence.live.set()
        self._registered_once.set()
        return True

    async def prepare_restart(self, hold_s: float, *, timeout_s: float | None = None) -> bool:
        """Prepare a planned restart: this process will exit leaving its jobs running, for an
        agent started again on the same work folder to take over (:mod:`agent.adoption`).

        Stops accepting work, then has the next heartbeat ask for a restart hold of ``hold_s``
        (the control planes then count no silence of this worker and place nothing on it for
        that long, from the heartbeat's commit). Once a heartbeat the database acknowledged
        recorded it, the fence deadline moves to that heartbeat's send time plus ``hold_s`` plus
        the fence span (the kill deadline as far), every sleep job's record is brought up to
        date, and no heartbeat is sent any more. Waits at most ``timeout_s`` (None: the fence
        span) for it. Safety: docs/design.md, "Restarts".

        Returns:
            True once the hold is recorded; False when it was not within ``timeout_s`` (the
            jobs then pause at the fence deadline as for a killed agent).
        """
        self._admission.fenced = True  # nothing new from here on: it would not be reported
        self._admission.restarting = True  # refused as "restarting", not as "fenced"
        self._jobs.keep_records = True  # a job ending now is settled by the next agent
        if self._admission.incarnation is None or self._fence.self_fenced:
            return False
        self._restart_hold_s = hold_s
        with trio.move_on_after(self._fence.fence_after_s if timeout_s is None else timeout_s):
            await self._restart_granted.wait()
        return self._restart_granted.is_set()

    def _hold_granted(self, sent_at: float, hold_s: float) -> None:
        """A heartbeat sent at ``sent_at`` recorded a restart hold of ``hold_s``: move the
        deadlines on by it (published for the reapers), stop heartbeating, park the fence
        watcher. No checkpoint."""
        self._fence.publish(sent_at + hold_s + self._fence.fence_after_s)
        self._jobs.record_progress()
        self._leave_live()
        self._restart_granted.set()
        self._logger.warning(
            "restart hold recorded: leaving the jobs to the next agent process",
            hold_s=hold_s,
            jobs=len(self._jobs),
            incarnation=self._admission.incarnation,
        )

    # ------------------------------------------------------------------ heartbeats

    def _adopt_told(self, interval_s: float | None, dead_after_s: float | None) -> None:
        """Take the dead_after and the heartbeat interval a reply told (None: not told).

        A dead_after that is a number > 0 is always taken: the self-fence must fit below the
        dead_after the cluster judges the worker by. An interval :func:`agent.fence.told_refusal`
        refuses (not a number > 0, outside ``heartbeat_interval_min_s`` ..
        ``heartbeat_interval_max_s``, or leaving a self-fence span no longer than itself) is
        logged (once per refused value) and the last good one kept. The self-fence span follows
        what is taken (:func:`agent.fence.fence_after_s`). Each heartbeat says which dead_after
        its fence is derived from, and the cluster judges the worker by the larger of that and
        the one it told (docs/design.md, "Heartbeat interval").
        """
        new_dead_after_s: float | None
        if dead_after_s is not None and math.isfinite(dead_after_s) and dead_after_s > 0:
            new_dead_after_s = dead_after_s
        else:
            new_dead_after_s = self.dead_after_s
        new_interval_s = self.heartbeat_interval_s
        if interval_s is not None:
            why = told_refusal(self.settings, interval_s, new_dead_after_s)
            if why is None:
                new_interval_s = interval_s
                self._refused_interval_s = None
            elif self._refused_interval_s != interval_s:
                self._refused_interval_s = interval_s
                self._logger.warning(
                    "heartbeat interval told by the control plane refused, keeping the last good one",
                    told_interval_s=interval_s,
                    dead_after_s=new_dead_after_s,
                    reason=why,
                    heartbeat_interval_s=self.heartbeat_interval_s,
                )
        fence_s = fence_after_s(self.settings, new_dead_after_s, new_interval_s)
        if (new_interval_s, fence_s) != (self.heartbeat_interval_s, self._fence.fence_after_s):
            self._logger.info(
                "heartbeat interval and self-fence span set by the cluster",
                heartbeat_interval_s=new_interval_s,
                dead_after_s=new_dead_after_s,
                self_fence_after_s=round(fence_s, 3),
                was_heartbeat_interval_s=self.heartbeat_interval_s,
                was_self_fence_after_s=round(self._fence.fence_after_s, 3),
            )
        self.heartbeat_interval_s = new_interval_s
        self.dead_after_s = new_dead_after_s
        self._fence.fence_after_s = fence_s

    def _told_in_use(self, sent_at: float) -> dict[str, int]:
        """What a heartbeat sent at trio time ``sent_at`` says of its order and of the dead_after
        the fence is derived from (``sent_monotonic_us``, ``dead_after_in_use_ms``)."""
        return {
            "sent_monotonic_us": max(1, int(monotonic_of(sent_at) * 1e6)),
            "dead_after_in_use_ms": 0 if self.dead_after_s is None else math.ceil(self.dead_after_s * 1000),
        }

    async def _heartbeat_loop(self) -> None:
        if not await self._keep_taken_over():
            # A new incarnation: whatever was taken over and not kept is stopped first.
            await self._register(StopReason.RESTART)
        # Counted from the registration's send time, as after a heartbeat: a slow answer is
        # followed at once, not an interval later, while the deadline runs from the send.
        assert self._fence.last_acked_send_time is not None
        # A heartbeat that took longer than the interval is followed at once, not by a burst.
        beats = Periodic(self.heartbeat_interval_s, last_at=self._fence.last_acked_send_time)
        failures = 0
        began = self._jobs.began()
        while True:
            beats.interval_s = self.heartbeat_interval_s  # as the cluster tells it
            await self._until_heartbeat(beats, began)
            if self._restart_granted.is_set():
                # The hold is recorded and the deadline moved on by it: no heartbeat may move
                # it back before the process exits (prepare_restart).
                await trio.sleep_forever()
            # Taken before the heartbeat lists what runs: a moved job that starts from here on
            # is in the next one, which it may pull forward.
            began = self._jobs.began()
            ok = await self._heartbeat_once(failures)
            failures = 0 if ok else failures + 1

    async def _until_heartbeat(self, beats: Periodic, began: trio.Event) -> None:
        """Sleep until the next heartbeat is due: the next of ``beats``, or sooner when a job
        placed before started since the last heartbeat (``began``) and an early heartbeat is allowed
        (:func:`agent.fence.early_heartbeat_allowed`); the ticks then count from it."""
        due = beats.next_at()
        with trio.move_on_at(due):
            await began.wait()
            if not early_heartbeat_allowed(trio.current_time(), self._early_heartbeat_at, beats.interval_s):
                await trio.sleep_forever()  # the regular heartbeat reports it
            await trio.sleep(EARLY_HEARTBEAT_GATHER_S)
            self._early_heartbeat_at = beats.last_at = trio.current_time()
            return
        await beats.tick()

    async def _heartbeat_once(self, failures: int) -> bool:
        """Send one heartbeat and obey its reply; False when no control plane answered."""
        self._fence_if_due()  # a thawed agent reports nothing before it has fenced
        incarnation = self._admission.incarnation
        assert incarnation is not None  # the loop registers first
        sent_at = trio.current_time()
        report = HeartbeatReport(
            worker_id=self.worker_id,
            incarnation=incarnation,
            running_assignment_ids=self.running_assignment_ids,
            finished=tuple(self._unacked),
            epoch_seen=self.max_epoch_seen,
            restart_hold_ms=0 if self._restart_hold_s is None else round(self._restart_hold_s * 1000),
            waited_ms=round(self._heartbeat_waited_s * 1000),
            **self._told_in_use(sent_at),
        )
        # Said by the next heartbeat only when it was sent while live and answered: a call given
        # up on, or one sent while paused through an outage, measures the outage (up to
        # register_timeout_s), not how long the replicas take now (docs/design.md, "Heartbeat
        # interval").
        live_at_send = self._fence.live.is_set()
        self._heartbeat_waited_s = 0.0
        try:
            answer = await self._cp.heartbeat(report, deadline_s=self._fence.call_deadline_s(failures))
        except StockadeError as exc:
            self._heartbeat_failures.inc()
            if failures % _LOG_EVERY_FAILURES == 0:
                self._logger.warning(
                    "heartbeat failed",
                    error=str(exc),
                    failures_in_a_row=failures + 1,
                    fenced=self._fence.self_fenced,
                )
            return False
        round_trip_s = trio.current_time() - sent_at
        self._heartbeat_waited_s = round_trip_s if live_at_send else 0.0
        metrics.AGENT_HEARTBEAT_ROUND_TRIP_SECONDS.observe(round_trip_s)
        self._clock_told(answer.database_unix_s, sent_at)
        if failures:
            self._logger.info("heartbeat answered again", failures_in_a_row=failures)
        await self._on_heartbeat_answer(report, answer, sent_at)
        return True

    async def _on_heartbeat_answer(
        self, report: HeartbeatReport, answer: HeartbeatAnswer, sent_at: float
    ) -> None:
        # A reply that comes after the deadline does not move it: pause (or fence) first.
        self._fence_if_due()
        if self._fence.paused:
            await self._on_answer_while_paused(report, answer, sent_at)
            return
        # Before the deadline moves: the span told with this answer counts from its send time
        # (the cluster judges the worker by it from this heartbeat's record on).
        self._adopt_told(answer.heartbeat_interval_s, answer.dead_after_s)
        self._fence.acknowledged(sent_at)
        self._admission.observe_epoch(answer.epoch)
        # Outcomes are only appended while the heartbeat was in flight, and heartbeats are
        # sequential: the first len(report.finished) entries are exactly those it carried.
        del self._unacked[: len(report.finished)]
        if self._fence.self_fenced:
            self._logger.info("heartbeat got through while fenced: registering again")
            await self._register(StopReason.SELF_FENCE)
            return
        if answer.reregister:
            await self._replaced_if_so(answer)
            self._logger.warning("control plane asked to register again", incarnation=report.incarnation)
            await self._register(StopReason.REREGISTER)
            return
        for aid in answer.stop_assignment_ids:
            self._admission.ended_by_control_plane(aid)
            job = self._jobs.get(aid)
            if job is not None:
                self._logger.info("control plane ended a running assignment", **job.log_keys)
                self._jobs.request_stop(job, StopReason.STOPPED_BY_CONTROL_PLANE)
        if report.restart_hold_ms and answer.restart_hold_granted:
            self._hold_granted(sent_at, report.restart_hold_ms / 1000)

    def _clock_told(self, database_unix_s: float | None, sent_at: float) -> None:
        """A reply to a request sent at ``sent_at`` arrived now, telling the database's clock
        (None: it told none): learn from it, and write the job-log lines that waited for it.
        No checkpoint."""
        self.database_clock.observe(database_unix_s, sent_at=sent_at, received_at=trio.current_time())
        self.joblog.flush()

    # ------------------------------------------------------------------ pause and self-fence

    def _fence_if_due(self) -> bool:
        """Pause every job now if live and the fence deadline has passed; kill them (self-fence)
        if the kill deadline has passed too. True if it paused or fenced now."""
        if self._fence.kill_due():
            if self._holds_no_job():
                # Nothing to kill: a self-fence would only throw this incarnation away and
                # register another, for no job's sake (in a registration storm, hundreds of
                # them). The worker stays paused instead, as through any outage.
                if self._fence.paused:
                    return False
                self._pause_now()
                return True
            self._fence_now()
            return True
        if self._fence.due():
            self._pause_now()
            return True
        return False

    def _holds_no_job(self) -> bool:
        """True when no job of this incarnation is running, paused or stopping: a self-fence
        would have nothing to kill. Nothing new is accepted while paused, so it stays true
        until the jobs resume."""
        return len(self._jobs) == 0

    def _pause_now(self) -> None:
        """Pause every job at once, with no checkpoint: refuse work, log it, hold the jobs.

        Command jobs are held by their reapers, which read the same deadline from the
        fence-deadline file (SIGSTOP); sleep jobs stop counting their duration. They count as
        paused from the fence deadline (or from now, when that came first). With no outage
        grace (``db_outage_grace_s`` not above the fence span) this is a self-fence.
        """
        fence = self._fence
        if fence.paused or fence.self_fenced:
            return
        if fence.outage_grace_s() <= fence.fence_after_s and not self._holds_no_job():
            self._fence_now()
            return
        now = trio.current_time()
        deadline = fence.deadline()
        fence.fenced_at = now if deadline is None else min(now, deadline)
        fence.paused = True
        fence.pause_began(fence.fenced_at)
        self._leave_live()
        metrics.AGENT_PAUSES.labels(self.worker_id).inc()
        self.joblog.write(
            LogEvent.PAUSE,
            incarnation=self._admission.incarnation,
            epoch=self.max_epoch_seen,
            at=fence.fenced_at,
        )
        kill_at = fence.kill_deadline()
        self._logger.warning(
            "paused every job: no heartbeat acknowledged",
            silent_s=round(now - (fence.last_acked_send_time or 0.0), 3),
            late_s=round(now - fence.fenced_at, 3),
            self_fence_after_s=fence.fence_after_s,
            killed_in_s=None if kill_at is None else round(kill_at - now, 3),
            jobs=len(self._jobs),
            **self._all_jobs_keys(),
        )
        fence.signal_change()

    def _all_jobs_keys(self) -> dict[str, Any]:
        """The keys of a line about every job at once (a pause, a resume, a self-fence): the
        incarnation, the newest epoch seen, and the jobs' ids (runtime/log.py)."""
        ids = self._jobs.ids()
        return {
            "incarnation": self._admission.incarnation,
            "epoch": self.max_epoch_seen,
            "job_ids": self._job_ids(ids),
            "assignment_ids": ids,
        }

    def _resume(self, sent_at: float) -> None:
        """Resume the paused jobs, with no checkpoint: a heartbeat sent at ``sent_at`` was
        acknowledged by the database, fresh enough that its deadline has not passed, and every
        job it did not list as stopped still has its assignment active on this incarnation.
        The new deadline is published first (the reapers SIGCONT their jobs when they see it)."""
        fence = self._fence
        now = trio.current_time()
        paused_from = fence.fenced_at
        fence.acknowledged(sent_at, resuming=True)
        fence.paused = False
        fence.fenced_at = None
        fence.pause_ended(now)
        self._jobs.record_progress()  # sleep jobs' records: the pause does not count
        self._admission.fenced = False
        fence.live.set()
        metrics.AGENT_RESUMES.labels(self.worker_id).inc()
        self.joblog.write(
            LogEvent.RESUME,
            incarnation=self._admission.incarnation,
            epoch=self.max_epoch_seen,
        )
        self._logger.warning(
            "resumed every job: a heartbeat was acknowledged",
            paused_s=None if paused_from is None else round(now - paused_from, 3),
            jobs=len(self._jobs),
            **self._all_jobs_keys(),
        )
        fence.signal_change()

    async def _on_answer_while_paused(
        self, report: HeartbeatReport, answer: HeartbeatAnswer, sent_at: float
    ) -> None:
        """Obey a heartbeat reply while the jobs are paused (the argument is in DESIGN.md,
        "Outages"): register again if asked (every job is killed first); else kill the jobs
        whose assignments the reply lists as ended and wait until they are gone; then resume
        the others if the heartbeat's own deadline has not passed, else stay paused (the next
        heartbeat tries again)."""
        self._admission.observe_epoch(answer.epoch)
        del self._unacked[: len(report.finished)]
        if answer.reregister:
            await self._replaced_if_so(answer)
            self._logger.warning(
                "control plane asked to register again while paused", incarnation=report.incarnation
            )
            await self._register(StopReason.REREGISTER)
            return
        # As on the live path: the span told with this answer counts from its send time (the
        # cluster judges the worker by it from this heartbeat's record on), so the freshness
        # below is judged by it. A paused worker still on the span it registered with would
        # never resume while answers take longer than that (the first minutes of a large
        # cluster), and would be killed at the grace with nothing to kill.
        self._adopt_told(answer.heartbeat_interval_s, answer.dead_after_s)
        ended = list(answer.stop_assignment_ids)
        for aid in ended:
            self._admission.ended_by_control_plane(aid)
        if ended:
            self._logger.info(
                "control plane ended paused assignments",
                epoch=answer.epoch,
                incarnation=report.incarnation,
                job_ids=self._job_ids(ended),
                assignment_ids=ended,
            )
            await self._jobs.stop(ended, StopReason.STOPPED_BY_CONTROL_PLANE)
        self._fence_if_due()
        if not self._fence.paused:
            return  # killed meanwhile (the kill deadline passed)
        if trio.current_time() >= sent_at + self._fence.fence_after_s:
            self._logger.info(
                "heartbeat answered too late to resume on",
                sent_s_ago=round(trio.current_time() - sent_at, 3),
            )
            return
        self._resume(sent_at)

    def _fence_now(self) -> None:
        """Self-fence at once, with no checkpoint: refuse work, log it, ask every job to stop
        (paused ones are killed at once). The jobs count as stopped when they paused, or at
        the fence deadline."""
        fence = self._fence
        if fence.self_fenced:
            return
        now = trio.current_time()
        if not fence.paused:
            deadline = fence.deadline()
            fence.fenced_at = now if deadline is None else min(now, deadline)
            fence.pause_began(fence.fenced_at)
        fence.paused = False
        fence.self_fenced = True
        self._leave_live()
        metrics.AGENT_SELF_FENCES.labels(self.worker_id).inc()
        self.joblog.write(
            LogEvent.SELF_FENCE,
            incarnation=self._admission.incarnation,
            epoch=self.max_epoch_seen,
        )
        self._logger.warning(
            "self-fenced: no heartbeat acknowledged, stopping every job",
            silent_s=round(now - (fence.last_acked_send_time or 0.0), 3),
            late_s=round(now - (fence.fenced_at or now), 3),
            self_fence_after_s=fence.fence_after_s,
            db_outage_grace_s=self.settings.db_outage_grace_s,
            jobs=len(self._jobs),
            **self._all_jobs_keys(),
        )
        self._jobs.request_stop_all(StopReason.SELF_FENCE)
        fence.signal_change()

    async def _fence_watch(self) -> None:
        """Pause every job once no heartbeat sent in the last ``self_fence_after_s`` was
        answered; kill them once none sent in the last ``db_outage_grace_s`` was."""
        fence = self._fence
        while True:
            if fence.paused:
                kill_at = fence.kill_deadline()
                assert kill_at is not None
                if self._fence_if_due():
                    await self._jobs.stop(None, StopReason.SELF_FENCE)
                    continue
                if trio.current_time() >= kill_at:
                    await fence.changed.wait()  # paused past the grace, holding no job
                    continue
                with trio.move_on_at(kill_at):
                    await fence.changed.wait()
                continue
            if not fence.live.is_set():
                await fence.live.wait()
                continue
            deadline = fence.deadline()
            assert deadline is not None  # set by the registration
            if self._fence_if_due():
                if fence.self_fenced:
                    await self._jobs.stop(None, StopReason.SELF_FENCE)
            else:
                await trio.sleep_until(deadline)

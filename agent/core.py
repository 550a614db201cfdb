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
- a heartbeat loop: register (retrying every ``register_retry_s`` while no control plane answers), then
  every ``heartbeat_interval_s`` report running assignments and every not yet acknowledged
  outcome; obey the reply (stop ids, re-register). Registrations carry the unacknowledged
  outcomes too, so a job that succeeded just before a fence keeps its result. Both calls are
  hedged (:meth:`runtime.client.ControlPlaneClient.call_hedged`): the preferred control plane
  may answer until shortly before the fence deadline, and the next one is asked too after
  ``heartbeat_timeout_s`` of silence. Heartbeats go one at a time: the answer to one sent at
  *t* moves the deadline to *t* + ``self_fence_after_s``, so a control plane that keeps
  answering later than about half of that still fences the worker; sending more heartbeats
  while one is unanswered would only add to the load that makes it slow;
- a fence watcher on its own timer (invariant 7 in DESIGN.md): once
  ``trio.current_time() >= last_acked_send_time + self_fence_after_s`` (the *fence
  deadline*; the send time of the newest heartbeat, or registration, that got a reply) the
  agent stops every job at once, refuses Assign with ``fenced``, and keeps heartbeating; the
  first heartbeat that gets through makes it register again (a new incarnation) and leave
  the fenced state;
- a deadman switch that holds while the agent cannot run (SIGSTOP, a stall, a crash): every
  time a heartbeat or registration is acknowledged the agent writes the fence deadline, on
  the ``CLOCK_MONOTONIC`` clock all processes share, to ``<work_dir>/fence_deadline``. Each
  command job runs under a reaper process (:mod:`agent.reaper`) that SIGKILLs the job once
  that deadline has passed and records the kill time, and that kills the job when the agent
  dies. A frozen agent's command jobs thus stop at the deadline, not when it thaws;
- one task per running job, shielded from cancellation: a job ends only through its stop
  event (or its reaper), so its ``stop`` line is written after it has really ended, also at
  shutdown;
- a leave at a clean stop (SIGTERM, SIGINT): once every job has ended, the agent tells a
  control plane that its incarnation left (the worker's row becomes ``left``, and the leader
  requeues its jobs at once instead of declaring it dead after ``dead_after``). A leave that
  gets no answer within ``leave_timeout_s`` changes nothing: the worker is then declared dead,
  as a killed one is. A left worker started again registers a new incarnation as usual.

The fence deadline is final. An agent that finds it passed (it was frozen or stalled past
it; its fence watcher may not even have run yet) self-fences *before* it completes or
reports anything else: every place that starts a job, ends one, sends a heartbeat, handles a
heartbeat reply or answers a Cancel checks the deadline first. A heartbeat reply that
arrives after the deadline does not move it: the agent fences and registers again. Stop
lines then tell when the jobs really stopped, not when the thawed agent noticed:

- a command job its reaper killed at the deadline: the reaper's recorded kill time;
- a sleep job (no process, no work) still running at the deadline: the deadline itself
  (its wall-clock equivalent). By the deadman rule it was dead then, whenever the agent
  noticed; that includes a sleep job whose duration ran out while the agent was frozen past
  its deadline, which is a fenced job, not a succeeded one. A sleep job whose duration ran
  out *before* the deadline succeeded then (its stop line carries that time).

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
The two exceptions convert from it at the edge: the fence-deadline file holds
``time.monotonic()`` seconds (other processes read it) and stop lines hold wall-clock times;
both clocks advance with trio's system clock (``CLOCK_MONOTONIC``), also while the process
is stopped, so the conversion is exact outside tests.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import attrs
import trio

from agent.acceptance import Admission
from agent.control_plane import ControlPlane
from agent.joblog import JobLog, LogEvent
from agent.messages import (
    AssignDecision,
    AssignOrder,
    CancelDecision,
    CancelOrder,
    HeartbeatAnswer,
    HeartbeatReport,
    JobOrder,
    JobState,
    Leave,
    LeaveAnswer,
    Outcome,
    RefusalReason,
    Registration,
    StopReason,
)
from agent.reaper import write_fence_deadline
from agent.runtimes import JobResult, JobRunner, forks, job_dir_for, job_runner, timed_by_agent_s
from agent.starts import StartLimiter, StartTicket
from runtime import log, metrics
from runtime.errors import StockadeError, TemporaryError
from runtime.loops import Periodic
from runtime.settings import AgentSettings

_LOG_EVERY_FAILURES = 20
"""Log the first failure of a streak, then every this-many (keeps a long outage quiet)."""
FENCE_DEADLINE_FILE = "fence_deadline"
"""The fence-deadline file in the work folder (see :mod:`agent.reaper`)."""


def _monotonic_of(trio_time: float) -> float:
    """``trio_time`` (trio's clock) as a ``time.monotonic()`` time."""
    return time.monotonic() + (trio_time - trio.current_time())


def _unix_time_of(trio_time: float) -> float:
    """``trio_time`` (trio's clock) as a wall-clock ``time.time()`` time."""
    return time.time() + (trio_time - trio.current_time())


@attrs.define(eq=False, kw_only=True)
class _Job:
    """One accepted assignment from acceptance until it has really ended."""

    order: JobOrder
    epoch: int
    """The epoch of the Assign request that started it."""
    incarnation: int
    started: bool = False
    """True from its start line on: it is (or was) really running."""
    started_at: float = 0.0
    """trio time at which its runtime was started (0 until its start line was written)."""
    stop: trio.Event = attrs.field(factory=trio.Event)
    stop_reason: StopReason | None = None
    """The first reason a stop was asked for; None while nobody asked."""
    done: trio.Event = attrs.field(factory=trio.Event)
    start_ticket: StartTicket | None = None
    """A command job's place in the queue for a start slot, then its slot; None for a sleep job."""
    reported: bool = False
    """True once it ended on its own and its outcome waits to be reported (never for a job
    stopped by the control plane, a fence or a shutdown)."""


def fence_after_s(settings: AgentSettings, dead_after_s: float | None) -> float:
    """The self-fence deadline to use, in seconds.

    Invariant 7: a cut-off worker stops its jobs before the cluster may place them elsewhere.
    The agent fences ``self_fence_after_s`` after the send time of its last acknowledged
    heartbeat and then takes up to ``stop_grace_s`` to stop a job (SIGTERM, then SIGKILL); the
    control planes declare it dead ``dead_after_s`` after the last heartbeat they recorded,
    which was sent no earlier. So ``self_fence_after_s + stop_grace_s + self_fence_margin_s``
    must not exceed ``dead_after_s``; when it would, the deadline is lowered to fit (never
    below ``min_self_fence_s``). Unknown ``dead_after_s`` (an older control plane) keeps the setting.
    """
    if dead_after_s is None:
        return settings.self_fence_after_s
    limit = dead_after_s - settings.stop_grace_s - settings.self_fence_margin_s
    return max(settings.min_self_fence_s, min(settings.self_fence_after_s, limit))


class Agent:
    """One worker's agent. Serve its :meth:`assign`/:meth:`cancel` and run :meth:`run`.

    Args:
        settings: this worker's settings (capacity, timing, work folder).
        control_plane: how to reach the control plane (:class:`agent.control_plane.GrpcControlPlane`
            in production, a scripted stand-in in tests).
        start_limiter: the process's start slots (shared by the agents of a fleet); None: a
            limiter of its own with ``settings.max_concurrent_starts`` slots.
        runner: what runs the jobs; None: :func:`agent.runtimes.run_job` forking reapers on
            the calling (trio) thread, for tests. :func:`agent.main.run_agent` passes one
            bound to the process's spawner thread.
    """

    def __init__(
        self,
        settings: AgentSettings,
        control_plane: ControlPlane,
        *,
        start_limiter: StartLimiter | None = None,
        runner: JobRunner | None = None,
    ) -> None:
        self.settings = settings
        self.worker_id = settings.worker_id
        self.address = ""
        """host:port registered with the control plane; set by :meth:`run`."""
        self.work_dir = Path(settings.work_dir).resolve()
        self.jobs_dir = self.work_dir / "jobs"
        self.joblog = JobLog(self.work_dir / "agent.jsonl", worker_id=settings.worker_id)
        self.fence_deadline_path = self.work_dir / FENCE_DEADLINE_FILE
        """Where the fence deadline is published to the reapers (see :mod:`agent.reaper`)."""
        self._cp = control_plane
        self._start_limiter = start_limiter or StartLimiter(settings.max_concurrent_starts)
        self._runner = runner or job_runner(None)
        self._admission = Admission(
            worker_id=settings.worker_id,
            cpu_capacity_millis=settings.cpu_millis,
            memory_capacity_mb=settings.memory_mb,
        )
        self._jobs: dict[int, _Job] = {}
        self._run_id = uuid.uuid4().hex
        """This agent's run, for the control plane to tell copies of one registration apart
        from a new one."""
        self._registrations = 0
        """Registrations begun in this run (the number of the current one)."""
        self._unacked: list[Outcome] = []
        self._last_acked_send_time: float | None = None
        self._fence_after_s = settings.self_fence_after_s
        """The self-fence deadline in force: the setting, or less when the control planes'
        dead_after leaves too small a margin (see :func:`fence_after_s`)."""
        self._self_fenced = False
        self._fenced_at: float | None = None
        """While self-fenced: the trio time the jobs count as stopped at (the fence deadline,
        or the fence itself when that came first)."""
        self._live = trio.Event()
        """Set while registered and not fenced; replaced by a fresh one when that ends."""
        self._registered_once = trio.Event()
        self._job_nursery: trio.Nursery | None = None
        self._logger = log.get("agent").bind(worker_id=settings.worker_id)

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
        return self._self_fenced

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
        return tuple(sorted(aid for aid, job in self._jobs.items() if job.started))

    @property
    def unacknowledged_outcomes(self) -> tuple[Outcome, ...]:
        """Outcomes waiting for a heartbeat reply."""
        return tuple(self._unacked)

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
        decision = self._admission.assign(order)
        for refusal in decision.refused:
            if refusal.reason is RefusalReason.NO_ROOM:
                self._logger.warning(
                    "assignment refused: no room",
                    assignment_id=refusal.assignment_id,
                    cpu_used_millis=self._admission.cpu_used_millis,
                    memory_used_mb=self._admission.memory_used_mb,
                    epoch=order.epoch,
                )
        if decision.to_start:
            decision = self._start(order, decision)
        if decision.refused:
            self._logger.info(
                "assignments refused",
                epoch=order.epoch,
                incarnation=order.incarnation,
                refused={r.assignment_id: r.reason.value for r in decision.refused},
            )
        return decision

    def _start(self, order: AssignOrder, decision: AssignDecision) -> AssignDecision:
        """Give every job of ``decision.to_start`` its task (it starts the job, see :meth:`_run_job`)."""
        nursery = self._job_nursery
        assert nursery is not None, "accepted while not running: Admission must be fenced"
        for job_order in decision.to_start:
            job = _Job(order=job_order, epoch=order.epoch, incarnation=order.incarnation)
            if job_order.spec.runtime is not None and forks(job_order.spec.runtime):
                # Queued here, in the order of acceptance, not when the task first runs
                # (trio runs newly started tasks in no set order).
                job.start_ticket = self._start_limiter.ticket()
            self._jobs[job_order.assignment_id] = job
            nursery.start_soon(self._run_job, job)
        return decision

    async def cancel(self, order: CancelOrder) -> CancelDecision:
        """Apply the cancel rules; stop the running ones and return once they have ended.

        The answer says what happened to each id (:meth:`agent.acceptance.Admission.cancel`):
        a job that ended on its own, before the cancel or while it was being stopped, is
        finished, not acknowledged.
        """
        self._fence_if_due()
        decision = self._admission.cancel(order)
        jobs = [self._jobs[aid] for aid in decision.to_stop if aid in self._jobs]
        for job in jobs:
            self._request_stop(job, StopReason.CANCELLED)
        for job in jobs:
            await job.done.wait()
        return self._admission.settle_cancel(decision)

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
        """
        self.address = address
        self.joblog.open()
        stopping_since: float | None = None
        try:
            async with trio.open_nursery() as job_nursery:
                self._job_nursery = job_nursery
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._heartbeat_loop)
                        nursery.start_soon(self._fence_watch)
                        task_status.started(self)
                finally:
                    stopping_since = trio.current_time()
                    self._admission.fenced = True
                    with trio.CancelScope(shield=True):
                        await self._stop_all(StopReason.SHUTDOWN)
            # Every job's task has returned (the job nursery waited for them): nothing runs.
        finally:
            self._job_nursery = None
            try:
                if stopping_since is not None:
                    with trio.CancelScope(shield=True):
                        await self._leave(stopping_since)
            finally:
                self.joblog.close()

    # ------------------------------------------------------------------ leave

    async def _leave(self, stopping_since: float) -> None:
        """Say that this worker stopped cleanly, once every job has ended; never raises a
        StockadeError.

        A control plane that records it makes the worker's row ``left``: it is never declared
        dead, and the leader ends its assignments as stopped and requeues their jobs at once.
        The request names this incarnation and this agent run (a late or foreign leave changes
        nothing there) and carries the outcomes no reply has acknowledged. It waits at most
        ``leave_timeout_s``; a leave that does not get through (or changes nothing) leaves
        the existing path in charge: the worker is declared dead ``dead_after`` after its last
        heartbeat, which is safe, since it runs nothing. Either way a ``leave`` line records
        the clean stop, at ``stopping_since`` (trio time: when heartbeats stopped), for the
        checker.

        Never called while a job runs: the agent must not be both left and running jobs.
        """
        incarnation = self._admission.incarnation
        if incarnation is None:
            return  # never registered: no row of this life to leave
        if self._jobs:
            # run() calls this only after the job nursery has closed; a bug otherwise.
            self._logger.error("not leaving: jobs are still running", jobs=sorted(self._jobs))
            return
        timeout_s = self.settings.leave_timeout_s
        request = Leave(
            worker_id=self.worker_id,
            incarnation=incarnation,
            agent_run_id=self._run_id,
            finished=tuple(self._unacked),
        )
        answer: LeaveAnswer | None = None
        error = f"no control plane answered within {timeout_s:g} s"
        with trio.move_on_after(timeout_s):
            try:
                answer = await self._cp.leave(request, deadline_s=timeout_s)
            except StockadeError as exc:
                error = str(exc)
        left = answer is not None and answer.left
        if answer is not None:
            self._admission.observe_epoch(answer.epoch)
            del self._unacked[: len(request.finished)]
        self.joblog.write(
            LogEvent.LEAVE,
            incarnation=incarnation,
            epoch=self.max_epoch_seen,
            time_unix_s=_unix_time_of(stopping_since),
            left=left,
        )
        if left:
            self._logger.info("left the cluster", incarnation=incarnation, outcomes=len(request.finished))
        else:
            self._logger.warning(
                "leave not recorded: the control planes will declare this worker dead",
                incarnation=incarnation,
                error=error if answer is None else answer.detail,
            )

    # ------------------------------------------------------------------ jobs

    def _request_stop(self, job: _Job, reason: StopReason) -> None:
        if job.stop_reason is None:
            job.stop_reason = reason
        job.stop.set()

    async def _stop_all(self, reason: StopReason) -> None:
        """Ask every job to stop at once, then wait until all have ended."""
        jobs = list(self._jobs.values())
        for job in jobs:
            self._request_stop(job, reason)
        for job in jobs:
            await job.done.wait()

    async def _run_job(self, job: _Job) -> None:
        """Wait for a start slot (command jobs), start the job, and record its end.

        Shielded: a job ends only through its stop event, so shutdown too goes through
        _stop_all and every job gets its stop line after it has really ended.
        """
        with trio.CancelScope(shield=True):
            ticket = job.start_ticket
            try:
                if ticket is not None and not await ticket.wait(job.stop):
                    self._end_unstarted(job)
                    return
                await self._start_and_run(job, ticket)
            finally:
                if ticket is not None:
                    ticket.release()

    def _end_unstarted(self, job: _Job) -> None:
        """Release a job that was stopped before it started: no line, no outcome."""
        self._logger.info(
            "job stopped before it started",
            job_id=job.order.job_id,
            assignment_id=job.order.assignment_id,
            reason=None if job.stop_reason is None else job.stop_reason.value,
        )
        self._release(job)
        job.done.set()

    async def _start_and_run(self, job: _Job, ticket: StartTicket | None) -> None:
        """Write the start line, run the job until it ends, record its end."""
        order = job.order
        runtime = order.spec.runtime
        assert runtime is not None  # Admission refuses a spec without runtime
        self._fence_if_due()  # a thawed agent starts nothing past its fence deadline
        if job.stop.is_set():
            self._end_unstarted(job)
            return
        try:
            # Written just before the job begins, with no checkpoint in between (the checker
            # relies on it), and never for a job that was stopped first.
            self._write_job_line(LogEvent.START, job)
        except OSError as exc:
            self._fail_unstarted(
                job, f"not started: cannot write the start line to {self.joblog.path}: {exc}"
            )
            return
        job_dir = job_dir_for(self.jobs_dir, order.job_id, order.assignment_id)
        job.started = True
        job.started_at = trio.current_time()
        try:
            result = await self._runner(
                runtime,
                job_dir=job_dir,
                stop=job.stop,
                stop_grace_s=self.settings.stop_grace_s,
                fence_deadline_path=self.fence_deadline_path,
                job_nice=self.settings.job_nice,
                on_started=(lambda: None) if ticket is None else ticket.release,
            )
        except BaseException:
            # A bug in a runtime: it has killed and reaped what it started before
            # raising. Record the end, release the job, and let the error take the
            # agent down (fail loud).
            self._release(job)
            try:
                self._write_job_line(
                    LogEvent.STOP,
                    job,
                    reason=StopReason.FAILED.value,
                )
            finally:
                job.done.set()
            raise
        self._job_ended(job, result)

    def _fail_unstarted(self, job: _Job, detail: str) -> None:
        """End a job that cannot be started as failed (it was accepted, so the control plane
        must hear how it ended): report the outcome, release it; nothing is logged as run."""
        order = job.order
        self._logger.error(
            "job not started", job_id=order.job_id, assignment_id=order.assignment_id, detail=detail
        )
        now_unix_s = time.time()
        job.reported = True
        self._unacked.append(
            Outcome(
                assignment_id=order.assignment_id,
                job_id=order.job_id,
                state=JobState.FAILED,
                exit_code=None,
                started_unix_s=now_unix_s,
                finished_unix_s=now_unix_s,
                detail=detail,
            )
        )
        self._release(job)
        job.done.set()

    def _release(self, job: _Job) -> None:
        """Forget a job that has really ended and free its reservation."""
        self._admission.job_ended(job.order.assignment_id, finished=job.reported)
        self._jobs.pop(job.order.assignment_id, None)

    def _job_ended(self, job: _Job, result: JobResult) -> None:
        try:
            self._record_end(job, result)
        finally:
            # Also on an error (it takes the agent down): nobody may wait forever for the job.
            self._release(job)
            job.done.set()

    def _record_end(self, job: _Job, result: JobResult) -> None:
        """Write the stop line of a job that has ended and keep its outcome for reporting."""
        order = job.order
        # Thawed past the fence deadline: fence before completing or reporting anything.
        self._fence_if_due()
        if result.fenced and self._live.is_set():
            # Its reaper saw a passed deadline this agent has not reached (the agent could not
            # update the file in time): the deadman's verdict stands for the whole worker.
            self._logger.warning(
                "a reaper fenced its job before the agent fenced", assignment_id=order.assignment_id
            )
            self._fence_now()
        fenced, ended_unix_s = self._fenced_end(job, result)
        if fenced:
            reason = StopReason.SELF_FENCE
        elif result.stopped and job.stop_reason is not None:
            reason = job.stop_reason
        else:
            reason = StopReason(result.state.value)
        self._write_job_line(
            LogEvent.STOP,
            job,
            reason=reason.value,
            exit_code=result.exit_code,
            time_unix_s=ended_unix_s,
            started=result.started,
        )
        self._logger.info(
            "job ended",
            job_id=order.job_id,
            assignment_id=order.assignment_id,
            reason=reason.value,
            exit_code=result.exit_code,
            started=result.started,
            detail=result.detail,
        )
        if not (result.stopped or fenced):
            job.reported = True
            self._unacked.append(
                Outcome(
                    assignment_id=order.assignment_id,
                    job_id=order.job_id,
                    state=result.state,
                    exit_code=result.exit_code,
                    started_unix_s=result.started_unix_s,
                    finished_unix_s=result.finished_unix_s,
                    stdout_path=result.stdout_path,
                    stderr_path=result.stderr_path,
                    detail=result.detail,
                )
            )

    def _fenced_end(self, job: _Job, result: JobResult) -> tuple[bool, float]:
        """Whether the fence stopped ``job``, and the wall-clock time it ended at.

        A command job's end is its runtime's (for one its reaper fenced: the kill time). A
        sleep job still running when the agent fenced itself counts as stopped at the fence
        deadline (see the module docstring), also when its duration ran out later while the
        agent could not run.
        """
        if result.fenced:
            return True, result.finished_unix_s
        runtime = job.order.spec.runtime
        duration_s = None if runtime is None else timed_by_agent_s(runtime)
        fenced_at = self._fenced_at
        if fenced_at is None or duration_s is None:
            return False, result.finished_unix_s
        if result.stopped or job.started_at + duration_s >= fenced_at:
            return True, max(result.started_unix_s, _unix_time_of(fenced_at))
        return False, result.finished_unix_s

    # ------------------------------------------------------------------ registration

    def _leave_live(self) -> None:
        """Stop accepting work: fenced for Admission, the fence watcher parks."""
        self._admission.fenced = True
        if self._live.is_set():
            self._live = trio.Event()

    async def _register(self, stop_reason: StopReason) -> None:
        """Stop every job, then register until a control plane answers (new incarnation).

        Every registration carries the outcomes no reply has acknowledged yet; those it
        carried are dropped once it succeeded (outcomes that appear meanwhile stay).
        """
        self._leave_live()
        await self._stop_all(stop_reason)
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
                    deadline_s=self._call_deadline_s(),
                )
            except StockadeError as exc:
                failures += 1
                if failures % _LOG_EVERY_FAILURES == 1:
                    level = "warning" if isinstance(exc, TemporaryError) else "error"
                    getattr(self._logger, level)(
                        "registration failed, retrying",
                        error=str(exc),
                        attempts=failures,
                        retry_in_s=self.settings.register_retry_s,
                    )
                await trio.sleep(self.settings.register_retry_s)
                continue
            break
        # Outcomes are only appended, and nothing else drops any while this runs (heartbeats
        # wait for it): the first len(finished) entries are exactly those it carried.
        del self._unacked[: len(finished)]
        fence_s = fence_after_s(self.settings, reply.dead_after_s)
        if fence_s != self._fence_after_s:
            self._logger.warning(
                "self_fence_after_s lowered to stop every job before the cluster may move them",
                self_fence_after_s=self._fence_after_s,
                stop_grace_s=self.settings.stop_grace_s,
                dead_after_s=reply.dead_after_s,
                now_s=fence_s,
            )
            self._fence_after_s = fence_s
        self._publish_deadline(sent_at + fence_s)  # before any job of this life can start
        self._last_acked_send_time = sent_at
        self._admission.registered(reply.incarnation, reply.epoch)
        self._self_fenced = False
        self._fenced_at = None
        self.joblog.write(LogEvent.REGISTER, incarnation=reply.incarnation, epoch=self.max_epoch_seen)
        self._logger.info(
            "registered",
            incarnation=reply.incarnation,
            epoch=reply.epoch,
            address=self.address,
            attempts=failures + 1,
        )
        self._live.set()
        self._registered_once.set()

    def _write_job_line(
        self,
        event: LogEvent,
        job: _Job,
        *,
        reason: str | None = None,
        exit_code: int | None = None,
        time_unix_s: float | None = None,
        started: bool = True,
    ) -> None:
        """Append ``event`` for ``job`` to the job log: its incarnation, the epoch of the Assign
        that started it, its job and assignment ids, and the given fields.

        Raises:
            OSError: the line could not be written.
        """
        self.joblog.write(
            event,
            incarnation=job.incarnation,
            epoch=job.epoch,
            job_id=job.order.job_id,
            assignment_id=job.order.assignment_id,
            reason=reason,
            exit_code=exit_code,
            time_unix_s=time_unix_s,
            started=started,
        )

    # ------------------------------------------------------------------ heartbeats

    async def _heartbeat_loop(self) -> None:
        interval_s = self.settings.heartbeat_interval_s
        await self._register(StopReason.REREGISTER)
        # Counted from the registration's send time, as after a heartbeat: a slow answer is
        # followed at once, not an interval later, while the deadline runs from the send.
        assert self._last_acked_send_time is not None
        # A heartbeat that took longer than the interval is followed at once, not by a burst.
        beats = Periodic(interval_s, last_at=self._last_acked_send_time)
        failures = 0
        while True:
            await beats.tick()
            ok = await self._heartbeat_once(failures)
            failures = 0 if ok else failures + 1

    async def _heartbeat_once(self, failures: int) -> bool:
        """Send one heartbeat and obey its reply; False when no control plane answered."""
        self._fence_if_due()  # a thawed agent reports nothing before it has fenced
        incarnation = self._admission.incarnation
        assert incarnation is not None  # the loop registers first
        report = HeartbeatReport(
            worker_id=self.worker_id,
            incarnation=incarnation,
            running_assignment_ids=self.running_assignment_ids,
            finished=tuple(self._unacked),
            epoch_seen=self.max_epoch_seen,
        )
        sent_at = trio.current_time()
        try:
            answer = await self._cp.heartbeat(report, deadline_s=self._call_deadline_s())
        except StockadeError as exc:
            if failures % _LOG_EVERY_FAILURES == 0:
                self._logger.warning(
                    "heartbeat failed",
                    error=str(exc),
                    failures_in_a_row=failures + 1,
                    fenced=self._self_fenced,
                )
            return False
        metrics.AGENT_HEARTBEAT_ROUND_TRIP_SECONDS.observe(trio.current_time() - sent_at)
        if failures:
            self._logger.info("heartbeat answered again", failures_in_a_row=failures)
        await self._on_heartbeat_answer(report, answer, sent_at)
        return True

    async def _on_heartbeat_answer(
        self, report: HeartbeatReport, answer: HeartbeatAnswer, sent_at: float
    ) -> None:
        # A reply that comes after the deadline does not move it: fence (and register again).
        self._fence_if_due()
        if self._last_acked_send_time is None or sent_at > self._last_acked_send_time:
            if self._live.is_set():
                self._publish_deadline(sent_at + self._fence_after_s)
            self._last_acked_send_time = sent_at
        self._admission.observe_epoch(answer.epoch)
        # Outcomes are only appended while the heartbeat was in flight, and heartbeats are
        # sequential: the first len(report.finished) entries are exactly those it carried.
        del self._unacked[: len(report.finished)]
        if self._self_fenced:
            self._logger.info("heartbeat got through while fenced: registering again")
            await self._register(StopReason.SELF_FENCE)
            return
        if answer.reregister:
            self._logger.warning("control plane asked to register again", incarnation=report.incarnation)
            await self._register(StopReason.REREGISTER)
            return
        for aid in answer.stop_assignment_ids:
            self._admission.ended_by_control_plane(aid)
            job = self._jobs.get(aid)
            if job is not None:
                self._logger.info("control plane ended a running assignment", assignment_id=aid)
                self._request_stop(job, StopReason.STOPPED_BY_CONTROL_PLANE)

    # ------------------------------------------------------------------ self-fence

    def _call_deadline_s(self) -> float:
        """How long the next heartbeat or registration may wait for an answer, in seconds.

        While live: until ``call_deadline_margin_s`` before the fence deadline (a slow
        answer still keeps the jobs; a later one could not). Otherwise (registering, fenced)
        the self-fence span minus the margin, which bounds the deadline a registration sets.
        Never less than ``heartbeat_timeout_s``.
        """
        deadline = self._deadline()
        if self._live.is_set() and deadline is not None:
            left_s = deadline - trio.current_time() - self.settings.call_deadline_margin_s
        else:
            left_s = self._fence_after_s - self.settings.call_deadline_margin_s
        return max(self.settings.heartbeat_timeout_s, left_s)

    def _deadline(self) -> float | None:
        """The fence deadline in trio time; None before the first registration."""
        if self._last_acked_send_time is None:
            return None
        return self._last_acked_send_time + self._fence_after_s

    def _publish_deadline(self, deadline: float) -> None:
        """Write ``deadline`` (trio time) for the reapers, atomically, as ``time.monotonic()`` s.

        Called *before* the agent's own deadline moves, with no checkpoint until it does: an
        agent frozen in between holds a deadline no later than the reapers' (the file's), and
        both agree but for the few instructions after the rename.

        A failed write is logged, not raised: the reapers keep the previous deadline and kill
        their jobs at it, which fences the worker (fail safe, never unsafe).
        """
        try:
            write_fence_deadline(self.fence_deadline_path, _monotonic_of(deadline))
        except OSError as exc:
            self._logger.error(
                "cannot write the fence deadline: command jobs will be killed at the previous one",
                path=str(self.fence_deadline_path),
                error=repr(exc),
            )

    def _fence_if_due(self) -> bool:
        """Self-fence now if live and the fence deadline has passed; True if it fenced."""
        deadline = self._deadline()
        # >= rather than >: sleep_until(deadline) wakes exactly at the deadline on a mock
        # clock, and a strict test there would spin without time moving on.
        if self._live.is_set() and deadline is not None and trio.current_time() >= deadline:
            self._fence_now()
            return True
        return False

    def _fence_now(self) -> None:
        """Self-fence at once, with no checkpoint: refuse work, log it, ask every job to stop."""
        if self._self_fenced:
            return
        now = trio.current_time()
        deadline = self._deadline()
        self._fenced_at = now if deadline is None else min(now, deadline)
        self._self_fenced = True
        self._leave_live()
        metrics.AGENT_SELF_FENCES.labels(self.worker_id).inc()
        self.joblog.write(
            LogEvent.SELF_FENCE,
            incarnation=self._admission.incarnation,
            epoch=self.max_epoch_seen,
        )
        self._logger.warning(
            "self-fenced: no heartbeat acknowledged, stopping every job",
            silent_s=round(now - (self._last_acked_send_time or 0.0), 3),
            late_s=round(now - self._fenced_at, 3),
            self_fence_after_s=self._fence_after_s,
            jobs=len(self._jobs),
        )
        for job in list(self._jobs.values()):
            self._request_stop(job, StopReason.SELF_FENCE)

    async def _fence_watch(self) -> None:
        """Self-fence once no heartbeat sent in the last ``self_fence_after_s`` was answered."""
        while True:
            if not self._live.is_set():
                await self._live.wait()
                continue
            deadline = self._deadline()
            assert deadline is not None  # set by the registration
            if self._fence_if_due():
                await self._stop_all(StopReason.SELF_FENCE)
            else:
                await trio.sleep_until(deadline)

"""The agent's jobs from acceptance until they have really ended: one shielded task each.

:class:`RunningJobs` gives every accepted job its task (a command job first waits for a start
slot, :mod:`agent.starts`), writes its ``start`` line just before it begins and its ``stop`` line
once it has really ended, keeps the outcome of a job that ended on its own for the heartbeats,
and frees the job's reservation. Fencing is the agent's (``fence_if_due``, ``fence_now``).

Every started job has a record in its folder (:mod:`agent.adoption`) from its ``start`` line
until its ``stop`` line, so that an agent started again on the same work folder can take it over
(:meth:`RunningJobs.adopt`) or settle it (:meth:`RunningJobs.settle_ended`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from agent import adoption, job_record
from agent.acceptance import Admission
from agent.adoption import Found, ReaperWatch, Verdict
from agent.fence import FenceClock, monotonic_of, trio_time_of
from agent.identities import JobIdentities
from agent.job_env import job_environment
from agent.job_record import JobRecord
from agent.job_results import JobResult, oom_killed, reported_state, stop_reason_of
from agent.job_task import Job, runner_options, sleep_not_kept, sleep_ran_out, sleep_rest, stop_metric_reason
from agent.joblog import JobLog, LogEvent
from agent.messages import AssignOrder, JobOrder, JobState, Outcome, StopReason
from agent.resources import JobLimits, JobResources, JobUsage, release
from agent.runtimes import JobRunner, forks, job_dir_for
from agent.sleep_jobs import either
from agent.starts import StartLimiter, StartTicket
from runtime import metrics
from runtime.jobs import SleepRuntime
from runtime.os_users import RunAs
from runtime.settings.agent import AgentSettings


@attrs.define(eq=False, kw_only=True)
class RunningJobs:
    """The jobs of one agent, by assignment id. ``outcomes`` is the agent's list of outcomes not
    yet acknowledged (appended to); ``fence_if_due`` and ``fence_now`` are the agent's."""

    settings: AgentSettings
    joblog: JobLog
    jobs_dir: Path
    runner: JobRunner
    start_limiter: StartLimiter
    admission: Admission
    fence: FenceClock
    outcomes: list[Outcome]
    fence_if_due: Callable[[], bool]
    fence_now: Callable[[], None]
    logger: Any
    run_as: RunAs | None = None
    """Who command jobs run as (the agent's resolved ``job_user``); None: the agent's user.
    Not used for jobs given a uid of their own by ``identities``."""
    identities: JobIdentities | None = None
    """The pool that gives each command and container job a uid of its own (a root agent's,
    :mod:`agent.identities`); None: every job runs as ``run_as``."""
    resources: JobResources | None = None
    """How command jobs' ``cpu_millis`` and ``memory_mb`` are enforced (:mod:`agent.resources`);
    None: not at all."""
    nursery: trio.Nursery | None = None
    """Where the jobs' tasks run; set while the agent runs."""
    keep_records: bool = False
    """Set for a planned restart: the records of jobs that end from now on stay, so the next
    agent process settles them (their outcomes may not get out before this one exits)."""
    _jobs: dict[int, Job] = attrs.field(factory=dict)
    _added: trio.Event = attrs.field(factory=trio.Event)
    _began: trio.Event = attrs.field(factory=trio.Event)

    def __len__(self) -> int:
        return len(self._jobs)

    def added(self) -> trio.Event:
        """An event set when the next job is added (accepted, or taken over)."""
        return self._added

    def began(self) -> trio.Event:
        """An event set when the next job placed before (:attr:`agent.messages.JobOrder.placed_before`)
        starts: the heartbeat loop waits on it to report the run early."""
        return self._began

    def _put(self, job: Job) -> None:
        self._jobs[job.order.assignment_id] = job
        self._added.set()
        self._added = trio.Event()

    def ids(self) -> list[int]:
        """Every job's assignment id, sorted."""
        return sorted(self._jobs)

    def get(self, assignment_id: int) -> Job | None:
        """The job of ``assignment_id``; None when there is none (any more)."""
        return self._jobs.get(assignment_id)

    def started_count(self) -> int:
        """How many jobs have started and not ended yet. Safe to call from another thread (the
        metrics server's): the copy of the jobs is taken in one step under the GIL."""
        return sum(1 for job in list(self._jobs.values()) if job.started)

    def cgroup_names(self) -> dict[int, str]:
        """The cgroup name of each job that started and has a folder (assignment id -> name:
        its folder's, as :mod:`agent.runtimes` names the cgroup); a sleep or container job has no
        cgroup of that name, and is not found there."""
        return {aid: job.job_dir.name for aid, job in self._jobs.items() if job.started and job.job_dir}

    @property
    def running_assignment_ids(self) -> tuple[int, ...]:
        """Assignments whose jobs have started and not ended yet."""
        return tuple(sorted(aid for aid, job in self._jobs.items() if job.started))

    def start(self, order: AssignOrder, to_start: tuple[JobOrder, ...]) -> None:
        """Give every job of ``to_start`` its task (it starts the job, see :meth:`_run_job`)."""
        nursery = self.nursery
        assert nursery is not None, "accepted while not running: Admission must be fenced"
        for job_order in to_start:
            job = Job(order=job_order, epoch=order.epoch, incarnation=order.incarnation)
            if job_order.spec.runtime is not None and forks(job_order.spec.runtime):
                # Queued here, in the order of acceptance, not when the task first runs
                # (trio runs newly started tasks in no set order).
                job.start_ticket = self.start_limiter.ticket()
            self._put(job)
            nursery.start_soon(self._run_job, job)

    def request_stop(self, job: Job, reason: StopReason) -> None:
        """Ask ``job`` to stop; the first reason asked for is the one recorded."""
        if job.stop_reason is None:
            job.stop_reason = reason
        job.stop.set()

    def request_stop_all(self, reason: StopReason) -> None:
        """Ask every job to stop, with no checkpoint."""
        for job in list(self._jobs.values()):
            self.request_stop(job, reason)

    def request_graceful_stop(self, job: Job, reason: StopReason, grace_s: float) -> None:
        """Ask ``job`` to stop with a grace of its own, ``grace_s`` seconds (> 0): a command or
        container job that has started gets SIGTERM at once and is killed that long after (a
        later :meth:`request_stop` hurries it); any other job stops as :meth:`request_stop`
        has it (a sleep job, or one not started yet, has nothing to finish)."""
        if job.stop_reason is None:
            job.stop_reason = reason
            job.stop_grace_ms = round(grace_s * 1000)
        runtime = job.order.spec.runtime
        if job.started and not job.held and runtime is not None and forks(runtime):
            job.notice.give(grace_s)
        else:
            self.request_stop(job, reason)

    async def stop(
        self, assignment_ids: list[int] | None, reason: StopReason, *, grace_s: float | None = None
    ) -> None:
        """Ask the jobs of ``assignment_ids`` (None: every job) to stop, then wait until all
        have ended: at once, or with ``grace_s`` seconds of grace of their own
        (:meth:`request_graceful_stop`; None or 0: the agent's ``stop_grace_s``)."""
        if assignment_ids is None:
            jobs = list(self._jobs.values())
        else:
            jobs = [self._jobs[aid] for aid in assignment_ids if aid in self._jobs]
        for job in jobs:
            if grace_s:
                self.request_graceful_stop(job, reason, grace_s)
            else:
                self.request_stop(job, reason)
        for job in jobs:
            await job.done.wait()

    async def _run_job(self, job: Job) -> None:
        """Wait for a start slot (command jobs), start the job, and record its end. Shielded: a
        job ends only through its stop event, so it gets its stop line after it has really ended."""
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

    def _end_unstarted(self, job: Job) -> None:
        """Release a job that was stopped before it started: no line, no outcome."""
        self.logger.info(
            "job stopped before it started",
            reason=None if job.stop_reason is None else job.stop_reason.value,
            **job.log_keys,
        )
        self._release(job)
        job.done.set()

    async def _start_and_run(self, job: Job, ticket: StartTicket | None) -> None:
        """Write the start line, run the job until it ends, record its end."""
        order = job.order
        runtime = order.spec.runtime
        assert runtime is not None  # Admission refuses a spec without runtime
        self.fence_if_due()  # a thawed agent starts nothing past its fence deadline
        while self.fence.paused and not job.stop.is_set():
            # Not started while paused: its assignment stays unconfirmed, and it starts once a
            # heartbeat the database acknowledged has resumed the worker.
            await either(job.stop, self.fence.changed)
            self.fence_if_due()
        if job.stop.is_set():
            self._end_unstarted(job)
            return
        if self.identities is not None and forks(runtime):
            if not self.identities.swept.is_set():
                # The start sweep is still removing what earlier uids of the pool left.
                await either(job.stop, self.identities.swept)
                if job.stop.is_set():
                    self._end_unstarted(job)
                    return
            own = self.identities.run_as()
            if own is None:
                pool = self.identities.pool
                self._fail_unstarted(
                    job,
                    f"not started: no free job uid (pool {pool.first_uid}-{pool.last_uid}: "
                    f"{len(pool.held)} held, {len(pool.quarantined)} quarantined)",
                )
                return
            job.job_uid = own.uid
        try:
            # Written just before the job begins, with no checkpoint in between (the checker
            # relies on it), and never for a job that was stopped first.
            job.start_line_s = self._write_job_line(LogEvent.START, job, units=order.units)
        except OSError as exc:
            self._fail_unstarted(
                job, f"not started: cannot write the start line to {self.joblog.path}: {exc}"
            )
            return
        metrics.AGENT_JOB_STARTS.labels(self.settings.worker_id, runtime.kind).inc()
        self.logger.info("job started", runtime=runtime.kind, **job.log_keys)
        job_dir = job_dir_for(self.jobs_dir, order.job_id, order.assignment_id)
        job.started = True
        job.started_at = trio.current_time()
        if order.placed_before:
            self._began.set()
            self._began = trio.Event()
        job.job_dir = job_dir
        self._write_record(
            job,
            JobRecord(
                worker_id=self.settings.worker_id,
                assignment_id=order.assignment_id,
                job_id=order.job_id,
                incarnation=job.incarnation,
                epoch=job.epoch,
                cpu_millis=order.spec.cpu_millis,
                memory_mb=order.spec.memory_mb,
                runtime=runtime,
                timeout_s=order.spec.timeout_s,
                name=order.spec.name,
                started_monotonic_s=monotonic_of(job.started_at),
                start_line_s=job.start_line_s,
                began_monotonic_s=monotonic_of(job.started_at),
                job_uid=job.job_uid,
                units=order.units,
            ),
        )
        options = runner_options(
            order,
            self.settings,
            run_as=self._run_as(job),
            resources=self.resources,
            on_spawned=lambda pid: self._record_reaper(job, pid),
            notice=job.notice,
        )
        try:
            result = await self._run(
                runtime,
                job,
                job_dir,
                job_env={**dict(order.spec.env), **job_environment(order, self.settings.resources)},
                on_started=(lambda: None) if ticket is None else ticket.release,
                **options,
            )
        except BaseException:
            # A bug in a runtime: it has killed and reaped what it started before raising.
            # Record the end, release the job, and let the error take the agent down.
            self._release(job)
            try:
                self._write_job_line(LogEvent.STOP, job, reason=StopReason.FAILED.value)
            finally:
                job.done.set()
            raise
        self._job_ended(job, result)

    async def _run(self, runtime: Any, job: Job, job_dir: Path, **options: Any) -> JobResult:
        """Run ``runtime`` for ``job`` with the agent's settings and ``options``."""
        return await self.runner(
            runtime,
            job_dir=job_dir,
            stop=job.stop,
            stop_grace_s=self.settings.stop_grace_s,
            fence_deadline_path=self.fence.path,
            job_nice=self.settings.job_nice,
            run_as=self._run_as(job),
            pause=self.fence,
            **options,
        )

    def _run_as(self, job: Job) -> RunAs | None:
        """Who ``job`` runs as: its own uid (and gid), else the agent's ``run_as``."""
        if job.job_uid is None:
            return self.run_as
        return RunAs(uid=job.job_uid, gid=job.job_uid, name=f"uid {job.job_uid}")

    def _report(self, job: Job, **outcome: Any) -> None:
        """Queue ``job``'s outcome (the :class:`Outcome` fields other than its ids) for the
        next heartbeat, and mark the job reported."""
        job.reported = True
        self.outcomes.append(
            Outcome(assignment_id=job.order.assignment_id, job_id=job.order.job_id, **outcome)
        )

    def _fail_unstarted(self, job: Job, detail: str) -> None:
        """End a job that cannot be started as failed (it was accepted, so the control plane
        must hear how it ended): report the outcome, release it; nothing is logged as run."""
        self.logger.error("job not started", detail=detail, **job.log_keys)
        self._report(
            job, state=JobState.FAILED, exit_code=None, run_s=0.0, ended_at=trio.current_time(), detail=detail
        )
        self._release(job)
        job.done.set()

    def _release(self, job: Job) -> None:
        """Forget a job that has really ended and free its reservation; its uid goes back to
        the pool once what it left is removed (in the background)."""
        self.admission.job_ended(job.order.assignment_id, finished=job.reported)
        self._jobs.pop(job.order.assignment_id, None)
        uid, job.job_uid = job.job_uid, None
        if uid is not None and self.identities is not None and self.nursery is not None:
            self.nursery.start_soon(self.identities.release, uid, job.job_dir)

    def _job_ended(self, job: Job, result: JobResult) -> None:
        try:
            self._record_end(job, result)
        finally:
            # Also on an error (it takes the agent down): nobody may wait forever for the job.
            self._release(job)
            job.done.set()

    def _forget_record(self, job: Job) -> None:
        """Remove ``job``'s record once its stop line is written (a restarted agent has nothing
        to do with it then), unless a planned restart keeps records."""
        if job.job_dir is not None and not self.keep_records:
            job_record.remove_record(job.job_dir)
            if isinstance(job.order.spec.runtime, SleepRuntime):
                with contextlib.suppress(OSError):
                    job.job_dir.rmdir()  # a sleep job's folder held only its record

    def _write_record(self, job: Job, record: JobRecord) -> None:
        """Write ``job``'s record; one that cannot be written is logged, not raised: the job
        runs on, and a restarted agent stops it instead of keeping it (fail safe)."""
        assert job.job_dir is not None
        try:
            job_record.write_record(job.job_dir, record)
        except OSError as exc:
            self.logger.error(
                "cannot write the job's record: a restarted agent will not keep it",
                error=repr(exc),
                **job.log_keys,
            )
            return
        job.record = record

    def _record_reaper(self, job: Job, pid: int) -> None:
        """Add a command job's reaper (``pid`` and its start time) to its record."""
        if job.record is not None:
            ticks = adoption.start_ticks(pid)
            self._write_record(
                job, attrs.evolve(job.record, supervisor_pid=pid, supervisor_start_ticks=ticks)
            )

    def record_progress(self) -> None:
        """Write every running sleep job's record again with the time it has spent paused (its
        duration does not count it), so that a restarted agent continues it where it is. Called
        when the jobs resume (the only time that grows); no checkpoint."""
        now = trio.current_time()
        for job in self._jobs.values():
            record = job.record
            if (
                record is not None
                and job.started
                and not job.held
                and isinstance(record.runtime, SleepRuntime)
            ):
                paused_s = self.fence.paused_s_between(job.started_at, now)
                began_s = monotonic_of(job.started_at)
                self._write_record(job, attrs.evolve(record, began_monotonic_s=began_s, paused_s=paused_s))

    def adopt(
        self, found: Found, *, go: trio.Event, pause_at_s: float | None, kill_at_s: float | None
    ) -> Job | None:
        """Take over a job the previous agent process of this work folder left running (found by
        :func:`agent.adoption.survey`): it holds its reservation and gets a task that watches its
        reaper through a pidfd, or, for a sleep job, holds it until ``go`` is set and then runs
        the rest of its duration. A stray (:attr:`Verdict.STRAY`) is asked to stop at once.

        Args:
            go: set once the control plane continued the incarnation.
            pause_at_s: the fence-deadline file's pause deadline as the previous process left it,
                ``time.monotonic()`` seconds (None: none): a kept sleep job counts as paused from it.
            kill_at_s: the file's kill deadline: a sleep job not continued by then ends there.

        Returns:
            The job, or None when its reaper exited meanwhile (settle it with :meth:`settle_ended`).
        """
        nursery = self.nursery
        assert nursery is not None, "adopted while not running"
        watch: ReaperWatch | None = None
        if found.verdict is not Verdict.SLEEP:
            assert found.running is not None
            watch = ReaperWatch.open(found.running)
            if watch is None:
                return None
        job = self._take_over(found)
        if watch is not None:
            assert found.running is not None
            nursery.start_soon(self._run_adopted_reaper, job, watch, found.running.start_ticks)
        else:
            job.held = True
            nursery.start_soon(self._run_adopted_sleep, job, go, pause_at_s, kill_at_s)
        self.logger.info(
            "job taken over from the previous agent process", verdict=found.verdict.value, **job.log_keys
        )
        if found.verdict is Verdict.STRAY:
            self.request_stop(job, StopReason.RESTART)
        return job

    def _take_over(self, found: Found) -> Job:
        """A job of the previous agent process, from its record: its reservation held, added."""
        record = found.record
        job = Job.taken_over(record, found.job_dir)
        if record.job_uid is not None and self.identities is not None:
            self.identities.hold(record.job_uid)
        self.admission.reserve(
            record.assignment_id, cpu_millis=record.cpu_millis, memory_mb=record.memory_mb, units=record.units
        )
        self._put(job)
        return job

    def settle_ended(self, found: Found) -> None:
        """Write the ``stop`` line of a job that ended while no agent watched it, from its report
        (or of a sleep job whose duration ran out meanwhile), and queue its outcome when it ended
        on its own. No checkpoint."""
        record = found.record
        job = self._take_over(found)
        if isinstance(record.runtime, SleepRuntime):
            result = sleep_ran_out(record, record.runtime)
        else:
            result = adoption.result_from_report(record, found.job_dir, stopped=False)
        self.logger.info("a job ended while no agent watched it", **job.log_keys)
        self._job_ended(job, result)

    async def _run_adopted_reaper(self, job: Job, watch: ReaperWatch, ticks: int) -> None:
        """Watch a taken-over reaper until it has exited (passing stops on), then end the job
        from its report. Shielded, as every job's task."""
        with trio.CancelScope(shield=True):
            assert job.record is not None and job.job_dir is not None
            stopped = await adoption.watch_supervisor(
                watch,
                ticks=ticks,
                stop=job.stop,
                stop_grace_s=self.settings.stop_grace_s,
                notice=job.notice,
                job_dir=job.job_dir,
            )
            result = adoption.result_from_report(job.record, job.job_dir, stopped=stopped)
            usage = await self.release_cgroup(job.job_dir.name)
            if usage is not None:
                limits = JobLimits(cpu_millis=job.record.cpu_millis, memory_mb=job.record.memory_mb)
                result = oom_killed(result, usage.oom_kills, limits)
            self._job_ended(job, result)

    async def release_cgroup(self, name: str) -> JobUsage | None:
        """Remove the cgroup of a job a previous agent process started, in the job folder
        ``name``, once its supervisor has exited; what it counted, or None when there is none."""
        confined = None if self.resources is None else self.resources.find(name)
        return None if confined is None else await release(confined)

    async def _run_adopted_sleep(
        self, job: Job, go: trio.Event, pause_at_s: float | None, kill_at_s: float | None
    ) -> None:
        """Hold a taken-over sleep job until the incarnation is continued (``go``), then run the
        rest of its duration; stopped first, or not continued by the kill deadline, it ended
        when its jobs paused (the file's pause deadline), or now if that is later."""
        with trio.CancelScope(shield=True):
            record = job.record
            assert record is not None and isinstance(record.runtime, SleepRuntime)
            kill_at = math.inf if kill_at_s is None else trio_time_of(kill_at_s)
            with trio.move_on_at(kill_at):
                await either(job.stop, go)
            now = trio.current_time()
            if not go.is_set() or job.stop.is_set():
                asked = job.stop.is_set()
                self._job_ended(job, sleep_not_kept(record, now=now, pause_at_s=pause_at_s, asked=asked))
                return
            ran_s = adoption.sleep_ran_s(record, now_s=monotonic_of(now), pause_at_s=pause_at_s)
            # From here its duration counts in this life, whose pauses the fence clock knows.
            job.started_at = now - ran_s
            job.held = False
            self._write_record(
                job, attrs.evolve(record, began_monotonic_s=monotonic_of(job.started_at), paused_s=0.0)
            )
            rest, options = sleep_rest(record, record.runtime, ran_s=ran_s, now_s=monotonic_of(now))
            result = await self._run(
                rest, job, job.job_dir or self.jobs_dir, job_env={}, on_started=lambda: None, **options
            )
            self._job_ended(job, attrs.evolve(result, began_at=trio_time_of(record.started_monotonic_s)))

    def _record_end(self, job: Job, result: JobResult) -> None:
        """Write the stop line of a job that has ended and keep its outcome for reporting."""
        # Thawed past the fence deadline: fence before completing or reporting anything.
        self.fence_if_due()
        if result.fenced and self.fence.live.is_set():
            # Its reaper saw a passed deadline this agent has not reached (the agent could not
            # update the file in time): the deadman's verdict stands for the whole worker.
            self.logger.warning("a reaper fenced its job before the agent fenced", **job.log_keys)
            self.fence_now()
        # Whether the fence stopped it: its reaper's fence, or the agent's self-fence.
        fenced = result.fenced or (result.stopped and job.stop_reason is StopReason.SELF_FENCE)
        reason = stop_reason_of(result, fenced=fenced, asked=job.stop_reason)
        # A stop with a grace of its own (a preemption's) says the grace it was given.
        grace_ms = job.stop_grace_ms if reason is StopReason.PREEMPTED else None
        # The runtime's end (a command job held or killed at the fence: when it was paused; a
        # sleep job stopped while paused: when the pause began), dated by the database's clock,
        # never before its start line. Its record goes once the line is written: a line that
        # waits for the clock keeps it, so an agent killed meanwhile leaves the job to the next.
        self._write_job_line(
            LogEvent.STOP,
            job,
            reason=reason.value,
            exit_code=result.exit_code,
            grace_ms=grace_ms,
            at=result.ended_at,
            not_before_s=job.start_line_s,
            started=result.started,
            on_written=lambda _: self._forget_record(job),
        )
        metrics.AGENT_JOB_STOPS.labels(
            self.settings.worker_id, stop_metric_reason(reason, result.detail)
        ).inc()
        self.logger.info(
            "job ended",
            **job.log_keys,
            reason=reason.value,
            exit_code=result.exit_code,
            started=result.started,
            detail=result.detail,
            grace_ms=grace_ms,
        )
        state = reported_state(result, fenced=fenced, asked=job.stop_reason)
        if state is not None:
            unstarted = state is JobState.NOT_STARTED
            ran = result.started and not unstarted
            self._report(
                job,
                state=state,
                exit_code=None if unstarted else result.exit_code,
                run_s=max(0.0, result.ended_at - result.began_at) if ran else 0.0,
                ended_at=result.ended_at,
                stdout_path=None if unstarted else result.stdout_path,
                stderr_path=None if unstarted else result.stderr_path,
                detail=result.detail,
            )

    def _write_job_line(self, event: LogEvent, job: Job, **fields: Any) -> float | None:
        """Append ``event`` for ``job`` to the job log with its incarnation, epoch, ids and
        ``fields``; returns the line's time (None: it waits for the database's clock). Raises
        OSError when the line could not be written."""
        return self.joblog.write(
            event,
            incarnation=job.incarnation,
            epoch=job.epoch,
            job_id=job.order.job_id,
            assignment_id=job.order.assignment_id,
            **fields,
        )

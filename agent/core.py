"""The agent of one worker: :class:`Agent`, the Worker service's rules and the lifecycle.

:class:`Agent` owns everything of one worker (no module-level state: several agents can live in
one process). It is built in layers over :class:`agent.state.AgentState` (self_fence.py,
registration.py, heartbeat.py, leave.py); this module adds the read-only views, Assign, Cancel
and :meth:`Agent.run`. docs/design.md, "The agent's loops".
"""

from __future__ import annotations

import os

import trio

from agent import adoption
from agent.job_record import RECORD_FILE
from agent.leave import Leaving
from agent.messages import (
    AssignDecision,
    AssignOrder,
    CancelDecision,
    CancelOrder,
    Outcome,
    Refusal,
    RefusalReason,
    StopReason,
)
from agent.work_folder import close_work_folder
from runtime import metrics
from runtime.jobs import SleepRuntime


class Agent(Leaving):
    """One worker's agent. Serve its :meth:`assign`/:meth:`cancel` and run :meth:`run`.

    Args:
        start_limiter: the process's start slots (shared by the agents of a fleet); None: a
            limiter of its own.
        leave_turns: the process's turns for leave attempts (shared by a fleet); None: its own.
        runner: what runs the jobs; None: :func:`agent.runtimes.run_job` forking reapers on
            the calling (trio) thread, for tests.
        run_as: who command jobs run as; None: this process's user, for tests.
        identities: the pool giving each command and container job a uid of its own (a root
            agent's, :mod:`agent.identities`); None: every job runs as ``run_as``.
        resources: how command jobs' limits are enforced; None: they are not, for tests.
        rng: draws the pauses between registration attempts; None: a fresh one.
    """

    @property
    def incarnation(self) -> int | None:
        """The current incarnation; None before the first registration."""
        return self._admission.incarnation

    @property
    def self_fenced(self) -> bool:
        """True from a self-fence until the next registration."""
        return self._fence.self_fenced

    def active_jobs(self, *, writing: bool = False) -> list[tuple[int, int]]:
        """``(job_id, assignment_id)`` of every job accepted here that has not ended yet (waiting
        for a start slot, running, or being stopped): whose folders are in use. ``writing``: only
        those that write output files (every job but a sleep job)."""
        jobs = (self._jobs.get(aid) for aid in self._jobs.ids())
        orders = [job.order for job in jobs if job is not None]
        return [
            (o.job_id, o.assignment_id)
            for o in orders
            if not (writing and isinstance(o.spec.runtime, SleepRuntime))
        ]

    def output_jobs(self) -> list[tuple[int, int]]:
        """Those of :meth:`active_jobs` that write output files."""
        return self.active_jobs(writing=True)

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

    def assign(self, order: AssignOrder) -> AssignDecision:
        """Apply the acceptance rules to an Assign request and set off what they accept.

        Synchronous on purpose: the decision and its effect (the reservation, the job's task)
        happen with no checkpoint in between, so concurrent requests cannot both accept one
        assignment or both take the last free capacity. A passed fence deadline fences the
        agent first, so nothing is accepted after it.
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
            # One line per Assign request, its ids listed (runtime/log.py).
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
        """Apply the cancel rules; stop the running ones and return once they have ended. A job
        that ended on its own, before the cancel or while it was being stopped, is finished, not
        acknowledged.

        With ``order.grace_ms`` > 0 (a preemption's) the running command and container jobs get
        SIGTERM at once and are killed ``grace_ms`` after, not after the agent's
        ``stop_grace_s``; their ``stop`` lines say ``preempted`` with that ``grace_ms``. A
        shutdown meanwhile stops them with ``stop_grace_s`` from then.
        """
        self._fence_if_due()
        decision = self._admission.cancel(order)
        preempted = order.grace_ms > 0
        if decision.to_stop:
            self._logger.info(
                "stopping preempted jobs" if preempted else "stopping cancelled jobs",
                epoch=order.epoch,
                incarnation=order.incarnation,
                job_ids=self._job_ids(decision.to_stop),
                assignment_ids=list(decision.to_stop),
                grace_ms=order.grace_ms if preempted else None,
            )
        self._count_refusals("cancel", decision.refused)
        await self._jobs.stop(
            list(decision.to_stop),
            StopReason.PREEMPTED if preempted else StopReason.CANCELLED,
            grace_s=order.grace_ms / 1000.0 if preempted else None,
        )
        return self._admission.settle_cancel(decision)

    def _count_refusals(self, request: str, refused: tuple[Refusal, ...]) -> None:
        for refusal in refused:
            metrics.AGENT_ASSIGNMENTS_REFUSED.labels(self.worker_id, request, refusal.reason.value).inc()

    async def run(
        self, address: str, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Register as ``address``, heartbeat and run jobs until cancelled.

        Signals ``task_status.started(self)`` at once (before the first registration). On
        cancellation stops every job (shielded), each with a ``stop`` line of reason
        ``shutdown``, then leaves (:meth:`_leave`, at most ``leave_timeout_s``) and re-raises.

        Raises:
            OSError: the work folder or the log file cannot be created.
            LocalFileError: another agent process runs on the same work folder.
        """
        self.address = address
        self._clock = trio.lowlevel.current_clock()
        close_work_folder(self.work_dir, record_file=RECORD_FILE)
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
                        if self._usage is not None:
                            nursery.start_soon(self._usage.run)
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

    async def prepare_restart(self, hold_s: float, *, timeout_s: float | None = None) -> bool:
        """Prepare a planned restart: this process will exit leaving its jobs running for the
        next agent on the same work folder. Stops accepting work, then has the next heartbeat
        ask for a restart hold of ``hold_s``; once recorded, the fence deadline moves on by it
        and no heartbeat is sent any more. Waits at most ``timeout_s`` (None: the fence span);
        returns whether the hold was recorded. docs/design.md, "Restarts"."""
        self._admission.fenced = True  # nothing new from here on: it would not be reported
        self._admission.restarting = True  # refused as "restarting", not as "fenced"
        self._jobs.keep_records = True  # a job ending now is settled by the next agent
        if self._admission.incarnation is None or self._fence.self_fenced:
            return False
        self._restart_hold_s = hold_s
        with trio.move_on_after(self._fence.fence_after_s if timeout_s is None else timeout_s):
            await self._restart_granted.wait()
        return self._restart_granted.is_set()

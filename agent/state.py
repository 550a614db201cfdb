"""One worker's agent state, shared by the layers of :class:`agent.core.Agent`: the fields that
registration, heartbeats, the pause and self-fence and the leave read and change together, and
what each takes from a reply (docs/design.md, "The agent's loops").
"""

from __future__ import annotations

import abc
import math
import random
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import trio

from agent import adoption
from agent.acceptance import Admission
from agent.control_plane import ControlPlane
from agent.dbclock import DatabaseClock
from agent.fence import FENCE_DEADLINE_FILE, FenceClock, fence_after_s, monotonic_of, told_refusal
from agent.identities import JobIdentities
from agent.joblog import JobLog, LogEvent
from agent.messages import WORKER_TOTAL, HeartbeatReport, Outcome, StopReason, UsageSample
from agent.resources import JobResources, Mode
from agent.running import RunningJobs
from agent.runtimes import JobRunner, job_runner
from agent.starts import StartLimiter
from agent.usage import UsageReporter
from runtime import log, metrics
from runtime.backoff import FullJitterBackoff
from runtime.os_users import RunAs
from runtime.settings.agent import AgentSettings

LOG_EVERY_FAILURES = 20
"""Log the first failure of a streak, then every this-many (keeps a long outage quiet)."""


class AgentState(abc.ABC):
    """The state of one worker's agent, built from :class:`agent.core.Agent`'s arguments; the
    layers above it read and change it with no checkpoint between a decision and its effect."""

    def __init__(
        self,
        settings: AgentSettings,
        control_plane: ControlPlane,
        *,
        start_limiter: StartLimiter | None = None,
        leave_turns: trio.CapacityLimiter | None = None,
        runner: JobRunner | None = None,
        run_as: RunAs | None = None,
        identities: JobIdentities | None = None,
        resources: JobResources | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self._rng = rng or random.Random()  # the jitter of the registration retries
        self._register_backoff = FullJitterBackoff(
            base_s=settings.register_retry_s, cap_s=settings.register_retry_max_s
        )
        self.worker_id = settings.worker_id
        self.address = ""
        """host:port registered with the control plane; set by :meth:`run`."""
        self.work_dir = Path(settings.work_dir).resolve()
        self.jobs_dir = self.work_dir / "jobs"
        self.database_clock = DatabaseClock()  # as the replies tell it: the job log's times
        self.joblog = JobLog(
            self.work_dir / "agent.jsonl", worker_id=settings.worker_id, clock=self.database_clock
        )
        self.fence_deadline_path = self.work_dir / FENCE_DEADLINE_FILE
        self._logger = log.get("agent").bind(worker_id=settings.worker_id)
        self._cp = control_plane
        self._admission = Admission(
            worker_id=settings.worker_id,
            cpu_capacity_millis=settings.cpu_millis,
            memory_capacity_mb=settings.memory_mb,
        )
        self._fence = FenceClock(settings=settings, path=self.fence_deadline_path, logger=self._logger)
        self._run_id = uuid.uuid4().hex  # tells copies of one registration from a new one
        self._registrations = 0  # begun in this run (the number of the current one)
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
            identities=identities,
            resources=resources,
            logger=self._logger,
        )
        self._usage = (
            None
            if resources is None or resources.mode is Mode.RLIMIT or not settings.usage_interval_s
            else UsageReporter(
                resources=resources,
                interval_s=settings.usage_interval_s,
                cgroup_names=self._jobs.cgroup_names,
            )
        )
        """Measures the running command jobs for the heartbeats; None: not measured."""
        self._registered_once = trio.Event()
        self._takeover: adoption.TakeoverPlan | None = None  # until kept or stopped
        self._continued = trio.Event()  # the taken-over jobs' incarnation was continued
        self._restart_hold_s: float | None = None  # while a planned restart asks for its hold
        self._restart_granted = trio.Event()  # a heartbeat recorded the restart hold
        self._heartbeat_failures = metrics.AGENT_HEARTBEAT_FAILURES.labels(self.worker_id)
        self.heartbeat_interval_s = settings.heartbeat_interval_s
        """The heartbeat interval in force: the setting until the cluster tells another one."""
        self.dead_after_s: float | None = None
        """The dead_after the self-fence is derived from now (the newest one told and accepted);
        None: none told yet."""
        self._refused_interval_s: float | None = None  # logged once, not at every reply
        self._early_heartbeat_at = -math.inf  # when a job's start last pulled a heartbeat forward
        self._heartbeat_waited_s = 0.0
        """The round trip (s) of the last heartbeat if it was sent while live and answered, else 0."""
        self._clock: trio.abc.Clock | None = None  # set by run(); read by the metrics thread

    @property
    def max_epoch_seen(self) -> int:
        """The newest epoch this worker has seen."""
        return self._admission.max_epoch_seen

    @property
    def running_assignment_ids(self) -> tuple[int, ...]:
        """Assignments whose jobs have started and not ended yet: what heartbeats report as
        running. One waiting for a start slot stays unconfirmed, so the leader's window of
        unconfirmed assignments paces a worker by what it really starts (:mod:`actors.placement`)."""
        return self._jobs.running_assignment_ids

    def _job_ids(self, assignment_ids: Iterable[int]) -> list[int | None]:
        """The job of each of ``assignment_ids`` this agent runs (None for one it does not), for
        log lines about a batch (runtime/log.py)."""
        return [None if (job := self._jobs.get(aid)) is None else job.order.job_id for aid in assignment_ids]

    def _leave_live(self) -> None:
        """Stop accepting work: fenced for Admission, the fence watcher parks."""
        self._admission.fenced = True
        self._fence.leave_live()

    def _adopt_told(self, interval_s: float | None, dead_after_s: float | None) -> None:
        """Take the dead_after and the heartbeat interval a reply told (None: not told).

        A dead_after that is a number > 0 is always taken: the self-fence must fit below the
        dead_after the cluster judges the worker by. An interval :func:`agent.fence.told_refusal`
        refuses is logged (once per refused value) and the last good one kept. The self-fence
        span follows what is taken (docs/design.md, "Heartbeat interval").
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

    def _heartbeat_report(
        self,
        incarnation: int,
        sent_at: float,
        finished: tuple[Outcome, ...],
        usage: tuple[UsageSample, ...] = (),
        **more: int,
    ) -> HeartbeatReport:
        """The heartbeat of ``incarnation`` sent at trio time ``sent_at``, carrying ``finished``,
        ``usage`` (but the samples of jobs that ended since they were measured: a heartbeat
        carries at most one per running assignment, and the worker's total) and ``more``
        (``restart_hold_ms``, ``waited_ms``): what runs, the newest epoch seen, its order
        (``sent_monotonic_us``) and the dead_after the fence is derived from."""
        running = self.running_assignment_ids
        kept = {WORKER_TOTAL, *running}
        return HeartbeatReport(
            worker_id=self.worker_id,
            incarnation=incarnation,
            running_assignment_ids=running,
            usage=tuple(s for s in usage if s.assignment_id in kept),
            finished=finished,
            epoch_seen=self.max_epoch_seen,
            sent_monotonic_us=max(1, int(monotonic_of(sent_at) * 1e6)),
            dead_after_in_use_ms=0 if self.dead_after_s is None else math.ceil(self.dead_after_s * 1000),
            **more,
        )

    async def _stop_ended(self, message: str, ids: tuple[int, ...], epoch: int, incarnation: int) -> None:
        """Stop the jobs of ``ids``, the assignments a reply of ``epoch`` to ``incarnation`` said
        the control plane ended, logging ``message``, and wait until they are gone."""
        if ids:
            self._logger.info(
                message,
                epoch=epoch,
                incarnation=incarnation,
                job_ids=self._job_ids(ids),
                assignment_ids=list(ids),
            )
            await self._jobs.stop(list(ids), StopReason.STOPPED_BY_CONTROL_PLANE)

    def _log_event(self, event: LogEvent, **more: Any) -> None:
        """Write a job-log line about the whole worker (no job) in this incarnation."""
        self.joblog.write(event, incarnation=self._admission.incarnation, epoch=self.max_epoch_seen, **more)

    def _clock_told(self, database_unix_s: float | None, sent_at: float) -> None:
        """A reply to a request sent at ``sent_at`` arrived now, telling the database's clock
        (None: it told none): learn from it, and write the job-log lines that waited for it.
        No checkpoint."""
        self.database_clock.observe(database_unix_s, sent_at=sent_at, received_at=trio.current_time())
        self.joblog.flush()

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

    # The fence layer's (agent.self_fence): the jobs call them before they start or end.

    @abc.abstractmethod
    def _fence_if_due(self) -> bool: ...

    @abc.abstractmethod
    def _fence_now(self) -> None: ...

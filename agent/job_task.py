"""One accepted job of the agent (:class:`Job`), what its runner is given beyond the common
arguments (:func:`runner_options`), and the label of its stop metric."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from agent.fence import trio_time_of
from agent.job_record import JobRecord
from agent.job_results import JobResult
from agent.messages import JobOrder, JobState, StopReason
from agent.resources import JobLimits, JobResources
from agent.runtimes import ContainerJob, RunOptions, owner_of
from agent.starts import StartTicket
from agent.supervised import StopNotice
from runtime.jobs import CommandRuntime, ContainerRuntime, SleepRuntime
from runtime.os_users import RunAs
from runtime.settings.agent import AgentSettings

_FAILURE_REASON = re.compile(r"([a-z_]{1,40}):")
"""A failure whose detail starts with a reason (``oom_killed: ...``), read as the control plane
reads it into ``end_reason`` (``record_outcomes`` in ``schema.sql``)."""


def stop_metric_reason(reason: StopReason, detail: str) -> str:
    """The ``reason`` label of ``stockade_agent_job_stops`` for a job that stopped for
    ``reason`` with ``detail``: the reason a failure's detail starts with, else ``reason``."""
    if reason is StopReason.FAILED:
        named = _FAILURE_REASON.match(detail)
        if named is not None:
            return named.group(1)
    return reason.value


@attrs.define(eq=False, kw_only=True)
class Job:
    """One accepted assignment from acceptance until it has really ended."""

    order: JobOrder
    epoch: int
    """The epoch of the Assign request that started it."""
    incarnation: int
    started: bool = False
    """True from its start line on: it is (or was) really running."""
    started_at: float = 0.0
    """trio time at which its runtime was started (0 until its start line was written)."""
    start_line_s: float | None = None
    """The time its start line carries (the database's clock); its stop line is never dated
    earlier. None until that line is written (or for a job taken over whose record lacks it)."""
    stop: trio.Event = attrs.field(factory=trio.Event)
    stop_reason: StopReason | None = None
    """The first reason a stop was asked for; None while nobody asked."""
    stop_grace_ms: int | None = None
    """The grace of its own the first stop asked for (a preemption's), in milliseconds; None:
    none (a sleep job, or one not started yet, was stopped at once all the same)."""
    notice: StopNotice = attrs.field(factory=StopNotice)
    """A stop with a grace of its own (a preemption's), for a command or container job that has
    started; ``stop`` hurries it (the worker's own grace from then)."""
    done: trio.Event = attrs.field(factory=trio.Event)
    start_ticket: StartTicket | None = None
    """A command job's place in the queue for a start slot, then its slot; None for a sleep job."""
    reported: bool = False
    """True once it ended on its own and its outcome waits to be reported (never for a job
    stopped by the control plane, a fence or a shutdown)."""
    job_dir: Path | None = None
    """Its folder, where its record is (:mod:`agent.adoption`); None until it started."""
    record: JobRecord | None = None
    """Its record as last written; None when it has none (not started, or not written)."""
    adopted: bool = False
    """True for a job this agent took over from its previous process."""
    held: bool = False
    """True while a sleep job taken over waits for its incarnation to be continued."""
    job_uid: int | None = None
    """The uid of its own it runs as (:mod:`agent.identities`), until the uid is given back;
    None: it has none."""

    @classmethod
    def taken_over(cls, record: JobRecord, job_dir: Path) -> Job:
        """A job the previous agent process of this work folder started, from its record."""
        return cls(
            order=record.order(),
            epoch=record.epoch,
            incarnation=record.incarnation,
            started=True,
            started_at=trio_time_of(record.began_monotonic_s),
            start_line_s=record.start_line_s,
            job_dir=job_dir,
            record=record,
            adopted=True,
            job_uid=record.job_uid,
        )

    @property
    def log_keys(self) -> dict[str, int]:
        """The keys every log line about this job carries (runtime/log.py)."""
        return {
            "job_id": self.order.job_id,
            "assignment_id": self.order.assignment_id,
            "epoch": self.epoch,
            "incarnation": self.incarnation,
        }


def runner_options(
    order: JobOrder,
    settings: AgentSettings,
    *,
    run_as: RunAs | None,
    resources: JobResources | None,
    on_spawned: Callable[[int], None],
    notice: StopNotice | None = None,
) -> dict[str, Any]:
    """The arguments of :data:`agent.runtimes.JobRunner` that only some jobs are given (by name,
    so runners of other jobs, tests' stand-ins among them, need not know them): a container
    job's names and limits, a timeout or working directory its spec asks for, a command job's
    resources and limits, ``on_spawned`` (its reaper's pid goes into its record) and OOM score
    (the OOM killer's first choice: :mod:`runtime.oom`), and a command's or container's
    ``notice`` (a stop with a grace of its own)."""
    runtime = order.spec.runtime
    given: dict[str, Any] = {}
    if notice is not None and isinstance(runtime, CommandRuntime | ContainerRuntime):
        given["notice"] = notice
    if isinstance(runtime, ContainerRuntime):
        given["container"] = ContainerJob(
            worker_id=settings.worker_id,
            job_id=order.job_id,
            assignment_id=order.assignment_id,
            cpu_millis=order.spec.cpu_millis,
            memory_mb=order.spec.memory_mb,
            user="" if run_as is None else f"{run_as.uid}:{run_as.gid}",
            owner=owner_of(settings.work_dir),
            workdir=order.spec.workdir,
            oom_score_adj=settings.job_oom_score_adj,
        )
    run_options = RunOptions(timeout_s=order.spec.timeout_s, workdir=order.spec.workdir)
    if not run_options.default:
        given["run_options"] = run_options
    if isinstance(runtime, CommandRuntime):
        if resources is not None:
            given["resources"] = resources
            given["limits"] = JobLimits(cpu_millis=order.spec.cpu_millis, memory_mb=order.spec.memory_mb)
        given["on_spawned"] = on_spawned
        given["oom_score_adj"] = settings.job_oom_score_adj
    return given


def sleep_ran_out(record: JobRecord, runtime: SleepRuntime) -> JobResult:
    """A taken-over sleep job whose duration ran out while no agent watched it: succeeded, at
    the end of its duration with its recorded pauses added."""
    ended_at = record.began_monotonic_s + record.paused_s + runtime.duration_ms / 1000.0
    return JobResult(
        state=JobState.SUCCEEDED,
        stopped=False,
        exit_code=0,
        began_at=trio_time_of(record.started_monotonic_s),
        ended_at=trio_time_of(ended_at),
    )


def sleep_not_kept(record: JobRecord, *, now: float, pause_at_s: float | None, asked: bool) -> JobResult:
    """A taken-over sleep job stopped (``asked``) or not continued by the kill deadline: it
    ended when its jobs paused (the deadline file's ``pause_at_s``, ``time.monotonic()``), or at
    trio time ``now`` if that is earlier; fenced unless a stop was asked for before a pause."""
    paused_from = now if pause_at_s is None else min(now, trio_time_of(pause_at_s))
    return JobResult(
        state=JobState.CANCELLED,
        stopped=True,
        fenced=paused_from < now or not asked,
        exit_code=None,
        began_at=trio_time_of(record.started_monotonic_s),
        ended_at=paused_from,
        detail="its agent restarted and did not keep it",
    )


def sleep_rest(
    record: JobRecord, runtime: SleepRuntime, *, ran_s: float, now_s: float
) -> tuple[SleepRuntime, dict[str, Any]]:
    """What is left to run of a taken-over sleep job that has run ``ran_s`` seconds, at
    ``now_s`` (``time.monotonic()``): its runtime, and its runner's ``run_options`` when it has
    a timeout (what is left of it, counted from its first start)."""
    options: dict[str, Any] = {}
    if record.timeout_s is not None:
        left_s = max(0.0, record.timeout_s - (now_s - record.started_monotonic_s))
        options["run_options"] = RunOptions(timeout_s=max(left_s, 0.001))
    return SleepRuntime(duration_ms=max(0, runtime.duration_ms - int(ran_s * 1000))), options

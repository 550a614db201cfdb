"""How a job's run ended: :class:`JobResult`, and how it is read from a job supervisor's report
and the kernel's OOM kills. A run's times are trio's clock, never the wall clock.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import attrs
import trio

from agent.fence import trio_time_of
from agent.messages import JobState, StopReason
from agent.resources import JobLimits, oom_detail

_T = TypeVar("_T")


@attrs.frozen(kw_only=True)
class JobResult:
    """How one run of a job ended."""

    state: JobState
    stopped: bool
    """True when the job did not end on its own: the stop event ended it, or its reaper killed
    it at the fence deadline (then ``fenced`` is true too)."""
    exit_code: int | None
    """The process's exit status; negative ``-N`` when signal N killed it (``subprocess``
    convention); 0 for a sleep job that ran its full duration; None when there is none."""
    began_at: float
    """Trio time its run began (a command: just before its reaper was forked)."""
    ended_at: float
    """Trio time the job had really ended (for a job its reaper fenced: when it stopped it)."""
    stdout_path: str = ""
    stderr_path: str = ""
    detail: str = ""
    fenced: bool = False
    """True when its reaper SIGKILLed the job because the worker's fence deadline had passed."""
    started: bool = True
    """False when the job never ran: a command that was not exec'd (stopped before its
    reaper was started, the reaper or the exec failed, the fence deadline had passed)."""


def timeout_detail(timeout_s: float) -> str:
    """The detail of a job stopped at its timeout; its prefix ``timeout`` is the reason the
    control plane records (schema.sql, record_outcomes)."""
    return f"timeout: ran past its timeout_s of {timeout_s:g} s and was stopped"


@attrs.frozen(kw_only=True)
class OutputPaths:
    stdout_path: str
    stderr_path: str

    @classmethod
    def in_folder(cls, job_dir: Path) -> OutputPaths:
        """The output files of the job whose folder is ``job_dir``: its ``stdout.log`` and
        ``stderr.log``."""
        return cls(stdout_path=str(job_dir / "stdout.log"), stderr_path=str(job_dir / "stderr.log"))


def never_ran(
    paths: OutputPaths, *, began_at: float, detail: str, stopped: bool = False, ended_at: float | None = None
) -> JobResult:
    """The result of a command job that never ran: stopped before its reaper was started
    (``stopped``: cancelled), or its reaper or its exec failed (failed), ended at trio time
    ``ended_at`` (None: now)."""
    return JobResult(
        state=JobState.CANCELLED if stopped else JobState.FAILED,
        stopped=stopped,
        exit_code=None,
        began_at=began_at,
        ended_at=trio.current_time() if ended_at is None else ended_at,
        detail=detail,
        stdout_path=paths.stdout_path,
        stderr_path=paths.stderr_path,
        started=False,
    )


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def oom_killed(result: JobResult, oom_kills: int, limits: JobLimits | None) -> JobResult:
    """``result`` as failed with :func:`agent.resources.oom_detail` when the kernel's OOM killer
    hit the job in its cgroup (``oom_kills`` > 0) and the job ended on its own (a stop, a
    fence or its timeout keeps its own end), whatever its exit code, as for a container."""
    ended_itself = not (result.stopped or result.fenced or result.detail.startswith("timeout:"))
    if not oom_kills or limits is None or not result.started or not ended_itself:
        return result
    return attrs.evolve(result, state=JobState.FAILED, detail=oom_detail(limits.memory_mb, result.detail))


def _parse(report: dict[str, str], key: str, kind: Callable[[str], _T]) -> _T | None:
    try:
        return kind(report[key])
    except (KeyError, ValueError):
        return None


def report_time(report: dict[str, str], key: str) -> float | None:
    """A time of a supervisor's report (``ended_monotonic_s``, ``fenced_monotonic_s``:
    ``CLOCK_MONOTONIC`` seconds, shared by every process of the machine) in trio's clock; None
    when the report has none."""
    value = _parse(report, key, float)
    return None if value is None or not math.isfinite(value) else trio_time_of(value)


def command_result(
    report: dict[str, str],
    reaper_code: int,
    *,
    stopped: bool,
    exec_reported: bool,
    began_at: float,
    paths: OutputPaths,
) -> JobResult:
    """The result of a command job from its reaper's report and its start pipe
    (``exec_reported``: the reaper said the job exec'd), begun at trio time ``began_at``.
    ``stopped`` is whether the agent asked for a stop; the report's own ``stopped`` decides
    when there is one. A time the report lacks is now."""
    now = trio.current_time()
    if "error" in report:
        ended_at = max(began_at, report_time(report, "ended_monotonic_s") or now)
        return never_ran(paths, began_at=began_at, ended_at=ended_at, detail=report["error"])
    code = _parse(report, "exit_code", int)
    ran = exec_reported or code is not None
    fenced_at = report_time(report, "fenced_monotonic_s")
    finished = max(began_at, report_time(report, "ended_monotonic_s") or now)
    if not report:
        code = reaper_code
        detail = f"its reaper ended without a report ({describe_exit(reaper_code)})"
    elif code is None and fenced_at is None:
        detail = "stopped before it was started (its start was held at the fence deadline)"
    elif code is None:
        detail = "not started: the fence deadline had passed"
    else:
        detail = describe_exit(code)
    if fenced_at is not None:
        state, stopped, finished = JobState.CANCELLED, True, max(began_at, fenced_at)
        detail = f"killed by its reaper at the fence deadline: {detail}"
    else:
        if "stopped" in report:
            # The reaper knows whether the stop reached the job before it ended: a job that
            # ended on its own keeps its own end (and its outcome).
            stopped = report["stopped"] == "1"
        state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
        timed_out_after_s = _parse(report, "timed_out_after_s", float)
        if timed_out_after_s is not None:
            # Its reaper stopped it at its timeout: the job's own end, a failure.
            stopped, state, detail = False, JobState.FAILED, f"{timeout_detail(timed_out_after_s)} ({detail})"
        if stopped:
            state = JobState.CANCELLED
    return JobResult(
        state=state,
        stopped=stopped,
        fenced=fenced_at is not None,
        exit_code=code,
        began_at=began_at,
        ended_at=finished,
        detail=detail,
        stdout_path=paths.stdout_path,
        stderr_path=paths.stderr_path,
        started=ran,
    )


def container_result(
    report: dict[str, str],
    supervisor_code: int,
    *,
    stopped: bool,
    exec_reported: bool,
    began_at: float,
    paths: OutputPaths,
) -> JobResult:
    """A container job's result from its supervisor's report: a command job's, with the report's
    ``reason`` first in the detail and the job failed (when it was not stopped) whatever its
    exit code. A job its supervisor paused or killed at the fence deadline stays fenced."""
    result = command_result(
        report, supervisor_code, stopped=stopped, exec_reported=exec_reported, began_at=began_at, paths=paths
    )
    reason = report.get("reason")
    if not reason:
        return result
    if result.fenced:
        # Paused (or killed) at the fence deadline before the reason came: it stays a fence stop.
        why = f"{reason}: {report.get('reason_detail') or ''}".rstrip(": ")
        return attrs.evolve(result, detail=f"killed by its supervisor at the fence deadline; then {why}")
    detail = f"{reason}: {report.get('reason_detail') or result.detail}"
    if result.exit_code is not None:
        detail += f" (exit code {result.exit_code})"
    state = JobState.CANCELLED if result.stopped else JobState.FAILED
    return attrs.evolve(result, state=state, detail=detail, started=True)


def stop_reason_of(result: JobResult, *, fenced: bool, asked: StopReason | None) -> StopReason:
    """Why a run ended, as its ``stop`` line says: the fence (its reaper's, or the agent's
    self-fence: ``fenced``), else the stop that was ``asked`` for when one stopped it, else
    ``restart`` for a run taken over unstarted (its agent died as it started it), else its own
    end (succeeded, failed)."""
    if fenced:
        return StopReason.SELF_FENCE
    if result.stopped and asked is not None:
        return asked
    if result.state is JobState.NOT_STARTED:
        return StopReason.RESTART
    return StopReason(result.state.value)


def reported_state(result: JobResult, *, fenced: bool, asked: StopReason | None) -> JobState | None:
    """What a run's end tells the control plane (None: nothing). A run the fence ended on its
    own, nobody having asked for a stop, is ``not_started`` when it never started and ``fenced``
    when it did: should this incarnation live on, only that report ends its assignment. A run
    that ended on its own tells its own end. A stop that was asked for tells nothing: whoever
    asked (the control plane, or the agent's own self-fence, after which the worker registers
    anew) ends the assignment."""
    if fenced:
        if asked is not None:
            return None
        return JobState.FENCED if result.started else JobState.NOT_STARTED
    return None if result.stopped else result.state

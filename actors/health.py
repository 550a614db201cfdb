"""Worker health: which workers' recent runs fail far more often than the other workers' (a
pure rule, :func:`judge_health`; the leader's reconciler reads the runs and writes the marks).

A worker marked unhealthy gets no new placement but, every ``health_probe_after_s``, one job
at a time as a probe (the half-open state of a circuit breaker: M. Nygard, "Release It!",
2007). The mark clears when a run ended there after it succeeds (a probe, or a run that was
already there), when the other workers' runs turn out to fail as often (the jobs were at
fault), or when an operator uncordons the worker. Where the idea comes from, and how it differs:

- Apache Spark's exclusion on failure (``spark.excludeOnFailure.*``): an executor on which
  ``maxFailedTasksPerExecutor`` different tasks failed is excluded, then included again after
  ``spark.excludeOnFailure.timeout``; failures of one task count once. Here: different jobs.
- Hadoop 1's JobTracker "graylisted" a TaskTracker whose task failure rate was well above the
  cluster's average (``mapred.cluster.average.blacklist.threshold``), so jobs that fail
  everywhere do not take healthy nodes away. Here: the rate against the other workers'.

Which runs are judged: those a worker ended on its own (``finished``: succeeded or failed) within
``health_window_s``, its last ``health_window_runs``. A failure that is the job's own doing
(:data:`JOB_FAULTS`: its timeout, the kernel's OOM killer at its memory limit, a working folder
it named that does not exist or is closed to it, a command not in its image) is not judged;
nor are runs lost with their worker, cancelled (by a user, or by the leader at a timeout),
drained or released. A failure to start (a pids limit, a cgroup that cannot be made, an image
or a program missing on that worker) is the worker's: if the job is at fault it fails on the
other workers too, and the comparison with their rate keeps the worker healthy. The argument
and the choices are in docs/design.md, "Worker health".
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from runtime.settings import ReconcilerSettings

JOB_FAULTS = ("timeout", "oom_killed", "workdir_not_found", "workdir_denied", "command_not_found")
"""End reasons of failed runs (the reason a failure's detail starts with, ``record_outcomes`` in
``schema.sql``) that are the job's own doing: never held against its worker."""

MAX_DETAIL_CHARS = 200
"""Most characters of the last failure's detail a reason quotes."""


@attrs.frozen(kw_only=True)
class Run:
    """One judged run of a worker."""

    job_id: int
    failed: bool
    detail: str = ""
    """How it ended, as the worker told it (``exit code 2``)."""
    after_mark: bool = False
    """It ended after the worker's last mark or renewal (only for a worker marked unhealthy)."""


@attrs.frozen(kw_only=True)
class WorkerRuns:
    """An alive worker, its health, and its judged runs."""

    worker_id: str
    version: int
    """Its ``health_version`` as read: a change applies only to it."""
    runs: tuple[Run, ...]
    """Newest first; at most ``health_window_runs``, within ``health_window_s``, ended after
    its ``health_since``."""
    unhealthy: bool = False
    takes_placements: bool = True
    """Not cordoned or draining."""


@attrs.frozen(kw_only=True)
class HealthChange:
    """Mark a worker unhealthy (again), or clear its mark."""

    worker_id: str
    version: int
    """The ``health_version`` it was judged at."""
    unhealthy: bool
    """True: mark it (a new mark, or renewed after a failed probe); False: clear it."""
    reason: str
    """Why: the mark's reason as status shows it, or why it was cleared (for the log)."""
    renewed: bool = False
    """A marked worker marked again (a run there failed after its mark)."""


@attrs.frozen(kw_only=True)
class HealthVerdict:
    """What one judgement changes, and the workers unhealthy once it is written."""

    changes: tuple[HealthChange, ...]
    unhealthy: tuple[str, ...]


def _failures(runs: Sequence[Run]) -> int:
    return sum(1 for r in runs if r.failed)


def mark_reason(runs: Sequence[Run], others_failed: int, others_runs: int) -> str:
    """Why a worker with these judged ``runs`` (newest first) is unhealthy:
    ``unhealthy: 8 of the last 10 runs failed (other workers: 1 of 40), last: exit code 2``."""
    failed = [r for r in runs if r.failed]
    last = failed[0].detail[:MAX_DETAIL_CHARS] if failed else ""
    return (
        f"unhealthy: {len(failed)} of the last {len(runs)} runs failed "
        f"(other workers: {others_failed} of {others_runs}), last: {last or 'no detail'}"
    )


def stands_out(failed: int, runs: int, others_failed: int, others_runs: int, factor: float) -> bool:
    """Whether ``failed`` of ``runs`` is at least ``factor`` times the other workers' rate
    (``others_failed`` of ``others_runs``; 0 when they have none)."""
    if not runs:
        return False
    others_rate = others_failed / others_runs if others_runs else 0.0
    return failed / runs >= factor * others_rate


def judge_health(workers: Sequence[WorkerRuns], settings: ReconcilerSettings) -> HealthVerdict:
    """Which workers to mark unhealthy, and which marks to clear: a pure function.

    A healthy worker is marked when, among its judged runs, runs of at least
    ``health_min_failed_jobs`` different jobs failed, the fraction of its runs that failed is at
    least ``health_min_failure_rate`` and at least ``health_rate_factor`` times the other
    workers' (their judged runs together; 0 when they have none yet: a worker whose jobs fail
    in milliseconds is marked before the others' first runs end), and another worker that takes
    placements would stay healthy (a lone worker is never marked: there is nothing to compare
    it with, and nowhere else to go). With the defaults: 3 different jobs, half of its runs,
    and three times the others' rate.

    A marked worker is cleared when its newest run that ended after the mark succeeded, or when
    its failure rate no longer stands out (below ``health_rate_factor`` times the others': the
    jobs fail everywhere, as the others' runs now show); it is marked again (its probe waits
    anew) when that newest run failed. Workers are judged in id order, each against the marks
    already made in this judgement.

    Args:
        workers: every alive worker with its judged runs (see :class:`WorkerRuns`).
        settings: the ``health_*`` thresholds.

    Returns:
        The changes, in worker id order, and the workers unhealthy once they are written.
    """
    s = settings
    ordered = sorted(workers, key=lambda w: w.worker_id)
    all_failed = sum(_failures(w.runs) for w in ordered)
    all_runs = sum(len(w.runs) for w in ordered)
    unhealthy = {w.worker_id for w in ordered if w.unhealthy}
    changes: list[HealthChange] = []
    for w in ordered:
        failed = _failures(w.runs)
        others_failed, others_runs = all_failed - failed, all_runs - len(w.runs)
        out = stands_out(failed, len(w.runs), others_failed, others_runs, s.health_rate_factor)
        if not w.unhealthy:
            failed_jobs = {r.job_id for r in w.runs if r.failed}
            rest_healthy = any(
                o.takes_placements and o.worker_id not in unhealthy for o in ordered if o is not w
            )
            if (
                out
                and rest_healthy
                and len(failed_jobs) >= s.health_min_failed_jobs
                and failed / len(w.runs) >= s.health_min_failure_rate
            ):
                unhealthy.add(w.worker_id)
                changes.append(
                    HealthChange(
                        worker_id=w.worker_id,
                        version=w.version,
                        unhealthy=True,
                        reason=mark_reason(w.runs, others_failed, others_runs),
                    )
                )
            continue
        after = [r for r in w.runs if r.after_mark]
        if after and not after[0].failed:
            why = f"a run succeeded there after the mark (job {after[0].job_id})"
        elif w.runs and not out:
            why = (
                f"its runs no longer fail far more often than the other workers' ({failed} of {len(w.runs)} "
                f"against {others_failed} of {others_runs})"
            )
        elif after:
            changes.append(
                HealthChange(
                    worker_id=w.worker_id,
                    version=w.version,
                    unhealthy=True,
                    reason=mark_reason(w.runs, others_failed, others_runs),
                    renewed=True,
                )
            )
            continue
        else:
            continue
        unhealthy.discard(w.worker_id)
        changes.append(HealthChange(worker_id=w.worker_id, version=w.version, unhealthy=False, reason=why))
    return HealthVerdict(changes=tuple(changes), unhealthy=tuple(sorted(unhealthy)))

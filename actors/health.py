"""Worker health: which workers' recent runs fail where the same jobs do not fail elsewhere (a
pure rule, :func:`judge_health`; the leader's reconciler reads the runs and writes the marks).

A worker marked unhealthy gets no new placement but, every ``health_probe_after_s``, one job at
a time as a probe. Which runs are judged, which failures count against a worker, and where the
rule comes from: docs/design.md, "Where a retry goes, and workers whose runs fail".
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence

import attrs

from runtime.settings.leader import ReconcilerSettings

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
    age_s: float = 0.0
    """How long ago it ended, in seconds (database time, as read)."""
    array_id: int | None = None
    """The job's array, if it belongs to one: its siblings are the array's other jobs."""
    spec_key: str = ""
    """What the job runs (a digest of its runtime, command and image): jobs with the same key
    are siblings. Empty: none (no sibling by command)."""
    failed_elsewhere: bool = False
    """Another run of the same job failed on another worker within ``health_window_s``."""
    succeeded_elsewhere: bool = False
    """A run of the same job succeeded on another worker: the strongest evidence that its
    failure here was the worker's."""


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


@attrs.frozen(kw_only=True)
class Evidence:
    """What a worker's judged runs say against it, next to the other workers' over the same
    span of time (from its oldest judged run's end until the read)."""

    counted: tuple[Run, ...]
    """Its judged runs but the failures not held against it (:meth:`Cluster.contrasted`),
    newest first."""
    excused: tuple[Run, ...]
    """Its failures that are the jobs' (:meth:`Cluster.excused`)."""
    strong_jobs: frozenset[int]
    """The jobs of the counted failures that succeeded on another worker."""
    others_failed: int
    others_runs: int
    """The other workers' judged runs that ended within the span, and how many of them failed."""

    @property
    def failed(self) -> int:
        return sum(1 for r in self.counted if r.failed)


def kinds(run: Run) -> tuple[tuple[str, object], ...]:
    """The keys a run shares with its siblings: its job, its array (if any) and its command (if
    known). Two runs are siblings when they share one."""
    keys: list[tuple[str, object]] = [("job", run.job_id)]
    if run.array_id is not None:
        keys.append(("array", run.array_id))
    if run.spec_key:
        keys.append(("spec", run.spec_key))
    return tuple(keys)


@attrs.frozen
class Cluster:
    """Every judged run, indexed: by kind, the workers where one failed and where one
    succeeded; and the sorted ages of all the runs and of the failures."""

    failed_on: dict[tuple[str, object], set[str]]
    succeeded_on: dict[tuple[str, object], set[str]]
    ages_s: list[float]
    failed_ages_s: list[float]

    @classmethod
    def of(cls, workers: Sequence[WorkerRuns]) -> Cluster:
        failed_on: dict[tuple[str, object], set[str]] = {}
        succeeded_on: dict[tuple[str, object], set[str]] = {}
        for w in workers:
            for r in w.runs:
                for key in kinds(r):
                    (failed_on if r.failed else succeeded_on).setdefault(key, set()).add(w.worker_id)
        runs = [r for w in workers for r in w.runs]
        return cls(
            failed_on=failed_on,
            succeeded_on=succeeded_on,
            ages_s=sorted(r.age_s for r in runs),
            failed_ages_s=sorted(r.age_s for r in runs if r.failed),
        )

    def elsewhere(self, on: dict[tuple[str, object], set[str]], run: Run, worker_id: str) -> bool:
        """Whether a sibling of ``run`` (itself included) is in ``on`` for another worker."""
        return any(on.get(key, set()) - {worker_id} for key in kinds(run))

    def excused(self, run: Run, worker_id: str) -> bool:
        """Whether a failed ``run`` on ``worker_id`` is the job's doing: it or a sibling failed
        on another worker too, and the job did not succeed on another worker."""
        if not run.failed or run.succeeded_elsewhere:
            return False
        return run.failed_elsewhere or self.elsewhere(self.failed_on, run, worker_id)

    def contrasted(self, run: Run, worker_id: str) -> bool:
        """Whether a failed ``run`` on ``worker_id`` is held against it: the job succeeded on
        another worker, or the failure is not :meth:`excused` and a sibling succeeded on another."""
        if not run.failed:
            return False
        if run.succeeded_elsewhere:
            return True
        return not self.excused(run, worker_id) and self.elsewhere(self.succeeded_on, run, worker_id)


def evidence(w: WorkerRuns, cluster: Cluster) -> Evidence:
    """The :class:`Evidence` against ``w``: its successes and its :meth:`Cluster.contrasted`
    failures, and the others' runs over its span only (older successes elsewhere say nothing of
    a batch that fails now)."""
    span_s = max((r.age_s for r in w.runs), default=0.0)
    counted = tuple(r for r in w.runs if not r.failed or cluster.contrasted(r, w.worker_id))
    own_failed = sum(1 for r in w.runs if r.failed)
    # Every run of w ended within its span: the others' are the cluster's within it but w's.
    others_runs = bisect.bisect_right(cluster.ages_s, span_s) - len(w.runs) if w.runs else 0
    others_failed = bisect.bisect_right(cluster.failed_ages_s, span_s) - own_failed if w.runs else 0
    return Evidence(
        counted=counted,
        excused=tuple(r for r in w.runs if cluster.excused(r, w.worker_id)),
        strong_jobs=frozenset(r.job_id for r in counted if r.failed and r.succeeded_elsewhere),
        others_failed=others_failed,
        others_runs=others_runs,
    )


def mark_reason(e: Evidence) -> str:
    """Why a worker with this evidence is unhealthy: ``unhealthy: 8 of the last 10 runs failed
    (other workers meanwhile: 1 of 40; 3 of those jobs succeeded elsewhere), last: exit code 2``."""
    failed = [r for r in e.counted if r.failed]
    last = failed[0].detail[:MAX_DETAIL_CHARS] if failed else ""
    strong = f"; {len(e.strong_jobs)} of those jobs succeeded elsewhere" if e.strong_jobs else ""
    return (
        f"unhealthy: {len(failed)} of the last {len(e.counted)} runs failed "
        f"(other workers meanwhile: {e.others_failed} of {e.others_runs}{strong}), "
        f"last: {last or 'no detail'}"
    )


def failing_here(runs: Sequence[Run], s: ReconcilerSettings) -> bool:
    """Whether runs of at least ``health_min_failed_jobs`` jobs failed among ``runs``, and at
    least ``health_min_failure_rate`` of them."""
    failed = [r for r in runs if r.failed]
    return (
        bool(runs)
        and len({r.job_id for r in failed}) >= s.health_min_failed_jobs
        and len(failed) / len(runs) >= s.health_min_failure_rate
    )


def makes_a_case(e: Evidence, s: ReconcilerSettings) -> bool:
    """Whether the evidence marks a worker: :func:`failing_here` of its counted runs, and either
    the other workers ran at least ``health_min_compared_runs`` runs over the span and its rate
    is at least ``health_rate_factor`` times theirs, or they ran fewer and at least
    ``health_min_failed_jobs`` of the jobs that failed there succeeded elsewhere."""
    if not failing_here(e.counted, s):
        return False
    if e.others_runs >= s.health_min_compared_runs:
        others_rate = e.others_failed / e.others_runs if e.others_runs else 0.0
        return e.failed / len(e.counted) >= s.health_rate_factor * others_rate
    return len(e.strong_jobs) >= s.health_min_failed_jobs


def judge_health(workers: Sequence[WorkerRuns], settings: ReconcilerSettings) -> HealthVerdict:
    """Which workers to mark unhealthy, and which marks to clear: a pure function of every
    alive worker's judged runs and the ``health_*`` thresholds (docs/design.md, "Where a retry
    goes, and workers whose runs fail").

    A healthy worker is marked when :func:`makes_a_case` and another worker that takes
    placements would stay healthy (a lone worker is never marked). A marked worker is cleared
    when its newest run after the mark succeeded, or when its failures suffice for a mark only
    with those :meth:`Cluster.excused` counted; it is marked again when that newest run failed
    and counts against it. Workers are judged in id order, each against the marks already made.

    Returns:
        The changes, in worker id order, and the workers unhealthy once they are written.
    """
    s = settings
    ordered = sorted(workers, key=lambda w: w.worker_id)
    unhealthy = {w.worker_id for w in ordered if w.unhealthy}
    changes: list[HealthChange] = []
    cluster = Cluster.of(ordered)
    for w in ordered:
        e = evidence(w, cluster)
        change = functools.partial(HealthChange, worker_id=w.worker_id, version=w.version)
        if not w.unhealthy:
            rest_healthy = any(
                o.takes_placements and o.worker_id not in unhealthy for o in ordered if o is not w
            )
            if rest_healthy and makes_a_case(e, s):
                unhealthy.add(w.worker_id)
                changes.append(change(unhealthy=True, reason=mark_reason(e)))
            continue
        after = [r for r in w.runs if r.after_mark]
        if after and not after[0].failed:
            why = f"a run succeeded there after the mark (job {after[0].job_id})"
        elif failing_here(w.runs, s) and not failing_here([r for r in w.runs if r not in e.excused], s):
            why = (
                f"the jobs that failed there failed on other workers too ({e.failed} of its "
                f"{len(w.runs)} runs failed where they did not)"
            )
        elif after and after[0] in e.counted:
            changes.append(change(unhealthy=True, reason=mark_reason(e), renewed=True))
            continue
        else:
            continue
        unhealthy.discard(w.worker_id)
        changes.append(change(unhealthy=False, reason=why))
    return HealthVerdict(changes=tuple(changes), unhealthy=tuple(sorted(unhealthy)))

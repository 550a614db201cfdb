"""Waiting jobs: dependencies (``after``) and the limit of an array's tasks running at once.

The leader settles them in its reconcile pass: :func:`plan_waiting` decides, and the ledger
writes the plan (``queries.SETTLE_WAITING_JOBS`` re-checks each rule at commit). The rules (Slurm's
``afterok`` and array throttle): docs/design.md, "Dependencies and arrays".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

FAILED_STATES = frozenset({"failed", "cancelled"})
"""A dependency that ended in one of these can never succeed: its dependants are cancelled."""

CASCADE_STEPS = 8
"""Most settling writes one reconcile pass makes while each cancelled jobs (a chain of
dependants longer than this is cancelled over several passes)."""


MISSING_RULE = "must name jobs that exist (a job may wait only for jobs submitted before it)"
"""Why a submission whose ``after`` names a job that does not exist is refused."""


def missing_detail(missing: Sequence[int]) -> str:
    """The detail of :data:`MISSING_RULE`: ``no job 99, 100``; for a job submitted by another
    call while this one ran (it was not there when this one looked), say so."""
    if not missing:
        return "a job named was submitted while this call ran; nothing was stored, try again"
    return "no job " + ", ".join(str(i) for i in missing) + "; nothing was stored"


@attrs.frozen(kw_only=True)
class WaitingJob:
    """A waiting job as the reconciler reads it (``queries.WAITING_JOBS``)."""

    job_id: int
    after: tuple[tuple[int, str], ...] = ()
    """Each dependency's id and state, by id."""
    array_id: int | None = None
    """The array it is a task of; None: not a task."""
    array_index: int = 0
    array_max_running: int = 0
    """The array's limit on tasks at once; 0: none."""
    array_active: int = 0
    """The array's tasks pending, assigned or running when read."""

    def failed_dependency(self) -> int | None:
        """The lowest dependency that failed or was cancelled; None when there is none."""
        return min((i for i, state in self.after if state in FAILED_STATES), default=None)

    def dependencies_succeeded(self) -> bool:
        """Whether every dependency succeeded (true when there is none)."""
        return all(state == "succeeded" for _, state in self.after)


@attrs.frozen(kw_only=True)
class WaitingPlan:
    """What one settling write does (:func:`plan_waiting`)."""

    release: tuple[int, ...] = ()
    """Jobs to make pending."""
    cancel: tuple[tuple[int, int], ...] = ()
    """(job id, its failed dependency) pairs to cancel."""

    def __bool__(self) -> bool:
        return bool(self.release or self.cancel)

    @property
    def rows(self) -> int:
        """Rows the write changes."""
        return len(self.release) + len(self.cancel)


def plan_waiting(waiting: Iterable[WaitingJob], *, most: int) -> WaitingPlan:
    """Which of ``waiting`` (read together, any order) to cancel and which to make pending now:
    a failed or cancelled dependency cancels the job, naming the lowest such one; all succeeded
    make it pending, an array's tasks only within its limit, lowest index first. At most ``most``
    jobs, cancellations first, each by job id."""
    cancel: list[tuple[int, int]] = []
    ready: list[WaitingJob] = []
    for job in sorted(waiting, key=lambda j: (j.array_id or 0, j.array_index, j.job_id)):
        failed = job.failed_dependency()
        if failed is not None:
            cancel.append((job.job_id, failed))
        elif job.dependencies_succeeded():
            ready.append(job)
    release: list[int] = []
    taken: dict[int, int] = {}
    for job in ready:
        if job.array_id is not None and job.array_max_running > 0:
            already = taken.get(job.array_id, 0)
            if job.array_active + already >= job.array_max_running:
                continue
            taken[job.array_id] = already + 1
        release.append(job.job_id)
    cancel.sort()
    cancel = cancel[:most]
    return WaitingPlan(cancel=tuple(cancel), release=tuple(sorted(release[: most - len(cancel)])))

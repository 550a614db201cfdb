"""Waiting jobs: dependencies (``after``) and the limit of an array's tasks running at once.

A job is ``waiting`` while it may not be placed yet (schema.sql, the jobs' state):

- it names dependencies (``JobSpec.after``) that have not all succeeded; its reason says
  which (:func:`waiting_reason`: ``waiting for job 12, 14``);
- or it is a task of an array whose limit (``--array 1-100%10``: ``array_max_running``) is
  reached by the array's tasks that are pending, assigned or running (their reason:
  :func:`array_limit_reason`, ``array limit: 10 running``).

The leader settles them in its reconcile pass (:mod:`actors.reconciler`), a fenced write like
every decision (``queries.SETTLE_WAITING_JOBS``, which re-checks each rule below on the rows
as they are at commit):

1. A waiting job one of whose dependencies failed or was cancelled is cancelled, its reason
   and detail ``dependency_failed: job N`` (N the lowest such dependency). The jobs waiting
   on it are cancelled the same way in the steps that follow: a chain ends within as many
   settling writes as it is long (:data:`CASCADE_STEPS` per pass).
2. A waiting job whose dependencies all succeeded becomes pending (a new ``pending_seq`` and
   ``pending_xid``, as every requeue, so the placer's incremental read sees it), unless it is
   a task of an array with a limit: then only as many of the array's ready tasks as the limit
   leaves room for, lowest index first.
3. Anything else stays waiting.

This is Slurm's ``afterok`` dependency (``sbatch --dependency=afterok:12:14``, except that a
dependency that can never be satisfied cancels the job instead of holding it for ever) and its
array throttle (``sbatch --array=1-100%10``).

An array's id (its first task's) stands for the whole array: a job ``after`` it waits until
every task has succeeded and is cancelled when one fails or is cancelled (its reason names the
array's id); the queries read a dependency's state with ``queries.jobs.dependency_states``.

Dependencies name only jobs that exist when the job is submitted (``queries.SUBMIT_JOB``
refuses others): their ids were drawn before the new job's, so every dependency points to an
older job and no cycle can form (schema.sql's ``jobs_after_older_check`` holds it).

Pure functions: the reconciler reads the waiting jobs (:class:`WaitingJob`) and asks the ledger
to write what :func:`plan_waiting` decided.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

FAILED_STATES = frozenset({"failed", "cancelled"})
"""A dependency that ended in one of these can never succeed: its dependants are cancelled."""

ACTIVE_STATES = frozenset({"pending", "assigned", "running"})
"""The states of an array's tasks that count against its limit."""

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


def waiting_reason(unfinished: Sequence[int]) -> str:
    """The reason of a job waiting for ``unfinished`` dependencies: ``waiting for job 12, 14``."""
    return "waiting for job " + ", ".join(str(i) for i in unfinished)


def array_limit_reason(max_running: int) -> str:
    """The reason of an array's task held by its limit: ``array limit: 10 running``."""
    return f"array limit: {max_running} running"


def dependency_failed(job_id: int) -> str:
    """The reason and detail of a job cancelled because dependency ``job_id`` failed or was
    cancelled: ``dependency_failed: job 12``."""
    return f"dependency_failed: job {job_id}"


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
    """Which waiting jobs to cancel and which to make pending now (rules 1-3 of the module):
    a pure function.

    Args:
        waiting: waiting jobs, read together (each task's ``array_active`` counted in the same
            read); any order.
        most: the most jobs the plan may name (a fenced write's rows).

    Returns:
        At most ``most`` jobs: cancellations first, then releases, each by job id (an array's
        tasks by index).
    """
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


def initial_states(*, tasks: int, max_running: int, dependencies_succeeded: bool) -> list[bool]:
    """For each task of a new array (or the one job, ``tasks`` 1, ``max_running`` 0), in
    index order, whether it is pending at submission (else waiting): all of them when its
    dependencies have all succeeded and there is no limit, the first ``max_running`` when there
    is one, none while a dependency has not succeeded. (``queries.SUBMIT_JOB`` applies the
    same rule in SQL; this is its specification.)"""
    if not dependencies_succeeded:
        return [False] * tasks
    if max_running <= 0:
        return [True] * tasks
    return [index < max_running for index in range(tasks)]

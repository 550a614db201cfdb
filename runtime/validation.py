"""The rules of what a client asks for, applied on both sides: by the client before it sends
(:mod:`ops.client`, the ``stockade`` commands) and by the control plane before it stores
(:mod:`actors.ingest`, :mod:`actors.logs`).

Each check raises :class:`runtime.errors.InvalidArgument` naming the field, the value and the
limit (``job_id must be between 1 and 9223372036854775807, got 0``). A job's spec has its rules
with it (:meth:`runtime.jobs.JobSpec.check`); what only the control plane receives (a worker's
registration, heartbeats, outcomes) is checked in :mod:`actors.validation`, whose ``LIMITS``
lists every limit, these included, for ``docs/limits.md``.
Imports stay light: ``stockade --help`` loads this module.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, TypeVar

from runtime.checks import check_int_between, check_text
from runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from runtime.jobs import JobSpec


T = TypeVar("T")

MAX_ID = 2**63 - 1
"""Ids are PostgreSQL bigints."""

JOB_STATES = ("waiting", "pending", "assigned", "running", "succeeded", "failed", "cancelled")
"""Every state a job can be in, in the order a job goes through them."""
MAX_LIST_LIMIT = 10_000
"""The most jobs one ListJobs may ask for (``stockade list --limit``)."""
MAX_BATCH_JOBS = 10_000
"""The most jobs of one SubmitJobs (``stockade jobs`` splits larger batches)."""
BATCH_ROWS_RULE = f"must hold at most {MAX_BATCH_JOBS} jobs, each array's and gang's tasks counted"
MAX_IDEMPOTENCY_KEY_BYTES = 128
"""The longest idempotency key of a mutating call, in bytes of UTF-8."""
MAX_TAIL_LINES = 100_000
"""The most lines a ReadJobLogs tail may ask for (``stockade logs --tail``); a worker's reading
of them is bounded by the output it keeps (``max_output_mb``) all the same."""
MAX_DRAIN_DEADLINE_S = 7 * 24 * 3600
"""The longest drain deadline, in seconds (one week): past it, cordon without a deadline."""
MAX_DRAIN_DEADLINE_MS = MAX_DRAIN_DEADLINE_S * 1000
MAX_CANCEL_GRACE_MS = 600_000
"""The longest grace a Cancel may give the jobs it stops (``CancelRequest.grace_ms``, a
preemption's), in milliseconds (ten minutes): the Cancel is answered only once they ended."""


def check_job_id(job_id: int) -> int:
    """Raises InvalidArgument outside 1..MAX_ID (ids start at 1 and are bigints)."""
    return check_int_between("job_id", job_id, 1, MAX_ID)


def check_idempotency_key(key: str) -> str:
    """Check a mutating call's idempotency key: InvalidArgument if empty, over
    :data:`MAX_IDEMPOTENCY_KEY_BYTES` in UTF-8, or holding a NUL or control character."""
    return check_text("idempotency_key", key, max_bytes=MAX_IDEMPOTENCY_KEY_BYTES, printable=True)


def check_jobs(specs: Sequence[JobSpec]) -> list[JobSpec]:
    """Check a batch of specs (:meth:`runtime.jobs.JobSpec.check` each).

    Raises:
        InvalidArgument: an empty or too large batch (more than :data:`MAX_BATCH_JOBS` jobs, or
            rows with each array's and gang's tasks counted), a bad job, or jobs that name each other
            wrongly (:func:`pipeline_order`); the field is named with its index, e.g.
            ``specs[3].cpu_millis``.
    """
    steps = check_jobs_steps(specs, spec_of=lambda spec: spec, step_jobs=len(specs) + 1)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            checked: list[JobSpec] = done.value
            return checked


def check_jobs_steps(
    specs: Sequence[T], *, spec_of: Callable[[T], JobSpec], step_jobs: int
) -> Generator[None, None, list[JobSpec]]:
    """:func:`check_jobs` in steps: a generator that yields after every ``step_jobs`` jobs it
    checked and returns the checked jobs, so a large batch need not hold the event loop.

    Args:
        spec_of: turns one item of ``specs`` into a :class:`runtime.jobs.JobSpec` (such as
            :func:`runtime.wire_jobs.job_spec_from_pb`); its errors are named with the index too.
        step_jobs: jobs checked between two yields (at least 1).
    """
    if not specs:
        raise InvalidArgument("specs", [], "must hold at least one job")
    if len(specs) > MAX_BATCH_JOBS:
        raise InvalidArgument("specs", len(specs), f"must hold at most {MAX_BATCH_JOBS} jobs")
    checked = []
    rows = 0
    for index, spec in enumerate(specs):
        try:
            job = spec_of(spec).check()
        except InvalidArgument as exc:
            raise InvalidArgument(f"specs[{index}].{exc.field}", exc.value, exc.rule) from None
        rows += job.array.tasks if job.array is not None else job.tasks or 1
        if rows > MAX_BATCH_JOBS:
            raise InvalidArgument("specs", f"{rows} rows by specs[{index}]", BATCH_ROWS_RULE)
        checked.append(job)
        if (index + 1) % step_jobs == 0:
            yield
    pipeline_order(checked)
    return checked


class PipelineError(InvalidArgument):
    """A batch whose jobs name each other (``after_names``) in a way that cannot be stored: the
    message names the field (``specs[1].after_names[0]``) as any InvalidArgument's.

    Args:
        index: the job at fault (from 0).
        field: its field, as the wire names it (``after_names``, ``name``).
        words: what is wrong, without the field's name, for a job file's message
            (``after: cycle a -> b -> a``).
    """

    def __init__(self, index: int, field: str, value: object, rule: str, *, words: str) -> None:
        super().__init__(f"specs[{index}].{field}", value, rule)
        self.index = index
        self.words = words


def pipeline_order(specs: Sequence[JobSpec]) -> list[int]:
    """The indexes of a batch's ``specs`` in the order they are stored: each after every job its
    ``after_names`` names, else in the batch's order (Kahn's topological sort, the lowest index
    first; A. B. Kahn, "Topological sorting of large networks", CACM 5(11), 1962). A name
    stands for the one job of the batch called so; when any job names another, every name of
    the batch must be different.

    Raises:
        PipelineError: ``specs[i].name`` shared by two jobs of a batch whose jobs name each
            other; ``specs[i].after_names[j]`` naming no job of the batch; or
            ``specs[i].after_names`` closing a cycle, the rule naming it (``after: cycle a ->
            b -> a``; a job naming itself: ``after: cycle a -> a``).
    """
    named = [index for index, spec in enumerate(specs) if spec.after_names]
    if not named:
        return list(range(len(specs)))
    by_name: dict[str, int] = {}
    for index, spec in enumerate(specs):
        first = by_name.setdefault(spec.name, index)
        if first != index:
            raise PipelineError(
                index,
                "name",
                spec.name,
                "must differ from every other job's when jobs of the batch name each other in after "
                f"(specs[{first}] is called so too)",
                words=f"name {spec.name!r} is job {first + 1}'s too; jobs that name each other in "
                "after need names of their own",
            )
    needs: list[list[int]] = [[] for _ in specs]
    for index in named:
        for position, name in enumerate(specs[index].after_names):
            if name not in by_name:
                raise PipelineError(
                    index,
                    f"after_names[{position}]",
                    name,
                    "must name a job of the same batch",
                    words=f"after names {name!r}, which is no job of this file nor a job id",
                )
            needs[index].append(by_name[name])
    waiting = [len(set(n)) for n in needs]
    dependants: list[list[int]] = [[] for _ in specs]
    for index, deps in enumerate(needs):
        for dep in set(deps):
            dependants[dep].append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for dependant in dependants[index]:
            waiting[dependant] -= 1
            if waiting[dependant] == 0:
                heapq.heappush(ready, dependant)
    if len(order) < len(specs):
        cycle = _a_cycle(needs, {i for i, count in enumerate(waiting) if count > 0})
        words = "after: cycle " + " -> ".join(specs[i].name for i in cycle)
        raise PipelineError(
            cycle[0],
            "after_names",
            list(specs[cycle[0]].after_names),
            f"must not close a cycle ({words})",
            words=words,
        )
    return order


def _a_cycle(needs: Sequence[Sequence[int]], left: set[int]) -> list[int]:
    """A cycle among the jobs ``left`` (each needs one of them), from the lowest index, as
    indexes with the first repeated at the end: following each job's first need still left
    must come back to a job already walked."""
    walked: dict[int, int] = {}
    path: list[int] = []
    index = min(left)
    while index not in walked:
        walked[index] = len(path)
        path.append(index)
        index = next(dep for dep in needs[index] if dep in left)
    return [*path[walked[index] :], index]


def check_list(state: str, limit: int) -> tuple[str, int]:
    """Check a ListJobs request (a limit of 0 means 100): InvalidArgument for an unknown state
    or a limit outside 0..MAX_LIST_LIMIT."""
    if state and state not in JOB_STATES:
        raise InvalidArgument("state", state, f"must be empty or one of {', '.join(JOB_STATES)}")
    if not 0 <= limit <= MAX_LIST_LIMIT:
        raise InvalidArgument("limit", limit, f"must be between 0 and {MAX_LIST_LIMIT}")
    return state, limit or 100


def check_tail_lines(tail_lines: int) -> int:
    """The lines a ReadJobLogs (or ReadLogs) tail asks for; InvalidArgument past :data:`MAX_TAIL_LINES`."""
    if not 0 <= tail_lines <= MAX_TAIL_LINES:
        raise InvalidArgument("tail_lines", tail_lines, f"must be between 0 and {MAX_TAIL_LINES:,}")
    return tail_lines


def check_worker_id(worker_id: str) -> str:
    """A worker id named by an operator (cordon, uncordon, drain); InvalidArgument if not an id."""
    from runtime import identifiers  # attrs and ipaddress: only for calls that name a worker

    return identifiers.check_id(worker_id, field="worker_id")


AUDIT_ACTIONS = (
    *("submit", "cancel", "drain", "cordon", "uncordon", "account_set"),
    *("schedule_add", "schedule_pause", "schedule_resume", "schedule_remove"),
)
"""Every action the audit trail records (schema.sql, audit_log.action)."""


MAX_AUDIT_SINCE_S = 1_000_000_000
"""The longest look back of ``stockade audit --since-s``, seconds (about 31 years)."""


def check_audit_query(action: str, since_s: float | None, limit: int) -> tuple[str, float | None, int]:
    """Check a ListAudit request (``stockade audit``; a limit of 0 means 100): InvalidArgument
    for an unknown action, a ``since_s`` outside 0..:data:`MAX_AUDIT_SINCE_S` (NaN too), or a
    limit outside 0..MAX_LIST_LIMIT."""
    if action and action not in AUDIT_ACTIONS:
        raise InvalidArgument("action", action, f"must be empty or one of {', '.join(AUDIT_ACTIONS)}")
    if since_s is not None and not 0 <= since_s <= MAX_AUDIT_SINCE_S:  # NaN compares false: refused
        raise InvalidArgument(
            "since_s", since_s, f"must be a number of seconds from 0 to {MAX_AUDIT_SINCE_S}"
        )
    if not 0 <= limit <= MAX_LIST_LIMIT:
        raise InvalidArgument("limit", limit, f"must be between 0 and {MAX_LIST_LIMIT}")
    return action, since_s, limit or 100


def check_drain_deadline_s(deadline_s: float) -> float:
    """A drain's deadline in seconds (``stockade drain --deadline-s``); InvalidArgument if NaN,
    negative, or over :data:`MAX_DRAIN_DEADLINE_S`."""
    if not 0 <= deadline_s <= MAX_DRAIN_DEADLINE_S:  # NaN compares false: refused too
        raise InvalidArgument(
            "deadline_s", deadline_s, f"must be between 0 and {MAX_DRAIN_DEADLINE_S} seconds (one week)"
        )
    return deadline_s


def check_cancel_grace_ms(grace_ms: int) -> int:
    """A Cancel's ``grace_ms`` (0: the worker's own ``stop_grace_s``); InvalidArgument outside
    0..:data:`MAX_CANCEL_GRACE_MS` (ten minutes)."""
    if not 0 <= grace_ms <= MAX_CANCEL_GRACE_MS:
        raise InvalidArgument(
            "grace_ms", grace_ms, f"must be between 0 and {MAX_CANCEL_GRACE_MS} ms (ten minutes)"
        )
    return grace_ms


def check_drain_deadline_ms(deadline_ms: int) -> int:
    """A drain's deadline as DrainWorker carries it, in milliseconds (at most a week)."""
    return check_int_between("deadline_ms", deadline_ms, 0, MAX_DRAIN_DEADLINE_MS)

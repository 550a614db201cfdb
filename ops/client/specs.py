"""A job's spec from the fields of a job file, as Python values: :func:`job_spec`, read by
:func:`ops.jobfields.spec_of_table` with a job file's names, checks and errors. A
:class:`runtime.jobs.JobSpec` can also be made directly; it is checked when submitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runtime.constraints import Constraint
from runtime.jobs import ArrayRange, JobSpec


def job_spec(
    *,
    cpu_millis: int,
    memory_mb: int,
    command: Sequence[str] | None = None,
    sleep_s: float | None = None,
    image: str | None = None,
    name: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    retry_backoff_s: float | None = None,
    count_lost: bool | None = None,
    timeout_s: float | None = None,
    constraints: Iterable[str | Constraint] = (),
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    after: Iterable[int | str] = (),
    array: str | ArrayRange | None = None,
    max_failed_tasks: int | None = None,
    retry_on_exit: Iterable[int] = (),
    no_retry_on: Iterable[str] = (),
    resources: Mapping[str, int] | None = None,
) -> JobSpec:
    """A checked job spec from a job file's fields (None: the field's default).

    Args:
        cpu_millis: CPU the job reserves, millicores (1000 = one core), 1 to 1,000,000.
        memory_mb: memory it reserves, MiB, 1 to 16 TiB.
        command: the program and its arguments (looked up on the worker's PATH); with
            ``image``, the command run in the container (None: the image's own).
        sleep_s: a sleep job holding its resources this long, seconds (at most a week).
        image: run in a Docker container of this image (already on the workers).
        name: for people; default: the command's basename, the image's name, or ``sleep``.
        priority: higher runs first (-1,000,000 to 1,000,000; default 0).
        max_attempts: most runs, 1 to 100 (default 1); a failed run is retried after a backoff.
        retry_backoff_s: the base of the backoff before a retry, 0 to 600 seconds (default 1).
        count_lost: a run lost with its worker spends an attempt too (default False).
        timeout_s: the longest run, 0.001 s to a week (default: no limit).
        constraints: rules on worker labels, all of which must hold: ``"key=value"``,
            ``"key!=value"``, ``"key"``, ``"key in (a,b)"`` (or :class:`Constraint` values).
        env: environment variables (names without ``=`` or NUL, not ``STOCKADE_*``).
        workdir: the working directory, an absolute path on the worker.
        after: jobs that must all have succeeded first: ids of stored jobs, and names of jobs
            submitted in the same :meth:`~ops.client.Client.submit_many` call (a pipeline).
        array: ``"FIRST-LAST[%MAX_RUNNING]"`` (or an :class:`ArrayRange`): one task per index.
        max_failed_tasks: with ``array``: once this many tasks have failed, the tasks that have
            not ended are cancelled and the array has failed (1 to its tasks; default: no limit).
        retry_on_exit: exit codes (1-255) of failed runs that may be retried; another fails the
            job at once (default: any).
        no_retry_on: failure reasons (``timeout``, ``oom_killed``...) that fail the job at once.
        resources: countable devices each run holds, name -> count (``{"gpu": 2}``: two whole
            gpu units of one worker; docs/devices.md).

    Give exactly one runtime: ``sleep_s``, ``command``, or ``image`` (with an optional ``command``).

    Raises:
        InvalidArgument: the first rule broken, naming the field as a job file does, the value
            and the limit (``max_attempts must be between 1 and 100, got 0``; ``runtime must
            be one of sleep_s, command, or image (with an optional command), got 'none'``).
    """
    table: dict[str, Any] = {
        "name": name,
        "cpu_millis": cpu_millis,
        "memory_mb": memory_mb,
        "priority": priority,
        "sleep_s": sleep_s,
        # A file's parser gives lists and tables: any sequence and mapping read as those.
        "command": command if command is None or isinstance(command, str) else list(command),
        "image": image,
        "max_attempts": max_attempts,
        "retry_backoff_s": retry_backoff_s,
        "count_lost": count_lost,
        "timeout_s": timeout_s,
        "constraints": [c if isinstance(c, str) else c.describe() for c in constraints],
        "env": None if env is None else dict(env),
        "workdir": workdir,
        "after": list(after),
        "array": array.describe() if isinstance(array, ArrayRange) else array,
        "max_failed_tasks": max_failed_tasks
        if max_failed_tasks is not None or not isinstance(array, ArrayRange)
        else array.max_failed_tasks or None,
        "retry_on_exit": list(retry_on_exit),
        "no_retry_on": list(no_retry_on),
        "resources": None if resources is None else dict(resources),
    }
    from ops.jobfields import spec_of_table

    return spec_of_table(table)

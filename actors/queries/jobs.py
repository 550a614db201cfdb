"""A job's spec in the columns of ``jobs``: read from a row, written as columns.

:func:`job_spec_of` reads a spec from a row and :func:`job_columns` gives the columns a
spec is stored in: the one place the runtimes meet SQL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from runtime.constraints import Constraint
from runtime.gangs import GangSeat
from runtime.jobs import ArrayRange, CommandRuntime, ContainerRuntime, JobRuntime, JobSpec, SleepRuntime
from runtime.validation import pipeline_order


def _lifecycle(row: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's fields after its runtime from a row; a column the row lacks keeps the spec's
    default (a dispatch reads only what a worker needs)."""
    fields: dict[str, Any] = {}
    keys = set(row.keys())
    if "max_attempts" in keys and row["max_attempts"] is not None:
        fields["max_attempts"] = int(row["max_attempts"])
    if "retry_backoff_ms" in keys and row["retry_backoff_ms"] is not None:
        fields["retry_backoff_s"] = int(row["retry_backoff_ms"]) / 1000
    if "count_lost" in keys and row["count_lost"] is not None:
        fields["count_lost"] = bool(row["count_lost"])
    if "timeout_ms" in keys and row["timeout_ms"] is not None:
        fields["timeout_s"] = int(row["timeout_ms"]) / 1000
    if "constraints" in keys and row["constraints"]:
        fields["constraints"] = tuple(
            Constraint(key=c["key"], op=c["op"], values=tuple(c.get("values", ())))
            for c in json.loads(row["constraints"])
        )
    if "env" in keys and row["env"]:
        fields["env"] = json.loads(row["env"])
    if "workdir" in keys and row["workdir"]:
        fields["workdir"] = row["workdir"]
    if "after_ids" in keys and row["after_ids"]:
        fields["after"] = tuple(int(i) for i in row["after_ids"])
    if "resources" in keys and row["resources"]:
        fields["resources"] = json.loads(row["resources"])
    if "array_max_running" in keys and row.get("array_first") is not None:
        fields["array"] = ArrayRange(
            first_index=int(row["array_first"]),
            last_index=int(row["array_last"]),
            max_running=int(row["array_max_running"] or 0),
            max_failed_tasks=int(row.get("array_max_failed") or 0),
        )
    if "retry_on_exit" in keys and row["retry_on_exit"]:
        fields["retry_on_exit"] = tuple(int(c) for c in row["retry_on_exit"])
    if "no_retry_on" in keys and row["no_retry_on"]:
        fields["no_retry_on"] = tuple(row["no_retry_on"])
    return fields


def job_spec_of(row: Mapping[str, Any]) -> JobSpec:
    """The spec of a job from a row with its ``name``, ``cpu_millis``, ``memory_mb``,
    ``priority``, ``runtime``, ``sleep_ms``, ``argv`` and ``image`` (of :data:`GET_JOB`,
    :data:`COMMIT_PLACEMENTS` with the argv and image of :data:`JOB_ARGVS`,
    :data:`UNCONFIRMED_ASSIGNMENTS`).

    ``runtime`` is ``'sleep'`` (``sleep_ms``: the duration), ``'command'`` (``argv``) or
    ``'container'`` (``image`` and ``argv``); the columns that do not belong to the runtime are
    NULL and not read.

    Raises:
        ValueError: ``runtime`` names no known runtime.
    """
    name, cpu_millis, memory_mb, priority = row["name"], row["cpu_millis"], row["memory_mb"], row["priority"]
    runtime: JobRuntime
    match row["runtime"]:
        case SleepRuntime.kind:
            runtime = SleepRuntime(duration_ms=int(row["sleep_ms"] or 0))
        case CommandRuntime.kind:
            runtime = CommandRuntime(argv=row["argv"] or ())
        case ContainerRuntime.kind:
            runtime = ContainerRuntime(image=row["image"] or "", argv=row["argv"] or ())
        case other:  # schema.sql's CHECK on jobs.runtime admits no other
            raise ValueError(f"jobs.runtime {other!r} is not a runtime this control plane knows")
    return JobSpec(
        name=name,
        cpu_millis=int(cpu_millis),
        memory_mb=int(memory_mb),
        priority=int(priority),
        runtime=runtime,
        **_lifecycle(row),
    )


def gang_seat_of(row: Mapping[str, Any]) -> GangSeat | None:
    """A gang task's seat from a row with :data:`GANG_SEAT`'s columns (``gang_id`` NULL or
    absent: not a gang's task)."""
    if row.get("gang_id") is None or row.get("gang_port") is None:
        return None
    return GangSeat(
        gang_id=int(row["gang_id"]),
        rank=int(row["gang_rank"]),
        size=int(row["gang_size"]),
        port=int(row["gang_port"]),
        peers=tuple(row["gang_peers"] or ()),
    )


@attrs.frozen
class JobColumns:
    """A spec as the columns of ``jobs`` it is stored in: parameters $1-$8 of :data:`SUBMIT_JOB`."""

    name: str
    cpu_millis: int
    memory_mb: int
    priority: int
    runtime: str
    """``'sleep'``, ``'command'`` or ``'container'`` (the runtime's ``kind``)."""
    sleep_ms: int | None
    """A sleep's duration in milliseconds; None for another runtime."""
    argv: list[str] | None
    """A command's or a container's argv; None for a sleep."""
    image: str | None = None
    """A container's image; None for another runtime."""
    max_attempts: int = 1
    retry_backoff_ms: int = 1000
    count_lost: bool = False
    timeout_ms: int | None = None
    """None: no timeout."""
    constraints: str = "[]"
    """JSON: a list of {key, op, values}."""
    env: str = "{}"
    """JSON: an object of name -> value."""
    workdir: str = ""
    after_ids: list[int] = attrs.field(factory=list)
    array_first: int | None = None
    """An array's first task index; None: one job (parameters $17-$19 of :data:`SUBMIT_JOB`)."""
    array_last: int | None = None
    array_max_running: int = 0
    """An array's limit on tasks pending, assigned or running at once; 0: none."""
    retry_on_exit: list[int] = attrs.field(factory=list)
    """The failure policy: exit codes a failed run may be retried on (parameters $20-$22 of
    :data:`SUBMIT_JOB`, with ``no_retry_on`` and ``array_max_failed``)."""
    no_retry_on: list[str] = attrs.field(factory=list)
    array_max_failed: int | None = None
    """An array's max_failed_tasks; None: no limit (or not an array)."""


def job_columns(spec: JobSpec) -> JobColumns:
    """The columns ``spec`` is stored in; it must have a runtime (a checked spec has one).

    Raises:
        ValueError: ``spec.runtime`` is None.
    """
    sleep_ms: int | None = None
    argv: list[str] | None = None
    image: str | None = None
    match spec.runtime:
        case SleepRuntime(duration_ms=duration_ms):
            sleep_ms = duration_ms
        case CommandRuntime(argv=command):
            argv = list(command)
        case ContainerRuntime(image=container_image, argv=command):
            argv, image = list(command), container_image
        case None:
            raise ValueError(f"job {spec.name!r} has no runtime: check it before storing it")
    return JobColumns(
        spec.name,
        spec.cpu_millis,
        spec.memory_mb,
        spec.priority,
        spec.runtime.kind,
        sleep_ms,
        argv,
        image,
        max_attempts=spec.max_attempts,
        retry_backoff_ms=round(spec.retry_backoff_s * 1000),
        count_lost=spec.count_lost,
        timeout_ms=None if spec.timeout_s is None else round(spec.timeout_s * 1000),
        constraints=json.dumps(
            [{"key": c.key, "op": c.op, "values": list(c.values)} for c in spec.constraints]
        ),
        env=json.dumps(dict(spec.env)),
        workdir=spec.workdir,
        after_ids=list(spec.after),
        array_first=None if spec.array is None else spec.array.first_index,
        array_last=None if spec.array is None else spec.array.last_index,
        array_max_running=0 if spec.array is None else spec.array.max_running,
        retry_on_exit=list(spec.retry_on_exit),
        no_retry_on=list(spec.no_retry_on),
        array_max_failed=None if spec.array is None else (spec.array.max_failed_tasks or None),
    )


BATCH_COLUMNS = (
    *("name", "cpu_millis", "memory_mb", "priority", "runtime", "sleep_ms", "argv", "image"),
    *("max_attempts", "retry_backoff_ms", "count_lost", "timeout_ms", "constraints", "env", "workdir"),
    "after_ids",
    "retry_on_exit",
    "no_retry_on",
)
"""The columns of :data:`SUBMIT_JOBS`' parameters $1-$18, in order."""


def resources_json(spec: JobSpec) -> str:
    """The devices ``spec`` asks as ``jobs.resources`` stores them: JSON {name: count}."""
    return json.dumps(dict(spec.resources))


def job_column_arrays(specs: Sequence[JobSpec]) -> tuple[list[Any], ...]:
    """The columns of many specs as parameters $1-$24 of :data:`SUBMIT_JOBS`: one array per
    column, argv, after_ids, retry_on_exit and no_retry_on as JSON text (a ``text[]`` cannot
    hold arrays of different lengths); then each array's first and last index, limit and
    max_failed_tasks (NULL for a job), the positions in the batch (from 1) of the jobs its
    ``after_names`` name (JSON), and its place in the order of storing (from 1,
    :func:`runtime.validation.pipeline_order`).

    Raises:
        ValueError: a spec has no runtime.
        InvalidArgument: the batch's names do not resolve (:func:`pipeline_order`).
    """
    columns = [job_columns(spec) for spec in specs]
    arrays = {name: [getattr(c, name) for c in columns] for name in BATCH_COLUMNS}
    arrays["argv"] = [None if argv is None else json.dumps(argv) for argv in arrays["argv"]]
    for name in ("after_ids", "retry_on_exit", "no_retry_on"):
        arrays[name] = [json.dumps(items) for items in arrays[name]]
    position = {spec.name: n for n, spec in enumerate(specs, 1)}
    order = pipeline_order(specs)
    places = [0] * len(specs)
    for place, index in enumerate(order, 1):
        places[index] = place
    return (
        *arrays.values(),
        [c.array_first for c in columns],
        [c.array_last for c in columns],
        [None if c.array_first is None else c.array_max_running for c in columns],
        [c.array_max_failed for c in columns],
        [json.dumps([position[name] for name in spec.after_names]) for spec in specs],
        places,
    )


TEMPLATE_COLUMNS = (
    *("name", "cpu_millis", "memory_mb", "priority", "runtime", "sleep_ms", "argv", "image"),
    *("max_attempts", "retry_backoff_ms", "count_lost", "timeout_ms", "constraints", "env", "workdir"),
    *("retry_on_exit", "no_retry_on"),
)
"""The columns of a schedule's job template (``schedules.job``), those :data:`FIRE_SCHEDULE_SLOTS`
inserts: a spec's but its dependencies and array (a schedule's job has neither); with them, the
devices it asks (``resources``)."""


def job_template(spec: JobSpec) -> str:
    """``spec`` as a schedule's job template (``schedules.job``): a JSON object of
    :data:`TEMPLATE_COLUMNS`, ``constraints`` and ``env`` as JSON values.

    Raises:
        ValueError: the spec has no runtime, or has dependencies, an array or a gang's tasks.
    """
    if spec.after or spec.after_names or spec.array is not None or spec.tasks is not None:
        raise ValueError(f"job {spec.name!r}: a schedule's job has no after, array or tasks")
    columns = attrs.asdict(job_columns(spec))
    template = {name: columns[name] for name in TEMPLATE_COLUMNS}
    template["constraints"] = json.loads(template["constraints"])
    template["env"] = json.loads(template["env"])
    template["resources"] = dict(spec.resources)
    return json.dumps(template)


def job_spec_of_template(template: str | Mapping[str, Any]) -> JobSpec:
    """The spec a schedule's job template (:func:`job_template`) stores."""
    row = dict(json.loads(template) if isinstance(template, str) else template)
    row["constraints"] = json.dumps(row.get("constraints") or [])
    row["env"] = json.dumps(row.get("env") or {})
    row["resources"] = json.dumps(row.get("resources") or {})
    return job_spec_of(row)


GANG_ROOM = """
SELECT count(*) AS known,
       count(*) FILTER (WHERE cpu_millis >= $1 AND memory_mb >= $2) AS able,
       coalesce(sum(LEAST(cpu_millis / $1, memory_mb / $2)), 0)::bigint AS holds
  FROM workers
 WHERE state <> 'left'
"""
"""What the workers this cluster knows (live or dead, not left: a dead one may come back) could
hold of a gang's tasks of $1 cpu_millis and $2 memory_mb on empty workers: ``known`` workers,
``able`` of them with room for one task, ``holds`` tasks at once in all. Read by a gang's
submission (actors/ingest_jobs.py, ``gang_beyond_cluster``)."""

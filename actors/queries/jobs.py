"""A job's spec in the columns of ``jobs``: read from a row, written as columns.

:func:`job_spec_of` reads a spec from a row and :func:`job_columns` gives the columns a
spec is stored in: the one place the runtimes meet SQL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from runtime.jobs import CommandRuntime, ContainerRuntime, JobRuntime, JobSpec, SleepRuntime


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
        spec.name, spec.cpu_millis, spec.memory_mb, spec.priority, spec.runtime.kind, sleep_ms, argv, image
    )


def job_column_arrays(specs: Sequence[JobSpec]) -> tuple[list[Any], ...]:
    """The columns of many specs as parameters $1-$8 of :data:`SUBMIT_JOBS`: one array per
    column, argv as JSON text (a ``text[]`` cannot hold arrays of different lengths).

    Raises:
        ValueError: a spec has no runtime.
    """
    columns = [job_columns(spec) for spec in specs]
    return (
        [c.name for c in columns],
        [c.cpu_millis for c in columns],
        [c.memory_mb for c in columns],
        [c.priority for c in columns],
        [c.runtime for c in columns],
        [c.sleep_ms for c in columns],
        [None if c.argv is None else json.dumps(c.argv) for c in columns],
        [c.image for c in columns],
    )

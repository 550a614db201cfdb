"""Stockade's Python client: submit jobs, wait for them, read their output, from a trio or an
asyncio program.

::

    import trio
    from ops.client import Client, job_spec

    async def main() -> None:
        async with Client.open() as client:  # the cluster `stockade` would call
            job_id = await client.submit(job_spec(cpu_millis=500, memory_mb=256, command=["echo", "hi"]))
            job = await client.wait(job_id, timeout_s=60)
            async for chunk in client.logs(job_id):
                print(chunk.data.decode(), end="")

    trio.run(main)

:class:`Client` is the trio face, :class:`AsyncioClient` the asyncio one (the same calls,
arguments, results and errors; ``asyncio.run(main())`` with ``AsyncioClient.open()``). Both
find the cluster as ``stockade``'s commands do (:class:`ClientSettings`), call it over mutual
TLS, fail over between its control planes, and put an idempotency key on every call that
changes something. Results are frozen attrs classes (:mod:`ops.client.results`); errors are
:mod:`runtime.errors`' and :mod:`ops.client.errors`', re-exported here. ``docs/client.md``
("Python client") has the examples, which the test suite runs against a real cluster.

This package sits in ``ops`` because it finds the cluster with :mod:`ops.config` and builds
specs with :mod:`ops.jobfields`, as the CLI does (which uses it); nothing outside ``ops`` imports
it.
"""

from __future__ import annotations

from ops.client.asyncio_face import AsyncioClient, AsyncioLogStream
from ops.client.core import Client
from ops.client.errors import JobNotFound, WaitTimedOut, WorkerNotFound
from ops.client.results import (
    Attempt,
    CancelOutcome,
    ClusterStatus,
    ControlPlane,
    Job,
    JobEvent,
    JobHistory,
    LogChunk,
    Worker,
    WorkerSchedule,
)
from ops.client.settings import ClientSettings
from ops.client.specs import job_spec
from ops.client.streams import LogStream
from ops.config import ClusterError
from runtime.constraints import Constraint
from runtime.errors import (
    ClusterBusy,
    FailedPrecondition,
    IdempotencyConflict,
    InvalidArgument,
    NoControlPlaneReachable,
    NotFound,
    PeerUnavailable,
    PermissionDenied,
    RemoteError,
    StockadeError,
    Unavailable,
)
from runtime.jobs import ArrayRange, CommandRuntime, ContainerRuntime, JobSpec, SleepRuntime

__all__ = [
    "ArrayRange",
    "AsyncioClient",
    "AsyncioLogStream",
    "Attempt",
    "CancelOutcome",
    "Client",
    "ClientSettings",
    "ClusterBusy",
    "ClusterError",
    "ClusterStatus",
    "CommandRuntime",
    "Constraint",
    "ContainerRuntime",
    "ControlPlane",
    "FailedPrecondition",
    "IdempotencyConflict",
    "InvalidArgument",
    "Job",
    "JobEvent",
    "JobHistory",
    "JobNotFound",
    "JobSpec",
    "LogChunk",
    "LogStream",
    "NoControlPlaneReachable",
    "NotFound",
    "PeerUnavailable",
    "PermissionDenied",
    "RemoteError",
    "SleepRuntime",
    "StockadeError",
    "Unavailable",
    "WaitTimedOut",
    "Worker",
    "WorkerNotFound",
    "WorkerSchedule",
    "job_spec",
]

"""Stockade's Python client: submit jobs, wait for them, read their output, from a trio
(:class:`Client`) or an asyncio (:class:`AsyncioClient`) program, with the same calls,
arguments, results (:mod:`ops.client.results`) and errors (:mod:`runtime.errors`' and
:mod:`ops.client.errors`', re-exported here). docs/client.md ("Python client") has the
examples, which the test suite runs against a real cluster. It sits in ``ops`` because it
finds the cluster with :mod:`ops.config` and builds specs with :mod:`ops.jobfields`, as the CLI
does; nothing outside ``ops`` imports it.
"""

from __future__ import annotations

from ops.client.asyncio_face import AsyncioClient, AsyncioLogStream
from ops.client.core import Client
from ops.client.errors import JobNotFound, WaitTimedOut, WorkerNotFound
from ops.client.results import (
    Account,
    Attempt,
    AuditEntry,
    CancelOutcome,
    ClusterStatus,
    ControlPlane,
    Job,
    JobEvent,
    JobHistory,
    LogChunk,
    Schedule,
    Usage,
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
    "Account",
    "ArrayRange",
    "AsyncioClient",
    "AsyncioLogStream",
    "Attempt",
    "AuditEntry",
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
    "Schedule",
    "SleepRuntime",
    "StockadeError",
    "Unavailable",
    "Usage",
    "WaitTimedOut",
    "Worker",
    "WorkerNotFound",
    "WorkerSchedule",
    "job_spec",
]

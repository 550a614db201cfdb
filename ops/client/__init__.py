"""Stockade's Python client: submit jobs, wait for them, read their output, from a trio
(:class:`Client`) or an asyncio (:class:`AsyncioClient`) program, with the same calls,
arguments, results (:mod:`ops.client.results`) and errors (:mod:`runtime.errors`' and
:mod:`ops.client.errors`', re-exported here). docs/client.md ("Python client") has the
examples, which the test suite runs against a real cluster. It sits in ``ops`` because it
finds the cluster with :mod:`ops.config` and builds specs with :mod:`ops.jobfields`, as the CLI
does; nothing outside ``ops`` imports it.

The names other than the errors are loaded when first used (PEP 562), so a module of the
package (``ops.client.results``) can be imported without the trio client, as ``stockade``'s
hot commands import it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from ops.client.admin_results import Account, AuditEntry, Schedule, WorkerSchedule
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
        Usage,
        Worker,
    )
    from ops.client.settings import ClientSettings
    from ops.client.specs import job_spec
    from ops.client.streams import LogStream
    from ops.config import ClusterError
    from runtime.constraints import Constraint
    from runtime.jobs import ArrayRange, CommandRuntime, ContainerRuntime, JobSpec, SleepRuntime

_HOMES: dict[str, str] = {
    **dict.fromkeys(("AsyncioClient", "AsyncioLogStream"), "ops.client.asyncio_face"),
    **dict.fromkeys(("Client",), "ops.client.core"),
    **dict.fromkeys(("JobNotFound", "WaitTimedOut", "WorkerNotFound"), "ops.client.errors"),
    **dict.fromkeys(
        (
            "Attempt",
            "CancelOutcome",
            "ClusterStatus",
            "ControlPlane",
            "Job",
            "JobEvent",
            "JobHistory",
            "LogChunk",
            "Usage",
            "Worker",
        ),
        "ops.client.results",
    ),
    **dict.fromkeys(("Account", "AuditEntry", "Schedule", "WorkerSchedule"), "ops.client.admin_results"),
    **dict.fromkeys(("ClientSettings",), "ops.client.settings"),
    **dict.fromkeys(("job_spec",), "ops.client.specs"),
    **dict.fromkeys(("LogStream",), "ops.client.streams"),
    **dict.fromkeys(("ClusterError",), "ops.config"),
    **dict.fromkeys(("Constraint",), "runtime.constraints"),
    **dict.fromkeys(
        ("ArrayRange", "CommandRuntime", "ContainerRuntime", "JobSpec", "SleepRuntime"), "runtime.jobs"
    ),
}
"""Each public name and the module it comes from."""

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


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value

"""Every SQL statement the control plane runs, by name, one module per owner.

Writes appear only in two places: the ledger (fenced: placements, endings, dead workers) and
ingest (unfenced: submissions, cancels, registrations, heartbeats, presence, cordons and
drains, and the sweep of expired idempotency keys). Reads are used by the lease keeper,
placer, reconciler and ingest.
Durations are passed as float seconds and turned into intervals with ``make_interval(secs =>
$n)``; all times are the database's ``now()``.

A job's spec is stored in the columns of ``jobs``: :func:`job_spec_of` reads it from a row and
:func:`job_columns` gives the columns a spec is stored in, the one place the runtimes meet SQL.

The statements live in one module per actor that runs them: :mod:`actors.queries.lease`,
:mod:`actors.queries.ledger` (every fenced write), :mod:`actors.queries.placer` and
:mod:`actors.queries.reconciler` (their reads), :mod:`actors.queries.ingest` (every unfenced
write, the schema and the client-facing reads), and :mod:`actors.queries.jobs` (a job's spec
as columns). This package names them all, so callers write ``queries.NAME``.
"""

from __future__ import annotations

from actors.queries.ingest import (
    APPLY_SCHEMA_LOCK,
    APPLY_SCHEMA_UNLOCK,
    ARRAY_COUNTS,
    CANCEL_JOB,
    CORDON_WORKER,
    COUNT_PENDING,
    CURRENT_EPOCH,
    DRAIN_WORKER,
    GET_JOB,
    HEARTBEAT,
    IDEMPOTENCY_KEY_CONSTRAINT,
    JOB_ATTEMPTS,
    LEAVE_WORKER,
    LIST_JOBS,
    LOCK_WORKER,
    LOG_SOURCE,
    MISSING_JOBS,
    RECORD_OUTCOMES,
    RECORD_PRESENCE,
    RECORD_SCHEMA_VERSION,
    REGISTER_WORKER,
    SCHEMA_LOCK_KEY,
    SCHEMA_VERSION,
    SCHEMA_VERSION_TABLE,
    STATUS_CONTROL_PLANES,
    STATUS_JOB_COUNTS,
    STATUS_UNSCHEDULABLE,
    STATUS_WORKERS,
    SUBMIT_JOB,
    SUBMIT_JOBS,
    SWEEP_IDEMPOTENCY_KEYS,
    UNCORDON_WORKER,
    WORKER_REGISTRATION,
    once,
)
from actors.queries.jobs import (
    JobColumns,
    job_column_arrays,
    job_columns,
    job_spec_of,
)
from actors.queries.lease import (
    LEASE_LOCK_SPACE,
    PROBE_LEASE,
    READ_LEASE,
    RELEASE_LEASE,
    RENEW_LEASE,
    TAKE_OVER_LEASE,
    TRY_LEASE_LOCK,
    UNLOCK_LEASE_LOCK,
)
from actors.queries.ledger import (
    COMMIT_PLACEMENTS,
    DECLARE_DEAD_WORKERS,
    END_CANCELLED_ASSIGNMENTS,
    END_DRAINED_ASSIGNMENTS,
    END_ORPHANED_ASSIGNMENTS,
    END_TIMED_OUT_ASSIGNMENTS,
    FENCE_EPOCH,
    JOB_ARGVS,
    JUDGED_WORKERS,
    RECORD_STALE_WRITE,
    SETTLE_WAITING_JOBS,
)
from actors.queries.placer import (
    LIVE_WORKERS,
    NO_LONGER_PENDING,
    PENDING_JOBS,
    ROUND_READ,
)
from actors.queries.reconciler import (
    CANCEL_REQUESTED_ASSIGNMENTS,
    DRAIN_DUE_ASSIGNMENTS,
    HEARTBEAT_AGES,
    OVERDUE_ASSIGNMENTS,
    UNCONFIRMED_ASSIGNMENTS,
    WAITING_JOBS,
)

__all__ = [
    "APPLY_SCHEMA_LOCK",
    "APPLY_SCHEMA_UNLOCK",
    "ARRAY_COUNTS",
    "CANCEL_JOB",
    "CANCEL_REQUESTED_ASSIGNMENTS",
    "COMMIT_PLACEMENTS",
    "CORDON_WORKER",
    "COUNT_PENDING",
    "CURRENT_EPOCH",
    "DECLARE_DEAD_WORKERS",
    "DRAIN_DUE_ASSIGNMENTS",
    "DRAIN_WORKER",
    "END_CANCELLED_ASSIGNMENTS",
    "END_DRAINED_ASSIGNMENTS",
    "END_ORPHANED_ASSIGNMENTS",
    "END_TIMED_OUT_ASSIGNMENTS",
    "FENCE_EPOCH",
    "GET_JOB",
    "HEARTBEAT",
    "HEARTBEAT_AGES",
    "IDEMPOTENCY_KEY_CONSTRAINT",
    "JOB_ARGVS",
    "JOB_ATTEMPTS",
    "JUDGED_WORKERS",
    "LEASE_LOCK_SPACE",
    "LEAVE_WORKER",
    "LIST_JOBS",
    "LIVE_WORKERS",
    "LOCK_WORKER",
    "LOG_SOURCE",
    "MISSING_JOBS",
    "NO_LONGER_PENDING",
    "OVERDUE_ASSIGNMENTS",
    "PENDING_JOBS",
    "PROBE_LEASE",
    "READ_LEASE",
    "RECORD_OUTCOMES",
    "RECORD_PRESENCE",
    "RECORD_SCHEMA_VERSION",
    "RECORD_STALE_WRITE",
    "REGISTER_WORKER",
    "RELEASE_LEASE",
    "RENEW_LEASE",
    "ROUND_READ",
    "SCHEMA_LOCK_KEY",
    "SCHEMA_VERSION",
    "SCHEMA_VERSION_TABLE",
    "SETTLE_WAITING_JOBS",
    "STATUS_CONTROL_PLANES",
    "STATUS_JOB_COUNTS",
    "STATUS_UNSCHEDULABLE",
    "STATUS_WORKERS",
    "SUBMIT_JOB",
    "SUBMIT_JOBS",
    "SWEEP_IDEMPOTENCY_KEYS",
    "TAKE_OVER_LEASE",
    "TRY_LEASE_LOCK",
    "UNCONFIRMED_ASSIGNMENTS",
    "UNCORDON_WORKER",
    "UNLOCK_LEASE_LOCK",
    "WAITING_JOBS",
    "WORKER_REGISTRATION",
    "JobColumns",
    "job_column_arrays",
    "job_columns",
    "job_spec_of",
    "once",
]

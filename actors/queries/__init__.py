"""Every SQL statement the control plane runs, by name (``queries.NAME``), one module per owner.

Writes appear only in :mod:`actors.queries.ledger` (fenced) and :mod:`actors.queries.ingest`
(unfenced); :mod:`actors.queries.reads` holds what ingest answers clients with, and each other
module one actor's reads. Durations are passed as float seconds and turned into intervals with
``make_interval(secs => $n)``; all times are the database's ``now()``. A job's spec is stored in
the columns of ``jobs`` (:mod:`actors.queries.jobs`: :func:`job_spec_of`, :func:`job_columns`).
"""

from __future__ import annotations

# Every module's statements, by name: each of these modules holds only SQL and its comments.
from actors.queries.database_watch import *  # noqa: F403
from actors.queries.idempotent import AUDIT_PARAMS, once
from actors.queries.ingest import *  # noqa: F403
from actors.queries.ingest_admin import *  # noqa: F403
from actors.queries.ingest_workers import *  # noqa: F403
from actors.queries.jobs import (
    GANG_ROOM,
    JobColumns,
    gang_seat_of,
    job_column_arrays,
    job_columns,
    job_spec_of,
    job_spec_of_template,
    job_template,
    resources_json,
)
from actors.queries.lease import *  # noqa: F403
from actors.queries.ledger import *  # noqa: F403
from actors.queries.placer import *  # noqa: F403
from actors.queries.reads import *  # noqa: F403
from actors.queries.reconciler import *  # noqa: F403
from actors.queries.scheduler import *  # noqa: F403

__all__ = [
    "AUDIT_PARAMS",
    "GANG_ROOM",
    "JobColumns",
    "gang_seat_of",
    "job_column_arrays",
    "job_columns",
    "job_spec_of",
    "job_spec_of_template",
    "job_template",
    "once",
    "resources_json",
]

"""The schema's application (:mod:`actors.schema`): its lock and its version."""

from __future__ import annotations

SCHEMA_LOCK_KEY = 0x53544F43  # "STOC": serialises concurrent schema application
APPLY_SCHEMA_LOCK = "SELECT pg_advisory_lock($1)"
APPLY_SCHEMA_UNLOCK = "SELECT pg_advisory_unlock($1)"

# ``made`` (false: a new database, no lease table) and ``versioned`` (false: release 0.1.0 made it,
# version 1; its schema_version, if any, holds only the sha256 of its schema.sql).
SCHEMA_STATE = """
SELECT to_regclass('lease') IS NOT NULL AS made,
       EXISTS (SELECT FROM information_schema.columns
                WHERE table_schema = current_schema() AND table_name = 'schema_version'
                  AND column_name = 'version') AS versioned
"""

# The newest version of a versioned database (1 when none is recorded).
SCHEMA_VERSION = "SELECT coalesce(max(version), 1) FROM schema_version"

# $1 the version a migration brought the database to, in the migration's transaction.
RECORD_SCHEMA_VERSION = "INSERT INTO schema_version (version) VALUES ($1)"

# A write that changes nothing, made at every application: a read-only server (a standby) refuses
# it (SQLSTATE 25006), so a control plane waits at its start for a writable one, as it always has.
CHECK_WRITABLE = "UPDATE schema_version SET version = version WHERE false"

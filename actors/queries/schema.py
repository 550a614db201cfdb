"""The schema's application (:mod:`actors.schema`): its lock and its version."""

from __future__ import annotations

SCHEMA_LOCK_KEY = 0x53544F43  # "STOC": serialises concurrent schema application
APPLY_SCHEMA_LOCK = "SELECT pg_advisory_lock($1)"
APPLY_SCHEMA_UNLOCK = "SELECT pg_advisory_unlock($1)"

# The version the database holds: NULL for a new one (no lease table); 1 for one the first release
# made (it has no schema_version table with versions, only, if a control plane of that release
# applied it, one with the sha256 of its schema.sql); else the newest version recorded.
SCHEMA_VERSION = """
SELECT CASE WHEN to_regclass('lease') IS NULL THEN NULL
            WHEN NOT EXISTS (SELECT FROM information_schema.columns
                              WHERE table_schema = current_schema() AND table_name = 'schema_version'
                                AND column_name = 'version') THEN 1
            ELSE (SELECT max(version) FROM schema_version) END
"""

# $1 the version a migration brought the database to, in the migration's transaction.
RECORD_SCHEMA_VERSION = "INSERT INTO schema_version (version) VALUES ($1)"

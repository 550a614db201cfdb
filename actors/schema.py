"""The database schema's application, at every control plane's start (:func:`apply_schema`):
``schema.sql`` whole to a new database, else the numbered migrations (``actors/migrations/``) it
has not had yet, each in a transaction of its own, the newest with schema.sql's routines again;
under an advisory lock, so replicas that start together apply it once (docs/design.md, "The
database schema").
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import attrs

from actors.queries import schema as queries
from runtime.aio import PgConnection

_BESIDE_PACKAGES = Path(__file__).resolve().parents[1] / "schema.sql"
_WHEEL_DATA = Path(sys.prefix) / "share" / "stockade" / "schema.sql"
SCHEMA_PATH = _WHEEL_DATA if _WHEEL_DATA.is_file() and not _BESIDE_PACKAGES.is_file() else _BESIDE_PACKAGES
"""schema.sql: next to the packages in a source tree or an editable install, else where a wheel
installs it (data-files)."""

MIGRATIONS_PATH = Path(__file__).resolve().parent / "migrations"
"""The migrations, shipped inside the package (package data)."""

SCHEMA_CALL_TIMEOUT_S = 60.0
"""Longest one statement of the schema's application may go unanswered, in seconds: schema.sql
is one statement, and a replica may wait here for another applying it."""

_MIGRATION_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")
_STATEMENT = re.compile(r"^\s*[^-\s]", re.MULTILINE)
"""A line that is neither blank nor a comment."""


@attrs.frozen
class Migration:
    """One numbered change: the SQL that brings a database from ``version - 1`` to ``version``."""

    version: int
    path: Path


def migrations(folder: Path = MIGRATIONS_PATH) -> list[Migration]:
    """The migrations in ``folder`` (files ``NNNN_name.sql``), by version.

    Raises:
        ValueError: a file's name is not ``NNNN_name.sql``, or two files share a version.
    """
    found: dict[int, Migration] = {}
    for path in sorted(folder.glob("*.sql")):
        match = _MIGRATION_NAME.fullmatch(path.name)
        if match is None:
            raise ValueError(f"migration file names must be NNNN_name.sql, got {path.name!r}")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"migrations {found[version].path.name!r} and {path.name!r} share a version")
        found[version] = Migration(version, path)
    return [found[version] for version in sorted(found)]


ROUTINES_MARKER = "-- ================================================================ routines\n"
"""The line of schema.sql after which come only its functions, triggers and views."""


def routines(schema_sql: str) -> str:
    """The functions, triggers and views of ``schema_sql`` (all CREATE OR REPLACE): applied again
    with the newest migration, so a migration never copies a routine.

    Raises:
        ValueError: ``schema_sql`` has no :data:`ROUTINES_MARKER` line.
    """
    _, marker, after = schema_sql.partition(ROUTINES_MARKER)
    if not marker:
        raise ValueError(f"schema.sql has no line {ROUTINES_MARKER.strip()!r} before its routines")
    return after


async def apply_schema(database_url: str) -> None:
    """Bring the database to the newest schema: ``schema.sql`` to a new one, else each migration
    newer than the database's version (none recorded: version 1), the newest with
    :func:`routines`. A database at the newest version or a newer one is left alone; a read-only
    one is refused all the same.

    Raises:
        DatabaseUnavailable: the database cannot be reached, or is read-only (a standby).
        FileNotFoundError: the database is new and schema.sql is missing next to the packages.
    """
    conn = await PgConnection.connect(
        database_url,
        server_settings={"application_name": "stockade schema"},
        call_timeout_s=SCHEMA_CALL_TIMEOUT_S,
    )
    try:
        await conn.fetchval(queries.APPLY_SCHEMA_LOCK, queries.SCHEMA_LOCK_KEY)
        try:
            state = await conn.fetchrow(queries.SCHEMA_STATE)
            assert state is not None
            if not state["made"]:
                await conn.execute(SCHEMA_PATH.read_text())
                return
            version = await conn.fetchval(queries.SCHEMA_VERSION) if state["versioned"] else 1
            due = [migration for migration in migrations() if migration.version > version]
            for migration in due:
                sql = migration.path.read_text()
                if migration is due[-1]:
                    sql += "\n" + routines(SCHEMA_PATH.read_text())
                async with conn.transaction():
                    if _STATEMENT.search(sql):  # one of comments only would fail asyncpg
                        await conn.execute(sql)
                    await conn.execute(queries.RECORD_SCHEMA_VERSION, migration.version)
            await conn.execute(queries.CHECK_WRITABLE)
        finally:
            # A connection dropped by the error (a read-only server, a lost link) holds no lock
            # any more; unlocking it would only hide that error behind "connection is closed".
            if not conn.is_closed():
                await conn.fetchval(queries.APPLY_SCHEMA_UNLOCK, queries.SCHEMA_LOCK_KEY)
    finally:
        await conn.close()

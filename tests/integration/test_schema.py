"""The schema's application (:mod:`actors.schema`): a new database from schema.sql, a database of
the previous release migrated to the same catalog, and control planes that apply it at once."""

from __future__ import annotations

import re
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from conftest import execute, quote_ident, with_database

from actors.schema import SCHEMA_PATH, apply_schema, migrations, routines
from runtime.aio import PgConnection, asyncio_bridge
from runtime.errors import DatabaseUnavailable
from runtime.jobs import MAX_RETRY_BACKOFF_S

ROOT = Path(__file__).parents[2]
PREVIOUS_RELEASE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
PREVIOUS_SCHEMA = ROOT / "tests" / "fixtures" / f"schema-{PREVIOUS_RELEASE}.sql"

CATALOG = {
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid)
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'v')
           AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
          FROM pg_constraint WHERE connamespace = 'public'::regnamespace""",
    "indexes": "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
          FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace""",
    "triggers": "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal",
    "views": "SELECT viewname, definition FROM pg_views WHERE schemaname = 'public'",
    "relations": """
        SELECT relname, relkind::text, coalesce(reloptions::text, '') FROM pg_class
         WHERE relnamespace = 'public'::regnamespace""",
}
"""What two databases must share: every column (name, type, nullability, default; not its
position), constraint, index, function, trigger, view, table, sequence and storage option."""

VERSIONS = "SELECT array_agg(version ORDER BY version) FROM schema_version"


@pytest.fixture
def databases(pg_admin_url: str) -> Iterator[tuple[str, str]]:
    """Two empty databases (dropped after the test)."""
    names = [f"t_{uuid.uuid4().hex}" for _ in range(2)]
    execute(pg_admin_url, *(f"CREATE DATABASE {quote_ident(name)}" for name in names))
    yield with_database(pg_admin_url, names[0]), with_database(pg_admin_url, names[1])
    execute(pg_admin_url, *(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)" for name in names))


async def catalog(url: str) -> dict[str, set[tuple[object, ...]]]:
    """The parts of the database's catalog that :data:`CATALOG` names."""
    conn = await PgConnection.connect(url)
    try:
        return {part: {tuple(row) for row in await conn.fetch(sql)} for part, sql in CATALOG.items()}
    finally:
        await conn.close()


async def fetchval(url: str, *statements: str) -> object:
    """Runs ``statements`` on one connection; the first value of the last."""
    conn = await PgConnection.connect(url)
    try:
        for sql in statements[:-1]:
            await conn.execute(sql)
        return await conn.fetchval(statements[-1])
    finally:
        await conn.close()


def newest_version() -> int:
    return migrations()[-1].version


def test_schema_sql_records_the_newest_migrations_version() -> None:
    """schema.sql, which makes a new database at the newest version, says which one that is."""
    recorded = re.findall(r"INSERT INTO schema_version \(version\) VALUES \((\d+)\)", SCHEMA_PATH.read_text())
    assert recorded == [str(newest_version())]


def test_schema_sqls_routines_are_only_functions_triggers_and_views_that_replace_themselves() -> None:
    """What the newest migration applies again (schema.sql after its routines line) can be
    applied to any database at that version: no table, index or row, only CREATE OR REPLACE."""
    statements = re.findall(
        r"^(?:CREATE|ALTER|DROP|INSERT|UPDATE|DELETE|GRANT|COMMENT)\b.*",
        routines(SCHEMA_PATH.read_text()),
        re.M,
    )
    assert statements
    assert [s for s in statements if not re.match(r"CREATE OR REPLACE (FUNCTION|TRIGGER|VIEW) ", s)] == []
    with pytest.raises(ValueError, match="routines"):
        routines("CREATE TABLE t (id int);\n")


async def test_a_new_database_gets_schema_sql_at_the_newest_version(databases: tuple[str, str]) -> None:
    """A new database gets schema.sql whole, recorded at the newest version, and is left alone
    when the schema is applied again."""
    url = databases[0]
    async with asyncio_bridge():
        await apply_schema(url)
        before = await catalog(url)
        await apply_schema(url)
        assert await catalog(url) == before
        assert await fetchval(url, VERSIONS) == [newest_version()]


async def test_a_previous_release_database_is_migrated_to_the_same_catalog(
    databases: tuple[str, str],
) -> None:
    """A database the previous release made (its schema.sql, and the sha256 its control planes
    recorded) is migrated to the newest version and then holds the same tables, columns,
    constraints, indexes, functions, triggers and views as a database made new."""
    old, fresh = databases
    async with asyncio_bridge():
        await fetchval(
            old,
            PREVIOUS_SCHEMA.read_text(),
            "CREATE TABLE schema_version (id int PRIMARY KEY CHECK (id = 1), sha256 text);"
            " INSERT INTO schema_version VALUES (1, 'of the previous release')",
            "SELECT 1",
        )
        await apply_schema(old)
        await apply_schema(fresh)
        migrated, made = await catalog(old), await catalog(fresh)
        for part in CATALOG:
            assert migrated[part] == made[part], part
        versions = await fetchval(old, VERSIONS)
        assert versions == [m.version for m in migrations() if m.version > 1]


async def test_control_planes_that_start_together_apply_the_schema_once(
    databases: tuple[str, str],
) -> None:
    """Four replicas applying the schema at once to a new database and to one of the previous
    release all succeed, and each database records every version once."""
    fresh, old = databases
    async with asyncio_bridge():
        await fetchval(old, PREVIOUS_SCHEMA.read_text(), "SELECT 1")
        async with trio.open_nursery() as nursery:
            for url in (fresh, old) * 4:
                nursery.start_soon(apply_schema, url)
        assert await fetchval(fresh, VERSIONS) == [newest_version()]
        migrated = [m.version for m in migrations() if m.version > 1]
        assert await fetchval(old, VERSIONS) == migrated
        assert (await catalog(old))["columns"] == (await catalog(fresh))["columns"]


async def test_the_retry_delay_is_capped_at_the_jobs_largest_retry_backoff(database_url: str) -> None:
    """The database's retry delay (retry_delay_s) never passes runtime/jobs.py's
    MAX_RETRY_BACKOFF_S and reaches up to it."""
    async with asyncio_bridge():
        largest = await fetchval(
            database_url, "SELECT max(retry_delay_s(1000000000, 10)) FROM generate_series(1, 2000)"
        )
    assert isinstance(largest, float) and MAX_RETRY_BACKOFF_S * 0.98 < largest <= MAX_RETRY_BACKOFF_S


async def test_a_read_only_database_is_refused_even_when_its_schema_needs_nothing(database_url: str) -> None:
    """A server that refuses writes (a standby) is refused at the schema's application, even with
    the newest schema, so a control plane waits there for a writable one."""
    url = f"{database_url}{'&' if '?' in database_url else '?'}default_transaction_read_only=on"
    async with asyncio_bridge():
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            await apply_schema(url)

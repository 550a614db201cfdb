"""The embedded PostgreSQL server (ops/launcher/pg.py) and the database fixtures built on it."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import asyncpg
import psutil
import pytest

from ops.launcher.pg import EmbeddedPostgres, PostgresStartError
from ops.launcher.ports import free_port

SCHEMA_PATH = Path(__file__).parents[2] / "schema.sql"


def postmaster_pid(server: EmbeddedPostgres) -> int:
    return int((server.pgdata / "postmaster.pid").read_text().splitlines()[0])


def fetch(url: str, query: str) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            return await connection.fetch(query)
        finally:
            await connection.close()

    return asyncio.run(run())


def execute(url: str, script: str) -> None:
    """Run a script of one or more statements (simple query protocol)."""

    async def run() -> None:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            await connection.execute(script)
        finally:
            await connection.close()

    asyncio.run(run())


def has_exited(pid: int, *, timeout_s: float = 5.0) -> bool:
    """Whether process ``pid`` exits (or is a zombie awaiting its reaper) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_start_is_idempotent_and_stop_is_quiet(tmp_path: Path) -> None:
    """start() initialises and starts once, returns the same URL again; stop() twice is fine."""
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port(), fast_unsafe=True)
    try:
        assert not server.is_running()
        url = server.start()
        assert url == (
            f"postgresql://postgres@127.0.0.1:{server.port}/postgres?passfile={server.data_dir}/pgpass"
        )
        assert server.is_running()
        pid = postmaster_pid(server)

        assert server.start() == url
        assert postmaster_pid(server) == pid
        assert fetch(url, "SELECT 1 AS one")[0]["one"] == 1
    finally:
        server.stop()
    assert not server.is_running()
    assert has_exited(pid)
    server.stop()


def test_data_survives_a_restart(tmp_path: Path) -> None:
    """A table committed before stop() is still there after the next start()."""
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port())
    try:
        url = server.start()
        execute(url, "CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)")
        server.stop()
        assert not server.is_running()
        url = server.start()
        assert [row["id"] for row in fetch(url, "SELECT id FROM kept")] == [7]
    finally:
        server.stop()


def test_listens_on_loopback_only(tmp_path: Path) -> None:
    """Every TCP socket the postmaster listens on is bound to 127.0.0.1."""
    server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=free_port(), fast_unsafe=True)
    try:
        url = server.start()
        listening = [
            conn.laddr
            for conn in psutil.Process(postmaster_pid(server)).net_connections(kind="inet")
            if conn.status == psutil.CONN_LISTEN
        ]
        assert listening == [("127.0.0.1", server.port)]
        settings = {
            row["name"]: row["setting"]
            for row in fetch(
                url,
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('listen_addresses', 'max_connections', 'fsync', 'synchronous_commit')",
            )
        }
        assert settings == {
            "listen_addresses": "127.0.0.1",
            "max_connections": "300",
            "fsync": "off",
            "synchronous_commit": "off",
        }
    finally:
        server.stop()


def test_long_data_dir_puts_the_socket_under_tmp(tmp_path: Path) -> None:
    """A data dir too deep for a unix socket path gets a short socket dir, removed at stop()."""
    server = EmbeddedPostgres(data_dir=tmp_path / ("d" * 90) / "pg", port=free_port(), fast_unsafe=True)
    socket_dir = server.socket_dir
    assert socket_dir.parent == Path("/tmp")
    try:
        server.start()
        assert (socket_dir / f".s.PGSQL.{server.port}").is_socket()
    finally:
        server.stop()
    assert not socket_dir.exists()


def test_start_failure_reports_the_log(tmp_path: Path) -> None:
    """When the port is taken, start() raises PostgresStartError quoting the server log."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = EmbeddedPostgres(data_dir=tmp_path / "pg", port=port, fast_unsafe=True)
        try:
            with pytest.raises(PostgresStartError, match="Address already in use"):
                server.start(timeout_s=10)
            assert not server.is_running()
        finally:
            server.stop()


def test_fresh_database_has_the_schema(database_url: str) -> None:
    """A database_url database holds the schema's tables and the lease row at epoch 0."""
    tables = {
        row["table_name"]
        for row in fetch(
            database_url,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'",
        )
    }
    assert {"lease", "lease_history", "workers", "jobs", "assignments"} <= tables
    assert [tuple(row) for row in fetch(database_url, "SELECT id, epoch FROM lease")] == [(1, 0)]


def test_schema_applies_again_on_a_test_database(database_url: str) -> None:
    """schema.sql is idempotent: applying it to a copy of the template changes nothing."""
    execute(database_url, SCHEMA_PATH.read_text())
    assert [tuple(row) for row in fetch(database_url, "SELECT id, epoch FROM lease")] == [(1, 0)]


def test_each_test_gets_its_own_database(database_url: str) -> None:
    """database_url names a t_<hex> database, not the template or the admin database."""
    name = fetch(database_url, "SELECT current_database() AS name")[0]["name"]
    assert name.startswith("t_")
    assert len(name) == 2 + 32

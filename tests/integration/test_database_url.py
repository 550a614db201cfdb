"""A database URL that cannot work: malformed (refused before anything runs, exit 2), a wrong
password (one line, exit 1, no retry), a read-only server (the connection is dropped so the
next one finds a writable server)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from ops.cli import EXIT_INVALID, EXIT_UNAVAILABLE
from runtime.aio import PgConnection, asyncio_bridge
from runtime.errors import DatabaseRefused, DatabaseUnavailable, InvalidArgument
from runtime.identifiers import check_database_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("not a url", "must be a postgresql:// URL, e.g. postgresql://user@host:5432/database"),
        ("mysql://h/x", "must be a postgresql:// URL"),
        ("postgres://h:notaport/x", "must give ports in 1..65535 ('notaport' is not)"),
        ("postgresql://u:secret@h:99999/x", "must give ports in 1..65535 ('99999' is not)"),
        ("postgresql://a b/x", "must name hosts that are"),
        ("postgresql://h1:5432,h 2:5432/x", "('h 2' is not)"),
    ],
)
def test_a_malformed_database_url_is_refused_naming_the_part(url: str, rule: str) -> None:
    """Each malformed URL is refused naming what is wrong; a password never shows."""
    with pytest.raises(InvalidArgument) as raised:
        check_database_url(url)
    assert rule in str(raised.value)
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://db.example:5432/stockade",
        "postgres://user:pw@10.0.0.1/stockade?sslmode=verify-full&sslrootcert=/etc/ca.crt",
        "postgresql://a.example:5432,b.example:5433/stockade?target_session_attrs=read-write",
        "postgresql://[::1]:5432/x",
        "postgresql:///stockade?host=/run/postgresql",
    ],
)
def test_database_urls_asyncpg_takes_are_accepted(url: str) -> None:
    assert check_database_url(url) == url


def stockade_cp(database_url: str) -> subprocess.CompletedProcess[str]:
    """``stockade cp`` in a process of its own (it sets up logging and its CPU priority), given
    30 s: these must end on their own."""
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", "cp", "--id", "cp-1", "--insecure", "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_cp_command_refuses_a_malformed_url_in_one_line() -> None:
    result = stockade_cp("postgres://h:x/y")
    assert result.returncode == EXIT_INVALID
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: database_url must give ports in 1..65535 ('x' is not), got 'postgres://h:x/y'"
    ]


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` in its user part and without its passfile."""
    parts = urllib.parse.urlsplit(url)
    user = parts.username or "postgres"
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


async def test_a_wrong_password_is_refused_for_good(database_url: str) -> None:
    """A wrong password is a DatabaseRefused (not retried), naming the refusal."""
    async with asyncio_bridge():
        with pytest.raises(DatabaseRefused, match=r"the database refused this client .*retrying cannot help"):
            await PgConnection.connect(with_password(database_url, "wrong"))


def test_the_cp_command_stops_on_a_wrong_password_in_one_line(database_url: str) -> None:
    result = stockade_cp(with_password(database_url, "wrong"))
    assert result.returncode == EXIT_UNAVAILABLE
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the database refused this client" in errors[0]
    assert "Traceback" not in result.stderr


async def test_a_write_on_a_read_only_server_drops_the_connection(database_url: str) -> None:
    """SQLSTATE 25006 (a standby, an old primary after a failover) is a DatabaseUnavailable and
    the connection is closed, so its owner reconnects (to the writable server of a multi-host
    URL)."""
    async with asyncio_bridge():
        conn = await PgConnection.connect(
            database_url, server_settings={"default_transaction_read_only": "on"}
        )
        try:
            with pytest.raises(DatabaseUnavailable, match="the database is read-only"):
                await conn.execute("CREATE TABLE read_only_probe (id int)")
            assert conn.is_closed()
        finally:
            await conn.close()

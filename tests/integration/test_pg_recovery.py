"""Database connections on a real PostgreSQL that stops answering, changes its schema under a
cached statement, or is read-only: every call returns within its bound, the next call works on
a new connection, a transaction is run again whole, and a multi-host URL lands on a writable
server."""

from __future__ import annotations

import os
import signal
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import structlog
import trio

from ops.launcher.ports import free_port
from runtime import metrics
from runtime.aio import PgConnection, PgPool, ReconnectingConnection, asyncio_bridge, pg
from runtime.errors import DatabaseUnavailable


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The process ``pid`` stopped (SIGSTOP) for the body of the block, and always continued
    (SIGCONT) after it: a server that answers nothing, without closing its connections."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def parent_pid(pid: int) -> int:
    """The parent of process ``pid`` of this machine (a backend's parent is the postmaster)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


async def test_a_call_to_a_frozen_server_returns_within_its_bound_and_the_next_one_reconnects(
    database_url: str, server_pid: Callable[[int], int]
) -> None:
    """With the session's server process stopped, a call raises DatabaseUnavailable after its
    1 s bound and drops the connection; once the process runs again, the next call works on a
    new session."""
    async with asyncio_bridge():
        db = ReconnectingConnection(database_url, {}, owner="test", call_timeout_s=1.0)
        conn = await db.get()
        pid = conn.backend_pid
        with frozen(server_pid(pid)):
            started = trio.current_time()
            with pytest.raises(DatabaseUnavailable, match=r"did not answer within call_timeout_s = 1 s"):
                await conn.fetchval("SELECT 1")
            assert 1.0 <= trio.current_time() - started < 2.0
            assert conn.is_closed()
        again = await db.get()
        assert await again.fetchval("SELECT 1") == 1
        assert again.backend_pid != pid
        await db.close()


async def test_a_connect_to_a_frozen_postmaster_returns_within_its_bound(
    database_url: str, server_pid: Callable[[int], int]
) -> None:
    """With the postmaster stopped (the TCP connect is accepted by the kernel, nothing answers),
    a connect raises DatabaseUnavailable after its 1 s bound; once it runs again, it connects."""
    async with asyncio_bridge():
        probe = await PgConnection.connect(database_url)
        postmaster = parent_pid(server_pid(probe.backend_pid))
        await probe.close()
        db = ReconnectingConnection(database_url, {}, owner="test", connect_timeout_s=1.0)
        with frozen(postmaster):
            started = trio.current_time()
            with pytest.raises(DatabaseUnavailable, match="cannot connect to the database"):
                await db.get()
            assert 1.0 <= trio.current_time() - started < 2.0
        conn = await db.wait_connected()
        assert await conn.fetchval("SELECT 1") == 1
        await db.close()


def keepalive_options(raw: Any) -> tuple[int, int, int, int, int]:
    sock = raw._transport.get_extra_info("socket")
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
    )


EXPECTED_KEEPALIVES = (
    1,
    pg.KEEPALIVE_IDLE_S,
    pg.KEEPALIVE_INTERVAL_S,
    pg.KEEPALIVE_COUNT,
    pg.TCP_USER_TIMEOUT_S * 1000,
)


async def test_connections_and_pooled_connections_have_tcp_keepalives(database_url: str) -> None:
    async with asyncio_bridge():
        conn = await PgConnection.connect(database_url)
        try:
            assert keepalive_options(conn._raw) == EXPECTED_KEEPALIVES
        finally:
            await conn.close()
        pool = await PgPool.create(database_url, size=1)
        try:
            async with pool.acquire() as pooled:
                assert keepalive_options(pooled._raw._con) == EXPECTED_KEEPALIVES
        finally:
            await pool.close()


async def test_a_transaction_that_meets_a_changed_schema_runs_again_whole(database_url: str) -> None:
    """After ALTER TABLE adds a column under a cached ``SELECT *``, the transaction function
    runs a second time from its start (its first run's update rolled back) and succeeds; one
    retry is logged and counted."""
    async with asyncio_bridge():
        conn = await PgConnection.connect(database_url)
        other = await PgConnection.connect(database_url)
        try:
            await conn.execute("CREATE TABLE plan_probe (a int); INSERT INTO plan_probe VALUES (1)")
            runs: list[str] = []

            async def body(c: PgConnection) -> list[Any]:
                runs.append("start")
                await c.execute("UPDATE plan_probe SET a = a + 1")
                rows = await c.fetch("SELECT * FROM plan_probe")
                runs.append("end")
                return rows

            assert [dict(r) for r in await conn.run_in_transaction(body, what="probe")] == [{"a": 2}]
            await other.execute("ALTER TABLE plan_probe ADD COLUMN b int")
            runs.clear()
            before = metrics.DATABASE_TRANSACTION_RETRIES.labels("probe")._value.get()
            with structlog.testing.capture_logs() as logs:
                rows = await conn.run_in_transaction(body, what="probe")
            assert runs == ["start", "start", "end"]  # from the start, not from the failed statement
            assert [dict(r) for r in rows] == [{"a": 3, "b": None}]  # one increment: run 1 rolled back
            retries = [e for e in logs if e["event"] == "transaction run again after a schema change"]
            assert len(retries) == 1 and retries[0]["what"] == "probe"
            assert retries[0]["error"].startswith("InvalidCachedStatementError")
            assert retries[0]["sqlstate"] == "0A000"
            assert metrics.DATABASE_TRANSACTION_RETRIES.labels("probe")._value.get() == before + 1
        finally:
            await conn.close()
            await other.close()


async def test_a_plain_transaction_block_would_fail_on_the_changed_schema(database_url: str) -> None:
    """The control: without the whole-transaction retry the same change fails the transaction
    (asyncpg retries a statement on its own only outside a transaction)."""
    import asyncpg

    async with asyncio_bridge():
        conn = await PgConnection.connect(database_url)
        other = await PgConnection.connect(database_url)
        try:
            await conn.execute("CREATE TABLE plan_probe (a int)")
            async with conn.transaction():
                await conn.fetch("SELECT * FROM plan_probe")
            await other.execute("ALTER TABLE plan_probe ADD COLUMN b int")
            with pytest.raises(asyncpg.exceptions.InvalidCachedStatementError):
                async with conn.transaction():
                    await conn.fetch("SELECT * FROM plan_probe")
        finally:
            await conn.close()
            await other.close()


def multi_host(url: str, *hosts: str, query: dict[str, str] | None = None) -> str:
    """``url`` naming ``hosts`` instead of its own host, its query options kept (the passfile),
    plus ``query``."""
    parts = urllib.parse.urlsplit(url)
    user = parts.username or "postgres"
    options = dict(urllib.parse.parse_qsl(parts.query)) | (query or {})
    return urllib.parse.urlunsplit(
        (parts.scheme, f"{user}@{','.join(hosts)}", parts.path, urllib.parse.urlencode(options), "")
    )


async def test_a_multi_host_url_skips_a_dead_host(database_url: str) -> None:
    """``postgresql://u@dead:p1,live:p2/db?target_session_attrs=read-write&passfile=...``
    connects to the live, writable host."""
    parts = urllib.parse.urlsplit(database_url)
    url = multi_host(
        database_url,
        f"127.0.0.1:{free_port()}",
        f"{parts.hostname}:{parts.port}",
        query={"target_session_attrs": "read-write"},
    )
    async with asyncio_bridge():
        conn = await PgConnection.connect(url)
        try:
            assert await conn.fetchval("SHOW transaction_read_only") == "off"
        finally:
            await conn.close()


async def test_a_multi_host_url_never_settles_on_a_read_only_server(database_url: str) -> None:
    """With every host read-only, a multi-host URL that names no target gets no connection (a
    DatabaseUnavailable, retried, not a refusal); writable again, it connects."""
    parts = urllib.parse.urlsplit(database_url)
    host = f"{parts.hostname}:{parts.port}"
    url = multi_host(database_url, host, host)
    database = parts.path.lstrip("/")
    async with asyncio_bridge():
        admin = await PgConnection.connect(database_url)
        try:
            await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
            with pytest.raises(DatabaseUnavailable, match="cannot connect to the database"):
                await PgConnection.connect(url)
            await admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
            conn = await PgConnection.connect(url)
            assert await conn.fetchval("SHOW transaction_read_only") == "off"
            await conn.close()
        finally:
            await admin.close()


async def test_a_fenced_write_that_meets_a_changed_schema_runs_again_from_its_fence(
    database_url: str,
) -> None:
    """The ledger's fenced transaction meets a column added under its cached ``SELECT *``: it
    runs again from BEGIN, fence included, and commits its writes once."""
    from actors import queries
    from actors.ledger import Ledger
    from actors.messages import LeaseInbox, LedgerInbox
    from runtime.settings.leader import LedgerSettings

    async with asyncio_bridge():
        admin = await PgConnection.connect(database_url)
        try:
            row = await admin.fetchrow(queries.TAKE_OVER_LEASE, "cp-1", 30.0, 0, False)
            assert row is not None
            epoch = int(row["epoch"])
            await admin.execute(
                "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)"
                " VALUES ('w-1', '127.0.0.1:1', 8000, 8192, 1)"
            )
            _, ledger_recv = trio.open_memory_channel[LedgerInbox](1)
            lease_send, _ = trio.open_memory_channel[LeaseInbox](1)
            ledger = Ledger(
                cp_id="cp-1",
                database_url=database_url,
                settings=LedgerSettings(),
                inbox=ledger_recv,
                lease_inbox=lease_send,
            )
            runs = 0

            async def op(c: PgConnection) -> int:
                nonlocal runs
                runs += 1
                await c.execute("UPDATE workers SET memory_mb = memory_mb + 1 WHERE id = 'w-1'")
                return len(await c.fetch("SELECT * FROM workers"))

            assert await ledger.fenced(epoch, "probe", op, kind="probe") == 1
            await admin.execute("ALTER TABLE workers ADD COLUMN probe_column int")
            runs = 0
            assert await ledger.fenced(epoch, "probe", op, kind="probe") == 1
            assert runs == 2
            assert await admin.fetchval("SELECT memory_mb FROM workers WHERE id = 'w-1'") == 8194
            await ledger._db.close()
        finally:
            await admin.close()


def query_row(url: str, sql: str) -> Any:
    """The first row of ``sql``, on a short-lived connection of its own (a sync test's)."""
    import asyncio

    import asyncpg

    async def run() -> Any:
        conn = await asyncpg.connect(url, timeout=5.0)
        try:
            return await conn.fetchrow(sql)
        finally:
            await conn.close()

    return asyncio.run(run())


def wait_for_leader(url: str, timeout_s: float, *, above_epoch: int = 0) -> int:
    """The epoch cp-1 leads under, once it holds a live lease under an epoch above
    ``above_epoch`` (within ``timeout_s``)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = query_row(url, "SELECT holder, epoch, expires_at > now() AS live FROM lease WHERE id = 1")
        if row is not None and row["holder"] == "cp-1" and row["live"] and row["epoch"] > above_epoch:
            return int(row["epoch"])
        time.sleep(0.1)
    raise AssertionError(f"cp-1 did not lead under an epoch above {above_epoch} within {timeout_s:g} s")


def test_a_control_plane_rides_out_a_frozen_database(
    database_url: str, server_pid: Callable[[int], int]
) -> None:
    """Every server process of the control plane's database, and the postmaster, stopped for
    6 s (no reset: calls and connects just go unanswered): the replica steps down, logs the
    outage in a few lines, and leads again within a few seconds of the database's return (10 s,
    plus what the replica took to lead after its start on this machine), under a new epoch; it
    never exits, and stops cleanly on SIGTERM."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    started_at = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "cp", "--id", "cp-1", "--insecure", "--database-url", database_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        epoch = wait_for_leader(database_url, 60.0)
        first_lead_s = time.monotonic() - started_at  # what a start takes on this machine now
        database = urllib.parse.urlsplit(database_url).path.lstrip("/")
        backends = [
            server_pid(int(pid))
            for pid in query_row(
                database_url,
                f"SELECT array_agg(pid) FROM pg_stat_activity WHERE datname = '{database}'"
                " AND pid <> pg_backend_pid()",
            )[0]
        ]
        postmaster = parent_pid(backends[0])
        stopped: list[int] = []
        try:
            for pid in [postmaster, *backends]:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            time.sleep(6.0)
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        back_at = time.monotonic()
        # A renewal sent before the freeze may commit as the database wakes, leaving the old
        # epoch's lease live a moment longer (the replica has stepped down and writes nothing
        # under it): what counts is leading again under a new epoch.
        assert wait_for_leader(database_url, 60.0, above_epoch=epoch) > epoch
        recovered_s = time.monotonic() - back_at
        assert process.poll() is None, "the control plane exited during the outage"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=15)
        assert process.returncode == 0, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "Traceback" not in stderr
    unreachable = [line for line in stderr.splitlines() if "database unreachable" in line]
    assert 1 <= len(unreachable) <= 6, stderr  # one per connection owner at most
    assert "database reachable again" in stderr
    assert recovered_s < 10.0 + first_lead_s, (recovered_s, first_lead_s, stderr)

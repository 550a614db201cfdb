"""Reconnecting to a database that went away: the waits between failed connects grow, capped
and jittered, and start again from the shortest after a success; the outage is logged once
when it starts, every 10 s while it lasts, and once when it ends; a multi-host URL asks for a
writable server."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from runtime import log
from runtime.aio import pg, pg_reconnect
from runtime.backoff import RECONNECT_BACKOFF, FullJitterBackoff, ReconnectSchedule
from runtime.errors import DatabaseUnavailable, InvalidArgument
from runtime.identifiers import check_database_url
from runtime.outage import OutageLog


class Ceiling(random.Random):
    """Draws the top of every range: the waits are their ceilings."""

    def uniform(self, a: float, b: float) -> float:
        return b


def events(logs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(entry["log_level"], entry["event"]) for entry in logs]


# ------------------------------------------------------------------ the schedule


def test_the_waits_double_from_50_ms_to_a_cap_of_2_s() -> None:
    """Ceilings 0.05, 0.1, 0.2 ... s, never above 2 s, one per failed connect in a row."""
    schedule = ReconnectSchedule(rng=Ceiling())
    waits = [schedule.failed(now=0.0) for _ in range(9)]
    assert waits == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])
    assert FullJitterBackoff(base_s=0.05, cap_s=2.0) == RECONNECT_BACKOFF


def test_a_success_resets_the_waits() -> None:
    """After a successful connect, the next failure waits the shortest time again, and the
    next attempt is due at once until then."""
    schedule = ReconnectSchedule(rng=Ceiling())
    for _ in range(5):
        schedule.failed(now=0.0)
    schedule.succeeded()
    assert schedule.next_attempt_at < 0
    assert schedule.failed(now=10.0) == pytest.approx(0.05)
    assert schedule.next_attempt_at == pytest.approx(10.05)


def test_the_waits_are_jittered_below_their_ceiling_and_repeat_with_a_seed() -> None:
    """Each wait is drawn in [0, ceiling]; the same seed draws the same waits."""
    first = ReconnectSchedule(rng=random.Random(7))
    second = ReconnectSchedule(rng=random.Random(7))
    waits = [first.failed(now=0.0) for _ in range(12)]
    assert waits == [second.failed(now=0.0) for _ in range(12)]
    for attempt, wait_s in enumerate(waits):
        assert 0.0 <= wait_s <= RECONNECT_BACKOFF.ceiling_s(attempt)
    assert len(set(waits)) == len(waits)


# ------------------------------------------------------------------ the outage log


async def test_an_outage_is_logged_when_it_starts_every_10_s_and_when_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """25 failures one second apart log one warning, reminders at 10 s and 20 s (attempts and
    down_for_s), and one info on the success; the password never shows."""
    with structlog.testing.capture_logs() as logs:
        outage = OutageLog(log.get("ledger"), "postgresql://u:secret@db.example:5432/stockade")
        for _ in range(25):
            outage.failed("connection refused")
            await trio.sleep(1.0)
        outage.succeeded()
        outage.succeeded()  # reachable already: nothing more
    assert events(logs) == [
        ("warning", "database unreachable"),
        ("warning", "database still unreachable"),
        ("warning", "database still unreachable"),
        ("info", "database reachable again"),
    ]
    assert logs[0]["target"] == "postgresql://u:***@db.example:5432/stockade"
    assert logs[0]["error"] == "connection refused"
    assert (logs[1]["attempts"], logs[1]["down_for_s"]) == (11, 10.0)
    assert (logs[2]["attempts"], logs[2]["down_for_s"]) == (21, 20.0)
    assert (logs[3]["attempts"], logs[3]["down_for_s"]) == (25, 25.0)
    assert all("secret" not in str(entry) for entry in logs)


async def test_a_second_outage_is_logged_again(autojump_clock: trio.testing.MockClock) -> None:
    """Down, up, down: two 'unreachable' lines and one 'reachable again' between them."""
    with structlog.testing.capture_logs() as logs:
        outage = OutageLog(log.get("lease"), "postgresql://h/db")
        outage.failed("a")
        outage.failed("b")
        outage.succeeded()
        outage.failed("c")
    assert events(logs) == [
        ("warning", "database unreachable"),
        ("info", "database reachable again"),
        ("warning", "database unreachable"),
    ]
    assert logs[2]["error"] == "c"


def test_the_reminder_interval_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="remind_every_s must be a finite number > 0, got 0"):
        OutageLog(log.get("x"), "postgresql://h/db", remind_every_s=0)


# ------------------------------------------------------------------ a reconnecting connection


class FakeConnection:
    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    async def close(self) -> None:
        self.closed = True


async def test_a_reconnecting_connection_waits_the_schedule_and_logs_once(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four refused connects are tried at 0, 0.05, 0.15 and 0.35 s and the fifth, at 0.75 s,
    succeeds; after the connection breaks, the next refused connect waits 0.05 s again. One
    warning and one info per outage, none per attempt."""
    attempts: list[float] = []
    refuse = [True] * 4 + [False] + [True, False]

    async def connect(url: str, **options: Any) -> FakeConnection:
        attempts.append(trio.current_time())
        if refuse.pop(0):
            raise DatabaseUnavailable("cannot connect to the database: refused")
        return FakeConnection()

    monkeypatch.setattr(pg.PgConnection, "connect", connect)
    with structlog.testing.capture_logs() as logs:
        db = pg_reconnect.ReconnectingConnection(
            "postgresql://h/db", {}, owner="ledger", schedule=ReconnectSchedule(rng=Ceiling())
        )
        first = await db.wait_connected()
        assert attempts == pytest.approx([0.0, 0.05, 0.15, 0.35, 0.75])
        first.closed = True  # type: ignore[attr-defined]
        await trio.sleep(1.0)
        await db.wait_connected()
    assert attempts[5:] == pytest.approx([1.75, 1.80])
    assert events(logs) == [
        ("warning", "database unreachable"),
        ("info", "database reachable again"),
        ("warning", "database unreachable"),
        ("info", "database reachable again"),
    ]
    assert logs[1]["attempts"] == 4 and logs[1]["down_for_s"] == pytest.approx(0.75)
    assert all(entry["actor"] == "ledger" for entry in logs)


# ------------------------------------------------------------------ multi-host URLs


MULTI_HOST = "postgresql://u@h1.example:5432,h2.example:5433/stockade?target_session_attrs=read-write&passfile=/etc/stockade/pgpass"


def test_a_multi_host_url_with_options_is_accepted() -> None:
    assert check_database_url(MULTI_HOST) == MULTI_HOST


def test_asyncpg_reads_every_host_and_the_writable_target_from_a_multi_host_url() -> None:
    """asyncpg takes both hosts and ``target_session_attrs=read-write`` from the URL as given."""
    from asyncpg import connect_utils

    addrs, params = connect_utils._parse_connect_dsn_and_args(  # the parsing asyncpg.connect does
        dsn=MULTI_HOST,
        host=None,
        port=None,
        user=None,
        password=None,
        passfile=None,
        database=None,
        ssl=None,
        direct_tls=None,
        server_settings=None,
        target_session_attrs=None,
        krbsrvname=None,
        gsslib=None,
        service=None,
        servicefile=None,
    )
    assert addrs == [("h1.example", 5432), ("h2.example", 5433)]
    assert params.target_session_attrs.value == "read-write"


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("postgresql://u@a:5432,b:5432/db", {"target_session_attrs": "read-write"}),
        ("postgresql://u@a,b/db?passfile=/x", {"target_session_attrs": "read-write"}),
        ("postgresql:///db?host=a,b", {"target_session_attrs": "read-write"}),
        ("postgresql://u@a:5432,b:5432/db?target_session_attrs=any", {}),
        ("postgresql://u@a:5432/db", {}),
        ("postgresql:///db?host=/run/postgresql", {}),
    ],
)
def test_a_multi_host_url_asks_for_a_writable_server_unless_it_says_otherwise(
    url: str, options: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    assert pg.connect_options(url) == options


# ------------------------------------------------------------------ a pool


class FakeRawConnection:
    async def fetchval(self, sql: str, *args: Any) -> int:
        return 1


class FakeRawPool:
    """asyncpg's pool as PgPool uses it: ``acquire`` refused while ``refusing``."""

    def __init__(self) -> None:
        self.refusing = True
        self.acquires = 0

    async def acquire(self, timeout: float) -> FakeRawConnection:  # noqa: ASYNC109 (asyncpg's signature)
        self.acquires += 1
        if self.refusing:
            raise ConnectionRefusedError(111, "Connect call failed")
        return FakeRawConnection()

    async def release(self, raw: FakeRawConnection) -> None:
        pass


async def test_a_pool_fails_fast_until_its_next_connect_is_due(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the database is unreachable, a borrow before the next connect is due fails at
    once without trying; one after it tries; the first answered call ends the outage. One
    warning and one info in all."""

    async def run_aio(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)  # the fakes are trio-safe coroutines

    monkeypatch.setattr(pg, "run_aio", run_aio)
    monkeypatch.setattr(pg_reconnect, "run_aio", run_aio)
    raw = FakeRawPool()

    async def borrow() -> int:
        async with pool.acquire() as conn:
            return int(await conn.fetchval("SELECT 1"))

    with structlog.testing.capture_logs() as logs:
        pool = pg_reconnect.PgPool(raw, url="postgresql://h/db", owner="ingest")  # type: ignore[arg-type]
        pool.schedule = ReconnectSchedule(rng=Ceiling())
        with pytest.raises(DatabaseUnavailable, match="no database connection"):
            await borrow()
        with pytest.raises(DatabaseUnavailable, match=r"\(1 failed attempts\); next connect in 0.05 s"):
            await borrow()
        assert raw.acquires == 1
        await trio.sleep(0.05)
        with pytest.raises(DatabaseUnavailable, match="no database connection"):
            await borrow()
        assert raw.acquires == 2
        raw.refusing = False
        with pytest.raises(DatabaseUnavailable, match=r"next connect in 0.10 s"):
            await borrow()
        await trio.sleep(0.1)
        assert await borrow() == 1
        assert await borrow() == 1
    assert events(logs) == [("warning", "database unreachable"), ("info", "database reachable again")]
    assert logs[1]["attempts"] == 2


class BreakingRawConnection(FakeRawConnection):
    """A pooled connection whose session the server ended: every call fails as asyncpg's does."""

    def __init__(self) -> None:
        self.terminated = False

    async def fetchval(self, sql: str, *args: Any) -> int:
        raise ConnectionResetError(104, "Connection reset by peer")

    def is_closed(self) -> bool:
        return self.terminated

    def terminate(self) -> None:
        self.terminated = True


async def test_one_lost_pooled_connection_does_not_make_the_next_borrow_wait(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that loses its connection fails (DatabaseUnavailable) and drops that connection,
    but the very next borrow is tried and answered at once: one broken session is not an
    outage of a server that answers. Nothing is logged as unreachable."""

    async def run_aio(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)

    monkeypatch.setattr(pg, "run_aio", run_aio)
    monkeypatch.setattr(pg_reconnect, "run_aio", run_aio)
    raw = FakeRawPool()
    raw.refusing = False
    broken = BreakingRawConnection()
    handed = [broken]

    async def acquire(timeout: float) -> FakeRawConnection:  # noqa: ASYNC109 (asyncpg's signature)
        raw.acquires += 1
        return handed.pop() if handed else FakeRawConnection()

    raw.acquire = acquire  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        pool = pg_reconnect.PgPool(raw, url="postgresql://h/db", owner="ingest")  # type: ignore[arg-type]
        with pytest.raises(DatabaseUnavailable, match="database connection lost"):
            async with pool.acquire() as conn:
                await conn.fetchval("SELECT 1")
        assert broken.terminated
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1
    assert raw.acquires == 2
    assert ("warning", "database unreachable") not in events(logs)


def test_asyncpgs_pool_floor_retries_are_not_logged_once_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool's own retry warning (a traceback per attempt while the database is away) is
    dropped once logging is configured; other asyncpg warnings are kept."""
    log.quiet_pool_floor_retries()
    pool_logger = logging.getLogger("asyncpg.pool")
    with caplog.at_level(logging.WARNING, logger="asyncpg.pool"):
        pool_logger.warning("Failed to restore the pool connection floor; retrying", exc_info=False)
        pool_logger.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]

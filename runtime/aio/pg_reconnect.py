"""The database connections that come back: :class:`ReconnectingConnection` (one owner's,
opened again on the next use after it broke), :class:`ReadStore` (the base of the actors' read
stores), :class:`PgPool` (the ingest's pool) and :func:`open_pool_when_reachable`.

Each waits between failed connects (:class:`runtime.backoff.ReconnectSchedule`: from 50 ms up
to 2 s, full jitter, reset by a success) and logs each change of the database's reachability
once (:class:`runtime.outage.OutageLog`), not each attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from runtime import log, metrics
from runtime.aio.bridge import CLEANUP_DEADLINE_S, run_aio
from runtime.aio.pg import (
    CALL_MARGIN_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    PgConnection,
    connect_raw,
    finish_shielded,
    set_keepalives,
    unreachable_errors,
)
from runtime.backoff import ReconnectSchedule
from runtime.errors import DatabaseUnavailable
from runtime.outage import OutageLog
from runtime.settings.fields import DEFAULT_READ_STATEMENT_TIMEOUT_S, session_ms

if TYPE_CHECKING:
    import asyncpg

DEFAULT_CALL_TIMEOUT_S = 10.0
"""Longest a call of a :class:`ReconnectingConnection` or a :class:`PgPool` may go unanswered
when its owner sets no bound of its own, in seconds."""


class ReconnectingConnection:
    """One owner's connection: opened on first use, and again on the next use after it broke
    (a :class:`DatabaseUnavailable` leaves it closed); :meth:`get` waits out the schedule after
    a failed connect, and the reachability is logged once per change (module docstring).

    Args:
        url: the database URL.
        server_settings: PostgreSQL session settings for every connection it opens.
        owner: names the owner in the log (its ``actor``), e.g. ``"ledger"``.
        connect_timeout_s: longest one connect may take, in seconds.
        call_timeout_s: longest one call may go unanswered, in seconds (None: no bound).
        schedule: the waits between failed connects (a test passes one with a seeded rng).
    """

    def __init__(
        self,
        url: str,
        server_settings: dict[str, str],
        *,
        owner: str = "database",
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
        schedule: ReconnectSchedule | None = None,
    ) -> None:
        self._url = url
        self._server_settings = server_settings
        self._connect_timeout_s = connect_timeout_s
        self._call_timeout_s = call_timeout_s
        self._conn: PgConnection | None = None
        self.schedule = schedule or ReconnectSchedule()
        self.outage = OutageLog(log.get(owner), url)

    def _outcome(self, error: BaseException | None) -> None:
        if error is None:
            self.outage.succeeded()
        else:
            self.outage.failed(error)

    async def get(self) -> PgConnection:
        """The open connection, connecting first if needed (after the schedule's wait).

        Raises:
            DatabaseUnavailable: the server could not be reached.
            DatabaseRefused: it refused this client for good.
        """
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        if self.schedule.next_attempt_at > trio.current_time():
            await trio.sleep_until(self.schedule.next_attempt_at)
        try:
            self._conn = await PgConnection.connect(
                self._url,
                server_settings=self._server_settings,
                connect_timeout_s=self._connect_timeout_s,
                call_timeout_s=self._call_timeout_s,
                on_outcome=self._outcome,
            )
        except DatabaseUnavailable as exc:
            self.schedule.failed(trio.current_time())
            self.outage.failed(exc)
            raise
        except trio.Cancelled:
            # The caller's deadline ended the connect: a failed attempt all the same, or a
            # frozen server would be retried without backoff and its outage never logged.
            self.schedule.failed(trio.current_time())
            self.outage.failed("no answer to the connect within its caller's deadline")
            raise
        self.schedule.succeeded()
        self.outage.succeeded()
        return self._conn

    async def wait_connected(self) -> PgConnection:
        """:meth:`get` again and again until it connects (cancel to give up).

        Raises:
            DatabaseRefused: the server refused this client for good.
        """
        while True:
            try:
                return await self.get()
            except DatabaseUnavailable:
                pass  # logged by the outage log; get() waits before the next attempt

    async def close(self) -> None:
        """Close it (shielded, see :meth:`PgConnection.close`); the next :meth:`get` reopens."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


async def _keep_session(connection: asyncpg.Connection) -> None:
    """A pool's reset that sends nothing (asyncpg has rolled back any open transaction)."""


async def _set_keepalives_on(raw: Any) -> None:
    """A pool's ``init``: :func:`runtime.aio.pg.set_keepalives` on each connection it opens."""
    set_keepalives(raw)


@attrs.define
class ReadStore:
    """The base of the actors' read stores: reads on a :class:`ReconnectingConnection` of its
    own, each bounded by ``statement_timeout_s`` on the server and ``+ CALL_MARGIN_S`` on the
    client (subclasses add their queries, and may add session settings).

    Args:
        database_url: the database URL.
        application_name: the connection's name in ``pg_stat_activity`` and in the log.
        statement_timeout_s: longest one read may run (the session's ``statement_timeout``).
    """

    database_url: str
    application_name: str
    statement_timeout_s: float = DEFAULT_READ_STATEMENT_TIMEOUT_S
    _db: ReconnectingConnection = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._db = ReconnectingConnection(
            self.database_url,
            self.server_settings(),
            owner=self.application_name,
            call_timeout_s=self.statement_timeout_s + CALL_MARGIN_S,
        )

    def server_settings(self) -> dict[str, str]:
        """The PostgreSQL session settings of the store's connection."""
        return {
            "application_name": self.application_name,
            "statement_timeout": session_ms(self.statement_timeout_s),
        }

    async def _connection(self) -> PgConnection:
        return await self._db.get()

    async def close(self) -> None:
        """Close the connection (shielded); a later read opens another."""
        await self._db.close()


class PgPool:
    """A small asyncpg pool shared by concurrent request handlers (the ingest actor).

    While the database is unreachable, an acquire within the schedule's wait fails at once, so
    a flood of requests is not a flood of connects. Only a failed connect starts that wait: a
    call that loses its connection drops that one (``stockade_database_connections_lost``),
    and the next borrow opens another.
    """

    def __init__(
        self,
        raw: asyncpg.Pool,
        *,
        url: str = "",
        owner: str = "database",
        call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
        acquire_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        self._raw = raw
        self._owner = owner
        self._call_timeout_s = call_timeout_s
        self._acquire_timeout_s = acquire_timeout_s
        self.schedule = ReconnectSchedule()
        self.outage = OutageLog(log.get(owner), url)

    @classmethod
    async def create(
        cls,
        url: str,
        *,
        size: int,
        server_settings: dict[str, str] | None = None,
        min_size: int = 1,
        idle_close_s: float = 300.0,
        reset_on_release: bool = True,
        owner: str = "database",
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
    ) -> PgPool:
        """A pool of up to ``size`` connections to ``url``, ``min_size`` of them opened now,
        each with TCP keepalives (:func:`set_keepalives`).

        Args:
            idle_close_s: a connection unused this long is closed, in seconds (0: never).
            reset_on_release: send asyncpg's reset query (``RESET ALL``...) when a connection
                is given back, one more round trip; False for owners that change no session
                state (an open transaction is rolled back either way).
            connect_timeout_s: longest one connect (and one acquire) may take, in seconds.
            owner, call_timeout_s: as :class:`ReconnectingConnection`'s.

        Raises:
            DatabaseUnavailable: the server could not be reached.
            DatabaseRefused: it refused this client for good.
        """
        import asyncpg

        raw = await connect_raw(
            asyncpg.create_pool,
            url,
            min_size=min_size,
            max_size=size,
            max_inactive_connection_lifetime=idle_close_s,
            server_settings=server_settings or {},
            timeout=connect_timeout_s,
            reset=None if reset_on_release else _keep_session,
            init=_set_keepalives_on,
        )
        assert raw is not None
        return cls(
            raw, url=url, owner=owner, call_timeout_s=call_timeout_s, acquire_timeout_s=connect_timeout_s
        )

    def _outcome(self, error: BaseException | None) -> None:
        """A connect ended (``error`` None: it succeeded)."""
        if error is None:
            self.schedule.succeeded()
            self.outage.succeeded()
        else:
            self.schedule.failed(trio.current_time())
            self.outage.failed(error)

    def _call_outcome(self, error: BaseException | None) -> None:
        """A call on a borrowed connection ended. An answer ends an outage; a lost connection
        counts against that connection only (waiting on every borrow for one broken connection
        would fail the heartbeats of a healthy server)."""
        if error is None:
            self._outcome(None)
        else:
            metrics.DATABASE_CONNECTIONS_LOST.labels(self._owner).inc()

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[PgConnection]:
        """Borrow a connection for the body of the block.

        Raises:
            DatabaseUnavailable: no connection within ``connect_timeout_s``, or the database
                is unreachable and the next connect is not due yet.
        """
        wait_s = self.schedule.next_attempt_at - trio.current_time()
        if self.outage.is_down and wait_s > 0:
            raise DatabaseUnavailable(
                f"database unreachable ({self.outage.attempts} failed attempts); "
                f"next connect in {wait_s:.2f} s"
            )
        try:
            raw = await run_aio(self._raw.acquire, timeout=self._acquire_timeout_s)
        except unreachable_errors() as exc:
            self._outcome(exc)
            raise DatabaseUnavailable(f"no database connection: {exc!r}") from exc
        try:
            yield PgConnection(raw, call_timeout_s=self._call_timeout_s, on_outcome=self._call_outcome)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S):
                try:
                    await run_aio(self._raw.release, raw)
                except Exception:
                    raw.terminate()

    async def close(self) -> None:
        """Close every connection, shielded; terminate what does not close in time."""
        await finish_shielded(self._raw.close, self._raw.terminate)


async def open_pool_when_reachable(
    url: str, *, owner: str, schedule: ReconnectSchedule | None = None, **options: Any
) -> PgPool:
    """:meth:`PgPool.create` (with ``options``) again and again until the database answers,
    waiting as ``schedule`` says and logging the outage once per change.

    Raises:
        DatabaseRefused: the server refused this client for good.
    """
    schedule = schedule or ReconnectSchedule()
    outage = OutageLog(log.get(owner), url)
    while True:
        try:
            pool = await PgPool.create(url, owner=owner, **options)
        except DatabaseUnavailable as exc:
            outage.failed(exc)
            await trio.sleep(schedule.failed(trio.current_time()))
            continue
        outage.succeeded()
        return pool

"""PostgreSQL from trio: asyncpg connections and pools behind the bridge.

:class:`PgConnection` is one owner's connection, :class:`ReconnectingConnection` opens it
again after it broke, :class:`ReadStore` is the base of the actors' read stores and
:class:`PgPool` the pool the ingest actor's handlers share. Errors are translated here: a broken
connection becomes :class:`runtime.errors.DatabaseUnavailable`, a statement the server gave up
on :class:`runtime.errors.DatabaseBusy`, a broken unique index
:class:`runtime.errors.DuplicateKey`. A trio cancel that lands inside an asyncpg call
terminates the connection; close, release and rollback are shielded, with a deadline of their
own (:data:`runtime.aio.bridge.CLEANUP_DEADLINE_S`).

asyncpg is imported when first needed, inside the functions that use it, not with this module.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from runtime.aio.bridge import CLEANUP_DEADLINE_S, connection_errors, run_aio
from runtime.errors import DatabaseBusy, DatabaseRefused, DatabaseUnavailable, DuplicateKey
from runtime.settings import DEFAULT_READ_STATEMENT_TIMEOUT_S, session_ms

if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool
    from asyncpg import Record

T = TypeVar("T")


@functools.cache
def refused_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean the server refused this client for good (class 28 SQLSTATEs:
    password, role; 3D000: no such database; a URL asyncpg cannot use)."""
    import asyncpg

    return (
        asyncpg.exceptions.InvalidAuthorizationSpecificationError,
        asyncpg.exceptions.InvalidCatalogNameError,
        asyncpg.exceptions.ClientConfigurationError,
    )


def refused_message(exc: BaseException) -> str:
    """One line for a refusal of :func:`refused_errors`."""
    return f"the database refused this client ({type(exc).__name__}): {exc}; retrying cannot help"


def _busy_errors() -> tuple[type[BaseException], ...]:
    """The server gave up on one statement (statement_timeout, lock_timeout, a deadlock
    victim): the connection is still good, the caller may try again."""
    import asyncpg

    return (
        asyncpg.exceptions.QueryCanceledError,
        asyncpg.exceptions.LockNotAvailableError,
        asyncpg.exceptions.DeadlockDetectedError,
    )


class PgConnection:
    """One asyncpg connection owned by one actor, callable from trio.

    Create with :meth:`connect`; every method may raise :class:`DatabaseUnavailable` when the
    connection breaks (the owner then closes it and connects again), :class:`DatabaseBusy` when
    the server gave up on the statement, and :class:`DuplicateKey` when it broke a unique index.
    Other SQL errors propagate as asyncpg's own ``PostgresError`` subclasses.
    """

    def __init__(self, raw: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> None:
        self._raw: Any = raw

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        server_settings: dict[str, str] | None = None,
        connect_timeout_s: float = 5.0,
    ) -> PgConnection:
        """Connect to ``url``; ``server_settings`` are PostgreSQL session settings.

        Raises:
            DatabaseUnavailable: the server could not be reached in ``connect_timeout_s``.
            DatabaseRefused: it refused this client for good (password, role, database, URL).
        """
        import asyncpg

        try:
            raw = await run_aio(
                asyncpg.connect,
                url,
                server_settings=server_settings or {},
                timeout=connect_timeout_s,
                statement_cache_size=256,
            )
        except refused_errors() as exc:
            raise DatabaseRefused(refused_message(exc)) from exc
        except connection_errors() as exc:
            raise DatabaseUnavailable(f"cannot connect to the database: {exc!r}") from exc
        return cls(raw)

    @property
    def backend_pid(self) -> int:
        """The PostgreSQL server process id serving this session."""
        return int(self._raw.get_server_pid())

    def is_closed(self) -> bool:
        import asyncpg

        try:
            return bool(self._raw.is_closed())
        except asyncpg.exceptions.InterfaceError:
            # A pooled connection that was terminated has been handed back to its pool
            # already: its proxy answers nothing any more.
            return True

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        import asyncpg

        try:
            return await run_aio(fn, *args)
        except connection_errors() as exc:
            self.terminate()
            raise DatabaseUnavailable(f"database connection lost: {exc!r}") from exc
        except asyncpg.exceptions.ReadOnlySQLTransactionError as exc:
            # SQLSTATE 25006: this server is a standby now (an old primary after a failover):
            # drop the connection, so the next one finds the writable server.
            self.terminate()
            raise DatabaseUnavailable(f"the database is read-only (a standby?): {exc}") from exc
        except _busy_errors() as exc:
            raise DatabaseBusy(f"database busy: {exc!r}", retry_after_s=0.05) from exc
        except asyncpg.exceptions.UniqueViolationError as exc:
            raise DuplicateKey(exc.constraint_name or "", str(exc)) from exc

    async def fetch(self, sql: str, *args: Any) -> list[Record]:
        """Rows of ``sql``."""
        try:
            return await self._call(self._raw.fetch, sql, *args)
        except trio.Cancelled:
            self.terminate()
            raise

    async def fetchrow(self, sql: str, *args: Any) -> Record | None:
        """The first row of ``sql``, or None."""
        try:
            return await self._call(self._raw.fetchrow, sql, *args)
        except trio.Cancelled:
            self.terminate()
            raise

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row of ``sql``, or None."""
        try:
            return await self._call(self._raw.fetchval, sql, *args)
        except trio.Cancelled:
            self.terminate()
            raise

    async def execute(self, sql: str, *args: Any) -> str:
        """Run ``sql``; returns the command tag (``"UPDATE 3"``)."""
        try:
            return await self._call(self._raw.execute, sql, *args)
        except trio.Cancelled:
            self.terminate()
            raise

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgConnection]:
        """``BEGIN`` ... ``COMMIT`` around the body; ``ROLLBACK`` (shielded) when it raises.

        Raises:
            DatabaseUnavailable: the connection broke, including at COMMIT. A COMMIT whose
                answer was lost is ambiguous: the caller must not assume it failed.
        """
        await self.execute("BEGIN")
        try:
            yield self
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S) as scope:
                if not self.is_closed():
                    try:
                        await run_aio(self._raw.execute, "ROLLBACK")
                    except Exception:
                        self.terminate()
            if scope.cancelled_caught:
                self.terminate()
            raise
        await self.execute("COMMIT")

    async def close(self) -> None:
        """Close, shielded from cancellation; terminates if a clean close takes too long."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S) as scope:
            if not self.is_closed():
                try:
                    await run_aio(self._raw.close)
                except Exception:
                    self.terminate()
        if scope.cancelled_caught:
            self.terminate()

    def terminate(self) -> None:
        """Drop the connection at once (no goodbye to the server); idempotent."""
        if not self.is_closed():
            self._raw.terminate()


class ReconnectingConnection:
    """One owner's connection: opened on first use, and again on the next use after it broke
    (a :class:`DatabaseUnavailable` leaves it closed).

    Args:
        url: the database URL.
        server_settings: PostgreSQL session settings for every connection it opens.
    """

    def __init__(self, url: str, server_settings: dict[str, str]) -> None:
        self._url = url
        self._server_settings = server_settings
        self._conn: PgConnection | None = None

    async def get(self) -> PgConnection:
        """The open connection, connecting first if needed.

        Raises:
            DatabaseUnavailable: the server could not be reached.
        """
        if self._conn is None or self._conn.is_closed():
            self._conn = await PgConnection.connect(self._url, server_settings=self._server_settings)
        return self._conn

    async def close(self) -> None:
        """Close it (shielded, see :meth:`PgConnection.close`); the next :meth:`get` reopens."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


async def _keep_session(connection: asyncpg.Connection) -> None:
    """A pool's reset that sends nothing (asyncpg has rolled back any open transaction)."""


@attrs.define
class ReadStore:
    """A decider's reads on a connection of its own, opened on first use and again after a
    failure, each read bounded by ``statement_timeout_s``: the base of the actors' database
    stores (subclasses add their queries, and may add session settings).

    Args:
        database_url: the database URL.
        application_name: the connection's name in ``pg_stat_activity``.
        statement_timeout_s: longest one read may run (the session's ``statement_timeout``).
    """

    database_url: str
    application_name: str
    statement_timeout_s: float = DEFAULT_READ_STATEMENT_TIMEOUT_S
    _db: ReconnectingConnection = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._db = ReconnectingConnection(self.database_url, self.server_settings())

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
    """A small asyncpg pool shared by concurrent request handlers (the ingest actor)."""

    def __init__(self, raw: asyncpg.Pool) -> None:
        self._raw = raw

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
    ) -> PgPool:
        """A pool of up to ``size`` connections to ``url``, ``min_size`` of them opened now.

        Args:
            url: the database URL.
            size: most connections open at once.
            server_settings: PostgreSQL session settings of every connection.
            min_size: connections opened at once and kept open.
            idle_close_s: a connection unused this long is closed, in seconds (0: never).
            reset_on_release: send asyncpg's reset query (``RESET ALL``, ``UNLISTEN *``,
                ``CLOSE ALL``, advisory locks released) when a connection is given back: one
                more round trip per borrow. False skips it, for owners whose work changes no
                session state; an open transaction is rolled back either way.

        Raises:
            DatabaseUnavailable: the server could not be reached.
        """
        import asyncpg

        try:
            raw = await run_aio(
                asyncpg.create_pool,
                url,
                min_size=min_size,
                max_size=size,
                max_inactive_connection_lifetime=idle_close_s,
                server_settings=server_settings or {},
                timeout=5.0,
                reset=None if reset_on_release else _keep_session,
            )
        except refused_errors() as exc:
            raise DatabaseRefused(refused_message(exc)) from exc
        except connection_errors() as exc:
            raise DatabaseUnavailable(f"cannot connect to the database: {exc!r}") from exc
        assert raw is not None
        return cls(raw)

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[PgConnection]:
        """Borrow a connection for the body of the block.

        Raises:
            DatabaseUnavailable: no connection could be had within 5 s.
        """
        try:
            raw = await run_aio(self._raw.acquire, timeout=5.0)
        except connection_errors() as exc:
            raise DatabaseUnavailable(f"no database connection: {exc!r}") from exc
        try:
            yield PgConnection(raw)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S):
                try:
                    await run_aio(self._raw.release, raw)
                except Exception:
                    raw.terminate()

    async def close(self) -> None:
        """Close every connection, shielded; terminate what does not close in time."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S) as scope:
            try:
                await run_aio(self._raw.close)
            except Exception:
                self._raw.terminate()
        if scope.cancelled_caught:
            self._raw.terminate()

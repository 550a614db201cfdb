"""PostgreSQL from trio: asyncpg connections and pools behind the bridge.

:class:`PgConnection` is one owner's connection, :class:`ReconnectingConnection` opens it
again after it broke, :class:`ReadStore` is the base of the actors' read stores and
:class:`PgPool` the pool the ingest actor's handlers share. Errors are translated here: a broken
connection becomes :class:`runtime.errors.DatabaseUnavailable`, a statement the server gave up
on :class:`runtime.errors.DatabaseBusy`, a broken unique index
:class:`runtime.errors.DuplicateKey`. A trio cancel that lands inside an asyncpg call
terminates the connection; close, release and rollback are shielded, with a deadline of their
own (:data:`runtime.aio.bridge.CLEANUP_DEADLINE_S`).

Nothing waits on a dead server for long:

- Every connect is bounded (``connect_timeout_s``, asyncpg's ``timeout``), and so is every
  call (``call_timeout_s``, a trio deadline): a call unanswered by then terminates its
  connection and raises :class:`DatabaseUnavailable`. The read stores and the lease keeper
  set it a margin (:data:`CALL_MARGIN_S`) above their session's ``statement_timeout``, so the
  server's own timeout (a :class:`DatabaseBusy`, connection kept) comes first while the
  server lives; the ledger and the ingest, whose work is bounded as a whole by their
  ``answer_timeout_s`` already, bound each call by that too. The
  deadline is trio's, not asyncpg's ``command_timeout``: on its timeout asyncpg asks the server
  to cancel the statement over a new connection, one more connect to a server that answers
  nothing.
- Every TCP connection has keepalives (:func:`set_keepalives`): an idle connection to a
  server that vanished without a reset (a frozen host, a cut network) is found broken within
  about ``KEEPALIVE_IDLE_S + KEEPALIVE_COUNT * KEEPALIVE_INTERVAL_S`` seconds, and one whose
  sent data goes unacknowledged within ``TCP_USER_TIMEOUT_S`` (Linux). libpq's ``keepalives*``
  URL options do not apply to asyncpg; these are set on the socket after connecting.
- A multi-host URL (``postgresql://u@a:5432,b:5432/db``) connects to a writable server:
  ``target_session_attrs=read-write`` unless the URL (or ``PGTARGETSESSIONATTRS``) asks for
  something else, so the connection opened after a read-only server dropped one (SQLSTATE
  25006, see :meth:`PgConnection._call`) goes to the new primary.
- :meth:`PgConnection.run_in_transaction` runs a transaction function once more, from its
  start, when a schema change invalidated a statement cached on the connection ("cached plan
  must not change result type"); a statement inside a transaction is never retried alone.
- :class:`ReconnectingConnection` and :class:`PgPool` wait between failed connects
  (:class:`runtime.backoff.ReconnectSchedule`: from 50 ms up to 2 s, full jitter, reset by a
  success) and log each change of the database's reachability once
  (:class:`runtime.outage.OutageLog`), not each attempt.

asyncpg is imported when first needed, inside the functions that use it, not with this module.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from runtime import log, metrics
from runtime.aio.bridge import CLEANUP_DEADLINE_S, connection_errors, run_aio
from runtime.backoff import ReconnectSchedule
from runtime.errors import DatabaseBusy, DatabaseRefused, DatabaseUnavailable, DuplicateKey
from runtime.outage import OutageLog
from runtime.settings.fields import (
    DEFAULT_READ_STATEMENT_TIMEOUT_S,
    session_ms,
)

if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool
    from asyncpg import Record

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""Longest a connect may take (TCP, TLS, authentication, session settings), in seconds."""
DEFAULT_CALL_TIMEOUT_S = 10.0
"""Longest a call of a :class:`ReconnectingConnection` or a :class:`PgPool` may go unanswered
when its owner sets no bound of its own, in seconds."""
CALL_MARGIN_S = 2.0
"""How much longer than its session's ``statement_timeout`` an owner lets a call go unanswered
before taking the connection for dead, in seconds: room for the server's cancel, a slow commit
(an fsync) and the network."""

KEEPALIVE_IDLE_S = 5
"""Seconds a TCP connection is idle before the first keepalive probe (``TCP_KEEPIDLE``)."""
KEEPALIVE_INTERVAL_S = 2
"""Seconds between unanswered keepalive probes (``TCP_KEEPINTVL``)."""
KEEPALIVE_COUNT = 3
"""Unanswered probes after which the kernel drops the connection (``TCP_KEEPCNT``)."""
TCP_USER_TIMEOUT_S = 10
"""Seconds sent data may stay unacknowledged before the kernel drops the connection
(``TCP_USER_TIMEOUT``, Linux; it bounds a call to a frozen server even without our deadline)."""

_STALE_STATEMENT_ERRORS = ("InvalidCachedStatementError", "OutdatedSchemaCacheError")


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


@functools.cache
def unreachable_errors() -> tuple[type[BaseException], ...]:
    """The errors of a connect that may pass: :func:`runtime.aio.bridge.connection_errors`,
    and no host of a multi-host URL being writable (during a failover)."""
    import asyncpg

    return (*connection_errors(), asyncpg.exceptions.TargetServerAttributeNotMatched)


@functools.cache
def stale_statement_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean a schema change invalidated a statement (or type) asyncpg had
    cached: SQLSTATE 0A000 "cached plan must not change result type" after an ``ALTER TABLE``
    (``InvalidCachedStatementError``), or a changed composite type. Outside a transaction
    asyncpg prepares the statement again itself; inside one the transaction is aborted and
    must run again whole (:meth:`PgConnection.run_in_transaction`)."""
    import asyncpg

    return tuple(getattr(asyncpg.exceptions, name) for name in _STALE_STATEMENT_ERRORS)


def hosts_of(url: str) -> list[str]:
    """The ``host[:port]`` items a database URL names (several in a multi-host URL), from its
    authority or its ``host=`` query option; empty when it names none."""
    rest = url.partition("://")[2]
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    hosts = netloc.rpartition("@")[2]
    items = hosts.split(",") if hosts else []
    query = rest.partition("?")[2]
    for option in query.split("&") if query else []:
        key, _, value = option.partition("=")
        if key == "host" and value:
            items = value.split(",")
    return items


def connect_options(url: str) -> dict[str, Any]:
    """asyncpg ``connect`` options that ``url`` implies: ``target_session_attrs="read-write"``
    for a URL naming several hosts that does not choose one itself (nor does
    ``PGTARGETSESSIONATTRS``), so that a control plane never settles on a standby."""
    query = url.partition("?")[2]
    chosen = any(option.partition("=")[0] == "target_session_attrs" for option in query.split("&"))
    if len(hosts_of(url)) > 1 and not chosen and not os.environ.get("PGTARGETSESSIONATTRS"):
        return {"target_session_attrs": "read-write"}
    return {}


def set_keepalives(raw: Any) -> None:
    """Turn on TCP keepalives (and ``TCP_USER_TIMEOUT`` on Linux) on the socket of the asyncpg
    connection ``raw``; a Unix-socket connection is left as it is. See the module docstring
    for the values and why."""
    transport = getattr(raw, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", TCP_USER_TIMEOUT_S * 1000),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # not every platform has each of them
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


async def _set_keepalives_on(raw: Any) -> None:
    """A pool's ``init``: :func:`set_keepalives` on each connection it opens."""
    set_keepalives(raw)


Outcome = Callable[[BaseException | None], None]
"""Told how each call ended: None when the server answered (whatever it said), else the error
that broke the connection."""


class PgConnection:
    """One asyncpg connection owned by one actor, callable from trio.

    Create with :meth:`connect`; every method may raise :class:`DatabaseUnavailable` when the
    connection breaks or a call goes unanswered for ``call_timeout_s`` (the owner then closes
    it and connects again), :class:`DatabaseBusy` when the server gave up on the statement,
    and :class:`DuplicateKey` when it broke a unique index. Other SQL errors propagate as
    asyncpg's own ``PostgresError`` subclasses.

    Args:
        raw: the asyncpg connection (or a pool's proxy of one).
        call_timeout_s: longest one call may go unanswered, in seconds. None: no bound, for
            operator tools whose statements may run long (the checker, the benchmarks);
            every control-plane owner passes one (:class:`ReconnectingConnection`,
            :class:`PgPool`, the schema's connection).
        on_outcome: told how each call ended (see :data:`Outcome`); None: nobody.
    """

    def __init__(
        self,
        raw: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        *,
        call_timeout_s: float | None = None,
        on_outcome: Outcome | None = None,
    ) -> None:
        self._raw: Any = raw
        self.call_timeout_s = call_timeout_s
        self._on_outcome = on_outcome

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        server_settings: dict[str, str] | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        call_timeout_s: float | None = None,
        on_outcome: Outcome | None = None,
    ) -> PgConnection:
        """Connect to ``url``; ``server_settings`` are PostgreSQL session settings. The
        connection gets TCP keepalives (:func:`set_keepalives`) and, for a multi-host URL, goes
        to a writable server (:func:`connect_options`).

        Args:
            url: the database URL.
            server_settings: PostgreSQL session settings.
            connect_timeout_s: longest the connect may take, in seconds.
            call_timeout_s: longest each later call may go unanswered, in seconds (None: no
                bound).
            on_outcome: told how each later call ended.

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
                **connect_options(url),
            )
        except refused_errors() as exc:
            raise DatabaseRefused(refused_message(exc)) from exc
        except unreachable_errors() as exc:
            raise DatabaseUnavailable(f"cannot connect to the database: {exc!r}") from exc
        set_keepalives(raw)
        return cls(raw, call_timeout_s=call_timeout_s, on_outcome=on_outcome)

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

    def _lost(self, exc: BaseException) -> None:
        self.terminate()
        if self._on_outcome is not None:
            self._on_outcome(exc)

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        import asyncpg

        limit_s = self.call_timeout_s
        with trio.move_on_after(limit_s if limit_s is not None else float("inf")):
            try:
                result = await run_aio(fn, *args)
            except connection_errors() as exc:
                self._lost(exc)
                raise DatabaseUnavailable(f"database connection lost: {exc!r}") from exc
            except asyncpg.exceptions.ReadOnlySQLTransactionError as exc:
                # SQLSTATE 25006: this server is a standby now (an old primary after a failover):
                # drop the connection, so the next one finds the writable server.
                self._lost(exc)
                raise DatabaseUnavailable(f"the database is read-only (a standby?): {exc}") from exc
            except _busy_errors() as exc:
                self._answered()
                raise DatabaseBusy(f"database busy: {exc!r}", retry_after_s=0.05) from exc
            except asyncpg.exceptions.UniqueViolationError as exc:
                self._answered()
                raise DuplicateKey(exc.constraint_name or "", str(exc)) from exc
            except asyncpg.exceptions.PostgresError:
                self._answered()
                raise
            self._answered()
            return result
        # The call was cancelled at the deadline: its protocol state is unknown, so the
        # connection goes.
        unanswered = DatabaseUnavailable(
            f"the database did not answer within call_timeout_s = {limit_s:g} s; connection dropped"
        )
        self._lost(unanswered)
        raise unanswered

    def _answered(self) -> None:
        if self._on_outcome is not None:
            self._on_outcome(None)

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

        A body that may meet a statement invalidated by a schema change should be a function
        run by :meth:`run_in_transaction` instead, which runs it again whole.

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

    async def run_in_transaction(self, body: Callable[[PgConnection], Awaitable[T]], *, what: str) -> T:
        """``body(self)`` in one transaction (:meth:`transaction`); when a schema change
        invalidated a statement cached on this connection (:func:`stale_statement_errors`),
        the transaction is rolled back, the connection's statement and type caches are
        cleared, and ``body`` runs once more from its start in a new transaction. A statement
        is never retried on its own: the first run's earlier statements were rolled back with
        it, and ``body`` may have decided on what they returned.

        Args:
            body: the transaction's statements; may run twice, so it must not act outside
                the database before it returns.
            what: names the transaction in the retry's log line and in
                ``stockade_database_transaction_retries{what}``.

        Raises:
            DatabaseUnavailable: as :meth:`transaction`.
            Whatever ``body`` raises, the stale-statement error included when the second run
            meets it too.
        """
        try:
            async with self.transaction():
                return await body(self)
        except stale_statement_errors() as exc:
            log.get("pg").info(
                "transaction run again after a schema change",
                what=what,
                error=f"{type(exc).__name__}: {exc}",
                sqlstate=getattr(exc, "sqlstate", None),
            )
            metrics.DATABASE_TRANSACTION_RETRIES.labels(what).inc()
            if not self.is_closed():
                await run_aio(self._raw.reload_schema_state)
        async with self.transaction():
            return await body(self)

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

    After a failed connect the next one waits (:class:`runtime.backoff.ReconnectSchedule`:
    below 50 ms at first, growing to at most 2 s, jittered, reset by a success); :meth:`get`
    sleeps until then. Failed connects and calls, and the first success after them, are
    logged once per change (:class:`runtime.outage.OutageLog`, on the owner's logger).

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
        """The open connection, connecting first if needed (after the wait a failed connect
        asked for, if it has not passed yet).

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
            # The caller's own deadline ended the connect first (the lease keeper bounds each
            # probe by its statement timeout): a failed attempt all the same, or a frozen
            # server would be retried without backoff and its outage never logged.
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


@attrs.define
class ReadStore:
    """A decider's reads on a connection of its own, opened on first use and again after a
    failure (with backoff, see :class:`ReconnectingConnection`), each read bounded by
    ``statement_timeout_s`` on the server and ``statement_timeout_s + CALL_MARGIN_S`` on the
    client: the base of the actors' database stores (subclasses add their queries, and may
    add session settings).

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

    asyncpg opens a pooled connection again when one that broke is next acquired. While the
    database is unreachable, an acquire within the wait a failed one asked for
    (:class:`runtime.backoff.ReconnectSchedule`) fails at once instead of trying to connect,
    so a flood of requests does not become a flood of connects; the reachability is logged
    once per change (:class:`runtime.outage.OutageLog`, on the ``owner``'s logger). Only a
    failed connect starts that wait: a call that loses its connection drops that one
    connection (``stockade_database_connections_lost``), and the next borrow opens another.
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
            url: the database URL.
            size: most connections open at once.
            server_settings: PostgreSQL session settings of every connection.
            min_size: connections opened at once and kept open.
            idle_close_s: a connection unused this long is closed, in seconds (0: never).
            reset_on_release: send asyncpg's reset query (``RESET ALL``, ``UNLISTEN *``,
                ``CLOSE ALL``, advisory locks released) when a connection is given back: one
                more round trip per borrow. False skips it, for owners whose work changes no
                session state; an open transaction is rolled back either way.
            owner: names the owner in the log (its ``actor``).
            connect_timeout_s: longest one connect (and one acquire) may take, in seconds.
            call_timeout_s: longest one call may go unanswered, in seconds (None: no bound).

        Raises:
            DatabaseUnavailable: the server could not be reached.
            DatabaseRefused: it refused this client for good.
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
                timeout=connect_timeout_s,
                reset=None if reset_on_release else _keep_session,
                init=_set_keepalives_on,
                **connect_options(url),
            )
        except refused_errors() as exc:
            raise DatabaseRefused(refused_message(exc)) from exc
        except unreachable_errors() as exc:
            raise DatabaseUnavailable(f"cannot connect to the database: {exc!r}") from exc
        assert raw is not None
        return cls(
            raw, url=url, owner=owner, call_timeout_s=call_timeout_s, acquire_timeout_s=connect_timeout_s
        )

    def _outcome(self, error: BaseException | None) -> None:
        """A connect (an acquire that opened a connection) or a call ended: ``error`` None, it
        was answered."""
        if error is None:
            self.schedule.succeeded()
            self.outage.succeeded()
        else:
            self.schedule.failed(trio.current_time())
            self.outage.failed(error)

    def _call_outcome(self, error: BaseException | None) -> None:
        """A call on a borrowed connection ended. An answer ends an outage; a lost connection
        (reset, unanswered within its call timeout, a session the server ended, a standby)
        is dropped by :class:`PgConnection` and counts against that connection only: the
        next borrow opens another, and a failed connect then starts the outage's wait. Making
        every borrow wait for one broken connection would fail the heartbeats of a healthy
        server (asyncpg leaves a connection whose session the server ended, e.g. by
        ``idle_in_transaction_session_timeout``, unusable: "cannot switch to state ...")."""
        if error is None:
            self._outcome(None)
        else:
            metrics.DATABASE_CONNECTIONS_LOST.labels(self._owner).inc()

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[PgConnection]:
        """Borrow a connection for the body of the block.

        Raises:
            DatabaseUnavailable: no connection could be had within ``connect_timeout_s``, or
                the database is unreachable and the next connect is not due yet.
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
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S) as scope:
            try:
                await run_aio(self._raw.close)
            except Exception:
                self._raw.terminate()
        if scope.cancelled_caught:
            self._raw.terminate()


async def open_pool_when_reachable(
    url: str, *, owner: str, schedule: ReconnectSchedule | None = None, **options: Any
) -> PgPool:
    """:meth:`PgPool.create` again and again until the database answers, waiting between
    attempts as ``schedule`` says (default: :class:`runtime.backoff.ReconnectSchedule`) and
    logging the outage once per change; ``options`` go to :meth:`PgPool.create`.

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

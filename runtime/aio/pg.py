"""PostgreSQL from trio: one owner's asyncpg connection behind the bridge (:class:`PgConnection`).

Errors are translated here (see :class:`PgConnection`); a trio cancel inside an asyncpg call
terminates the connection; close and rollback are shielded, with a deadline of their own. The
owners that connect again: :mod:`runtime.aio.pg_reconnect`. Why each wait is bounded as it is:
docs/design.md, "Database connections from trio: every wait bounded". asyncpg is imported when
first needed.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from runtime import log, metrics
from runtime.aio.bridge import CLEANUP_DEADLINE_S, connection_errors, run_aio
from runtime.errors import (
    DatabaseBusy,
    DatabaseRefused,
    DatabaseUnavailable,
    DuplicateKey,
    FailedPrecondition,
    InvalidArgument,
)

if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool
    from asyncpg import Record

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""Longest a connect may take (TCP, TLS, authentication, session settings), in seconds."""
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

REFUSED_SQLSTATE = "SK001"
"""The SQLSTATE a statement of ours raises to refuse a request whole for a rule only the database
can judge (schema.sql's check_submission: max_pending): raised here as :class:`FailedPrecondition`,
with the database's message (which names the account, its count and the cap)."""

INVALID_SQLSTATE = "SK002"
"""The SQLSTATE a statement of ours raises to refuse a request whole for input that breaks a rule
only the database holds (schema.sql's check_submission: an account's max_priority): raised here as
:class:`InvalidArgument`, its field the error's ``COLUMN``, its value the ``DETAIL`` (an integer
when it reads as one), its rule the message and its detail the ``HINT``."""


def invalid_argument(exc: BaseException) -> InvalidArgument:
    """The :class:`InvalidArgument` a statement's :data:`INVALID_SQLSTATE` error stands for."""
    value: object = getattr(exc, "detail", None) or ""
    try:
        value = int(str(value))
    except ValueError:
        pass
    field = getattr(exc, "column_name", None) or "request"
    rule = getattr(exc, "message", None) or str(exc)
    return InvalidArgument(field, value, rule, detail=getattr(exc, "hint", None) or "")


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
    cached (SQLSTATE 0A000 after an ``ALTER TABLE``); inside a transaction it must run again
    whole (:meth:`PgConnection.run_in_transaction`)."""
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
    connection ``raw`` (values: ``KEEPALIVE_*``); a Unix-socket connection is left as it is."""
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


async def connect_raw(fn: Callable[..., Awaitable[T]], url: str, **options: Any) -> T:
    """``await fn(url, **options)`` (asyncpg's ``connect`` or ``create_pool``) with the options
    ``url`` implies (:func:`connect_options`).

    Raises:
        DatabaseUnavailable: the server could not be reached.
        DatabaseRefused: it refused this client for good (password, role, database, URL).
    """
    try:
        return await run_aio(fn, url, **options, **connect_options(url))
    except refused_errors() as exc:
        raise DatabaseRefused(refused_message(exc)) from exc
    except unreachable_errors() as exc:
        raise DatabaseUnavailable(f"cannot connect to the database: {exc!r}") from exc


async def finish_shielded(fn: Callable[[], Awaitable[Any]], terminate: Callable[[], None]) -> None:
    """``await fn()`` (a close or a rollback), shielded from cancellation and bounded by
    :data:`runtime.aio.bridge.CLEANUP_DEADLINE_S`; ``terminate()`` when it fails or takes
    longer."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S) as scope:
        try:
            await run_aio(fn)
        except Exception:
            terminate()
    if scope.cancelled_caught:
        terminate()


Outcome = Callable[[BaseException | None], None]
"""Told how each call ended: None when the server answered (whatever it said), else the error
that broke the connection."""


class PgConnection:
    """One asyncpg connection owned by one actor, callable from trio.

    Create with :meth:`connect`; every method may raise :class:`DatabaseUnavailable` when the
    connection breaks or a call goes unanswered for ``call_timeout_s`` (the owner then connects
    again), :class:`DatabaseBusy` when the server gave up on the statement, and
    :class:`DuplicateKey` when it broke a unique index, :class:`FailedPrecondition` when it raised
    :data:`REFUSED_SQLSTATE` and :class:`InvalidArgument` when it raised :data:`INVALID_SQLSTATE`
    (each rolled back whole); other SQL errors are asyncpg's own.

    Args:
        raw: the asyncpg connection (or a pool's proxy of one).
        call_timeout_s: longest one call may go unanswered, in seconds (None: no bound, for
            operator tools whose statements may run long).
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
        """Connect to ``url`` within ``connect_timeout_s`` seconds; ``server_settings`` are
        PostgreSQL session settings, the other arguments the class's. The connection gets TCP
        keepalives (:func:`set_keepalives`) and, for a multi-host URL, a writable server
        (:func:`connect_options`).

        Raises:
            DatabaseUnavailable: the server could not be reached in ``connect_timeout_s``.
            DatabaseRefused: it refused this client for good (password, role, database, URL).
        """
        import asyncpg

        raw = await connect_raw(
            asyncpg.connect,
            url,
            server_settings=server_settings or {},
            timeout=connect_timeout_s,
            statement_cache_size=256,
        )
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
        """``fn(*args)`` on the connection, its errors translated (see the class); a cancel
        terminates the connection, whose protocol state is then unknown."""
        try:
            return await self._call_within_limit(fn, *args)
        except trio.Cancelled:
            self.terminate()
            raise

    async def _call_within_limit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
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
            except asyncpg.exceptions.PostgresError as exc:
                self._answered()
                if getattr(exc, "sqlstate", None) == REFUSED_SQLSTATE:
                    raise FailedPrecondition(str(exc)) from exc
                if getattr(exc, "sqlstate", None) == INVALID_SQLSTATE:
                    raise invalid_argument(exc) from exc
                raise
            self._answered()
            return result
        # Cancelled at the deadline: the protocol state is unknown, so the connection goes.
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
        return await self._call(self._raw.fetch, sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Record | None:
        """The first row of ``sql``, or None."""
        return await self._call(self._raw.fetchrow, sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row of ``sql``, or None."""
        return await self._call(self._raw.fetchval, sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        """Run ``sql``; returns the command tag (``"UPDATE 3"``)."""
        return await self._call(self._raw.execute, sql, *args)

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
            if not self.is_closed():
                await finish_shielded(functools.partial(self._raw.execute, "ROLLBACK"), self.terminate)
            raise
        await self.execute("COMMIT")

    async def run_in_transaction(self, body: Callable[[PgConnection], Awaitable[T]], *, what: str) -> T:
        """``body(self)`` in one transaction (:meth:`transaction`); when a schema change
        invalidated a statement cached on this connection (:func:`stale_statement_errors`), the
        caches are cleared and ``body`` runs once more, whole, in a new transaction (never one
        statement alone: ``body`` may have decided on what the earlier ones returned).

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
        if not self.is_closed():
            await finish_shielded(self._raw.close, self.terminate)

    def terminate(self) -> None:
        """Drop the connection at once (no goodbye to the server); idempotent."""
        if not self.is_closed():
            self._raw.terminate()

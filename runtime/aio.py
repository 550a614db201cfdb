"""The trio-asyncio bridge: asyncpg and grpclib used from trio code.

asyncpg and grpclib are asyncio libraries. Each Stockade process opens one asyncio loop on
top of trio (:func:`asyncio_bridge`) and every call into those libraries goes through this
module, the only caller of ``aio_as_trio``. Errors are translated at the boundary: a broken
connection or an unreachable peer becomes a :class:`runtime.errors.TemporaryError`, a broken
unique index :class:`runtime.errors.DuplicateKey`, a gRPC status :class:`InvalidArgument`,
:class:`NotFound`, :class:`IdempotencyConflict` or :class:`RemoteError`.

Cancellation: a trio cancel that lands inside an asyncpg call terminates that connection
(its protocol state is unknown afterwards), so the owner reconnects; close and rollback are
shielded, with a short deadline of their own.

Served RPCs and their deadlines: grpclib runs each request in an asyncio task and, when the
client's deadline (``grpc-timeout``) passes or the client resets the stream, cancels that task
(``grpclib.server.request_handler``: a ``DeadlineWrapper`` timer, or ``Handler.cancel`` on a
reset). The task awaits the trio handler through ``trio_as_aio``, so the cancel reaches the trio
handler wherever it is, in the middle of an asyncpg call included, which would then terminate a
pooled connection. A handler that must not lose its connection that way runs its database work
under :func:`finish_despite_cancel`; it learns its client's deadline from :func:`rpc_deadline`.

Encoding on the handler's terms: grpclib decodes a request before the handler runs and encodes
its reply after it returns, each in one piece on the event loop (70 ms and more for a message
with a thousand elements). A handler that must do that work itself, in slices and only once it
has admitted the request, returns a :class:`protocol.wire.Encoded` reply (sent as is, see
:class:`WireCodec`) and, when marked with :func:`takes_encoded_request`, receives its request
undecoded.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import betterproto2
import grpclib.client
import grpclib.const
import grpclib.exceptions
import grpclib.server
import trio
import trio_asyncio
from betterproto2.grpclib import ServiceBase, ServiceStub
from grpclib.encoding.proto import ProtoCodec

from protocol import wire
from protocol.wire import Encoded
from runtime.errors import (
    Busy,
    ConnectionRefused,
    DatabaseBusy,
    DatabaseUnavailable,
    DeadlineExceeded,
    DuplicateKey,
    IdempotencyConflict,
    InvalidArgument,
    NotFound,
    RemoteError,
    StaleEpoch,
    StockadeError,
    TemporaryError,
    Unavailable,
)
from runtime.identifiers import parse_address
from runtime.settings import DEFAULT_READ_STATEMENT_TIMEOUT_S, session_ms

if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool
    from asyncpg import Record

T = TypeVar("T")
StubT = TypeVar("StubT", bound=ServiceStub)

_CLEANUP_DEADLINE_S = 2.0


@asynccontextmanager
async def asyncio_bridge() -> AsyncIterator[None]:
    """Open the asyncio loop that asyncpg and grpclib run on, for the body of the block.

    Open it once per process, around everything else (``trio_asyncio.open_loop``).

    trio-asyncio's loop raises every error reported to its exception handler into its
    nursery, which ends the process. One report is routine, not a failure: a future that
    ended with a connection error nobody retrieved. asyncpg leaves one behind when a call is
    cancelled (a gRPC handler past its deadline) and its connection is then terminated
    (see :class:`PgConnection`): the pending reply's future gets ``ConnectionError('unexpected
    connection_lost() call')`` after its awaiter has gone. Those are logged; every other
    report still ends the process.
    """
    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(_on_asyncio_error)
        yield


def _on_asyncio_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exception = context.get("exception")
    if isinstance(exception, _connection_errors()) and "never retrieved" in str(context.get("message", "")):
        from runtime import log  # structlog: loaded only by processes that log

        log.get("aio").info("a dropped connection's pending reply was discarded", error=repr(exception))
        return
    loop.default_exception_handler(context)


async def run_aio(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Await the asyncio coroutine function ``fn(*args, **kwargs)`` from trio."""
    return await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- PostgreSQL

# asyncpg is imported when first needed, not with this module: a client (``stockade status``)
# uses the bridge and gRPC only, and should not pay for loading the database driver.


@functools.cache
def _connection_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean a connection is broken (the owner reconnects)."""
    import asyncpg

    return (
        OSError,
        asyncio.TimeoutError,
        asyncpg.exceptions.ConnectionDoesNotExistError,
        asyncpg.exceptions.InterfaceError,
        asyncpg.exceptions.PostgresConnectionError,
        asyncpg.exceptions.CannotConnectNowError,
        asyncpg.exceptions.AdminShutdownError,
        asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
        # What asyncpg says when the server ended the session while the process was frozen:
        # the connection's protocol state is lost, so it counts as broken.
        asyncpg.exceptions.InternalClientError,
    )


@functools.cache
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
        except _connection_errors() as exc:
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
        except _connection_errors() as exc:
            self.terminate()
            raise DatabaseUnavailable(f"database connection lost: {exc!r}") from exc
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
            with trio.CancelScope(shield=True), trio.move_on_after(_CLEANUP_DEADLINE_S) as scope:
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
        with trio.CancelScope(shield=True), trio.move_on_after(_CLEANUP_DEADLINE_S) as scope:
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
        except _connection_errors() as exc:
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
        except _connection_errors() as exc:
            raise DatabaseUnavailable(f"no database connection: {exc!r}") from exc
        try:
            yield PgConnection(raw)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(_CLEANUP_DEADLINE_S):
                try:
                    await run_aio(self._raw.release, raw)
                except Exception:
                    raw.terminate()

    async def close(self) -> None:
        """Close every connection, shielded; terminate what does not close in time."""
        with trio.CancelScope(shield=True), trio.move_on_after(_CLEANUP_DEADLINE_S) as scope:
            try:
                await run_aio(self._raw.close)
            except Exception:
                self._raw.terminate()
        if scope.cancelled_caught:
            self._raw.terminate()


# ---------------------------------------------------------------------------- gRPC server

_STATUS_OF: list[tuple[type[BaseException], grpclib.const.Status]] = [
    (Busy, grpclib.const.Status.RESOURCE_EXHAUSTED),
    (DeadlineExceeded, grpclib.const.Status.DEADLINE_EXCEEDED),
    (InvalidArgument, grpclib.const.Status.INVALID_ARGUMENT),
    (NotFound, grpclib.const.Status.NOT_FOUND),
    (IdempotencyConflict, grpclib.const.Status.ALREADY_EXISTS),
    (StaleEpoch, grpclib.const.Status.FAILED_PRECONDITION),
    (TemporaryError, grpclib.const.Status.UNAVAILABLE),
]


def _to_grpc_error(exc: StockadeError) -> grpclib.exceptions.GRPCError:
    for cls, status in _STATUS_OF:
        if isinstance(exc, cls):
            return grpclib.exceptions.GRPCError(status, str(exc))
    return grpclib.exceptions.GRPCError(grpclib.const.Status.INTERNAL, str(exc))


_STREAM_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "stockade_stream_deadline", default=None
)
"""The served request's deadline as ``time.monotonic()`` (asyncio side; None: no grpc-timeout)."""

_RPC_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar(
    "stockade_rpc_deadline", default=math.inf
)
"""The served request's deadline in trio time (trio side)."""


def rpc_deadline() -> float:
    """The trio time (``trio.current_time()``) at which the client of the RPC being handled
    stops waiting for its answer; ``math.inf`` when it sent no deadline or outside a handler
    served by :func:`trio_service`."""
    return _RPC_DEADLINE.get()


@contextmanager
def finish_despite_cancel(bound_s: float) -> Iterator[None]:
    """Run the body to its end even when an enclosing scope is cancelled meanwhile (an RPC's
    deadline passing, its client resetting the stream), for at most ``bound_s`` seconds.

    For database work of a request handler: a cancel landing inside an asyncpg call terminates
    the connection (:class:`PgConnection`), and a replica that answers late would then
    reconnect, a new server process each time, on a machine that is already short of CPU. The
    work's own server-side timeouts (``statement_timeout``, ``lock_timeout``) end it in time;
    ``bound_s`` is the last resort for a connection that stalled with no server timeout to end
    it, and only then is the connection dropped. A cancel that arrived meanwhile is delivered
    at the caller's next checkpoint, so an answer nobody waits for is simply not sent.

    Args:
        bound_s: the longest the body may run, in seconds.

    Raises:
        DatabaseUnavailable: the body ran longer than ``bound_s`` (it was cancelled at that
            point; a connection in the middle of a call was terminated).
    """
    try:
        with trio.CancelScope(shield=True), trio.fail_after(bound_s):
            yield
    except trio.TooSlowError as exc:
        raise DatabaseUnavailable(f"database work took longer than {bound_s:g} s") from exc


async def _call_in_trio(
    fn: Callable[[Any], Awaitable[Any]], message: Any, deadline_monotonic: float | None
) -> Any:
    # Converted here, in the trio task, so the hand-over from asyncio counts against the deadline.
    deadline = math.inf
    if deadline_monotonic is not None:
        deadline = trio.current_time() + (deadline_monotonic - time.monotonic())
    token = _RPC_DEADLINE.set(deadline)
    try:
        result = await fn(message)
    except StockadeError:
        await trio.lowlevel.checkpoint()
        raise
    finally:
        _RPC_DEADLINE.reset(token)
    # A client that gave up while the handler finished its work (finish_despite_cancel) gets no
    # answer: the cancel lands here, and grpclib ends the stream as cancelled instead of
    # trying to send a reply on a stream that is gone (which it logs as an error).
    await trio.lowlevel.checkpoint()
    return result


def _keeping_deadline(func: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    """Wrap a generated ``__rpc_*`` stream handler so the request's deadline is known inside."""

    async def handle(stream: grpclib.server.Stream[Any, Any]) -> None:
        deadline = stream.deadline
        token = _STREAM_DEADLINE.set(
            None if deadline is None else time.monotonic() + deadline.time_remaining()
        )
        try:
            await func(stream)
        finally:
            _STREAM_DEADLINE.reset(token)

    return handle


class WireCodec(ProtoCodec):
    """grpclib's protobuf codec, with two changes: a reply already in wire form
    (:class:`protocol.wire.Encoded` of the RPC's reply type) is sent as it is, and a request is
    decoded by :func:`protocol.wire.parse`, so an integer sent outside its field's type is
    refused (INVALID_ARGUMENT naming the field and the value as sent) instead of truncated."""

    def decode(self, data: bytes, message_type: Any) -> Any:
        """The request (or an :class:`protocol.wire.Encoded` of it, for a handler marked
        :func:`takes_encoded_request`, which decodes it itself).

        Raises:
            grpclib.exceptions.GRPCError: INVALID_ARGUMENT: an integer field's value as sent
                lies outside its type, or ``data`` is not a well-formed request.
        """
        if not (isinstance(message_type, type) and issubclass(message_type, betterproto2.Message)):
            return super().decode(data, message_type)
        try:
            return wire.parse(message_type, data)
        except wire.OutOfRange as exc:
            error = InvalidArgument(exc.field, exc.value, exc.rule, detail=exc.detail)
        except ValueError as exc:
            error = InvalidArgument(
                "request", f"{len(data)} bytes", f"must be a {message_type.__name__} ({exc})"
            )
        raise _to_grpc_error(error) from None

    def encode(self, message: Any, message_type: Any) -> bytes:
        """The reply's bytes.

        Raises:
            TypeError: ``message`` is neither a ``message_type`` nor an ``Encoded`` of one.
        """
        if isinstance(message, Encoded):
            if message.message_type is not message_type:
                raise TypeError(f"reply must be encoded from {message_type!r}, not {message.message_type!r}")
            return message.data
        return super().encode(message, message_type)


_ENCODED_REQUEST = "__stockade_takes_encoded_request__"

F = TypeVar("F", bound=Callable[..., Any])


def takes_encoded_request(method: F) -> F:
    """Mark a handler of :func:`trio_service` that receives its request undecoded, as a
    :class:`protocol.wire.Encoded` (it decodes it itself, e.g. in slices)."""
    setattr(method, _ENCODED_REQUEST, True)
    return method


def _undecoded(message_type: type[Any]) -> type[Any]:
    """A stand-in for ``message_type`` whose ``FromString`` keeps the bytes (what grpclib's
    codec calls to decode a request)."""

    class Undecoded:
        @staticmethod
        def FromString(data: bytes) -> Encoded[Any]:
            return Encoded(message_type, bytes(data))

    Undecoded.__name__ = f"Undecoded{message_type.__name__}"
    return Undecoded


def trio_service(base: type[ServiceBase], impl: object) -> ServiceBase:
    """Wrap ``impl`` (trio ``async def`` methods named like ``base``'s RPCs) as a grpclib service.

    Each RPC of the generated ``base`` class is served by the same-named trio method of
    ``impl``, which takes the request message and returns the reply message; an RPC ``impl``
    lacks answers UNIMPLEMENTED. A method may return its reply as a
    :class:`protocol.wire.Encoded` (served by :func:`serve_grpc`'s :class:`WireCodec`), and one
    marked :func:`takes_encoded_request` gets its request as one. Inside it,
    :func:`rpc_deadline` tells when the client stops waiting. StockadeErrors become gRPC
    statuses: Busy -> RESOURCE_EXHAUSTED, DeadlineExceeded -> DEADLINE_EXCEEDED,
    InvalidArgument -> INVALID_ARGUMENT, NotFound -> NOT_FOUND, IdempotencyConflict ->
    ALREADY_EXISTS, StaleEpoch -> FAILED_PRECONDITION, TemporaryError -> UNAVAILABLE, others ->
    INTERNAL.
    """
    methods: dict[str, Any] = {}
    undecoded: set[str] = set()
    for name, fn in vars(base).items():
        if name.startswith("_") or not inspect.iscoroutinefunction(fn):
            continue
        trio_fn = getattr(impl, name, None)
        if trio_fn is None:
            continue  # not implemented: the generated base answers UNIMPLEMENTED
        if getattr(trio_fn, _ENCODED_REQUEST, False):
            undecoded.add(name)

        async def rpc(self: Any, message: Any, _trio_fn: Any = trio_fn) -> Any:
            try:
                return await trio_asyncio.trio_as_aio(_call_in_trio)(
                    _trio_fn, message, _STREAM_DEADLINE.get()
                )
            except StockadeError as exc:
                raise _to_grpc_error(exc) from exc

        methods[name] = rpc

    def mapping(self: Any) -> dict[str, Any]:
        handlers = base.__mapping__(self)  # type: ignore[attr-defined]
        mapped = {}
        for path, handler in handlers.items():
            handler = handler._replace(func=_keeping_deadline(handler.func))
            if _snake_case(path.rpartition("/")[2]) in undecoded:
                handler = handler._replace(request_type=_undecoded(handler.request_type))
            mapped[path] = handler
        return mapped

    methods["__mapping__"] = mapping
    return type(f"Trio{base.__name__}", (base,), methods)()


def _snake_case(rpc: str) -> str:
    """``"SubmitJobs"`` -> ``"submit_jobs"`` (the generated methods' names)."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in rpc).lstrip("_")


async def serve_grpc(
    services: Sequence[ServiceBase],
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``services`` on ``host:port`` until cancelled; ``task_status.started(actual_port)``.

    Replies in wire form are sent as they are (:class:`WireCodec`).

    Raises:
        OSError: the address could not be bound.
    """
    server = grpclib.server.Server(list(services), codec=WireCodec())  # type: ignore[arg-type]
    await run_aio(server.start, host, port)
    try:
        # grpclib keeps its asyncio server private; the port bound for port 0 is only there.
        asyncio_server: Any = server._server
        sockets = asyncio_server.sockets if asyncio_server is not None else []
        actual_port = sockets[0].getsockname()[1] if sockets else port
        task_status.started(actual_port)
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(_CLEANUP_DEADLINE_S):
            server.close()
            await run_aio(server.wait_closed)


# ---------------------------------------------------------------------------- gRPC client

_RETRYABLE_STATUS = {
    grpclib.const.Status.UNAVAILABLE,
    grpclib.const.Status.DEADLINE_EXCEEDED,
    grpclib.const.Status.CANCELLED,
}


class GrpcChannel:
    """A client connection to one gRPC server, with trio-side calls and error translation."""

    def __init__(self, address: str) -> None:
        """Connect lazily to ``address``, ``host:port`` (:func:`runtime.identifiers.parse_address`).

        Raises:
            InvalidArgument: ``address`` is not such an address.
        """
        self.address = address
        self._host_port = parse_address(address, field="address")
        self._channel = grpclib.client.Channel(self._host_port.host, self._host_port.port)

    def stub(self, stub_cls: type[StubT]) -> StubT:
        """A generated stub (``pb.WorkerStub``, ``pb.ControlPlaneStub``) bound to this channel."""
        return stub_cls(self._channel)

    async def call(self, method: Callable[..., Awaitable[T]], request: Any, *, timeout_s: float) -> T:
        """Call a stub's bound ``method`` with ``request`` and a deadline of ``timeout_s``.

        Raises:
            Busy: the peer answered RESOURCE_EXHAUSTED: it is overloaded and did not start the
                request (nothing was stored; asking another peer is safe).
            ConnectionRefused: the peer refused the connection (nothing listens there).
            Unavailable: the peer did not answer in time, could not be reached, or answered
                UNAVAILABLE / DEADLINE_EXCEEDED.
            InvalidArgument, NotFound: the peer answered INVALID_ARGUMENT / NOT_FOUND
                (``field`` is ``"request"``; the peer's message is kept whole).
            IdempotencyConflict: the peer answered ALREADY_EXISTS: the request's idempotency
                key was first used for another request.
            RemoteError: any other error status.
        """
        try:
            with trio.fail_after(timeout_s + 0.5):
                return await run_aio(method, request, timeout=timeout_s)
        except trio.TooSlowError as exc:
            raise Unavailable(f"{self.address} did not answer within {timeout_s:g} s") from exc
        except grpclib.exceptions.GRPCError as exc:
            message = exc.message or ""
            if exc.status == grpclib.const.Status.RESOURCE_EXHAUSTED:
                raise Busy(f"{self.address}: {message}") from exc
            if exc.status in _RETRYABLE_STATUS:
                raise Unavailable(f"{self.address}: {exc.status.name}: {message}") from exc
            if exc.status == grpclib.const.Status.INVALID_ARGUMENT:
                raise _RemoteInvalid(message) from exc
            if exc.status == grpclib.const.Status.NOT_FOUND:
                raise NotFound(message) from exc
            if exc.status == grpclib.const.Status.ALREADY_EXISTS:
                raise IdempotencyConflict(message) from exc
            raise RemoteError(exc.status.name, message) from exc
        except ConnectionRefusedError as exc:
            raise ConnectionRefused(f"{self.address} refused the connection") from exc
        except (
            TimeoutError,
            OSError,
            grpclib.exceptions.StreamTerminatedError,
            grpclib.exceptions.ProtocolError,
        ) as exc:
            raise Unavailable(f"{self.address} unreachable: {exc!r}") from exc
        except StockadeError:
            raise
        except Exception as exc:
            # grpclib's own races (a connection lost while a stream is opened raises
            # AttributeError inside it): the peer is unreachable for this call; start afresh.
            self._reset()
            raise Unavailable(f"{self.address} failed: {exc!r}") from exc

    def _reset(self) -> None:
        self._channel.close()
        self._channel = grpclib.client.Channel(self._host_port.host, self._host_port.port)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._channel.close()


class _RemoteInvalid(InvalidArgument):
    """INVALID_ARGUMENT from a peer: keeps the peer's message as the whole text."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.field = "request"
        self.value = None
        self.rule = message
        self.detail = ""

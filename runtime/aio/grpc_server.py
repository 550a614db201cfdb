"""The gRPC server side: trio handlers served by grpclib.

:func:`serve_grpc` serves services built by :func:`trio_service` (each RPC's trio handler run
through :func:`runtime.aio.bridge.run_trio`, its StockadeErrors turned into gRPC statuses).
Inside a handler, :func:`rpc_deadline` tells when its client stops waiting and
:func:`finish_despite_cancel` keeps database work from being cancelled half way.
:class:`WireCodec` sends replies already in wire form as they are. Who called and what it may
do: :mod:`runtime.aio.grpc_access`. Why each exists: docs/design.md, "The trio-asyncio
boundary: errors, cancels, deadlines, streams".
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from typing import Any, TypeVar

import betterproto2
import grpclib.const
import grpclib.exceptions
import grpclib.protocol
import grpclib.server
import h2.settings
import trio
from betterproto2.grpclib import ServiceBase
from grpclib.encoding.proto import ProtoCodec

from protocol import wire
from protocol.wire import Encoded
from runtime.aio.bridge import CLEANUP_DEADLINE_S, run_aio, run_trio
from runtime.aio.grpc_access import NOBODY, RPC_CALLER, Access, Caller, caller_of, check_access
from runtime.aio.grpc_client import snake_case
from runtime.errors import (
    Busy,
    DatabaseUnavailable,
    DeadlineExceeded,
    FailedPrecondition,
    IdempotencyConflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StaleEpoch,
    StockadeError,
    TemporaryError,
)
from runtime.tls import TLS_HANDSHAKE_TIMEOUT_S

T = TypeVar("T")

_STATUS_OF: list[tuple[type[BaseException], grpclib.const.Status]] = [
    (Busy, grpclib.const.Status.RESOURCE_EXHAUSTED),
    (DeadlineExceeded, grpclib.const.Status.DEADLINE_EXCEEDED),
    (InvalidArgument, grpclib.const.Status.INVALID_ARGUMENT),
    (NotFound, grpclib.const.Status.NOT_FOUND),
    (PermissionDenied, grpclib.const.Status.PERMISSION_DENIED),
    (IdempotencyConflict, grpclib.const.Status.ALREADY_EXISTS),
    (FailedPrecondition, grpclib.const.Status.FAILED_PRECONDITION),
    (StaleEpoch, grpclib.const.Status.FAILED_PRECONDITION),
    (TemporaryError, grpclib.const.Status.UNAVAILABLE),
]


def _to_grpc_error(exc: StockadeError) -> grpclib.exceptions.GRPCError:
    for cls, status in _STATUS_OF:
        if isinstance(exc, cls):
            return grpclib.exceptions.GRPCError(status, str(exc))
    return grpclib.exceptions.GRPCError(grpclib.const.Status.INTERNAL, str(exc))


# The served request's deadline and caller: asyncio side (deadline as time.monotonic(), None: no
# grpc-timeout), and the deadline in trio time on the trio side.
_STREAM_DEADLINE = contextvars.ContextVar[float | None]("stockade_stream_deadline", default=None)
_STREAM_CALLER = contextvars.ContextVar[Caller]("stockade_stream_caller", default=NOBODY)
_RPC_DEADLINE = contextvars.ContextVar[float]("stockade_rpc_deadline", default=math.inf)


def rpc_deadline() -> float:
    """The trio time (``trio.current_time()``) at which the client of the RPC being handled
    stops waiting for its answer; ``math.inf`` when it sent no deadline or outside a handler
    served by :func:`trio_service`."""
    return _RPC_DEADLINE.get()


@contextmanager
def finish_despite_cancel(bound_s: float) -> Iterator[None]:
    """Run the body to its end even when an enclosing scope is cancelled meanwhile (an RPC's
    deadline passing, its client resetting the stream), for at most ``bound_s`` seconds.

    For a handler's database work: a cancel inside an asyncpg call terminates the connection
    (:class:`runtime.aio.pg.PgConnection`), and reconnecting costs a loaded server a new
    process. The server-side timeouts end the work in time; ``bound_s`` is the last resort. A
    cancel that arrived meanwhile is delivered at the caller's next checkpoint.

    Raises:
        DatabaseUnavailable: the body ran longer than ``bound_s`` (it was cancelled then).
    """
    try:
        with trio.CancelScope(shield=True), trio.fail_after(bound_s):
            yield
    except trio.TooSlowError as exc:
        raise DatabaseUnavailable(f"database work took longer than {bound_s:g} s") from exc


async def _served_in_trio(
    body: Callable[[], Awaitable[T]], deadline_monotonic: float | None, caller: Caller
) -> T:
    """``await body()``, the trio side of one served RPC, with :func:`rpc_deadline` and
    :func:`runtime.aio.grpc_access.rpc_caller` set."""
    # Converted here, in the trio task, so the hand-over from asyncio counts against the deadline.
    deadline = math.inf
    if deadline_monotonic is not None:
        deadline = trio.current_time() + (deadline_monotonic - time.monotonic())
    token = _RPC_DEADLINE.set(deadline)
    caller_token = RPC_CALLER.set(caller)
    try:
        result = await body()
    except StockadeError:
        await trio.lowlevel.checkpoint()
        raise
    finally:
        _RPC_DEADLINE.reset(token)
        RPC_CALLER.reset(caller_token)
    # A client that gave up meanwhile (finish_despite_cancel) gets no answer: the cancel lands
    # here, so grpclib ends the stream as cancelled instead of logging a failed send.
    await trio.lowlevel.checkpoint()
    return result


async def _in_trio(body: Callable[[], Awaitable[T]]) -> T:
    """Run ``body`` in trio from the asyncio task serving the RPC; a StockadeError becomes its
    gRPC status."""
    try:
        return await run_trio(_served_in_trio, body, _STREAM_DEADLINE.get(), _STREAM_CALLER.get())
    except StockadeError as exc:
        raise _to_grpc_error(exc) from exc


Send = Callable[[Any], Awaitable[None]]
"""What a server-streaming handler given a send function calls with each message (trio side);
it returns once grpclib has taken the message (HTTP/2 flow control)."""


async def _send_stream(fn: Callable[..., Any], message: Any, send: Send) -> None:
    """Send each message of ``fn(message)`` (an async generator), or await ``fn(message, send)``."""
    if inspect.isasyncgenfunction(fn):
        # Closed in this task however the stream ends, so its clean-up runs now, not at collection.
        async with aclosing(fn(message)) as replies:
            async for reply in replies:
                await send(reply)
    else:
        await fn(message, send)


def _stream_handler(trio_fn: Callable[..., Any]) -> Callable[[Any], Awaitable[None]]:
    """A grpclib stream handler (asyncio side) for a server-streaming RPC served by
    ``trio_fn``: reads the one request, then runs :func:`_send_stream` in trio. A client that
    resets the stream or whose deadline passes cancels the trio handler; a handler that returns
    or raises ends the stream."""

    async def handle(stream: grpclib.server.Stream[Any, Any]) -> None:
        request = await stream.recv_message()

        async def send(reply: Any) -> None:
            await run_aio(stream.send_message, reply)

        await _in_trio(functools.partial(_send_stream, trio_fn, request, send))

    return handle


MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The largest request a service takes by default, in bytes (gRPC's own default is 4 MiB),
refused from its length prefix, before its body is read."""


def _guarded(
    func: Callable[[Any], Awaitable[None]], rpc: str, access: Access | None, max_request_bytes: int
) -> Callable[[Any], Awaitable[None]]:
    """Wrap a generated ``__rpc_*`` stream handler: refuse a caller whose role may not call
    ``rpc`` and a request longer than ``max_request_bytes`` before the request's body is read
    (so no certificate, however low its role, makes a server buffer and decode a huge request),
    and make the request's deadline and caller known inside."""

    async def handle(stream: grpclib.server.Stream[Any, Any]) -> None:
        caller = caller_of(stream)
        try:
            check_access(rpc, access, caller)
        except PermissionDenied as exc:
            raise _to_grpc_error(exc) from None
        _limit_request_size(stream, rpc, max_request_bytes)
        deadline = stream.deadline
        token = _STREAM_DEADLINE.set(
            None if deadline is None else time.monotonic() + deadline.time_remaining()
        )
        caller_token = _STREAM_CALLER.set(caller)
        try:
            await func(stream)
        finally:
            _STREAM_DEADLINE.reset(token)
            _STREAM_CALLER.reset(caller_token)

    return handle


def _limit_request_size(stream: grpclib.server.Stream[Any, Any], rpc: str, max_request_bytes: int) -> None:
    """Make ``stream`` refuse a message longer than ``max_request_bytes`` (INVALID_ARGUMENT)
    from its length prefix: grpclib reads ``recv_data(5)`` then ``recv_data(length)``, with no
    limit of its own; the second read is checked on ``stream._stream`` (grpclib 0.4)."""
    inner = stream._stream
    read = inner.recv_data

    async def recv_data(size: int) -> bytes:
        if size > max_request_bytes:
            error = InvalidArgument(
                "request",
                f"{size} bytes",
                f"must be at most {max_request_bytes} bytes; send less per call (fewer jobs in a batch)",
                detail=rpc,
            )
            raise _to_grpc_error(error)
        data: bytes = await read(size)
        return data

    inner.recv_data = recv_data  # type: ignore[method-assign]


class WireCodec(ProtoCodec):
    """grpclib's protobuf codec, with two changes: a reply already in wire form
    (:class:`protocol.wire.Encoded` of the RPC's reply type) is sent as it is, and a request is
    decoded by :func:`protocol.wire.parse`, so an integer sent outside its field's type is
    refused (INVALID_ARGUMENT naming the field and the value as sent) instead of truncated."""

    def decode(self, data: bytes, message_type: Any) -> Any:
        """The request (an ``Encoded`` of it for :func:`takes_encoded_request` handlers).

        Raises:
            grpclib.exceptions.GRPCError: INVALID_ARGUMENT: an integer out of its field's type,
                or ``data`` is not a well-formed request.
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
        """The reply's bytes; TypeError if ``message`` is neither a ``message_type`` nor an
        ``Encoded`` of one."""
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
    """A stand-in for ``message_type`` whose ``FromString`` (grpclib's decode) keeps the bytes."""

    class Undecoded:
        @staticmethod
        def FromString(data: bytes) -> Encoded[Any]:
            return Encoded(message_type, bytes(data))

    Undecoded.__name__ = f"Undecoded{message_type.__name__}"
    return Undecoded


def trio_service(
    base: type[ServiceBase],
    impl: object,
    *,
    access: Access | None = None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> ServiceBase:
    """Wrap ``impl`` (trio ``async def`` methods named like ``base``'s RPCs) as a grpclib service.

    Each RPC of ``base`` is served by the same-named trio method of ``impl`` (request in,
    reply out; one ``impl`` lacks answers UNIMPLEMENTED). A reply may be a
    :class:`protocol.wire.Encoded`; a method marked :func:`takes_encoded_request` gets its
    request as one. StockadeErrors become gRPC statuses by ``_STATUS_OF`` (others: INTERNAL).

    A server-streaming RPC is served by a trio async generator
    (``async def x(self, request) -> AsyncIterator[Reply]``) or by a coroutine given a send
    function (``async def x(self, request, send: Send) -> None``), for a handler that must
    hold a nursery or cancel scope across its messages. A StockadeError it raises, even after
    some messages, becomes the stream's status; each send waits while the client does not
    read (HTTP/2 flow control), so a slow client holds up the handler, never its memory.

    ``access`` (None: no check) names, for each RPC, the roles whose certificates may call it
    on a mutual-TLS connection (plaintext is not checked); any other caller is refused
    (PERMISSION_DENIED, logged and counted) before the request's body is read, as is a request
    longer than ``max_request_bytes`` (INVALID_ARGUMENT).
    """
    methods: dict[str, Any] = {}
    undecoded: set[str] = set()
    streams: dict[str, Any] = {}
    for name, fn in vars(base).items():
        if name.startswith("_"):
            continue
        trio_fn = getattr(impl, name, None)
        if trio_fn is None:
            continue  # not implemented: the generated base answers UNIMPLEMENTED
        if inspect.isasyncgenfunction(fn):
            streams[name] = trio_fn  # the generated server-streaming stub is an async generator
            continue
        if not inspect.iscoroutinefunction(fn):
            continue
        if getattr(trio_fn, _ENCODED_REQUEST, False):
            undecoded.add(name)

        async def rpc(self: Any, message: Any, _trio_fn: Any = trio_fn) -> Any:
            return await _in_trio(functools.partial(_trio_fn, message))

        methods[name] = rpc

    def mapping(self: Any) -> dict[str, Any]:
        handlers = base.__mapping__(self)  # type: ignore[attr-defined]
        mapped = {}
        for path, handler in handlers.items():
            name = snake_case(path.rpartition("/")[2])
            func = _stream_handler(streams[name]) if name in streams else handler.func
            handler = handler._replace(func=_guarded(func, name, access, max_request_bytes))
            if name in undecoded:
                handler = handler._replace(request_type=_undecoded(handler.request_type))
            mapped[path] = handler
        return mapped

    methods["__mapping__"] = mapping
    return type(f"Trio{base.__name__}", (base,), methods)()


MAX_CONCURRENT_STREAMS = 1000
"""The most calls a client may have open at once on one connection (HTTP/2's
``SETTINGS_MAX_CONCURRENT_STREAMS``; h2's default is 100): a fleet sends every hosted worker's
calls over one connection per control plane (:mod:`agent.fleet`)."""


class _Protocol(grpclib.protocol.H2Protocol):
    """grpclib's connection protocol, announcing :data:`MAX_CONCURRENT_STREAMS`."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.connection._connection.update_settings(
            {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS}
        )
        self.connection.flush()


class _Server(grpclib.server.Server):
    """grpclib's server with a TLS handshake timeout (its ``start`` passes none to asyncio,
    whose default is 60 s), announcing :data:`MAX_CONCURRENT_STREAMS` on each connection."""

    def _protocol_factory(self) -> grpclib.protocol.H2Protocol:
        made = super()._protocol_factory()  # registers the connection's handler with the server
        return _Protocol(made.handler, made.config, made.h2_config)

    async def start_tls(
        self, host: str, port: int, context: ssl.SSLContext | None, handshake_timeout_s: float
    ) -> None:
        if self._server is not None:
            raise RuntimeError("Server is already started")
        self._server = await self._loop.create_server(
            self._protocol_factory,
            host,
            port,
            ssl=context,
            ssl_handshake_timeout=handshake_timeout_s if context is not None else None,
        )
        self._server_closed_fut = self._loop.create_future()


async def serve_grpc(
    services: Sequence[ServiceBase],
    host: str,
    port: int,
    *,
    tls: ssl.SSLContext | None = None,
    handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``services`` on ``host:port`` until cancelled; ``task_status.started(actual_port)``.

    With ``tls`` (:func:`runtime.tls.server_context`) every connection is mutual TLS, dropped
    if its handshake takes over ``handshake_timeout_s`` seconds; None serves plaintext.

    Raises:
        OSError: the address could not be bound.
    """
    server = _Server(list(services), codec=WireCodec())  # type: ignore[arg-type]
    await run_aio(server.start_tls, host, port, tls, handshake_timeout_s)
    try:
        # grpclib keeps its asyncio server private; the port bound for port 0 is only there.
        asyncio_server: Any = server._server
        sockets = asyncio_server.sockets if asyncio_server is not None else []
        actual_port = sockets[0].getsockname()[1] if sockets else port
        task_status.started(actual_port)
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S):
            server.close()
            await run_aio(server.wait_closed)

"""The gRPC client side: :class:`GrpcChannel`, calls to one peer from trio with their errors
translated (a gRPC status or an unreachable peer becomes a :class:`runtime.errors.StockadeError`
that says what the caller can do): unary calls (:meth:`GrpcChannel.call`) and server streams
(:meth:`GrpcChannel.stream`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import grpclib.client
import grpclib.config
import grpclib.const
import grpclib.exceptions
import trio

from runtime import errors
from runtime.aio.bridge import CLEANUP_DEADLINE_S, run_aio
from runtime.errors import ConnectionRefused, HandshakeRefused, PeerUnavailable, StockadeError, Unavailable
from runtime.identifiers import parse_address
from runtime.tls import TlsTarget, describe_tls_error

if TYPE_CHECKING:
    # Only named in annotations: importing this module leaves betterproto2 to protocol/__init__.py,
    # which imports it without pydantic.
    from betterproto2.grpclib import ServiceBase, ServiceStub

T = TypeVar("T")
StubT = TypeVar("StubT", bound="ServiceStub")


_RETRYABLE_STATUS = {
    grpclib.const.Status.UNAVAILABLE,
    grpclib.const.Status.DEADLINE_EXCEEDED,
    grpclib.const.Status.CANCELLED,
}


_BROKEN = (TimeoutError, OSError, grpclib.exceptions.StreamTerminatedError, grpclib.exceptions.ProtocolError)
"""Errors of a connection that could not be made or broke."""


@attrs.frozen
class StreamLimits:
    """How long a server stream may take, each in seconds (None: no limit)."""

    first_message_s: float | None
    """The longest wait for the first message (or the stream's end), the connection included."""
    idle_s: float | None = None
    """The longest wait for each later message."""
    timeout_s: float | None = None
    """The deadline of the whole stream."""


class GrpcChannel:
    """A client connection to one gRPC server, with trio-side calls and error translation."""

    def __init__(self, address: str, *, tls: TlsTarget | None = None) -> None:
        """Connect lazily to ``address``, ``host:port`` (:func:`runtime.identifiers.parse_address`),
        over mutual TLS with ``tls`` (from :meth:`runtime.tls.ClientTls.target`, which also says
        whose certificate the server must present), or plaintext when None.

        Raises:
            InvalidArgument: ``address`` is not such an address.
        """
        self.address = address
        self._host_port = parse_address(address, field="address")
        self._tls = tls
        self._channel = self._new_channel()

    def _new_channel(self) -> grpclib.client.Channel:
        if self._tls is None:
            return grpclib.client.Channel(self._host_port.host, self._host_port.port)
        return grpclib.client.Channel(
            self._host_port.host,
            self._host_port.port,
            ssl=self._tls.context,
            config=grpclib.config.Configuration(ssl_target_name_override=self._tls.server_name),
        )

    def stub(self, stub_cls: type[StubT]) -> StubT:
        """A generated stub (``pb.WorkerStub``, ``pb.ControlPlaneStub``) bound to this channel."""
        return stub_cls(self._channel)

    async def call(self, method: Callable[..., Awaitable[T]], request: Any, *, timeout_s: float) -> T:
        """Call a stub's bound ``method`` with ``request`` and a deadline of ``timeout_s``.

        Raises:
            Busy: the peer answered RESOURCE_EXHAUSTED: it is overloaded and did not start the
                request (nothing was stored; asking another peer is safe).
            ConnectionRefused: the peer refused the connection (nothing listens there).
            PeerUnavailable: the peer answered UNAVAILABLE: something it needs is out of its
                reach (``detail``: its words).
            Unavailable: the peer did not answer in time, could not be reached, or answered
                DEADLINE_EXCEEDED / CANCELLED.
            InvalidArgument, NotFound: the peer answered INVALID_ARGUMENT / NOT_FOUND
                (``field`` is ``"request"``; the peer's message is kept whole).
            FailedPrecondition: the peer answered FAILED_PRECONDITION (its message kept whole).
            IdempotencyConflict: the peer answered ALREADY_EXISTS: the request's idempotency
                key was first used for another request.
            PermissionDenied: the peer answered PERMISSION_DENIED or UNAUTHENTICATED: this
                client's certificate may not make this call.
            HandshakeRefused: the TLS handshake failed (either side refused the other's
                certificate, or one side does not speak TLS); the message says which.
            RemoteError: any other error status.
        """
        try:
            with trio.fail_after(timeout_s + 0.5):
                return await run_aio(method, request, timeout=timeout_s)
        except trio.TooSlowError as exc:
            raise Unavailable(f"{self.address} did not answer within {timeout_s:g} s") from exc
        except StockadeError:
            raise
        except Exception as exc:
            raise self._translated(exc) from exc

    def _translated(self, exc: Exception) -> StockadeError:
        """The StockadeError that says what a failed call's ``exc`` means (see :meth:`call`)."""
        if isinstance(exc, grpclib.exceptions.GRPCError):
            message = exc.message or ""
            if exc.status == grpclib.const.Status.RESOURCE_EXHAUSTED:
                return errors.Busy(f"{self.address}: {message}")
            if exc.status == grpclib.const.Status.UNAVAILABLE:
                return PeerUnavailable(f"{self.address}: UNAVAILABLE: {message}", detail=message)
            if exc.status in _RETRYABLE_STATUS:
                return Unavailable(f"{self.address}: {exc.status.name}: {message}")
            if exc.status in _REFUSALS:
                return _REFUSALS[exc.status](message)
            if exc.status in (grpclib.const.Status.PERMISSION_DENIED, grpclib.const.Status.UNAUTHENTICATED):
                return errors.PermissionDenied(f"{self.address}: {message}")
            return errors.RemoteError(exc.status.name, message)
        if isinstance(exc, TimeoutError) and exc.args == ("Deadline exceeded",):
            # grpclib's own deadline (grpclib.utils.DeadlineWrapper) ended the call.
            return Unavailable(f"{self.address}: DEADLINE_EXCEEDED: the call's deadline passed")
        if isinstance(exc, ConnectionRefusedError):
            return ConnectionRefused(f"{self.address} refused the connection")
        if isinstance(exc, ssl.SSLError):
            return HandshakeRefused(f"{self.address}: {describe_tls_error(exc)}")
        if isinstance(exc, _BROKEN):
            reason = describe_tls_error(exc)
            if reason is not None:
                return HandshakeRefused(f"{self.address}: {reason}")
            return Unavailable(f"{self.address} unreachable: {exc!r}{self._hint()}")
        # grpclib's own races (a connection lost while a stream is opened raises
        # AttributeError inside it): the peer is unreachable for this call; start afresh.
        self._reset()
        return Unavailable(f"{self.address} failed: {exc!r}")

    @asynccontextmanager
    async def stream(
        self,
        service: type[ServiceBase],
        rpc: str,
        request: Any,
        limits: StreamLimits,
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """A server-streaming call of ``service``'s ``rpc`` (snake_case, e.g. ``"read_logs"`` of
        ``protocol.bases.WorkerBase``) with ``request``, whose messages the block reads within ``limits``
        (its ``timeout_s`` sent as ``grpc-timeout``).

        The call is made when the first message is asked for; each message is read when the
        block asks for it (HTTP/2 flow control holds the server's sends meanwhile). Leaving the
        block, however it is left, resets the stream if it has not ended. No task runs beside
        the block, so an error it raises comes out as itself, not in an exception group.

        Raises (from the iteration, translated as :meth:`call` says):
            Unavailable: the peer could not be reached, sent nothing in time, or the stream
                broke; PeerUnavailable, Busy, NotFound, InvalidArgument, FailedPrecondition,
                PermissionDenied, HandshakeRefused, RemoteError: the peer's status.
            ValueError: ``service`` has no method ``rpc`` (at once).
        """
        path, request_type, reply_type = _route(service, rpc)
        call = self._channel.request(
            path, grpclib.const.Cardinality.UNARY_STREAM, request_type, reply_type, timeout=limits.timeout_s
        )
        messages = _Messages(self, call, request, limits)
        try:
            yield messages
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_DEADLINE_S):
                await messages.close()

    async def connect(self, *, timeout_s: float) -> None:
        """Open the connection now (with its TLS handshake) rather than at the first call.

        Raises:
            HandshakeRefused: the TLS handshake failed.
            Unavailable: the peer could not be reached within ``timeout_s``.
        """
        try:
            with trio.fail_after(timeout_s):
                await run_aio(self._channel.__connect__)
        except trio.TooSlowError as exc:
            raise Unavailable(f"{self.address} did not accept a connection within {timeout_s:g} s") from exc
        except ssl.SSLError as exc:
            raise HandshakeRefused(f"{self.address}: {describe_tls_error(exc)}") from exc
        except OSError as exc:
            raise Unavailable(f"{self.address} unreachable: {exc!r}") from exc

    def _hint(self) -> str:
        """What a lost connection may mean on this kind of channel."""
        if self._tls is None:
            return " (if the server uses TLS, this client needs its certificates instead of --insecure)"
        return (
            " (the server closed the connection: it may have refused this client's certificate, "
            "expired or from another CA, or a request too large for it)"
        )

    def _reset(self) -> None:
        self._channel.close()
        self._channel = self._new_channel()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._channel.close()


class _RemoteInvalid(errors.InvalidArgument):
    """INVALID_ARGUMENT from a peer: keeps the peer's message as the whole text."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.field = "request"
        self.value = None
        self.rule = message
        self.detail = ""


_REFUSALS: dict[grpclib.const.Status, Callable[[str], StockadeError]] = {
    grpclib.const.Status.INVALID_ARGUMENT: _RemoteInvalid,
    grpclib.const.Status.NOT_FOUND: errors.NotFound,
    grpclib.const.Status.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpclib.const.Status.ALREADY_EXISTS: errors.IdempotencyConflict,
}
"""The peer's own refusals, whose message is kept whole."""


@functools.cache
def _route(service: type[ServiceBase], rpc: str) -> tuple[str, type[Any], type[Any]]:
    """The path, request type and reply type of ``service``'s method ``rpc`` (snake_case), from
    the generated base's handler table; ValueError if it has none."""
    mapping: dict[str, Any] = service().__mapping__()  # type: ignore[abstract, attr-defined]
    for path, handler in mapping.items():
        if snake_case(path.rpartition("/")[2]) == rpc:
            return path, handler.request_type, handler.reply_type
    raise ValueError(f"{service.__name__} has no method {rpc!r}")


def snake_case(rpc: str) -> str:
    """``"SubmitJobs"`` -> ``"submit_jobs"`` (the generated methods' names)."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in rpc).lstrip("_")


@attrs.define
class _Messages:
    """The messages of one server stream (:meth:`GrpcChannel.stream`), as an async iterator;
    every step is one crossing to asyncio (grpclib's stream needs no task of its own)."""

    _channel: GrpcChannel
    _call: grpclib.client.Stream[Any, Any]
    _request: Any
    _limits: StreamLimits
    _entered: bool = False
    _ended: bool = False
    _received: int = 0

    def __aiter__(self) -> _Messages:
        return self

    async def _open(self) -> None:
        await run_aio(self._call.__aenter__)
        self._entered = True
        await run_aio(self._call.send_message, self._request, end=True)

    async def __anext__(self) -> Any:
        if self._ended:
            raise StopAsyncIteration
        wait_s = self._limits.first_message_s if self._received == 0 else self._limits.idle_s
        try:
            with trio.fail_after(math.inf if wait_s is None else wait_s):
                if not self._entered:
                    await self._open()
                message = await run_aio(self._call.recv_message)
                if message is None:
                    # The stream has ended: its trailers carry the status (an error raises here).
                    await run_aio(self._call.recv_trailing_metadata)
        except trio.TooSlowError:
            what = "its first message" if self._received == 0 else "anything more"
            raise Unavailable(f"{self._channel.address} did not send {what} within {wait_s:g} s") from None
        except StockadeError:
            raise
        except Exception as exc:
            self._ended = True
            raise self._channel._translated(exc) from exc
        if message is None:
            self._ended = True
            raise StopAsyncIteration
        self._received += 1
        return message

    async def close(self) -> None:
        """End the call: done if the stream ended, else reset (the server is told to stop)."""
        if not self._entered:
            return
        self._entered = False
        unfinished = None if self._ended else asyncio.CancelledError()
        with contextlib.suppress(Exception):  # the call is over either way; its error was reported
            await run_aio(
                self._call.__aexit__, None if unfinished is None else type(unfinished), unfinished, None
            )

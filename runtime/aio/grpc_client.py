"""The gRPC client side: :class:`GrpcChannel`, calls to one peer from trio with their errors
translated (a gRPC status or an unreachable peer becomes a :class:`runtime.errors.StockadeError`
that says what the caller can do), unary (:meth:`GrpcChannel.call`) or server-streaming
(:meth:`GrpcChannel.open_stream`, read as a :class:`GrpcStream`)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import grpclib.client
import grpclib.config
import grpclib.const
import grpclib.exceptions
import trio
from betterproto2.grpclib import ServiceStub

from runtime.aio.bridge import CLEANUP_DEADLINE_S, run_aio
from runtime.errors import (
    Busy,
    ConnectionRefused,
    HandshakeRefused,
    IdempotencyConflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RemoteError,
    StockadeError,
    Unavailable,
)
from runtime.identifiers import parse_address
from runtime.tls import TlsTarget, describe_tls_error

T = TypeVar("T")
StubT = TypeVar("StubT", bound=ServiceStub)


_RETRYABLE_STATUS = {
    grpclib.const.Status.UNAVAILABLE,
    grpclib.const.Status.DEADLINE_EXCEEDED,
    grpclib.const.Status.CANCELLED,
}


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
            Unavailable: the peer did not answer in time, could not be reached, or answered
                UNAVAILABLE / DEADLINE_EXCEEDED.
            InvalidArgument, NotFound: the peer answered INVALID_ARGUMENT / NOT_FOUND
                (``field`` is ``"request"``; the peer's message is kept whole).
            IdempotencyConflict: the peer answered ALREADY_EXISTS: the request's idempotency
                key was first used for another request.
            PermissionDenied: the peer answered PERMISSION_DENIED or UNAUTHENTICATED: this
                client's certificate may not make this call.
            HandshakeRefused: the TLS handshake failed (either side refused the other's
                certificate, or one side does not speak TLS); the message says which.
            RemoteError: any other error status.
        """
        with self._translated():
            try:
                with trio.fail_after(timeout_s + 0.5):
                    return await run_aio(method, request, timeout=timeout_s)
            except trio.TooSlowError as exc:
                raise Unavailable(f"{self.address} did not answer within {timeout_s:g} s") from exc

    def open_stream(
        self, method: Callable[..., AsyncIterator[T]], request: Any, *, timeout_s: float | None
    ) -> GrpcStream[T]:
        """Call a stub's bound server-streaming ``method`` (``read_job_logs``) with ``request``;
        the messages come from the stream returned, as the peer sends them.

        Args:
            method: the stub's method (it returns an asyncio async iterator).
            request: its request message.
            timeout_s: the deadline of the whole stream, in seconds (the peer ends it with
                DEADLINE_EXCEEDED then); None: none (the caller bounds the wait itself).

        Nothing is sent before the first :meth:`GrpcStream.next`.
        """
        return GrpcStream(self, method(request, timeout=timeout_s))

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """gRPC's and the network's errors, raised in the block, as the errors of :meth:`call`."""
        try:
            yield
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
            if exc.status in (grpclib.const.Status.PERMISSION_DENIED, grpclib.const.Status.UNAUTHENTICATED):
                raise PermissionDenied(f"{self.address}: {message}") from exc
            raise RemoteError(exc.status.name, message) from exc
        except ConnectionRefusedError as exc:
            raise ConnectionRefused(f"{self.address} refused the connection") from exc
        except ssl.SSLError as exc:
            raise HandshakeRefused(f"{self.address}: {describe_tls_error(exc)}") from exc
        except (
            TimeoutError,
            OSError,
            grpclib.exceptions.StreamTerminatedError,
            grpclib.exceptions.ProtocolError,
        ) as exc:
            reason = describe_tls_error(exc)
            if reason is not None:
                raise HandshakeRefused(f"{self.address}: {reason}") from exc
            raise Unavailable(f"{self.address} unreachable: {exc!r}{self._hint()}") from exc
        except StockadeError:
            raise
        except Exception as exc:
            # grpclib's own races (a connection lost while a stream is opened raises
            # AttributeError inside it): the peer is unreachable for this call; start afresh.
            self._reset()
            raise Unavailable(f"{self.address} failed: {exc!r}") from exc

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


_END: Any = object()
"""What :func:`_next_or_end` returns at the end of a stream (StopAsyncIteration does not cross
from an asyncio task to trio as itself)."""


async def _next_or_end(iterator: AsyncIterator[T]) -> T:
    """The next item of the asyncio async iterator ``iterator``, or :data:`_END` at its end."""
    try:
        return await anext(iterator)
    except StopAsyncIteration:
        return _END  # type: ignore[no-any-return]


class GrpcStream(Generic[T]):
    """The messages of one server-streaming call to one peer (:meth:`GrpcChannel.open_stream`),
    read from trio, with the errors of :meth:`GrpcChannel.call`. An async iterator; close it
    (:meth:`aclose`, or ``async with``) when it is left before its end, to end the call."""

    def __init__(self, channel: GrpcChannel, iterator: AsyncIterator[T]) -> None:
        self._channel = channel
        self._iterator = iterator
        self._closed = False

    @property
    def address(self) -> str:
        """The peer's ``host:port``."""
        return self._channel.address

    async def next(self) -> T | None:
        """The next message, or None once the peer has ended the stream.

        Raises:
            the errors of :meth:`GrpcChannel.call` (but for the deadline, which is the
            caller's), when the call fails before or while streaming.
        """
        if self._closed:
            return None
        with self._channel._translated():
            item = await run_aio(_next_or_end, self._iterator)
        if item is _END:
            self._closed = True
            return None
        return item

    def __aiter__(self) -> GrpcStream[T]:
        return self

    async def __anext__(self) -> T:
        item = await self.next()
        if item is None:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        """End the call if it is still open (idempotent; shielded, within
        :data:`runtime.aio.bridge.CLEANUP_DEADLINE_S`)."""
        if self._closed:
            return
        self._closed = True
        aclose = getattr(self._iterator, "aclose", None)
        if aclose is None:
            return
        # A call that failed has nothing left to end: its error was raised already.
        with (
            trio.CancelScope(shield=True),
            trio.move_on_after(CLEANUP_DEADLINE_S),
            contextlib.suppress(Exception),
        ):
            await run_aio(aclose)

    async def __aenter__(self) -> GrpcStream[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _RemoteInvalid(InvalidArgument):
    """INVALID_ARGUMENT from a peer: keeps the peer's message as the whole text."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.field = "request"
        self.value = None
        self.rule = message
        self.detail = ""

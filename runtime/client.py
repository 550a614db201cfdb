"""The control-plane client: any replica answers, and the client moves on when one does not.

:class:`ControlPlaneClient` walks the replicas for a call (:meth:`ControlPlaneClient.call`),
hedges a slow one (:meth:`ControlPlaneClient.call_hedged`), opens server streams
(:meth:`ControlPlaneClient.stream`), waits with backoff while every replica is busy (then
:class:`runtime.errors.ClusterBusy`), starts at a home replica (:mod:`runtime.routes`) and
sends every copy of a mutating call with one idempotency key (:mod:`runtime.idempotency_keys`).
Used by the agent, the CLI and the tests. Why it walks as it does: docs/design.md, "The
control-plane client: walks, hedges, homes and idempotency keys".
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio

from protocol import pb
from runtime.aio import GrpcChannel, StreamLimits
from runtime.backoff import FullJitterBackoff
from runtime.errors import (
    Busy,
    ClusterBusy,
    InvalidArgument,
    NoControlPlaneReachable,
    StockadeError,
    Unavailable,
)
from runtime.idempotency_keys import with_idempotency_key
from runtime.identifiers import parse_addresses
from runtime.routes import HOME_RETURN_S, Route, home_index
from runtime.tls import ANY_CONTROL_PLANE, ClientTls, TlsFiles

T = TypeVar("T")

HEDGED_RPCS = frozenset({"status", "get_job", "get_job_events", "list_jobs"})
"""The reads :meth:`ControlPlaneClient.call` hedges rather than abandons on a slow replica:
asking a second replica changes nothing in the cluster."""


@attrs.define
class _Walk:
    """What one walk of the replicas got: an answer, or how each failed."""

    reply: Any = None
    answered: bool = False
    failures: list[Unavailable] = attrs.field(factory=list)
    busy: bool = False

    def answer(self, reply: Any) -> None:
        self.reply = reply
        self.answered = True


class ControlPlaneClient:
    """Calls the ControlPlane service on the first of ``addresses`` that answers.

    Args:
        addresses: ``host:port`` of every control plane (at least one).
        timeout_s: deadline of one call to one address, in seconds.
        busy_retry_s: how long to keep asking again while every replica answers busy, in
            seconds (0: walk the list once).
        busy_backoff: the waits between walks of the list while every replica is busy.
        rng: the source of the backoff's jitter.
        tls: this client's mutual-TLS files (every call then presents its certificate and
            accepts only servers with a ``control-plane`` certificate from the same CA);
            None: plaintext, for a cluster run with ``--insecure``.
        home_key: spreads clients over the replicas (the agent passes its worker id): calls go
            first to :func:`home_index` of it. None: start at the first address, then stay with
            whichever replica answered last.
        home_return_s: with a ``home_key``, how long after moving away from home a walk starts
            there again, in seconds (:class:`runtime.routes.Route`).

    Raises:
        InvalidArgument: an empty list, a malformed address, a negative ``busy_retry_s`` or a
            ``home_return_s`` that is not > 0.
        runtime.tls.TlsFilesInvalid, runtime.tls.KeyFileExposed: a file of ``tls`` is
            missing, not PEM, or its key is readable by others.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        timeout_s: float = 2.0,
        busy_retry_s: float = 30.0,
        busy_backoff: FullJitterBackoff = FullJitterBackoff(),
        rng: random.Random | None = None,
        tls: TlsFiles | None = None,
        home_key: str | None = None,
        home_return_s: float = HOME_RETURN_S,
    ) -> None:
        if not addresses:
            raise InvalidArgument("control_planes", list(addresses), "must name at least one host:port")
        parse_addresses(addresses, field="control_planes")
        if not busy_retry_s >= 0:
            raise InvalidArgument("busy_retry_s", busy_retry_s, "must be >= 0")
        if not (home_return_s > 0 and math.isfinite(home_return_s)):
            raise InvalidArgument("home_return_s", home_return_s, "must be a finite number > 0")
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self.busy_retry_s = busy_retry_s
        self.busy_backoff = busy_backoff
        self._rng = rng or random.Random()
        self._channels: dict[str, GrpcChannel] = {}
        self._home_return_s = home_return_s
        self._route = self._new_route(home_key)
        self._routes: dict[str, Route] = {}
        """The route of each ``home_key`` passed per call (a shared client's workers)."""
        self._tls_target = None if tls is None else ClientTls(tls).target(ANY_CONTROL_PLANE)

    def _new_route(self, home_key: str | None) -> Route:
        home = None if home_key is None else home_index(home_key, len(self.addresses))
        return Route(home=home, home_return_s=self._home_return_s)

    def add_route(self, home_key: str, *, home: str | None = None) -> str:
        """Set up the route of calls made with ``home_key`` and return its home replica's
        address: ``home`` when given (a shared client's worker whose own list orders the
        replicas otherwise keeps its own home), else :func:`home_index` of the key.

        Raises:
            InvalidArgument: ``home`` is not one of this client's addresses.
        """
        if home is None:
            route = self._new_route(home_key)
        elif home in self.addresses:
            route = Route(home=self.addresses.index(home), home_return_s=self._home_return_s)
        else:
            raise InvalidArgument("home", home, f"must be one of the client's addresses {self.addresses}")
        self._routes[home_key] = route
        assert route.home is not None
        return self.addresses[route.home]

    def _route_of(self, home_key: str | None) -> Route:
        if home_key is None:
            return self._route
        if home_key not in self._routes:
            self._routes[home_key] = self._new_route(home_key)
        return self._routes[home_key]

    @property
    def home(self) -> str | None:
        """The home replica's address (None: the client has no ``home_key``)."""
        return None if self._route.home is None else self.addresses[self._route.home]

    def home_of(self, home_key: str) -> str:
        """The home replica's address of calls made with ``home_key`` (:meth:`add_route`)."""
        home = self._route_of(home_key).home
        assert home is not None
        return self.addresses[home]

    def _channel(self, address: str) -> GrpcChannel:
        if address not in self._channels:
            self._channels[address] = GrpcChannel(address, tls=self._tls_target)
        return self._channels[address]

    async def call(self, rpc: str, request: Any, *, timeout_s: float | None = None) -> Any:
        """Call ControlPlane method ``rpc`` (snake_case, e.g. ``"submit_job"``) with ``request``.

        Walks the replicas, starting with the one that answered last, skipping at once one
        that is unreachable or busy. A slow replica: :data:`HEDGED_RPCS` are hedged (the next
        one is asked too after ``timeout_s``, the first answer wins, the walk gives up after
        ``timeout_s * (replicas + 1)``: :meth:`call_hedged`); every other call waits
        ``timeout_s`` per replica, then asks the next. When every replica failed and one was
        busy, walks again after a backoff, for up to ``busy_retry_s``. A mutating request gets
        one idempotency key for the whole call (:func:`with_idempotency_key`).

        Raises:
            ClusterBusy: replicas kept answering busy for ``busy_retry_s`` (and the others did
                not answer); the message says how long and how each replica answered last.
            NoControlPlaneReachable: no replica answered and none was busy; the message says
                how each failed.
            InvalidArgument, NotFound, IdempotencyConflict, RemoteError: a replica refused
                the request itself (not retried elsewhere: every replica would say the same).
        """
        request = with_idempotency_key(request)
        per_replica_s = timeout_s or self.timeout_s

        async def walk_once() -> _Walk:
            if rpc in HEDGED_RPCS:
                return await self._hedged_walk(
                    rpc,
                    request,
                    hedge_after_s=per_replica_s,
                    deadline_s=per_replica_s * (len(self.addresses) + 1),
                )
            return await self._sequential_walk(
                lambda index: self._attempt(index, rpc, request, timeout_s=per_replica_s)
            )

        return await self._walk_while_busy(walk_once)

    async def _walk_while_busy(self, walk_once: Callable[[], Awaitable[_Walk]]) -> Any:
        """What ``walk_once()`` got, walking again after a backoff while a walk met busy
        replicas and no answer, for up to ``busy_retry_s``; raises as :meth:`call`."""
        started = trio.current_time()
        walks = 0
        while True:
            walk = await walk_once()
            if walk.answered:
                return walk.reply
            walks += 1
            if not walk.busy:
                raise self._unreachable(walk)
            elapsed_s = trio.current_time() - started
            left_s = self.busy_retry_s - elapsed_s
            if left_s <= 0:
                raise ClusterBusy(
                    f"every control plane is busy: asked {walks} time{'s' if walks != 1 else ''} over "
                    f"{elapsed_s:.1f} s (busy_retry_s {self.busy_retry_s:g}); nothing the busy replicas "
                    "refused was stored; last answers: " + "; ".join(map(str, walk.failures)),
                    addresses=self.addresses,
                    failures=walk.failures,
                )
            await trio.sleep(min(left_s, self.busy_backoff.delay_s(walks - 1, self._rng)))

    async def _sequential_walk(self, attempt: Callable[[int], Awaitable[Any]]) -> _Walk:
        """``await attempt(index)`` on each replica in turn, from the one that answered last,
        until one answers; :class:`Unavailable` passes on to the next, any other error is
        the answer of them all."""
        walk = _Walk()
        count = len(self.addresses)
        start = self._route.start_index()
        for step in range(count):
            index = (start + step) % count
            try:
                reply = await attempt(index)
            except Unavailable as exc:
                walk.busy = walk.busy or isinstance(exc, Busy)
                walk.failures.append(exc)
                continue
            self._route.answered_by(index)
            walk.answer(reply)
            return walk
        return walk

    async def call_hedged(
        self,
        rpc: str,
        request: Any,
        *,
        hedge_after_s: float,
        deadline_s: float,
        home_key: str | None = None,
    ) -> Any:
        """Call ``rpc`` with ``request``, asking the next replica too while the first is slow.

        The preferred replica (:class:`Route`, of ``home_key`` when given) is asked first.
        Whenever ``hedge_after_s`` passes without an answer, the next replica is asked too,
        without cancelling what is in flight; a failed attempt (refused, UNAVAILABLE, busy)
        moves on at once. Each replica is asked at most once; the first answer wins, the other
        attempts are cancelled, and its replica becomes the preferred one. Why: docs/design.md,
        "The control-plane client: walks, hedges, homes and idempotency keys".

        Args:
            rpc: the ControlPlane method, snake_case (``"heartbeat"``).
            request: its request message.
            hedge_after_s: seconds without an answer before the next replica is asked too.
            deadline_s: seconds after which the call gives up, every attempt included.
            home_key: the key whose route this call takes (a shared client passes each
                worker's id); None: the client's own route.

        Every copy of a mutating request carries one idempotency key.

        Raises:
            NoControlPlaneReachable: every replica failed, or none answered within
                ``deadline_s``; the message says how each failed.
            InvalidArgument, NotFound, IdempotencyConflict, RemoteError: a replica refused the
                request itself (the other attempts are cancelled: every replica would say the
                same).
        """
        request = with_idempotency_key(request)
        walk = await self._hedged_walk(
            rpc, request, hedge_after_s=hedge_after_s, deadline_s=deadline_s, route=self._route_of(home_key)
        )
        if walk.answered:
            return walk.reply
        raise self._unreachable(walk)

    async def _hedged_walk(
        self,
        rpc: str,
        request: Any,
        *,
        hedge_after_s: float,
        deadline_s: float,
        route: Route | None = None,
    ) -> _Walk:
        """One hedged walk of the replicas (:meth:`call_hedged`) on ``route`` (None: the
        client's own); raises a replica's refusal of the request itself."""
        route = route or self._route
        count = len(self.addresses)
        start = route.start_index()
        order = [(start + step) % count for step in range(count)]
        deadline = trio.current_time() + deadline_s
        walk = _Walk()
        in_flight: set[str] = set()
        refusal: list[StockadeError] = []
        failed_send, failed_recv = trio.open_memory_channel[None](count)

        async def attempt(index: int, cancel_all: trio.CancelScope) -> None:
            address = self.addresses[index]
            in_flight.add(address)  # left there when the deadline cancels it
            try:
                reply = await self._attempt(
                    index, rpc, request, timeout_s=max(0.001, deadline - trio.current_time())
                )
            except Unavailable as exc:
                in_flight.discard(address)
                walk.busy = walk.busy or isinstance(exc, Busy)
                walk.failures.append(exc)
                failed_send.send_nowait(None)
                return
            except StockadeError as exc:
                in_flight.discard(address)
                refusal.append(exc)
                cancel_all.cancel()
                return
            in_flight.discard(address)
            if not walk.answered and not refusal:
                route.answered_by(index)
                walk.answer(reply)
            cancel_all.cancel()

        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                for index in order:
                    nursery.start_soon(attempt, index, nursery.cancel_scope)
                    with trio.move_on_after(hedge_after_s):
                        await failed_recv.receive()
        if walk.answered:
            return walk
        if refusal:
            raise refusal[0]
        walk.failures.extend(
            Unavailable(f"{a} did not answer within {deadline_s:g} s") for a in sorted(in_flight)
        )
        return walk

    def _unreachable(self, walk: _Walk) -> NoControlPlaneReachable:
        return NoControlPlaneReachable(
            "no control plane answered: " + "; ".join(map(str, walk.failures)),
            addresses=self.addresses,
            failures=walk.failures,
        )

    async def _attempt(self, index: int, rpc: str, request: Any, *, timeout_s: float) -> Any:
        """One call of ``rpc`` to ``self.addresses[index]`` (tests replace it with scripted
        replicas); raises :class:`Unavailable` when it was not reached or slower than
        ``timeout_s``, else the replica's refusal."""
        channel = self._channel(self.addresses[index])
        method: Callable[..., Awaitable[Any]] = getattr(channel.stub(pb.ControlPlaneStub), rpc)
        return await channel.call(method, request, timeout_s=timeout_s)

    @asynccontextmanager
    async def stream(
        self,
        rpc: str,
        request: Any,
        limits: StreamLimits,
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """A server-streaming ControlPlane call (``rpc`` in snake_case, e.g.
        ``"read_job_logs"``) on the first replica that opens it; the block reads its messages.

        Walks the replicas one at a time, from the one that answered last, until one sends its
        first message (or ends the stream): one that cannot be reached, is busy, sends nothing
        within ``limits.first_message_s`` or answers UNAVAILABLE (e.g. the worker it would relay from
        is out of its reach) is left for the next; busy walks are retried as :meth:`call` does.
        Once a replica has sent a message the stream is its own: a later failure is raised from
        the iteration with a note of how many messages had come (another replica could not
        take it up where it stopped). Leaving the block ends the call.

        Raises:
            NoControlPlaneReachable, ClusterBusy: as :meth:`call` (a
                :class:`runtime.errors.PeerUnavailable` in ``failures`` for each replica that
                answered UNAVAILABLE).
            InvalidArgument, NotFound, FailedPrecondition, PermissionDenied, RemoteError: a
                replica refused the request.
            Unavailable: (from the iteration) the open stream broke or fell silent for
                ``limits.idle_s``.
        """
        async with contextlib.AsyncExitStack() as opened:

            def attempt(index: int) -> Awaitable[AsyncIterator[Any]]:
                return opened.enter_async_context(self._stream_attempt(index, rpc, request, limits))

            messages: AsyncIterator[Any] = await self._walk_while_busy(lambda: self._sequential_walk(attempt))
            yield messages

    @asynccontextmanager
    async def _stream_attempt(
        self, index: int, rpc: str, request: Any, limits: StreamLimits
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """``rpc``'s stream on ``self.addresses[index]`` (``limits``: as :meth:`stream`),
        entered once its first message has come; the block reads every message, that first one
        included (tests replace it with scripted replicas). Raises on entering as :meth:`_attempt`."""
        from protocol.bases import ControlPlaneBase  # here: unary calls need not load grpclib's server

        address = self.addresses[index]
        async with self._channel(address).stream(ControlPlaneBase, rpc, request, limits) as messages:
            try:
                first = [await anext(messages)]
            except StopAsyncIteration:
                first = []
            yield _opened(address, first, messages)

    @property
    def last_answered(self) -> str:
        """The address that answered last (or the first one, before any call)."""
        return self.addresses[self._route.preferred]

    def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


async def _opened(address: str, first: list[Any], rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The messages of a replica's stream that has opened (:meth:`ControlPlaneClient.stream`):
    those of ``first``, then those of ``rest``; a failure of ``rest`` is raised with a note
    naming the replica and how many messages had come."""
    for message in first:
        await trio.lowlevel.checkpoint()
        yield message
    received = len(first)
    while True:
        try:
            message = await anext(rest)
        except StopAsyncIteration:
            return
        except StockadeError as exc:
            plural = "" if received == 1 else "s"
            exc.add_note(f"the stream from {address} broke after {received} message{plural}")
            raise
        received += 1
        yield message

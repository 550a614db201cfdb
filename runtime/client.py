"""The control-plane client: any replica answers, and the client moves on when one does not.

Used by the agent (register, heartbeat), the CLI and the tests. Holds one channel per
address, tries the last address that answered first, and walks the list once on
:class:`runtime.errors.Unavailable` before giving up with
:class:`runtime.errors.NoControlPlaneReachable`.

The agent's heartbeats and registrations use :meth:`ControlPlaneClient.call_hedged` instead:
a slow replica is not abandoned (which turns one call into work on every replica) but given
until a deadline, while the next replica is asked too once the first has been slow for a while.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio

from protocol import pb
from runtime.aio import GrpcChannel, split_address
from runtime.errors import InvalidArgument, NoControlPlaneReachable, StockadeError, Unavailable

T = TypeVar("T")


class ControlPlaneClient:
    """Calls the ControlPlane service on the first of ``addresses`` that answers.

    Args:
        addresses: ``host:port`` of every control plane (at least one).
        timeout_s: deadline of one call to one address, in seconds.

    Raises:
        InvalidArgument: an empty list or a malformed address.
    """

    def __init__(self, addresses: Sequence[str], *, timeout_s: float = 2.0) -> None:
        if not addresses:
            raise InvalidArgument("control_planes", list(addresses), "must name at least one host:port")
        for address in addresses:
            split_address(address)
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self._channels: dict[str, GrpcChannel] = {}
        self._preferred = 0

    def _channel(self, address: str) -> GrpcChannel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = GrpcChannel(address)
        return channel

    async def call(self, rpc: str, request: Any, *, timeout_s: float | None = None) -> Any:
        """Call ControlPlane method ``rpc`` (snake_case, e.g. ``"submit_job"``) with ``request``.

        Raises:
            NoControlPlaneReachable: every address failed; the message says how each failed.
            InvalidArgument, NotFound, RemoteError: a replica refused the request itself
                (not retried elsewhere: every replica would say the same).
        """
        failures: list[str] = []
        count = len(self.addresses)
        for step in range(count):
            index = (self._preferred + step) % count
            address = self.addresses[index]
            channel = self._channel(address)
            method: Callable[..., Awaitable[Any]] = getattr(channel.stub(pb.ControlPlaneStub), rpc)
            try:
                reply = await channel.call(method, request, timeout_s=timeout_s or self.timeout_s)
            except Unavailable as exc:
                failures.append(str(exc))
                continue
            self._preferred = index
            return reply
        raise NoControlPlaneReachable("no control plane answered: " + "; ".join(failures))

    async def call_hedged(self, rpc: str, request: Any, *, hedge_after_s: float, deadline_s: float) -> Any:
        """Call ``rpc`` with ``request``, asking the next replica too while the first is slow.

        The preferred replica (the last that answered) gets the request first, with a deadline
        of ``deadline_s``. Whenever ``hedge_after_s`` has passed without an answer, the same
        request also goes to the next replica, without cancelling what is in flight; an attempt
        that fails (a refused connection, UNAVAILABLE) sends it to the next replica at once.
        Each replica is asked at most once per call. The first answer wins: every other
        attempt is cancelled, and its replica becomes the preferred one.

        Unlike :meth:`call`, a slow replica is not given up on after ``timeout_s``: a server
        that got the request usually does the work anyway (a cancelled handler even drops its
        database connection), so abandoning it and asking the next one turns one call into
        work on every replica exactly when they are overloaded. This is the hedged request of
        Dean and Barroso, "The Tail at Scale" (CACM 56(2), 2013), with the hedge sent after a
        fixed delay rather than a latency percentile.

        Args:
            rpc: the ControlPlane method, snake_case (``"heartbeat"``).
            request: its request message.
            hedge_after_s: seconds without an answer before the next replica is asked too.
            deadline_s: seconds after which the call gives up, every attempt included.

        Raises:
            NoControlPlaneReachable: every replica failed, or none answered within
                ``deadline_s``; the message says how each failed.
            InvalidArgument, NotFound, RemoteError: a replica refused the request itself
                (the other attempts are cancelled: every replica would say the same).
        """
        count = len(self.addresses)
        order = [(self._preferred + step) % count for step in range(count)]
        deadline = trio.current_time() + deadline_s
        failures: list[str] = []
        in_flight: set[str] = set()
        answer: list[tuple[int, Any]] = []
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
                failures.append(str(exc))
                failed_send.send_nowait(None)
                return
            except StockadeError as exc:
                in_flight.discard(address)
                refusal.append(exc)
                cancel_all.cancel()
                return
            in_flight.discard(address)
            if not answer and not refusal:
                answer.append((index, reply))
            cancel_all.cancel()

        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                for index in order:
                    nursery.start_soon(attempt, index, nursery.cancel_scope)
                    with trio.move_on_after(hedge_after_s):
                        await failed_recv.receive()
        if answer:
            self._preferred = answer[0][0]
            return answer[0][1]
        if refusal:
            raise refusal[0]
        failures.extend(f"{a} did not answer within {deadline_s:g} s" for a in sorted(in_flight))
        raise NoControlPlaneReachable("no control plane answered: " + "; ".join(failures))

    async def _attempt(self, index: int, rpc: str, request: Any, *, timeout_s: float) -> Any:
        """One call of ``rpc`` to ``self.addresses[index]`` (what :meth:`call_hedged` runs per
        replica; tests replace it with scripted replicas).

        Raises:
            Unavailable: the replica did not answer in ``timeout_s`` or could not be reached.
            InvalidArgument, NotFound, RemoteError: the replica refused the request.
        """
        channel = self._channel(self.addresses[index])
        method: Callable[..., Awaitable[Any]] = getattr(channel.stub(pb.ControlPlaneStub), rpc)
        return await channel.call(method, request, timeout_s=timeout_s)

    @property
    def last_answered(self) -> str:
        """The address that answered last (or the first one, before any call)."""
        return self.addresses[self._preferred]

    def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

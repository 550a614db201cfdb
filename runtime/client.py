"""The control-plane client: any replica answers, and the client moves on when one does not.

Used by the agent (register, heartbeat), the CLI and the tests. Holds one channel per
address, tries the last address that answered first, and walks the list once on
:class:`runtime.errors.Unavailable` before giving up with
:class:`runtime.errors.NoControlPlaneReachable`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from protocol import pb
from runtime.aio import GrpcChannel, split_address
from runtime.errors import InvalidArgument, NoControlPlaneReachable, Unavailable

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

    @property
    def last_answered(self) -> str:
        """The address that answered last (or the first one, before any call)."""
        return self.addresses[self._preferred]

    def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

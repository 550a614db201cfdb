"""The control-plane client: any replica answers, and the client moves on when one does not.

Used by the agent (register, heartbeat), the CLI and the tests. Holds one channel per
address, tries the last address that answered first, and walks the list once on
:class:`runtime.errors.Unavailable` before giving up with
:class:`runtime.errors.NoControlPlaneReachable`.

A replica that is overloaded answers :class:`runtime.errors.Busy` (it refused the request
before doing any of it) and the client asks the next one. When a whole walk of the list met
busy replicas and none that answered, the client waits, with capped exponential backoff and
full jitter (:mod:`runtime.backoff`), and walks the list again, until ``busy_retry_s`` has
passed; then it raises :class:`runtime.errors.ClusterBusy`. Hammering a saturated cluster with
immediate retries would only feed its overload.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio

from protocol import pb
from runtime.aio import GrpcChannel, split_address
from runtime.backoff import FullJitterBackoff
from runtime.errors import Busy, ClusterBusy, InvalidArgument, NoControlPlaneReachable, Unavailable

T = TypeVar("T")


class ControlPlaneClient:
    """Calls the ControlPlane service on the first of ``addresses`` that answers.

    Args:
        addresses: ``host:port`` of every control plane (at least one).
        timeout_s: deadline of one call to one address, in seconds.
        busy_retry_s: how long to keep asking again while every replica answers busy, in
            seconds (0: walk the list once).
        busy_backoff: the waits between walks of the list while every replica is busy.
        rng: the source of the backoff's jitter.

    Raises:
        InvalidArgument: an empty list, a malformed address or a negative ``busy_retry_s``.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        timeout_s: float = 2.0,
        busy_retry_s: float = 30.0,
        busy_backoff: FullJitterBackoff = FullJitterBackoff(),
        rng: random.Random | None = None,
    ) -> None:
        if not addresses:
            raise InvalidArgument("control_planes", list(addresses), "must name at least one host:port")
        for address in addresses:
            split_address(address)
        if not busy_retry_s >= 0:
            raise InvalidArgument("busy_retry_s", busy_retry_s, "must be >= 0")
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self.busy_retry_s = busy_retry_s
        self.busy_backoff = busy_backoff
        self._rng = rng or random.Random()
        self._channels: dict[str, GrpcChannel] = {}
        self._preferred = 0

    def _channel(self, address: str) -> GrpcChannel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = GrpcChannel(address)
        return channel

    async def call(self, rpc: str, request: Any, *, timeout_s: float | None = None) -> Any:
        """Call ControlPlane method ``rpc`` (snake_case, e.g. ``"submit_job"``) with ``request``.

        Tries each replica in turn, starting with the one that answered last. A replica that
        is unreachable or answers busy is skipped; when every replica failed and at least one
        of them was busy, waits (capped exponential backoff, full jitter) and tries them all
        again, for up to ``busy_retry_s`` in all. A busy replica did not start the request, so
        a submission retried after busy answers is stored once, not twice. (A replica that did
        not answer in time may have stored it; that retry is the caller's risk, as before.)

        Raises:
            ClusterBusy: replicas kept answering busy for ``busy_retry_s`` (and the others did
                not answer); the message says how long and how each replica answered last.
            NoControlPlaneReachable: no replica answered and none was busy; the message says
                how each failed.
            InvalidArgument, NotFound, RemoteError: a replica refused the request itself
                (not retried elsewhere: every replica would say the same).
        """
        started = trio.current_time()
        walks = 0
        while True:
            failures: list[str] = []
            busy = False
            count = len(self.addresses)
            for step in range(count):
                index = (self._preferred + step) % count
                address = self.addresses[index]
                channel = self._channel(address)
                method: Callable[..., Awaitable[Any]] = getattr(channel.stub(pb.ControlPlaneStub), rpc)
                try:
                    reply = await channel.call(method, request, timeout_s=timeout_s or self.timeout_s)
                except Busy as exc:
                    busy = True
                    failures.append(str(exc))
                    continue
                except Unavailable as exc:
                    failures.append(str(exc))
                    continue
                self._preferred = index
                return reply
            walks += 1
            if not busy:
                raise NoControlPlaneReachable("no control plane answered: " + "; ".join(failures))
            elapsed_s = trio.current_time() - started
            left_s = self.busy_retry_s - elapsed_s
            if left_s <= 0:
                raise ClusterBusy(
                    f"every control plane is busy: asked {walks} time{'s' if walks != 1 else ''} over "
                    f"{elapsed_s:.1f} s (busy_retry_s {self.busy_retry_s:g}); nothing the busy replicas "
                    "refused was stored; last answers: " + "; ".join(failures)
                )
            await trio.sleep(min(left_s, self.busy_backoff.delay_s(walks - 1, self._rng)))

    @property
    def last_answered(self) -> str:
        """The address that answered last (or the first one, before any call)."""
        return self.addresses[self._preferred]

    def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

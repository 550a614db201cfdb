"""A fault-injecting TCP proxy, to cut one worker off from every control plane and heal it.

For each worker the chaos harness runs one proxy in front of its Worker service and one per
control plane for the worker's own calls. Cutting a worker's :class:`Link` stalls every
connection through those proxies (new ones too), in both directions, as dropped packets would.
Healing closes the stalled connections (as a TCP timeout would have) and lets new ones through.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio


@attrs.define
class Link:
    """The network between one worker and the control planes: up, or cut."""

    name: str
    stalled: set[trio.CancelScope] = attrs.field(factory=set)
    """Scopes of the connections through this link; cancelled (closed) on heal."""
    cut: bool = False

    def sever(self) -> None:
        """Cut the link: every byte in flight through it stops moving."""
        self.cut = True

    def heal(self) -> None:
        """Restore the link; connections stalled by the cut are closed."""
        if self.cut:
            self.cut = False
            for scope in list(self.stalled):
                scope.cancel()


async def _pump(source: trio.abc.HalfCloseableStream, sink: trio.abc.HalfCloseableStream, link: Link) -> None:
    """Copy ``source`` to ``sink`` while the link is up. A broken or closed connection ends
    this direction quietly: to the proxy, a peer going away is ordinary traffic."""
    try:
        while True:
            if link.cut:
                await trio.sleep_forever()  # stalled; the cut's scope is cancelled on heal
            data = await source.receive_some(65536)
            if not data:
                await sink.send_eof()
                return
            if link.cut:
                await trio.sleep_forever()
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return


async def _relay(client: trio.abc.HalfCloseableStream, target: Callable[[], str], link: Link) -> None:
    with trio.CancelScope() as scope:
        link.stalled.add(scope)
        try:
            async with client:
                if link.cut:
                    await trio.sleep_forever()
                host, _, port = target().rpartition(":")
                try:
                    upstream = await trio.open_tcp_stream(host, int(port))
                except OSError:
                    return
                async with upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, upstream, link)
                    nursery.start_soon(_pump, upstream, client, link)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            link.stalled.discard(scope)


async def serve_proxy(
    port: int,
    target: Callable[[], str],
    link: Link,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Forward 127.0.0.1:``port`` to ``target()`` (host:port, looked up per connection)
    through ``link`` until cancelled; ``task_status.started(port)``.

    Raises:
        OSError: the port could not be bound.
    """
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        task_status.started(listeners[0].socket.getsockname()[1])

        async def handle(stream: trio.SocketStream) -> None:
            await _relay(stream, target, link)

        await trio.serve_listeners(handle, listeners, handler_nursery=nursery)

"""The fault-injecting proxy: forwards while up, stalls everything while cut, closes the
stalled connections on heal and lets new ones through."""

from __future__ import annotations

from functools import partial

import trio

from ops.netfault import Link, serve_proxy


async def echo(stream: trio.SocketStream) -> None:
    async with stream:
        async for data in stream:
            await stream.send_all(data)


async def test_cut_stalls_and_heal_closes_then_reconnects() -> None:
    """Bytes flow, then stop flowing during a cut (no error, no answer), then the stalled
    connection ends on heal and a new one works."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
        echo_port = listeners[0].socket.getsockname()[1]
        link = Link(name="w-1")
        port = await nursery.start(serve_proxy, 0, lambda: f"127.0.0.1:{echo_port}", link)

        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"ping")
        assert await stream.receive_some(100) == b"ping"

        link.sever()
        await stream.send_all(b"lost")
        with trio.move_on_after(0.3) as waited:
            await stream.receive_some(100)
        assert waited.cancelled_caught  # stalled, like dropped packets

        late = await trio.open_tcp_stream("127.0.0.1", port)  # accepted, but goes nowhere
        await late.send_all(b"hello")
        with trio.move_on_after(0.3) as waited:
            await late.receive_some(100)
        assert waited.cancelled_caught

        link.heal()
        with trio.fail_after(10):
            assert await stream.receive_some(100) == b""  # closed: the caller reconnects
        fresh = await trio.open_tcp_stream("127.0.0.1", port)
        await fresh.send_all(b"again")
        with trio.fail_after(10):
            assert await fresh.receive_some(100) == b"again"
        for s in (stream, late, fresh):
            await s.aclose()
        nursery.cancel_scope.cancel()

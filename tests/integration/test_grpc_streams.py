"""Server streams through the grpclib-under-trio bridge, over real gRPC on 127.0.0.1: a trio
async generator (or a coroutine given a send function) serves ``Worker.ReadLogs``, and a trio
caller reads it with :meth:`runtime.aio.GrpcChannel.stream`. Cancellation goes both ways, a
deadline ends the handler, errors keep their meaning, and a reader that stops reading holds the
server's sends back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from protocol import pb
from protocol.bases import WorkerBase
from runtime.aio import GrpcChannel, StreamLimits, asyncio_bridge, rpc_deadline, serve_grpc, trio_service
from runtime.errors import NotFound, Unavailable

CHUNK = b"x" * 65536


class Scripted:
    """A Worker service whose ReadLogs sends ``count`` chunks (each numbered in
    ``assignment_id``), then ends, or raises ``fail_with`` after them; it notes how far it got
    and when it ended, however it ended."""

    def __init__(self, count: int = 3, *, fail_with: Exception | None = None, pause_s: float = 0.0) -> None:
        self.count = count
        self.fail_with = fail_with
        self.pause_s = pause_s
        self.sent = 0
        self.ended = trio.Event()
        self.cancelled = False
        self.deadline = 0.0

    async def read_logs(self, request: pb.ReadLogsRequest) -> AsyncIterator[pb.LogChunk]:
        self.deadline = rpc_deadline()
        try:
            for n in range(self.count):
                yield pb.LogChunk(data=CHUNK, assignment_id=n + 1, worker_id=request.worker_id)
                self.sent += 1
                if self.pause_s:
                    await trio.sleep(self.pause_s)
            if self.fail_with is not None:
                raise self.fail_with
        except trio.Cancelled:
            self.cancelled = True
            raise
        finally:
            self.ended.set()


class SendForm:
    """ReadLogs as a coroutine given a send function, sending from inside a nursery."""

    async def read_logs(
        self, request: pb.ReadLogsRequest, send: Callable[[pb.LogChunk], Awaitable[None]]
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
            for n in range(request.tail_lines):
                await send(pb.LogChunk(data=b"%d\n" % n, assignment_id=n + 1))


@asynccontextmanager
async def served(impl: object) -> AsyncIterator[GrpcChannel]:
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, [trio_service(WorkerBase, impl)], "127.0.0.1", 0)
        channel = GrpcChannel(f"127.0.0.1:{port}")
        try:
            yield channel
        finally:
            channel.close()
            nursery.cancel_scope.cancel()


def open_stream(channel: GrpcChannel, **options: Any) -> Any:
    """A ReadLogs stream of ``channel`` (its first message within 5 s)."""
    return channel.stream(WorkerBase, "read_logs", pb.ReadLogsRequest(), StreamLimits(5.0, **options))


async def read_all(channel: GrpcChannel, request: pb.ReadLogsRequest, **options: Any) -> list[pb.LogChunk]:
    async with channel.stream(WorkerBase, "read_logs", request, StreamLimits(5.0, **options)) as chunks:
        return [chunk async for chunk in chunks]


async def test_an_async_generator_serves_every_message_in_order() -> None:
    """Every chunk a trio async generator yields reaches the caller, in order, and the stream ends."""
    impl = Scripted(count=5)
    async with served(impl) as channel:
        chunks = await read_all(channel, pb.ReadLogsRequest(worker_id="w-1"))
    assert [c.assignment_id for c in chunks] == [1, 2, 3, 4, 5]
    assert all(c.data == CHUNK and c.worker_id == "w-1" for c in chunks)


async def test_a_handler_given_a_send_function_may_send_from_inside_a_nursery() -> None:
    """The send-function form serves a stream whose handler holds a nursery across its sends."""
    async with served(SendForm()) as channel:
        chunks = await read_all(channel, pb.ReadLogsRequest(tail_lines=4))
    assert [c.data for c in chunks] == [b"0\n", b"1\n", b"2\n", b"3\n"]


async def test_an_error_after_some_messages_reaches_the_caller_after_them() -> None:
    """A StockadeError the handler raises after two chunks comes to the caller, translated, after
    the two chunks."""
    impl = Scripted(count=2, fail_with=NotFound("no such output"))
    got: list[int] = []
    async with served(impl) as channel:
        with pytest.raises(NotFound, match="no such output"):
            async with channel.stream(
                WorkerBase, "read_logs", pb.ReadLogsRequest(), StreamLimits(5.0)
            ) as chunks:
                async for chunk in chunks:
                    got.append(chunk.assignment_id)
    assert got == [1, 2]


async def test_a_caller_that_goes_away_cancels_the_handler() -> None:
    """Leaving the block after one chunk resets the stream: the server's generator is cancelled
    where it waits, long before it would have sent everything."""
    impl = Scripted(count=1000, pause_s=0.05)
    async with served(impl) as channel:
        async with open_stream(channel) as chunks:
            await anext(chunks)
        with trio.fail_after(5):
            await impl.ended.wait()
    assert impl.cancelled
    assert impl.sent < 1000


async def test_a_cancelled_caller_cancels_the_handler() -> None:
    """A caller cancelled while it waits for the next chunk stops the handler too."""
    impl = Scripted(count=1000, pause_s=0.05)
    async with served(impl) as channel:
        with trio.move_on_after(0.3):
            await read_all(channel, pb.ReadLogsRequest())
        with trio.fail_after(5):
            await impl.ended.wait()
    assert impl.cancelled


async def test_the_deadline_ends_the_handler_and_the_call() -> None:
    """A stream with a 0.5 s deadline: the handler knows it (rpc_deadline), is cancelled when it
    passes, and the caller gets Unavailable (DEADLINE_EXCEEDED)."""
    impl = Scripted(count=1000, pause_s=0.05)
    async with served(impl) as channel:
        with pytest.raises(Unavailable, match="DEADLINE_EXCEEDED"):
            await read_all(channel, pb.ReadLogsRequest(), timeout_s=0.5)
        with trio.fail_after(5):
            await impl.ended.wait()
    assert impl.cancelled
    assert impl.deadline < float("inf")


async def test_a_reader_that_does_not_read_holds_the_sends_back() -> None:
    """A caller that reads one 64 KiB chunk and then reads nothing for a second leaves the
    handler waiting in its sends (HTTP/2 flow control): it has sent far fewer than the 1000
    chunks it has to send."""
    impl = Scripted(count=1000)
    async with served(impl) as channel, open_stream(channel) as chunks:
        await anext(chunks)
        await trio.sleep(1.0)
        sent_while_idle = impl.sent
    assert sent_while_idle < 500


async def test_a_silent_stream_is_given_up_after_idle_s() -> None:
    """A server that sends one chunk and then nothing: the caller's next read gives up after
    idle_s with Unavailable naming the server."""
    impl = Scripted(count=2, pause_s=30.0)
    async with served(impl) as channel:
        with pytest.raises(Unavailable, match=r"did not send anything more within 0\.3 s"):
            await read_all(channel, pb.ReadLogsRequest(), idle_s=0.3)


async def test_nothing_listening_is_unavailable_from_the_first_read() -> None:
    """A stream to an address where nothing listens fails on its first read, as Unavailable."""
    async with asyncio_bridge():
        with trio.socket.socket() as sock:
            await sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        channel = GrpcChannel(f"127.0.0.1:{port}")
        try:
            with pytest.raises(Unavailable, match="refused"):
                await read_all(channel, pb.ReadLogsRequest())
        finally:
            channel.close()

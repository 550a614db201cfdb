"""A control plane takes more calls at once on one connection than HTTP/2's usual 100: a fleet
sends every hosted worker's calls over one connection per control plane, and 150 of them
in flight together (registering at once, or hedged to this replica) must all reach it rather
than queue on the client for a free stream."""

from __future__ import annotations

from functools import partial

import trio

from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import asyncio_bridge, serve_grpc, trio_service
from runtime.aio.grpc_server import MAX_CONCURRENT_STREAMS
from runtime.client import ControlPlaneClient

CALLS = 150
HANG_GUARD_S = 30.0
"""Bounds a wait that must end by itself; never a measured time."""


class HoldingReplica:
    """Answers no heartbeat until ``CALLS`` of them are in progress at once."""

    def __init__(self) -> None:
        self.in_progress = 0
        self.all_in = trio.Event()

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.in_progress += 1
        if self.in_progress == CALLS:
            self.all_in.set()
        await self.all_in.wait()
        return pb.HeartbeatReply(epoch=1)


async def test_150_calls_at_once_on_one_connection_all_reach_the_server() -> None:
    assert MAX_CONCURRENT_STREAMS >= CALLS
    replica = HoldingReplica()
    async with asyncio_bridge(), trio.open_nursery() as servers:
        service = trio_service(ControlPlaneBase, replica)
        port = await servers.start(partial(serve_grpc, [service], "127.0.0.1", 0))
        client = ControlPlaneClient([f"127.0.0.1:{port}"], timeout_s=HANG_GUARD_S)
        replies: list[pb.HeartbeatReply] = []
        try:

            async def beat(n: int) -> None:
                request = pb.HeartbeatRequest(worker_id=f"w-{n}", incarnation=1)
                replies.append(
                    await client.call_hedged(
                        "heartbeat", request, hedge_after_s=HANG_GUARD_S, deadline_s=HANG_GUARD_S
                    )
                )

            with trio.fail_after(HANG_GUARD_S):
                async with trio.open_nursery() as calls:
                    for n in range(CALLS):
                        calls.start_soon(beat, n)
        finally:
            client.close()
        servers.cancel_scope.cancel()
    assert len(replies) == CALLS and replica.in_progress == CALLS

"""The dispatcher's Cancel call (actors/dispatcher.py): a preemption's grace travels in the
request, and the call waits the grace longer for its answer."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from actors.dispatcher import Dispatcher
from actors.messages import CancelOnWorker, DispatcherInbox, LeaseInbox, WorkerRef
from protocol import pb
from runtime.reply import Reply
from runtime.settings.leader import DispatchSettings

W1 = WorkerRef(worker_id="w-1", address="127.0.0.1:1", incarnation=3)


@attrs.define
class ScriptedCalls:
    """Records each Cancel call's request and timeout, and acknowledges every id."""

    cancels: list[tuple[pb.CancelRequest, float]] = attrs.field(factory=list)

    async def assign(self, address: str, request: pb.AssignRequest, timeout_s: float) -> pb.AssignReply:
        raise AssertionError("no assignment is sent here")

    async def cancel(self, address: str, request: pb.CancelRequest, timeout_s: float) -> pb.CancelReply:
        self.cancels.append((request, timeout_s))
        return pb.CancelReply(acknowledged_ids=list(request.assignment_ids))


async def cancel_with(grace_s: float) -> tuple[pb.CancelRequest, float, tuple[int, ...]]:
    calls = ScriptedCalls()
    inbox_send, inbox_recv = trio.open_memory_channel[DispatcherInbox](4)
    lease_send, _ = trio.open_memory_channel[LeaseInbox](4)
    dispatcher = Dispatcher(
        settings=DispatchSettings(rpc_timeout_s=2.0), inbox=inbox_recv, lease_inbox=lease_send, calls=calls
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        reply: Reply[tuple[int, ...]] = Reply()
        await inbox_send.send(
            CancelOnWorker(epoch=4, worker=W1, assignment_ids=(7, 8), reply=reply, grace_s=grace_s)
        )
        acknowledged = await reply.wait()
        nursery.cancel_scope.cancel()
    ((request, timeout_s),) = calls.cancels
    return request, timeout_s, acknowledged


async def test_a_preemptions_cancel_carries_its_grace_and_waits_it_longer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancel with a grace of 5 s asks the worker for grace_ms 5000 and allows the call the
    grace plus rpc_timeout_s."""
    request, timeout_s, acknowledged = await cancel_with(5.0)
    assert (request.grace_ms, request.epoch, request.worker_id, request.incarnation) == (5000, 4, "w-1", 3)
    assert timeout_s == 7.0
    assert acknowledged == (7, 8)


async def test_an_ordinary_cancel_leaves_the_grace_to_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancel without a grace sends grace_ms 0 (the worker's own stop_grace_s) and allows the
    call rpc_timeout_s."""
    request, timeout_s, _ = await cancel_with(0.0)
    assert (request.grace_ms, timeout_s) == (0, 2.0)

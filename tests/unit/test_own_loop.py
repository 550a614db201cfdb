"""Actors on a loop of their own (runtime.threads): start, stop, errors, messages across loops.

Real threads and real trio loops (no mock clock: the hosted loop has a clock of its own).
"""

from __future__ import annotations

import threading
from functools import partial

import pytest
import trio

from runtime.reply import Reply
from runtime.threads import CrossLoopSender, OwnLoop, run_on_own_loop


async def test_the_actor_runs_in_another_thread_and_stops_with_its_host() -> None:
    """The hosted actor starts on another thread before the host reports started; cancelling
    the host cancels the actor, waits for its cleanup, and leaves no thread behind."""
    main_thread = threading.get_ident()
    seen: dict[str, object] = {}

    async def actor(*, task_status: trio.TaskStatus[None]) -> None:
        seen["thread"] = threading.get_ident()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            seen["cleaned_up"] = True

    loop = OwnLoop("test")
    async with trio.open_nursery() as nursery:
        await nursery.start(run_on_own_loop, loop, actor)
        assert seen["thread"] != main_thread
        assert loop.lag is not None
        nursery.cancel_scope.cancel()
    assert seen["cleaned_up"] is True
    assert not [t for t in threading.enumerate() if t.name == "stockade-test"]


async def test_an_error_of_the_actor_is_raised_by_its_host() -> None:
    """An exception in the hosted actor after its start ends the host with that exception."""

    async def actor(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.sleep(0.01)
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        await run_on_own_loop(OwnLoop("test"), actor)


async def test_messages_cross_loops_in_order_and_replies_come_back() -> None:
    """Calls posted to the hosted loop (also before it started) run there in order; the actor's
    messages reach a channel of the main loop in order; a Reply set on the hosted loop wakes
    its asker on the main loop."""
    main_token = trio.lowlevel.current_trio_token()
    to_main_send, to_main_recv = trio.open_memory_channel[int](100)
    inbox_send, inbox_recv = trio.open_memory_channel[tuple[int, Reply[int]]](100)
    loop = OwnLoop("test")
    reply: Reply[int] = Reply()
    loop.post(inbox_send.send_nowait, (0, reply))  # before the loop exists: kept

    async def actor(*, task_status: trio.TaskStatus[None]) -> None:
        out = CrossLoopSender(to_main_send, main_token, "to main")
        task_status.started()
        async for number, answer in inbox_recv:
            out.send_nowait(number)
            answer.set(number * 10)

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(run_on_own_loop, loop, actor))
        assert await reply.wait() == 0
        replies = [Reply[int]() for _ in range(20)]
        for number, answer in enumerate(replies, start=1):
            loop.post(inbox_send.send_nowait, (number, answer))
        assert [await r.wait() for r in replies] == [n * 10 for n in range(1, 21)]
        assert [to_main_recv.receive_nowait() for _ in range(21)] == list(range(21))
        nursery.cancel_scope.cancel()


async def test_the_hosted_loop_is_not_held_up_by_a_busy_main_loop() -> None:
    """While the main loop computes for 1 s without a checkpoint, the hosted loop keeps waking
    (its lag stays at most half the computation's length: held by the main loop, it would
    reach the whole second; the margin is for a loaded machine's scheduling)."""
    loop = OwnLoop("test")
    ticks: list[float] = []

    async def actor(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        while True:
            ticks.append(trio.current_time())
            await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        await nursery.start(run_on_own_loop, loop, actor)
        await trio.sleep(0.1)
        before = len(ticks)
        deadline = trio.current_time() + 1.0
        while trio.current_time() < deadline:  # no checkpoint: the main loop is held
            sum(range(10_000))
        assert len(ticks) - before >= 5
        assert loop.lag is not None and loop.lag.recent_max_s < 0.5
        nursery.cancel_scope.cancel()

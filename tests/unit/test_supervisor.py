"""Supervision: restart with capped backoff, give up past the limit, never swallow cancellation."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from runtime.errors import ActorGaveUp, PermanentError
from runtime.supervisor import RestartPolicy, supervise

POLICY = RestartPolicy(max_restarts=3, window_s=30.0, backoff_initial_s=0.1, backoff_max_s=0.4)


class Boom(Exception):
    pass


async def test_restarts_a_crashed_actor_with_doubling_backoff(autojump_clock: trio.testing.MockClock) -> None:
    """An actor that crashes twice is started again after 0.1 s, then 0.2 s, and then runs."""
    starts: list[float] = []

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) <= 2:
            raise Boom("crash")
        await trio.sleep(1.0)

    await supervise("flaky", actor, policy=POLICY)
    assert starts == pytest.approx([0.0, 0.1, 0.3])


async def test_signals_started_once_the_first_start_succeeds(autojump_clock: trio.testing.MockClock) -> None:
    """nursery.start(supervise, ...) returns once the actor's first start succeeded."""

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.sleep(0.5)
        task_status.started()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "slow", actor)
        assert trio.current_time() == pytest.approx(0.5)
        nursery.cancel_scope.cancel()


async def test_gives_up_after_too_many_crashes_in_the_window(autojump_clock: trio.testing.MockClock) -> None:
    """The fourth crash within 30 s (max_restarts=3) raises ActorGaveUp with the cause."""
    starts = 0

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal starts
        starts += 1
        raise Boom(f"crash {starts}")

    with pytest.raises(ActorGaveUp) as info:
        await supervise("doomed", actor, policy=POLICY)
    assert starts == 4
    assert isinstance(info.value.__cause__, Boom)


async def test_crashes_spread_beyond_the_window_are_forgiven(autojump_clock: trio.testing.MockClock) -> None:
    """Crashes 40 s apart never add up to the limit."""
    starts = 0

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal starts
        starts += 1
        task_status.started()
        if starts <= 6:
            await trio.sleep(40.0)
            raise Boom("late crash")

    await supervise("slow-flaky", actor, policy=POLICY)
    assert starts == 7


async def test_permanent_error_is_not_retried(autojump_clock: trio.testing.MockClock) -> None:
    """A PermanentError gives up at once."""
    starts = 0

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal starts
        starts += 1
        raise PermanentError("bad configuration")

    with pytest.raises(ActorGaveUp):
        await supervise("misconfigured", actor, policy=POLICY)
    assert starts == 1


async def test_cancellation_propagates_and_is_not_restarted(autojump_clock: trio.testing.MockClock) -> None:
    """Cancelling the supervisor stops the actor; it is not started again."""
    starts = 0

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal starts
        starts += 1
        task_status.started()
        await trio.sleep_forever()

    with trio.move_on_after(1.0):
        await supervise("steady", actor, policy=POLICY)
    assert starts == 1


async def test_an_inessential_actor_that_keeps_crashing_rests_and_comes_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Past the limit, an actor the process can do without rests a window (30 s) and starts
    again with its count cleared, instead of giving up; here it then runs."""
    starts: list[float] = []

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) <= 5:
            raise Boom(f"crash {len(starts)}")
        await trio.sleep(1.0)

    await supervise("console", actor, policy=POLICY, essential=False)
    # Four crashes 0.1, 0.2, 0.4 s apart, the fourth past max_restarts=3: 30 s of rest, then
    # the fifth start crashes once more and the sixth runs (the backoff begins again at 0.1 s).
    assert starts == pytest.approx([0.0, 0.1, 0.3, 0.7, 30.7, 30.8])


async def test_an_inessential_actor_whose_first_start_never_succeeds_gives_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One that crashes before it ever started still fails the process: a console that cannot
    start (its port taken) is a misconfiguration, said at once."""

    async def actor(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise Boom("cannot bind")

    with pytest.raises(ActorGaveUp):
        await supervise("console", actor, policy=POLICY, essential=False)

"""Hedged calls to the control planes, on trio's mock clock with scripted replicas.

:meth:`ControlPlaneClient.call_hedged` runs one attempt per replica through ``_attempt``,
which these tests replace with scripted replicas (answer after a delay, never, or refuse the
connection at once); the agent-level tests run a real :class:`agent.core.Agent` over
:class:`agent.control_plane.GrpcControlPlane` on such a client.
"""

from __future__ import annotations

import math
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from agent import fence as agent_fence
from agent.control_plane import GrpcControlPlane, HedgeDelay
from agent.core import Agent
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument, NoControlPlaneReachable, Unavailable
from runtime.settings.agent import AgentSettings

HEDGE_S = 0.5
DEADLINE_S = 1.4


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


@attrs.define
class Replica:
    """One scripted control plane: answers after ``delay_s`` (inf: never), or refuses at once."""

    name: str
    delay_s: float = 0.0
    refuse: bool = False
    invalid: bool = False
    calls: list[tuple[float, str, float]] = attrs.field(factory=list)
    """(trio time, rpc, timeout_s given) of every attempt."""
    answered: list[float] = attrs.field(factory=list)
    cancelled: int = 0
    incarnations: int = 0

    async def answer(self, rpc: str, request: Any, timeout_s: float) -> Any:
        self.calls.append((trio.current_time(), rpc, timeout_s))
        if self.refuse:
            raise Unavailable(f"{self.name} unreachable: ConnectionRefusedError()")
        if self.invalid:
            raise InvalidArgument("request", None, "is scripted to be refused")
        try:
            with trio.move_on_after(timeout_s) as scope:
                await trio.sleep(self.delay_s)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        if scope.cancelled_caught:
            raise Unavailable(f"{self.name} did not answer within {timeout_s:g} s")
        self.answered.append(trio.current_time())
        if rpc == "register_worker":
            self.incarnations += 1
            return pb.RegisterWorkerReply(incarnation=self.incarnations, epoch=1)
        if rpc == "leave_worker":
            return pb.LeaveWorkerReply(left=True, epoch=1)
        return pb.HeartbeatReply(epoch=1)


class ScriptedClient(ControlPlaneClient):
    """A ControlPlaneClient whose replicas are scripted."""

    def __init__(self, *replicas: Replica) -> None:
        super().__init__([f"10.0.0.{n}:7000" for n in range(1, len(replicas) + 1)], timeout_s=HEDGE_S)
        self.replicas = dict(zip(self.addresses, replicas, strict=True))

    async def _attempt(self, index: int, rpc: str, request: Any, *, timeout_s: float) -> Any:
        return await self.replicas[self.addresses[index]].answer(rpc, request, timeout_s)


async def hedged(client: ScriptedClient) -> tuple[Any, float]:
    """One hedged heartbeat call; returns the reply and how long it took."""
    began = trio.current_time()
    reply = await client.call_hedged(
        "heartbeat", pb.HeartbeatRequest(worker_id="w-1"), hedge_after_s=HEDGE_S, deadline_s=DEADLINE_S
    )
    return reply, trio.current_time() - began


# ---------------------------------------------------------------------------- the client


async def test_a_slow_replica_that_answers_late_still_counts(autojump_clock: Any) -> None:
    """A replica that answers after 0.8 s (past hedge_after_s) is not given up on: its answer
    is taken, although the hedge to the next replica was refused."""
    slow, down = Replica("a", delay_s=0.8), Replica("b", refuse=True)
    client = ScriptedClient(slow, down)
    reply, took_s = await hedged(client)
    assert reply.epoch == 1 and took_s == pytest.approx(0.8)
    assert [t for t, _, _ in down.calls] == pytest.approx([HEDGE_S])
    assert slow.cancelled == 0 and client.last_answered == "10.0.0.1:7000"


async def test_a_frozen_replica_is_hedged_and_the_hedge_answers(autojump_clock: Any) -> None:
    """The preferred replica never answers: after hedge_after_s the next one is asked too, its
    answer is taken, the frozen attempt is cancelled, and the next call goes to the new one
    first."""
    frozen, healthy = Replica("a", delay_s=math.inf), Replica("b", delay_s=0.05)
    client = ScriptedClient(frozen, healthy)
    _, took_s = await hedged(client)
    assert took_s == pytest.approx(HEDGE_S + 0.05)
    assert frozen.cancelled == 1
    assert client.last_answered == "10.0.0.2:7000"
    _, took_s = await hedged(client)
    assert took_s == pytest.approx(0.05)
    assert len(frozen.calls) == 1  # not asked again


async def test_when_both_answer_the_first_answer_wins(autojump_clock: Any) -> None:
    """The first replica answers at 0.7 s, the hedge (sent at 0.5 s) at 0.6 s: the hedge's
    answer is taken at 0.6 s, once, and the first attempt is cancelled."""
    first, hedge = Replica("a", delay_s=0.7), Replica("b", delay_s=0.1)
    client = ScriptedClient(first, hedge)
    _, took_s = await hedged(client)
    assert took_s == pytest.approx(0.6)
    assert (first.answered, first.cancelled) == ([], 1)
    assert len(hedge.answered) == 1


async def test_no_hedge_when_the_first_replica_answers_in_time(autojump_clock: Any) -> None:
    """An answer within hedge_after_s: the other replicas are never asked (no extra load)."""
    first, second, third = Replica("a", delay_s=0.3), Replica("b"), Replica("c")
    client = ScriptedClient(first, second, third)
    for _ in range(5):
        _, took_s = await hedged(client)
        assert took_s == pytest.approx(0.3)
    assert (len(first.calls), second.calls, third.calls) == (5, [], [])


async def test_a_read_from_a_slow_replica_is_hedged_not_abandoned(autojump_clock: Any) -> None:
    """call() on a read: the first replica answers after 2.5 timeouts; the second, asked after
    one timeout, answers later still. The first replica's answer is taken, and each replica
    was asked once (an abandoned listing would have been redone on every replica)."""
    slow, slower = Replica("a", delay_s=2.5 * HEDGE_S), Replica("b", delay_s=10 * HEDGE_S)
    client = ScriptedClient(slow, slower)
    began = trio.current_time()
    await client.call("list_jobs", pb.ListJobsRequest(limit=400))
    assert trio.current_time() - began == pytest.approx(2.5 * HEDGE_S)
    assert [t for t, _, _ in slower.calls] == pytest.approx([HEDGE_S])
    assert (len(slow.calls), slower.cancelled) == (1, 1)


async def test_a_read_gives_up_a_timeout_per_replica_and_one_more_after_it_began(autojump_clock: Any) -> None:
    """call() on a read where no replica ever answers: NoControlPlaneReachable after
    timeout_s * (replicas + 1), naming each replica."""
    client = ScriptedClient(Replica("a", delay_s=math.inf), Replica("b", delay_s=math.inf))
    began = trio.current_time()
    with pytest.raises(NoControlPlaneReachable, match=r"10\.0\.0\.1:7000 did not answer.*10\.0\.0\.2:7000"):
        await client.call("status", pb.StatusRequest())
    assert trio.current_time() - began == pytest.approx(3 * HEDGE_S)


async def test_a_submission_is_never_sent_to_two_replicas_at_once(autojump_clock: Any) -> None:
    """call() on a submission: the slow first replica is given timeout_s, then abandoned for
    the next; the two are never asked at the same time."""
    slow, fast = Replica("a", delay_s=3 * HEDGE_S), Replica("b", delay_s=0.1)
    client = ScriptedClient(slow, fast)
    await client.call("submit_job", pb.SubmitJobRequest())
    assert [t for t, _, _ in fast.calls] == pytest.approx([HEDGE_S])
    assert slow.answered == [] and client.last_answered == "10.0.0.2:7000"


async def test_a_refused_connection_fails_over_at_once(autojump_clock: Any) -> None:
    """A replica that refuses the connection hands the call to the next one at once."""
    down, up = Replica("a", refuse=True), Replica("b")
    client = ScriptedClient(down, up)
    _, took_s = await hedged(client)
    assert took_s == 0.0 and [t for t, _, _ in up.calls] == [0.0]


async def test_each_attempt_gets_what_is_left_of_the_deadline(autojump_clock: Any) -> None:
    """The first attempt may take the whole deadline, each hedge what is left of it; when none
    answers in time the call fails at the deadline, naming every replica."""
    a, b, c = (Replica(n, delay_s=math.inf) for n in "abc")
    client = ScriptedClient(a, b, c)
    began = trio.current_time()
    with pytest.raises(NoControlPlaneReachable) as info:
        await hedged(client)
    assert trio.current_time() - began == pytest.approx(DEADLINE_S)
    assert [t - began for r in (a, b, c) for t, _, _ in r.calls] == pytest.approx([0.0, HEDGE_S, 2 * HEDGE_S])
    assert [timeout for r in (a, b, c) for _, _, timeout in r.calls] == pytest.approx(
        [DEADLINE_S, DEADLINE_S - HEDGE_S, DEADLINE_S - 2 * HEDGE_S]
    )
    for address in client.addresses:
        assert f"{address} did not answer within" in str(info.value)


async def test_every_replica_refusing_fails_at_once(autojump_clock: Any) -> None:
    """When every replica refuses the connection the call fails at once, saying how each failed."""
    client = ScriptedClient(Replica("a", refuse=True), Replica("b", refuse=True))
    with pytest.raises(NoControlPlaneReachable, match=r"a unreachable.*b unreachable"):
        await hedged(client)
    assert trio.current_time() == 0.0


async def test_a_request_a_replica_refuses_is_not_sent_elsewhere(autojump_clock: Any) -> None:
    """INVALID_ARGUMENT from a replica ends the call with that error: every replica would say
    the same, so the slow first attempt is cancelled and no other replica is asked."""
    slow, refusing, spare = Replica("a", delay_s=math.inf), Replica("b", invalid=True), Replica("c")
    client = ScriptedClient(slow, refusing, spare)
    with pytest.raises(InvalidArgument, match="scripted to be refused"):
        await hedged(client)
    assert slow.cancelled == 1 and spare.calls == []


# ---------------------------------------------------------------------------- the agent

AGENT_HEARTBEAT_S = 0.25
AGENT_TIMEOUT_S = 0.5
AGENT_FENCE_S = 1.5


@pytest.fixture
def deadlines(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every fence deadline the agent publishes (``time.monotonic()`` follows the mock clock)."""
    written: list[float] = []
    monkeypatch.setattr(
        agent_fence,
        "write_fence_deadline",
        lambda path, monotonic_s, kill_at_s=None: written.append(monotonic_s),
    )
    shim = types.SimpleNamespace(time=lambda: 1e9 + trio.current_time(), monotonic=trio.current_time)
    monkeypatch.setattr(agent_fence, "time", shim)
    return written


@asynccontextmanager
async def agent_over(tmp_path: Path, client: ScriptedClient, **overrides: Any) -> AsyncIterator[Agent]:
    settings = AgentSettings(
        worker_id="w-1",
        control_planes=client.addresses,
        cpu_millis=1000,
        memory_mb=1000,
        work_dir=str(tmp_path),
        heartbeat_interval_s=AGENT_HEARTBEAT_S,
        heartbeat_timeout_s=AGENT_TIMEOUT_S,
        self_fence_after_s=AGENT_FENCE_S,
    )
    settings = attrs.evolve(settings, **overrides)
    agent = Agent(settings, GrpcControlPlane(client, hedge_after_s=AGENT_TIMEOUT_S))
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run, "127.0.0.1:9")
        await agent.wait_registered()
        yield agent
        nursery.cancel_scope.cancel()


async def test_an_agent_whose_control_plane_answers_slowly_does_not_fence(
    tmp_path: Path, autojump_clock: Any, deadlines: list[float]
) -> None:
    """Every call is answered 0.6 s after it was sent (past heartbeat_timeout_s, 0.5 s), and
    the only other replica refuses: each answer still counts, the fence deadline moves to its
    send time + self_fence_after_s, and the worker never fences. (Before hedged calls each
    heartbeat was given up after 0.5 s, and the worker fenced 1.5 s after registering.)"""
    slow, down = Replica("a", delay_s=0.6), Replica("b", refuse=True)
    client = ScriptedClient(slow, down)
    async with agent_over(tmp_path, client) as agent:
        await trio.sleep(10.0)
        assert not agent.self_fenced and agent.incarnation == 1
    heartbeat_sends = [t for t, rpc, _ in slow.calls if rpc == "heartbeat"]
    assert len(heartbeat_sends) >= 10
    # One deadline per answered call (the registration first), each from that call's send time.
    sends = [t for t, _, _ in slow.calls][: len(deadlines)]
    assert deadlines == pytest.approx([t + AGENT_FENCE_S for t in sends])
    assert all(timeout > AGENT_TIMEOUT_S for _, rpc, timeout in slow.calls if rpc == "heartbeat")


async def test_an_agent_whose_control_plane_freezes_is_answered_by_the_hedge(
    tmp_path: Path, autojump_clock: Any, deadlines: list[float]
) -> None:
    """The preferred replica freezes: the heartbeat in flight is answered by the next replica
    after heartbeat_timeout_s, the worker does not fence, and later heartbeats go to the new
    replica alone."""
    a, b = Replica("a"), Replica("b", delay_s=0.01)
    client = ScriptedClient(a, b)
    async with agent_over(tmp_path, client) as agent:
        await trio.sleep(1.1)  # between two heartbeats
        a.delay_s = math.inf
        frozen_at = trio.current_time()
        await trio.sleep(5.0)
        assert not agent.self_fenced
    assert a.cancelled == 1 and len([t for t, _, _ in a.calls if t > frozen_at]) == 1
    hedged_at = next(t for t, _, _ in b.calls)
    assert hedged_at - [t for t, _, _ in a.calls][-1] == pytest.approx(AGENT_TIMEOUT_S)
    assert len(b.answered) >= 15


async def test_when_both_replicas_answer_the_deadline_moves_once(
    tmp_path: Path, autojump_clock: Any, deadlines: list[float]
) -> None:
    """Both replicas answer one heartbeat (the first late, the hedge sooner): the agent takes
    one answer, and moves its fence deadline once, from the heartbeat's send time."""
    a, b = Replica("a"), Replica("b", delay_s=0.1)
    client = ScriptedClient(a, b)
    async with agent_over(tmp_path, client) as agent:
        await trio.sleep(0.1)
        a.delay_s = 0.7  # answers 0.7 s after each send; the hedge 0.6 s after
        deadlines.clear()
        sent_from = trio.current_time()
        await trio.sleep(1.0)
        assert not agent.self_fenced
        answers = len([t for t in b.answered if t > sent_from]) + len(
            [t for t in a.answered if t > sent_from]
        )
    first_send = next(t for t, _, _ in a.calls if t > sent_from)
    assert deadlines[0] == pytest.approx(first_send + AGENT_FENCE_S)
    assert b.answered[0] - first_send == pytest.approx(0.6)
    assert len(deadlines) == answers
    assert a.cancelled == 1


def test_the_hedge_delay_grows_with_slow_answers_within_its_bounds() -> None:
    """Before any answer: the floor. Answers 1 s slow everywhere: three times the smoothed round
    trip, capped at a third of the call's deadline; fast answers bring it back to the floor."""
    hedge = HedgeDelay(floor_s=0.5)
    assert hedge.after_s(deadline_s=6.0) == 0.5
    for _ in range(30):
        hedge.answered(1.0)
    assert hedge.after_s(deadline_s=12.0) == pytest.approx(3.0)
    assert hedge.after_s(deadline_s=6.0) == pytest.approx(2.0)
    assert hedge.after_s(deadline_s=0.9) == 0.5
    for _ in range(30):
        hedge.answered(0.01)
    assert hedge.after_s(deadline_s=6.0) == 0.5


async def test_a_cluster_slow_everywhere_is_not_sent_each_heartbeat_twice(
    tmp_path: Path, autojump_clock: Any, deadlines: list[float]
) -> None:
    """Heartbeats every second, self-fence after 4 s; both replicas answer every call 0.7 s
    after it was sent (past heartbeat_timeout_s, 0.5 s): the first heartbeats are hedged to
    the second replica, but once the round trips are known the agent waits for its replica, so
    over 20 s the second is asked a few times, not once per heartbeat; the worker never
    fences."""
    a, b = Replica("a", delay_s=0.7), Replica("b", delay_s=0.7)
    client = ScriptedClient(a, b)
    async with agent_over(tmp_path, client, heartbeat_interval_s=1.0, self_fence_after_s=4.0) as agent:
        await trio.sleep(20.0)
        assert not agent.self_fenced and agent.incarnation == 1
    heartbeats_a = [t for t, rpc, _ in a.calls if rpc == "heartbeat"]
    heartbeats_b = [t for t, rpc, _ in b.calls if rpc == "heartbeat"]
    assert len(heartbeats_a) >= 15
    assert len(heartbeats_b) <= 3, heartbeats_b

"""Workers spread over the control planes by a stable hash of their id, move on from a slow
home replica, and go home again after ``home_return_s`` (mock clock, scripted replicas)."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument, Unavailable
from runtime.routes import home_index

HEDGE_S = 0.5
DEADLINE_S = 1.4
RETURN_S = 10.0


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


@attrs.define
class Replica:
    """One scripted control plane: answers a heartbeat after ``delay_s`` (inf: never), or
    refuses the connection at once."""

    name: str
    delay_s: float = 0.0
    refuse: bool = False
    calls: list[float] = attrs.field(factory=list)
    answered: list[float] = attrs.field(factory=list)

    async def answer(self, rpc: str, request: Any, timeout_s: float) -> Any:
        self.calls.append(trio.current_time())
        if self.refuse:
            raise Unavailable(f"{self.name} unreachable: ConnectionRefusedError()")
        with trio.move_on_after(timeout_s) as scope:
            await trio.sleep(self.delay_s)
        if scope.cancelled_caught:
            raise Unavailable(f"{self.name} did not answer within {timeout_s:g} s")
        self.answered.append(trio.current_time())
        return pb.HeartbeatReply(epoch=1)


class HomedClient(ControlPlaneClient):
    """A ControlPlaneClient with a home replica, whose replicas are scripted."""

    def __init__(self, key: str, *replicas: Replica) -> None:
        super().__init__(
            [f"10.0.0.{n}:7000" for n in range(1, len(replicas) + 1)],
            timeout_s=HEDGE_S,
            home_key=key,
            home_return_s=RETURN_S,
        )
        self.replicas = dict(zip(self.addresses, replicas, strict=True))

    async def _attempt(self, index: int, rpc: str, request: Any, *, timeout_s: float) -> Any:
        return await self.replicas[self.addresses[index]].answer(rpc, request, timeout_s)


async def beat(client: ControlPlaneClient) -> None:
    await client.call_hedged(
        "heartbeat", pb.HeartbeatRequest(worker_id="w"), hedge_after_s=HEDGE_S, deadline_s=DEADLINE_S
    )


def key_with_home(home: int, replicas: int) -> str:
    """A worker id whose home is replica ``home``."""
    return next(f"w-{n}" for n in range(1, 1000) if home_index(f"w-{n}", replicas) == home)


def test_a_thousand_workers_spread_evenly_over_three_replicas() -> None:
    """w-1..w-1000 over 3 replicas: each replica is home to between 300 and 367 of them
    (a third, within 10 %)."""
    counts = [0, 0, 0]
    for n in range(1, 1001):
        counts[home_index(f"w-{n}", 3)] += 1
    assert all(300 <= c <= 367 for c in counts), counts


def test_the_home_replica_is_stable_and_not_salted() -> None:
    """The homes are the BLAKE2b rule's, pinned: the same in every process and Python version
    (Python's hash() of a str would change with PYTHONHASHSEED)."""
    assert [home_index(f"w-{n}", 3) for n in range(1, 9)] == [2, 1, 0, 2, 1, 0, 0, 1]
    assert home_index("w-1", 1) == 0


def test_zero_replicas_is_refused_naming_the_value() -> None:
    """home_index over 0 replicas is an error naming the field and value."""
    with pytest.raises(InvalidArgument, match="replicas"):
        home_index("w-1", 0)


def test_a_home_return_that_is_not_positive_is_refused() -> None:
    """home_return_s 0 is refused at construction, naming it."""
    with pytest.raises(InvalidArgument, match="home_return_s"):
        ControlPlaneClient(["127.0.0.1:1"], home_key="w-1", home_return_s=0)


async def test_calls_go_to_the_home_replica_first(autojump_clock: Any) -> None:
    """A client whose key hashes to replica 2 (of 3) asks replica 2 first, and only it."""
    replicas = [Replica("a"), Replica("b"), Replica("c")]
    client = HomedClient(key_with_home(2, 3), *replicas)
    for _ in range(3):
        await beat(client)
    assert [len(r.calls) for r in replicas] == [0, 0, 3]
    assert client.home == client.addresses[2] == client.last_answered


async def test_a_slow_home_makes_the_worker_move_on_and_it_comes_home_later(autojump_clock: Any) -> None:
    """Home (replica 0) freezes: the hedge goes to replica 1, which answers, and later calls go
    to replica 1 alone; home_return_s after the move the client asks home first again, and,
    home having recovered, stays there."""
    home, other, third = Replica("a"), Replica("b"), Replica("c")
    client = HomedClient(key_with_home(0, 3), home, other, third)
    await beat(client)
    home.delay_s = math.inf
    await beat(client)
    moved_at = trio.current_time()  # when replica 1's answer came
    assert client.last_answered == client.addresses[1]
    home.delay_s = 0.0  # home recovers, but the client does not know yet
    while trio.current_time() - moved_at < RETURN_S - 1.0:
        await beat(client)
        await trio.sleep(0.5)
    calls_home = len(home.calls)
    assert calls_home == 2  # the first call and the frozen one: nothing while away
    await trio.sleep(1.0)
    await beat(client)
    assert len(home.calls) == calls_home + 1 and client.last_answered == client.home
    assert home.answered[-1] - moved_at >= RETURN_S


async def test_a_home_still_down_on_return_is_left_again_at_once(autojump_clock: Any) -> None:
    """Home refuses connections: each return to it (every home_return_s) costs one refused
    attempt and the call is answered by the next replica; in between home is not asked."""
    home, other = Replica("a", refuse=True), Replica("b")
    client = HomedClient(key_with_home(0, 2), home, other)
    began = trio.current_time()
    while trio.current_time() - began < 3 * RETURN_S + 1:
        await beat(client)
        await trio.sleep(0.25)
    assert len(home.calls) == 4  # at 0, then after each of three home_return_s
    assert client.last_answered == client.addresses[1]


async def test_a_client_without_a_home_key_starts_at_the_first_and_stays_where_answered(
    autojump_clock: Any,
) -> None:
    """No home_key: the first address first, and no return after a move (the old rule)."""
    a, b = Replica("a", refuse=True), Replica("b")
    client = ControlPlaneClient(["10.0.0.1:7000", "10.0.0.2:7000"], timeout_s=HEDGE_S)
    replicas = dict(zip(client.addresses, [a, b], strict=True))

    async def attempt(index: int, rpc: str, request: Any, *, timeout_s: float) -> Any:
        return await replicas[client.addresses[index]].answer(rpc, request, timeout_s)

    client._attempt = attempt  # type: ignore[method-assign]
    await beat(client)
    a.refuse = False
    await trio.sleep(3 * RETURN_S)
    await beat(client)
    assert len(a.calls) == 1 and client.home is None


class SharedClient(HomedClient):
    """A client shared by many workers (a fleet's): no home of its own, scripted replicas."""

    def __init__(self, *replicas: Replica) -> None:
        ControlPlaneClient.__init__(
            self, [f"10.0.0.{n}:7000" for n in range(1, len(replicas) + 1)], home_return_s=RETURN_S
        )
        self.replicas = dict(zip(self.addresses, replicas, strict=True))


async def beat_as(client: ControlPlaneClient, worker_id: str) -> None:
    await client.call_hedged(
        "heartbeat",
        pb.HeartbeatRequest(worker_id=worker_id),
        hedge_after_s=HEDGE_S,
        deadline_s=DEADLINE_S,
        home_key=worker_id,
    )


async def test_a_shared_client_sends_each_workers_call_to_that_workers_home(autojump_clock: Any) -> None:
    """Through one shared client, a call made for a worker goes to that worker's home replica
    first, and only there while it answers; each worker's home is home_of its id."""
    replicas = [Replica("a"), Replica("b"), Replica("c")]
    client = SharedClient(*replicas)
    workers = [key_with_home(home, 3) for home in (0, 1, 2)]
    for worker_id in workers:
        await beat_as(client, worker_id)
        await beat_as(client, worker_id)
    assert [len(r.calls) for r in replicas] == [2, 2, 2]
    assert [client.home_of(w) for w in workers] == client.addresses


async def test_one_workers_move_away_from_its_home_does_not_move_another(autojump_clock: Any) -> None:
    """Replica 0 freezes: the worker homed there moves on to replica 1 (hedged), while the
    worker homed on replica 2 keeps asking replica 2 alone; each keeps its own route."""
    frozen, other, third = Replica("a"), Replica("b"), Replica("c")
    client = SharedClient(frozen, other, third)
    at_0, at_2 = key_with_home(0, 3), key_with_home(2, 3)
    frozen.delay_s = math.inf
    await beat_as(client, at_0)  # hedged to replica 1 after HEDGE_S
    await beat_as(client, at_0)  # now straight to replica 1
    await beat_as(client, at_2)
    assert (len(frozen.calls), len(other.calls), len(third.calls)) == (1, 2, 1)


async def test_a_route_added_with_a_home_starts_there(autojump_clock: Any) -> None:
    """A worker whose own list makes replica 2 its home, added so, is asked at replica 2 first
    through the shared client, whatever home_index of its id among the client's order says;
    a home the client does not know is refused, naming it."""
    replicas = [Replica("a"), Replica("b"), Replica("c")]
    client = SharedClient(*replicas)
    worker_id = key_with_home(0, 3)
    assert client.add_route(worker_id, home=client.addresses[2]) == client.addresses[2]
    await beat_as(client, worker_id)
    assert [len(r.calls) for r in replicas] == [0, 0, 1]
    with pytest.raises(InvalidArgument, match=r"10\.9\.9\.9:7000"):
        client.add_route(worker_id, home="10.9.9.9:7000")

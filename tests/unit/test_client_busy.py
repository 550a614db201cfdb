"""The client's answer to busy replicas: the next replica at once, then capped exponential
backoff with full jitter while all are busy (hypothesis for the schedule, a mock clock and
scripted replicas for the client)."""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from runtime.backoff import FullJitterBackoff
from runtime.client import ControlPlaneClient
from runtime.errors import Busy, ClusterBusy, InvalidArgument, NoControlPlaneReachable, Unavailable


@given(
    base_s=st.floats(0.001, 10.0),
    cap_s=st.floats(0.001, 60.0),
    attempt=st.integers(0, 5000),
    seed=st.integers(0, 2**32),
)
def test_every_wait_is_within_zero_and_the_capped_exponential(
    base_s: float, cap_s: float, attempt: int, seed: int
) -> None:
    """The wait after attempt n lies in [0, min(cap, base * 2**n)], and never above the cap."""
    backoff = FullJitterBackoff(base_s=base_s, cap_s=cap_s)
    delay = backoff.delay_s(attempt, random.Random(seed))
    ceiling = min(cap_s, base_s * 2.0**attempt) if attempt < 1000 else cap_s
    assert backoff.ceiling_s(attempt) == pytest.approx(ceiling)
    assert 0.0 <= delay <= backoff.ceiling_s(attempt) <= cap_s


@given(attempt=st.integers(0, 8))
def test_waits_are_spread_over_the_whole_interval(attempt: int) -> None:
    """Full jitter: waits cover [0, ceiling] from near 0 to near the ceiling, not a band at its end."""
    backoff = FullJitterBackoff(base_s=0.1, cap_s=2.0)
    rng = random.Random(attempt)
    delays = [backoff.delay_s(attempt, rng) for _ in range(2000)]
    ceiling = backoff.ceiling_s(attempt)
    assert min(delays) < 0.02 * ceiling and max(delays) > 0.98 * ceiling
    assert sum(delays) / len(delays) == pytest.approx(ceiling / 2, rel=0.1)


def test_backoff_settings_must_be_positive() -> None:
    """A zero or infinite cap names the field, the rule and the value."""
    with pytest.raises(InvalidArgument, match="cap_s must be a finite number > 0, got 0"):
        FullJitterBackoff(cap_s=0)
    with pytest.raises(InvalidArgument, match="cap_s must be a finite number > 0, got inf"):
        FullJitterBackoff(cap_s=float("inf"))


class _Stub:
    def __getattr__(self, rpc: str) -> str:
        return rpc


@attrs.define
class ScriptedReplica:
    """Stands in for one replica's channel: answers from ``script`` in turn, then ``then``."""

    script: list[Any]
    then: Any = None
    calls: list[float] = attrs.field(factory=list)

    def stub(self, stub_cls: type) -> _Stub:
        return _Stub()

    async def call(self, method: str, request: Any, *, timeout_s: float) -> Any:
        self.calls.append(trio.current_time())
        answer = self.script.pop(0) if self.script else self.then
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        pass


def client_with(*replicas: ScriptedReplica, **kwargs: Any) -> ControlPlaneClient:
    client = ControlPlaneClient([f"127.0.0.1:{7100 + i}" for i in range(len(replicas))], **kwargs)
    for address, replica in zip(client.addresses, replicas, strict=True):
        client._channels[address] = replica  # type: ignore[assignment]
    return client


def busy(name: str) -> Busy:
    return Busy(f"busy: {name} is overloaded, try another replica")


async def test_a_busy_replica_is_skipped_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """Busy moves on to the next replica without waiting, and that one is preferred afterwards."""
    first = ScriptedReplica([busy("cp-1")])
    second = ScriptedReplica([], then="reply")
    client = client_with(first, second)
    assert await client.call("submit_job", object()) == "reply"
    assert (first.calls, second.calls) == ([0.0], [0.0])
    assert client.last_answered == "127.0.0.1:7101"


async def test_all_busy_backs_off_with_full_jitter_until_one_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While every replica is busy the client waits delay_s(0), delay_s(1), ... (drawn from its
    rng) between walks of the list, and returns the first answer."""
    backoff = FullJitterBackoff(base_s=0.5, cap_s=4.0)
    first = ScriptedReplica([busy("cp-1")] * 3, then=busy("cp-1"))
    second = ScriptedReplica([busy("cp-2")] * 3, then="reply")
    client = client_with(first, second, busy_backoff=backoff, busy_retry_s=30.0, rng=random.Random(7))
    assert await client.call("submit_jobs", object()) == "reply"
    same_draws = random.Random(7)
    expected = [0.0]
    for attempt in range(3):
        expected.append(expected[-1] + backoff.delay_s(attempt, same_draws))
    assert first.calls == pytest.approx(expected, abs=1e-9)
    assert second.calls == pytest.approx(expected, abs=1e-9)


async def test_busy_for_the_whole_budget_raises_cluster_busy_at_its_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The client stops asking after busy_retry_s, its last wait cut to the budget, and says
    every replica was busy and that nothing refused was stored."""
    always = ScriptedReplica([], then=busy("cp-1"))
    client = client_with(always, busy_backoff=FullJitterBackoff(base_s=1.0, cap_s=2.0), busy_retry_s=5.0)
    with pytest.raises(ClusterBusy) as info:
        await client.call("status", object())
    assert trio.current_time() == pytest.approx(5.0)
    assert always.calls[-1] == pytest.approx(5.0)
    message = str(info.value)
    assert "every control plane is busy" in message and "busy_retry_s 5" in message
    assert "nothing the busy replicas refused was stored" in message and "busy: cp-1 is overloaded" in message


async def test_busy_and_unreachable_replicas_still_back_off(autojump_clock: trio.testing.MockClock) -> None:
    """One busy replica is enough to wait and ask again: the cluster is up, only loaded."""
    down = ScriptedReplica([], then=Unavailable("127.0.0.1:7100 unreachable"))
    loaded = ScriptedReplica([busy("cp-2")], then="reply")
    client = client_with(
        down, loaded, busy_backoff=FullJitterBackoff(base_s=1.0, cap_s=1.0), rng=random.Random(1)
    )
    assert await client.call("get_job", object()) == "reply"
    assert len(loaded.calls) == 2 and loaded.calls[1] == pytest.approx(random.Random(1).uniform(0.0, 1.0))


async def test_no_busy_answer_fails_at_once_as_before(autojump_clock: trio.testing.MockClock) -> None:
    """When no replica answered and none was busy, the client gives up after one walk."""
    client = client_with(
        ScriptedReplica([], then=Unavailable("a down")), ScriptedReplica([], then=Unavailable("b down"))
    )
    with pytest.raises(NoControlPlaneReachable) as info:
        await client.call("heartbeat", object())
    assert not isinstance(info.value, ClusterBusy)
    assert trio.current_time() == 0.0


async def test_a_zero_budget_walks_the_list_once(autojump_clock: trio.testing.MockClock) -> None:
    """busy_retry_s=0: one walk, then ClusterBusy, without waiting."""
    client = client_with(ScriptedReplica([], then=busy("cp-1")), busy_retry_s=0.0)
    with pytest.raises(ClusterBusy):
        await client.call("submit_job", object())
    assert trio.current_time() == 0.0

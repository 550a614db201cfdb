"""The client's idempotency keys: one key per call, sent on every retry and hedged copy of it, a
fresh one for the next call (a mock clock and scripted replicas)."""

from __future__ import annotations

import random
from typing import Any

import attrs
import trio
import trio.testing

from protocol import pb
from runtime.backoff import FullJitterBackoff
from runtime.client import ControlPlaneClient
from runtime.errors import Busy, Unavailable


class _Stub:
    def __getattr__(self, rpc: str) -> str:
        return rpc


@attrs.define
class Replica:
    """Stands in for one replica's channel: records each request, answers from ``script`` in
    turn (an exception is raised, ``"slow"`` never answers), then ``then``."""

    script: list[Any]
    then: Any = None
    requests: list[Any] = attrs.field(factory=list)

    def stub(self, stub_cls: type) -> _Stub:
        return _Stub()

    async def call(self, method: str, request: Any, *, timeout_s: float) -> Any:
        self.requests.append(request)
        answer = self.script.pop(0) if self.script else self.then
        if answer == "slow":
            await trio.sleep_forever()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        pass


def client_with(*replicas: Replica) -> ControlPlaneClient:
    client = ControlPlaneClient(
        [f"127.0.0.1:{7100 + i}" for i in range(len(replicas))],
        busy_backoff=FullJitterBackoff(base_s=0.1, cap_s=1.0),
        rng=random.Random(3),
    )
    for address, replica in zip(client.addresses, replicas, strict=True):
        client._channels[address] = replica  # type: ignore[assignment]
    return client


def submission() -> pb.SubmitJobRequest:
    return pb.SubmitJobRequest(spec=pb.JobSpec(name="j", cpu_millis=500, memory_mb=256))


def keys(*replicas: Replica) -> list[str]:
    return [r.idempotency_key for replica in replicas for r in replica.requests]


async def test_every_retry_of_one_call_carries_the_same_key(autojump_clock: trio.testing.MockClock) -> None:
    """A call that meets an unreachable replica, then busy ones and two backoffs before an
    answer sends one non-empty key on all five attempts, with the same request otherwise."""
    first = Replica(
        [Unavailable("cp-1 did not answer"), Busy("busy: cp-1")], then=pb.SubmitJobReply(job_id=7)
    )
    second = Replica([Busy("busy: cp-2"), Busy("busy: cp-2")], then=pb.SubmitJobReply(job_id=8))
    client = client_with(first, second)
    assert (await client.call("submit_job", submission())).job_id == 7
    assert trio.current_time() > 0  # it did back off
    sent = keys(first, second)
    assert len(sent) == 5 and sent[0] and set(sent) == {sent[0]}
    assert {r.spec.name for replica in (first, second) for r in replica.requests} == {"j"}


async def test_each_call_gets_a_fresh_key(autojump_clock: trio.testing.MockClock) -> None:
    """Two calls with equal requests, even one request object sent twice, are two calls: two
    keys. The caller's object is left without one, and a read is sent as it is."""
    replica = Replica([], then=pb.SubmitJobReply(job_id=1))
    client = client_with(replica)
    request = submission()
    await client.call("submit_job", request)
    await client.call("submit_job", request)
    await client.call("submit_job", submission())
    sent = keys(replica)
    assert len(set(sent)) == 3 and all(sent)
    assert request.idempotency_key == ""
    read = pb.GetJobRequest(job_id=1)
    await client.call("get_job", read)
    assert replica.requests[-1] is read


async def test_a_key_the_caller_chose_is_sent_as_it_is(autojump_clock: trio.testing.MockClock) -> None:
    """A caller that sets the key (stockade submit --idempotency-key) has it sent, on every
    attempt, for every mutating call."""
    replica = Replica([Unavailable("cp-1 did not answer")], then=pb.CancelJobReply(state="cancelled"))
    other = Replica([], then=pb.CancelJobReply(state="cancelled"))
    client = client_with(replica, other)
    await client.call("cancel_job", pb.CancelJobRequest(job_id=3, idempotency_key="mine"))
    await client.call(
        "submit_jobs", pb.SubmitJobsRequest(specs=[submission().spec], idempotency_key="mine-2")
    )
    assert keys(replica, other) == ["mine", "mine", "mine-2"]


async def test_hedged_copies_of_one_call_carry_the_same_key(autojump_clock: trio.testing.MockClock) -> None:
    """A hedged call sends one key to every replica it asks, the slow one included."""
    slow = Replica(["slow"])
    fast = Replica([], then=pb.SubmitJobReply(job_id=2))
    client = client_with(slow, fast)
    await client.call_hedged("submit_job", submission(), hedge_after_s=0.5, deadline_s=2.0)
    sent = keys(slow, fast)
    assert len(sent) == 2 and sent[0] and sent[0] == sent[1]


async def test_a_registration_without_a_run_id_gets_one_for_all_its_copies(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A registration's key is its agent run id and number: a caller that sent none gets a
    fresh run id and number 1, the same on a retry, and another for the next registration; an
    agent's own run id and number are sent as they are."""
    replica = Replica([Unavailable("cp-1 did not answer")], then=pb.RegisterWorkerReply(incarnation=1))
    other = Replica([], then=pb.RegisterWorkerReply(incarnation=1))
    client = client_with(replica, other)
    request = pb.RegisterWorkerRequest(worker_id="w-1", address="127.0.0.1:9", cpu_millis=1, memory_mb=1)
    await client.call("register_worker", request)
    await client.call("register_worker", request)
    await client.call(
        "register_worker",
        pb.RegisterWorkerRequest(
            worker_id="w-1", address="h:1", agent_run_id="agent-run", registration_seq=4
        ),
    )
    sent = [(r.agent_run_id, r.registration_seq) for replica_ in (replica, other) for r in replica_.requests]
    first_run = sent[0][0]
    assert first_run and sent[:2] == [(first_run, 1), (first_run, 1)]
    assert sent[2][0] not in ("", first_run) and sent[2][1] == 1
    assert sent[3] == ("agent-run", 4)
    assert request.agent_run_id == ""

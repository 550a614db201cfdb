"""Registration, heartbeats and self-fence of the agent, on trio's mock clock.

The agent reaches the control plane through a scripted stand-in, so every timing is exact:
pytest-trio's ``autojump_clock`` fixture (a ``MockClock(autojump_threshold=0)``) jumps time
whenever every task is blocked.

It is one file because it is the one specification of the agent's side of its conversation
with the control plane (:class:`agent.core.Agent`): every test drives the same scripted stand-in
and states one behaviour.
"""

from __future__ import annotations

import itertools
import math
import random
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from agent import dbclock as agent_dbclock
from agent import fence as agent_fence
from agent.core import Agent
from agent.messages import (
    AssignOrder,
    CancelOrder,
    HeartbeatAnswer,
    HeartbeatReport,
    JobOrder,
    Leave,
    LeaveAnswer,
    Registered,
    Registration,
)
from runtime.errors import NoControlPlaneReachable, PermissionDenied
from runtime.jobs import JobSpec, SleepRuntime
from runtime.settings.agent import AgentSettings
from runtime.text import read_jsonl

HEARTBEAT_S = 0.5
TIMEOUT_S = 1.0
FENCE_S = 3.0


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


@attrs.define
class ScriptedControlPlane:
    """A control plane stand-in: answers, fails after the call deadline, or hangs forever."""

    mode: str = "up"
    """up: answer at once; down: fail after TIMEOUT_S (like a real call); hang: never answer."""
    epoch: int = 1
    incarnations: int = 0
    registrations: list[tuple[float, Registration]] = attrs.field(factory=list)
    heartbeats: list[tuple[float, HeartbeatReport]] = attrs.field(factory=list)
    leaves: list[tuple[float, Leave]] = attrs.field(factory=list)
    answered: list[float] = attrs.field(factory=list)
    """Send times of the heartbeats that got a reply."""
    next_answer: dict[str, Any] = attrs.field(factory=dict)
    tells: dict[str, Any] = attrs.field(factory=dict)
    """Fields every heartbeat answer carries (what the cluster tells: interval, dead_after);
    ``next_answer`` overrides them for one answer."""
    answer_delay_s: float = 0.0
    register_failures: int = 0
    """Refuse this many registrations at once (NoControlPlaneReachable) before answering."""
    honour_deadlines: bool = False
    """A heartbeat whose answer would take longer than its call's deadline fails at the
    deadline instead, as a real call does (False: the answer comes whenever it comes)."""
    heartbeat_deadlines: list[float] = attrs.field(factory=list)
    """The deadline each heartbeat call was given (s), in order."""

    async def _gate(self) -> None:
        if self.mode == "down":
            await trio.sleep(TIMEOUT_S)
            raise NoControlPlaneReachable("no control plane answered: scripted outage")
        if self.mode == "hang":
            await trio.sleep_forever()

    async def register(self, request: Registration, *, deadline_s: float) -> Registered:
        self.registrations.append((trio.current_time(), request))
        await self._gate()
        if self.register_failures:
            self.register_failures -= 1
            raise NoControlPlaneReachable("no control plane answered: scripted refusal")
        self.incarnations += 1
        return Registered(incarnation=self.incarnations, epoch=self.epoch, database_unix_s=database_now())

    async def heartbeat(self, request: HeartbeatReport, *, deadline_s: float) -> HeartbeatAnswer:
        sent = trio.current_time()
        self.heartbeats.append((sent, request))
        self.heartbeat_deadlines.append(deadline_s)
        await self._gate()
        if self.honour_deadlines and self.answer_delay_s > deadline_s:
            await trio.sleep(deadline_s)
            raise NoControlPlaneReachable("no control plane answered: the call's deadline passed")
        await trio.sleep(self.answer_delay_s)
        answer = HeartbeatAnswer(
            epoch=self.epoch, database_unix_s=database_now(), **{**self.tells, **self.next_answer}
        )
        self.next_answer = {}
        self.answered.append(sent)
        return answer

    async def leave(self, request: Leave, *, deadline_s: float) -> LeaveAnswer:
        self.leaves.append((trio.current_time(), request))
        await self._gate()
        await trio.sleep(self.answer_delay_s)
        return LeaveAnswer(left=True, epoch=self.epoch)


WALL_AT_ZERO = 1_700_000_000.0
"""The database's clock (and the wall clock, where a test makes it follow the mock clock) at
mock time 0."""


def database_now() -> float:
    """The database's clock now, as the scripted control plane tells it: it follows the mock
    clock."""
    return WALL_AT_ZERO + trio.current_time()


def agent_settings(tmp_path: Path, **overrides: Any) -> AgentSettings:
    values: dict[str, Any] = {
        "worker_id": "w-1",
        "control_planes": ["127.0.0.1:1"],
        "cpu_millis": 4000,
        "memory_mb": 4096,
        "work_dir": str(tmp_path),
        "heartbeat_interval_s": HEARTBEAT_S,
        "heartbeat_timeout_s": TIMEOUT_S,
        "self_fence_after_s": FENCE_S,
        "stop_grace_s": 1.0,
        # These tests pin the self-fence that kills at the fence deadline (no outage grace);
        # pausing through an outage is tested in test_agent_pause.py.
        "db_outage_grace_s": 0.0,
    }
    values.update(overrides)
    return AgentSettings(**values)


class CeilingRng(random.Random):
    """Draws every jittered pause at its ceiling, so the pauses are exact."""

    def uniform(self, a: float, b: float) -> float:
        return b


@asynccontextmanager
async def running_agent(tmp_path: Path, cp: ScriptedControlPlane, **overrides: Any) -> AsyncIterator[Agent]:
    agent = Agent(agent_settings(tmp_path, **overrides), cp, rng=CeilingRng())
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run, "127.0.0.1:9")
        yield agent
        nursery.cancel_scope.cancel()


def sleep_job(aid: int, duration_s: float = 1000.0) -> JobOrder:
    return JobOrder(
        assignment_id=aid,
        job_id=aid * 10,
        spec=JobSpec(
            name="", cpu_millis=1000, memory_mb=100, runtime=SleepRuntime(duration_ms=int(duration_s * 1000))
        ),
    )


def moved(job: JobOrder) -> JobOrder:
    """``job`` as an assignment of a job placed before (moved off a dead worker)."""
    return attrs.evolve(job, placed_before=True)


def assign(agent: Agent, *jobs: JobOrder, epoch: int = 1) -> dict[int, str]:
    """Assign ``jobs``; returns id -> "accepted" or the refusal reason."""
    assert agent.incarnation is not None
    decision = agent.assign(
        AssignOrder(epoch=epoch, worker_id="w-1", incarnation=agent.incarnation, assignments=jobs)
    )
    result = {aid: "accepted" for aid in decision.accepted_ids}
    result.update({r.assignment_id: r.reason.value for r in decision.refused})
    return result


def stops(tmp_path: Path) -> dict[int, str]:
    return {
        r["assignment_id"]: r["reason"] for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "stop"
    }


async def test_heartbeats_are_sent_every_interval(tmp_path: Path, autojump_clock: Any) -> None:
    """After registering, the agent heartbeats exactly every heartbeat_interval_s."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        t0 = cp.registrations[0][0]
        await trio.sleep(2.1)
    times = [t - t0 for t, _ in cp.heartbeats]
    assert times == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert all(r.incarnation == 1 and r.worker_id == "w-1" for _, r in cp.heartbeats)


async def test_registration_is_retried_until_a_control_plane_answers(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """While no control plane answers, registration is tried again after a pause whose ceiling
    starts at register_retry_s (0.5 s) and doubles up to register_retry_max_s (5 s); the
    pauses here are drawn at their ceilings."""
    cp = ScriptedControlPlane(mode="down")
    async with running_agent(tmp_path, cp) as agent:
        await trio.sleep(5.0)
        assert agent.incarnation is None
        refused = agent.assign(
            AssignOrder(epoch=1, worker_id="w-1", incarnation=0, assignments=(sleep_job(1),))
        )
        assert [r.reason.value for r in refused.refused] == ["fenced"]
        cp.mode = "up"
        await agent.wait_registered()
    gaps = [b[0] - a[0] for a, b in zip(cp.registrations, cp.registrations[1:], strict=False)]
    pauses = [min(5.0, 0.5 * 2**n) for n in range(len(gaps))]
    assert gaps == pytest.approx([TIMEOUT_S + pause for pause in pauses])
    assert cp.registrations[0][1].address == "127.0.0.1:9"
    assert agent.incarnation == 1


async def test_workers_refused_together_come_back_at_different_times(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Two agents whose registrations are refused at the same moments retry after jittered
    pauses: their retries fall at different times, each pause below its ceiling."""
    cps = [ScriptedControlPlane(register_failures=4), ScriptedControlPlane(register_failures=4)]
    agents = [
        Agent(agent_settings(tmp_path / str(n), worker_id=f"w-{n}"), cp, rng=random.Random(n))
        for n, cp in enumerate(cps)
    ]
    async with trio.open_nursery() as nursery:
        for agent in agents:
            await nursery.start(agent.run, "127.0.0.1:9")
        for agent in agents:
            await agent.wait_registered()
        nursery.cancel_scope.cancel()
    times = [[t for t, _ in cp.registrations] for cp in cps]
    assert [len(t) for t in times] == [5, 5]
    assert times[0][1:] != pytest.approx(times[1][1:])
    for sent in times:
        pauses = [b - a for a, b in itertools.pairwise(sent)]
        assert all(p <= 0.5 * 2**n + 1e-9 for n, p in enumerate(pauses)), pauses


@attrs.define
class QueuedRegistrations(ScriptedControlPlane):
    """Registrations wait ``queue_s`` in a replica's queue before they are applied (a storm);
    a caller whose deadline comes first gets no answer, but what it sent is applied anyway, and
    a copy (same run and number) gets the incarnation the first created."""

    queue_s: float = 4.0
    applied: dict[tuple[str, int], int] = attrs.field(factory=dict)

    async def register(self, request: Registration, *, deadline_s: float) -> Registered:
        self.registrations.append((trio.current_time(), request))
        key = (request.agent_run_id, request.registration_seq)
        if key not in self.applied:
            self.incarnations += 1
            self.applied[key] = self.incarnations
        if self.queue_s > deadline_s:
            await trio.sleep(deadline_s)
            raise NoControlPlaneReachable(f"no control plane answered within {deadline_s:g} s")
        await trio.sleep(self.queue_s)
        return Registered(incarnation=self.applied[key], epoch=self.epoch, database_unix_s=database_now())


async def test_a_registration_answered_after_the_fence_span_is_waited_for(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Registrations are answered 4 s after they are sent, past the fence span (3 s): with an
    outage grace the agent waits for the answer (it holds no job yet) instead of giving up and
    sending copies; it registers with its first attempt, pauses nothing until its first
    heartbeat is answered, and goes live in that one incarnation."""
    cp = QueuedRegistrations(queue_s=4.0)
    async with running_agent(tmp_path, cp, db_outage_grace_s=30.0) as agent:
        with trio.fail_after(30):
            await agent.wait_registered()
        await trio.sleep(2.0)
        assert not agent.self_fenced and agent.incarnation == 1
        assert assign(agent, sleep_job(1)) == {1: "accepted"}
    assert len(cp.registrations) == 1 and cp.incarnations == 1


async def test_without_an_outage_grace_a_registration_gives_up_before_the_fence_span(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """With no outage grace a late answer would self-fence the worker at once: each attempt
    gives up call_deadline_margin_s before the fence span, as a heartbeat does."""
    cp = QueuedRegistrations(queue_s=4.0)
    async with running_agent(tmp_path, cp) as agent:
        await trio.sleep(10.0)
        assert agent.incarnation is None
    assert len(cp.registrations) >= 2
    sent = [t for t, _ in cp.registrations]
    assert sent[1] - sent[0] == pytest.approx(FENCE_S - 0.1 + agent.settings.register_retry_s)


@attrs.define
class RefusingControlPlane(ScriptedControlPlane):
    """Refuses every registration as the worker's certificate names another id."""

    async def register(self, request: Registration, *, deadline_s: float) -> Registered:
        self.registrations.append((trio.current_time(), request))
        raise PermissionDenied("permission denied: worker/w-9 may register_worker only as worker_id 'w-9'")


async def test_a_registration_refused_for_the_certificates_id_stops_the_agent(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A refusal every replica would repeat is not retried: the agent stops after one try,
    saying why and what to do."""
    cp = RefusingControlPlane()
    agent = Agent(agent_settings(tmp_path), cp)
    with pytest.raises(BaseExceptionGroup) as raised:  # the agent's nurseries wrap it
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run, "127.0.0.1:9")
            await trio.sleep(10.0)
    (refusal,) = _leaves(raised.value)
    assert isinstance(refusal, PermissionDenied)
    assert len(cp.registrations) == 1
    assert str(refusal).startswith("worker w-1 cannot register: permission denied: worker/w-9")
    assert "start the agent with the --id its certificate names" in str(refusal)


def _leaves(error: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


async def test_every_attempt_of_a_registration_carries_one_number_and_the_next_one_the_next(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Two refused attempts and the one answered of the first registration carry the agent's
    run id and number 1 (so a late copy of a refused attempt gets the same incarnation); the
    registration after a reply asking to register again carries number 2, same run."""
    cp = ScriptedControlPlane(register_failures=2)
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        cp.next_answer = {"reregister": True}
        await trio.sleep(2 * HEARTBEAT_S)
        assert agent.incarnation == 2
    sent = [(r.agent_run_id, r.registration_seq) for _, r in cp.registrations]
    run_id = sent[0][0]
    assert len(run_id) == 32
    assert sent == [(run_id, 1), (run_id, 1), (run_id, 1), (run_id, 2)]


async def test_self_fence_stops_jobs_after_self_fence_after_s_and_not_before(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Jobs run until self_fence_after_s past the last acknowledged send, then stop at once."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        t0 = trio.current_time()
        assert assign(agent, sleep_job(1), sleep_job(2)) == {1: "accepted", 2: "accepted"}
        await trio.sleep_until(t0 + 1.2)  # heartbeats at 0.5 and 1.0 answered
        cp.mode = "down"
        last_acked = cp.answered[-1]
        assert last_acked == pytest.approx(t0 + 1.0)
        await trio.sleep_until(last_acked + FENCE_S - 0.001)
        assert agent.running_assignment_ids == (1, 2)
        assert not agent.self_fenced
        await trio.sleep_until(last_acked + FENCE_S + 0.001)
        assert agent.self_fenced
        assert agent.running_assignment_ids == ()
        assert assign(agent, sleep_job(3)) == {3: "fenced"}
    assert stops(tmp_path) == {1: "self_fence", 2: "self_fence"}
    events = [r["event"] for r in read_jsonl(tmp_path / "agent.jsonl")]
    assert events == ["register", "start", "start", "self_fence", "stop", "stop", "leave"]


async def test_a_moved_jobs_start_pulls_the_next_heartbeat_forward_at_most_once_every_four_intervals(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A job placed before (moved off a dead worker) that starts is reported by a heartbeat sent
    EARLY_HEARTBEAT_GATHER_S later, not up to an interval later, and the regular heartbeats
    count from that one; a second moved job within four intervals waits for the regular
    heartbeat, and so does any job placed for the first time; a moved job after four intervals
    pulls a heartbeat forward again."""
    gather_s = agent_fence.EARLY_HEARTBEAT_GATHER_S
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        await trio.sleep(0.2)
        t0 = trio.current_time()
        assign(agent, moved(sleep_job(1, duration_s=60)))
        await trio.sleep(0.3)
        assign(agent, moved(sleep_job(2, duration_s=60)))
        await trio.sleep_until(t0 + 4 * HEARTBEAT_S + 0.05)
        assign(agent, sleep_job(3, duration_s=60))
        await trio.sleep(0.1)
        assign(agent, moved(sleep_job(4, duration_s=60)))
        await trio.sleep(0.1)
    sent = [(round(t - t0, 6), r.running_assignment_ids) for t, r in cp.heartbeats if t >= t0]
    regular = [round(gather_s + n * HEARTBEAT_S, 6) for n in range(1, 5)]
    assert sent == [
        (gather_s, (1,)),
        *((t, (1, 2)) for t in regular),
        (round(4 * HEARTBEAT_S + 0.15 + gather_s, 6), (1, 2, 3, 4)),
    ]


async def test_a_hanging_heartbeat_does_not_delay_the_fence(tmp_path: Path, autojump_clock: Any) -> None:
    """The fence runs on its own timer: a heartbeat call that never returns still fences."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        await trio.sleep(0.7)  # the heartbeat at 0.5 was answered
        cp.mode = "hang"
        last_acked = cp.answered[-1]
        await trio.sleep_until(last_acked + FENCE_S - 0.001)
        assert agent.running_assignment_ids == (1,)
        await trio.sleep_until(last_acked + FENCE_S + 0.001)
        assert agent.self_fenced and agent.running_assignment_ids == ()


async def test_fenced_agent_registers_again_when_a_heartbeat_gets_through(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """After a self-fence, the first answered heartbeat leads to a new incarnation."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        cp.mode = "down"
        await trio.sleep(FENCE_S + 1.0)
        assert agent.self_fenced
        fenced_heartbeats = len(cp.heartbeats)
        cp.mode = "up"
        await trio.sleep(TIMEOUT_S + HEARTBEAT_S + 0.1)
        assert len(cp.heartbeats) > fenced_heartbeats  # it kept trying while fenced
        assert not agent.self_fenced
        assert agent.incarnation == 2
        assert agent.running_assignment_ids == ()
        old = agent.assign(AssignOrder(epoch=1, worker_id="w-1", incarnation=1, assignments=(sleep_job(2),)))
        assert [r.reason.value for r in old.refused] == ["wrong_incarnation"]
        assert assign(agent, sleep_job(2)) == {2: "accepted"}
        # ... and it stays up: the new registration reset the fence deadline.
        await trio.sleep(FENCE_S * 2)
        assert not agent.self_fenced and agent.running_assignment_ids == (2,)
    registers = [r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "register"]
    assert [r["incarnation"] for r in registers] == [1, 2]
    assert stops(tmp_path) == {1: "self_fence", 2: "shutdown"}


async def test_outcomes_are_kept_until_a_heartbeat_carrying_them_is_answered(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A finished job's outcome rides every heartbeat until one of them is acknowledged."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, self_fence_after_s=100.0) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=0.2))
        cp.mode = "down"
        await trio.sleep(3.0)
        assert [o.assignment_id for o in agent.unacknowledged_outcomes] == [1]
        cp.mode = "up"
        await trio.sleep(2.0)
        assert agent.unacknowledged_outcomes == ()
    carried = [[o.assignment_id for o in r.finished] for _, r in cp.heartbeats]
    answered_carry = [[o.assignment_id for o in r.finished] for t, r in cp.heartbeats if t in cp.answered]
    assert [1] in carried
    assert answered_carry.count([1]) == 1  # once acknowledged, never sent again
    assert carried[-1] == []
    outcome = next(o for _, r in cp.heartbeats for o in r.finished)
    assert outcome.state.value == "succeeded" and outcome.exit_code == 0


async def test_only_the_acknowledged_outcomes_are_dropped(tmp_path: Path, autojump_clock: Any) -> None:
    """An outcome that appears while a heartbeat is in flight is kept for the next one."""
    cp = ScriptedControlPlane(answer_delay_s=0.3)
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        t0 = trio.current_time()
        assign(agent, sleep_job(1, duration_s=0.1), sleep_job(2, duration_s=0.6))
        # heartbeat at 0.5 carries outcome 1 and is answered at 0.8; job 2 ends at 0.6.
        await trio.sleep_until(t0 + 0.9)
        assert [o.assignment_id for o in agent.unacknowledged_outcomes] == [2]
        await trio.sleep_until(t0 + 1.5)
    carried = [[o.assignment_id for o in r.finished] for _, r in cp.heartbeats]
    assert carried[:2] == [[1], [2]]


async def test_registration_carries_the_unacknowledged_outcomes_and_then_drops_them(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A job that ends while a heartbeat is in flight, whose reply asks the worker to register
    again: every registration attempt carries the outcome until one succeeds; then it is
    dropped and no later heartbeat carries it."""
    cp = ScriptedControlPlane(answer_delay_s=0.3, register_failures=0)
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        t0 = trio.current_time()
        assign(agent, sleep_job(1, duration_s=0.6))
        # The heartbeat sent at 0.5 carries nothing; job 1 ends at 0.6; the reply at 0.8 says
        # "register again", and the first two registrations fail.
        cp.next_answer = {"reregister": True}
        cp.register_failures = 2
        await trio.sleep_until(t0 + 0.7)
        assert [o.assignment_id for o in agent.unacknowledged_outcomes] == [1]
        await trio.sleep_until(t0 + 2.5)
        assert agent.incarnation == 2
        assert agent.unacknowledged_outcomes == ()
        await trio.sleep_until(t0 + 4.0)
    carried = [[o.assignment_id for o in r.finished] for _, r in cp.registrations]
    assert carried == [[], [1], [1], [1]]  # the first registration, two refused, the one answered
    outcome = cp.registrations[-1][1].finished[0]
    assert (outcome.job_id, outcome.state.value, outcome.exit_code) == (10, "succeeded", 0)
    assert [o for _, r in cp.heartbeats for o in r.finished] == []
    gaps = [b[0] - a[0] for a, b in zip(cp.registrations[1:], cp.registrations[2:], strict=False)]
    assert gaps == pytest.approx([agent.settings.register_retry_s, 2 * agent.settings.register_retry_s])


async def test_stop_ids_in_a_heartbeat_reply_stop_the_job(tmp_path: Path, autojump_clock: Any) -> None:
    """A job the control plane ended is stopped, not reported, and refused if re-assigned."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1), sleep_job(2))
        cp.next_answer = {"stop_assignment_ids": (1,)}
        await trio.sleep(0.6)
        assert agent.running_assignment_ids == (2,)
        assert assign(agent, sleep_job(1)) == {1: "cancelled"}
        await trio.sleep(1.0)
    assert stops(tmp_path) == {1: "stopped_by_control_plane", 2: "shutdown"}
    assert all(not r.finished for _, r in cp.heartbeats)


async def test_reregister_reply_stops_everything_and_registers_again(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """reregister in a heartbeat reply stops every job and leads to a new incarnation."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        cp.next_answer = {"reregister": True}
        await trio.sleep(0.6)
        assert agent.incarnation == 2 and agent.running_assignment_ids == ()
    assert stops(tmp_path) == {1: "reregister"}


async def test_heartbeat_reply_epoch_makes_older_assigns_stale(tmp_path: Path, autojump_clock: Any) -> None:
    """The epoch in a heartbeat reply raises the newest seen epoch."""
    cp = ScriptedControlPlane(epoch=1)
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        cp.epoch = 4
        await trio.sleep(0.6)
        assert agent.max_epoch_seen == 4
        assert assign(agent, sleep_job(1), epoch=3) == {1: "stale_epoch"}
        assert cp.heartbeats[-1][1].epoch_seen == 1
        await trio.sleep(0.5)
        assert cp.heartbeats[-1][1].epoch_seen == 4


async def test_cancel_stops_a_running_job_before_it_answers(tmp_path: Path, autojump_clock: Any) -> None:
    """Cancel of a running job returns once the job has ended, and the id is refused after."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        await trio.sleep(0.1)  # started (a job cancelled before its task ran never starts)
        decision = await agent.cancel(
            CancelOrder(epoch=1, worker_id="w-1", incarnation=1, assignment_ids=(1,))
        )
        assert decision.acknowledged_ids == (1,)
        assert agent.running_assignment_ids == ()
        assert assign(agent, sleep_job(1)) == {1: "cancelled"}
    assert stops(tmp_path) == {1: "cancelled"}


async def test_a_cancel_that_comes_after_the_job_succeeded_leaves_the_success(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Issue 10, fault 1: a 0.3 s job that succeeded before its Cancel arrived is answered as
    finished, not acknowledged, and its success is still reported with its exit code."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=0.3))
        await trio.sleep(0.4)
        decision = await agent.cancel(
            CancelOrder(epoch=1, worker_id="w-1", incarnation=1, assignment_ids=(1,))
        )
        assert decision.acknowledged_ids == () and decision.finished_ids == (1,)
        await trio.sleep(HEARTBEAT_S * 2)
    assert stops(tmp_path) == {1: "succeeded"}
    reported = [o for _, hb in cp.heartbeats for o in hb.finished if o.assignment_id == 1]
    assert reported and reported[0].state.value == "succeeded" and reported[0].exit_code == 0


async def test_shutdown_stops_every_job_and_logs_it(tmp_path: Path, autojump_clock: Any) -> None:
    """Cancelling the agent stops its jobs and writes a shutdown stop line for each."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1), sleep_job(2))
    assert stops(tmp_path) == {1: "shutdown", 2: "shutdown"}
    assert agent.running_assignment_ids == ()


async def test_start_and_stop_lines_carry_the_assign_epoch(tmp_path: Path, autojump_clock: Any) -> None:
    """start and stop lines name the job, assignment, incarnation and the Assign's epoch."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=0.1), epoch=2)
        await trio.sleep(0.2)
    records = read_jsonl(tmp_path / "agent.jsonl")
    start, stop = (r for r in records if r["event"] in ("start", "stop"))
    for record in (start, stop):
        assert set(record) >= {
            "event",
            "worker_id",
            "incarnation",
            "job_id",
            "assignment_id",
            "epoch",
            "time",
        }
        assert (
            record["worker_id"],
            record["incarnation"],
            record["job_id"],
            record["assignment_id"],
            record["epoch"],
        ) == ("w-1", 1, 10, 1, 2)
    assert set(start) == {"event", "worker_id", "incarnation", "job_id", "assignment_id", "epoch", "time"}
    assert stop["reason"] == "succeeded" and stop["exit_code"] == 0
    assert math.isfinite(stop["time"]) and stop["time"] >= start["time"]


async def test_job_whose_start_line_cannot_be_written_is_not_started(
    tmp_path: Path, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the start line cannot be written when the accepted job is due to start, nothing
    runs: the job is reported failed, naming the error, and its capacity is freed."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, cpu_millis=1000) as agent:
        await agent.wait_registered()

        def disk_full(*args: Any, **kwargs: Any) -> None:
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as patch:
            patch.setattr(agent.joblog, "write", disk_full)
            assert assign(agent, sleep_job(1)) == {1: "accepted"}
            await trio.sleep(0.1)
        assert agent.running_assignment_ids == ()
        (outcome,) = agent.unacknowledged_outcomes
        assert (outcome.assignment_id, outcome.state.value, outcome.exit_code) == (1, "failed", None)
        assert "cannot write the start line" in outcome.detail and "No space left" in outcome.detail
        assert assign(agent, sleep_job(2)) == {2: "accepted"}  # the capacity is free again
    assert [r["event"] for r in read_jsonl(tmp_path / "agent.jsonl") if r["assignment_id"] == 1] == []


DRIFT_S = 0.01
"""How far a line's time may be from the database's clock at its event in these tests: its
bracket widens by agent.dbclock.MAX_DRIFT of the (mock) seconds since the reading it is dated
by, a few milliseconds here."""


@pytest.fixture
def clocks_follow_mock_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wall-clock and monotonic times in the agent follow the mock clock, as in production
    they follow the system clock: ``time.time() == WALL_AT_ZERO + trio.current_time()``."""
    shim = types.SimpleNamespace(
        time=lambda: WALL_AT_ZERO + trio.current_time(), monotonic=lambda: trio.current_time()
    )
    for module in (agent_fence, agent_dbclock):
        monkeypatch.setattr(module, "time", shim)


def _records(tmp_path: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == event]


@pytest.mark.parametrize("attempt", range(8))  # trio runs the tasks woken together in random order
async def test_a_sleep_job_that_ran_out_while_frozen_past_the_deadline_is_fenced_at_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, clocks_follow_mock_time: None, attempt: int
) -> None:
    """Thawed past its fence deadline, the agent fences before anything else: a sleep job whose
    duration ran out during the freeze after the deadline stops at the deadline, unreported."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=FENCE_S + 1.0))
        await trio.sleep(0.7)  # the heartbeat at 0.5 was answered
        deadline = cp.answered[-1] + FENCE_S
        autojump_clock.jump(10.0)  # a freeze: every timer comes due at once
        await trio.sleep(1.0)  # fences, then registers again
        assert agent.incarnation == 2
        assert agent.unacknowledged_outcomes == ()
    assert [o for _, hb in cp.heartbeats for o in hb.finished] == []
    (stop,) = _records(tmp_path, "stop")
    assert stop["assignment_id"] == 1 and stop["reason"] == "self_fence"
    assert stop["time"] == pytest.approx(WALL_AT_ZERO + deadline, abs=DRIFT_S)


async def test_a_sleep_job_that_ran_out_while_frozen_before_the_deadline_succeeded(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, clocks_follow_mock_time: None
) -> None:
    """A sleep job whose duration ran out before the fence deadline, during a freeze, succeeded
    then: its stop line carries its end, and its outcome is reported."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=1.0))
        await trio.sleep(0.1)
        autojump_clock.jump(10.0)
        await trio.sleep(1.0)
        assert agent.incarnation == 2
    (start,) = _records(tmp_path, "start")
    stop = _records(tmp_path, "stop")[0]
    assert stop["reason"] == "succeeded"
    assert stop["time"] == pytest.approx(start["time"] + 1.0, abs=DRIFT_S)
    # Reported once: by a heartbeat, or by the registration that follows the fence when the
    # job's task ran after the heartbeat that got through had been built.
    reported = [o for _, hb in cp.heartbeats for o in hb.finished]
    reported += [o for _, registration in cp.registrations for o in registration.finished]
    assert [o.state.value for o in reported] == ["succeeded"]


@pytest.mark.parametrize("attempt", range(8))  # trio runs the tasks woken together in random order
async def test_a_heartbeat_answered_after_the_deadline_does_not_move_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, clocks_follow_mock_time: None, attempt: int
) -> None:
    """A reply that the thawed agent gets after its fence deadline (for a heartbeat sent before
    it) does not move the deadline: the jobs count as stopped at the old one."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        t0 = trio.current_time()
        await trio.sleep_until(t0 + 0.7)  # the heartbeat at 0.5 was answered
        deadline = cp.answered[-1] + FENCE_S
        cp.answer_delay_s = 0.2
        await trio.sleep_until(t0 + 1.1)  # the heartbeat sent at 1.0 waits for its answer
        autojump_clock.jump(10.0)  # a freeze: the answer and the fence come due at once
        await trio.sleep(1.0)
        assert agent.incarnation == 2
    (stop,) = _records(tmp_path, "stop")
    assert stop["reason"] == "self_fence"
    assert stop["time"] == pytest.approx(WALL_AT_ZERO + deadline, abs=DRIFT_S)


async def test_an_agent_preparing_a_planned_restart_refuses_work_as_restarting(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """After SIGHUP's preparation (a planned restart) an Assign is refused as ``restarting``,
    its true reason, not ``fenced``: the worker is not fenced and its jobs run on."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        incarnation = agent.incarnation
        assert incarnation is not None
        kept = agent.assign(
            AssignOrder(epoch=1, worker_id="w-1", incarnation=incarnation, assignments=(sleep_job(1),))
        )
        assert kept.accepted_ids == (1,)
        await agent.prepare_restart(5.0, timeout_s=0.0)
        refused = agent.assign(
            AssignOrder(epoch=1, worker_id="w-1", incarnation=incarnation, assignments=(sleep_job(2),))
        )
        assert [(r.assignment_id, r.reason.value) for r in refused.refused] == [(2, "restarting")]

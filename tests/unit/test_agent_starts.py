"""Paced job starts: the start limiter, the spawner thread, and the agent that uses them.

The agent-level tests run on trio's mock clock with the scripted control plane of
``test_agent_heartbeat`` and a scripted job runner whose command jobs take a fixed (mock)
time to start, so every start and every heartbeat happens at an exact time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from test_agent_heartbeat import HEARTBEAT_S, ScriptedControlPlane, agent_settings

from agent.core import Agent
from agent.job_results import JobResult
from agent.messages import AssignOrder, CancelOrder, JobOrder, JobState
from agent.runtimes import run_job
from agent.starts import Spawner, StartLimiter, StartTicket
from runtime import metrics
from runtime.errors import InvalidArgument
from runtime.jobs import CommandRuntime, JobRuntime, JobSpec, SleepRuntime
from runtime.settings.agent import AgentSettings
from runtime.text import read_jsonl


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


# ---------------------------------------------------------------------------- the limiter


async def test_the_limiter_grants_slots_in_arrival_order_up_to_its_limit(autojump_clock: Any) -> None:
    """With 2 slots, 6 jobs that each hold theirs 1 s start in pairs at 0, 1 and 2 s, in the
    order they asked."""
    limiter = StartLimiter(2)
    began = trio.current_time()
    granted: list[tuple[int, float]] = []

    async def start(n: int, ticket: StartTicket) -> None:
        assert await ticket.wait(trio.Event())
        granted.append((n, trio.current_time() - began))
        await trio.sleep(1.0)
        ticket.release()
        ticket.release()  # idempotent

    async with trio.open_nursery() as nursery:
        for n in range(6):  # tickets are taken in this order; the tasks run in any order
            nursery.start_soon(start, n, limiter.ticket())
    assert sorted(granted) == [(0, 0.0), (1, 0.0), (2, 1.0), (3, 1.0), (4, 2.0), (5, 2.0)]
    assert (limiter.starting, limiter.waiting) == (0, 0)


async def test_a_stop_while_waiting_gives_up_the_wait(autojump_clock: Any) -> None:
    """A waiter whose stop event is set gets no slot, and the next waiter gets the free one."""
    limiter = StartLimiter(1)
    waiting_before = metrics.AGENT_JOBS_WAITING_FOR_START_SLOT._value.get()
    held = limiter.ticket()
    assert held.granted
    stop = trio.Event()
    results: dict[str, bool] = {}

    async def wait(name: str, ticket: StartTicket, event: trio.Event) -> None:
        results[name] = await ticket.wait(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "stopped", limiter.ticket(), stop)
        nursery.start_soon(wait, "next", limiter.ticket(), trio.Event())
        await trio.testing.wait_all_tasks_blocked()
        assert limiter.waiting == 2
        assert metrics.AGENT_JOBS_WAITING_FOR_START_SLOT._value.get() == waiting_before + 2
        stop.set()
        await trio.testing.wait_all_tasks_blocked()
        assert results == {"stopped": False} and limiter.waiting == 1
        held.release()
    assert results["next"] is True and limiter.starting == 1
    assert metrics.AGENT_JOBS_WAITING_FOR_START_SLOT._value.get() == waiting_before


def test_the_limiter_needs_at_least_one_slot() -> None:
    """max_concurrent_starts below 1 is refused, naming the field, the value and the limit."""
    with pytest.raises(InvalidArgument, match="max_concurrent_starts must be >= 1, got 0"):
        StartLimiter(0)


@pytest.mark.parametrize(("value", "ok"), [(0, True), (10, True), (19, True), (-1, False), (20, False)])
def test_job_nice_must_be_between_0_and_19(tmp_path: Path, value: int, ok: bool) -> None:
    """job_nice is checked at construction: 0..19, else refused naming field, value and limits."""
    if ok:
        assert agent_settings(tmp_path, job_nice=value).job_nice == value
    else:
        with pytest.raises(
            InvalidArgument, match=f"job_nice must be an integer between 0 and 19, got {value}"
        ):
            agent_settings(tmp_path, job_nice=value)


def test_agent_settings_default_to_two_starts_and_nice_10() -> None:
    """The defaults: 2 concurrent starts, jobs at nice +10."""
    settings = AgentSettings(worker_id="w", control_planes=["h:1"], cpu_millis=1, memory_mb=1, work_dir="/x")
    assert (settings.max_concurrent_starts, settings.job_nice) == (2, 10)


# ---------------------------------------------------------------------------- the spawner


async def test_the_spawner_runs_every_call_on_one_thread_of_its_own() -> None:
    """Every call runs on the same dedicated thread (not trio's), in order; results and errors
    come back to the caller."""
    with Spawner() as spawner:
        idents = [await spawner.run(threading.get_ident) for _ in range(3)]
        assert len(set(idents)) == 1 and idents[0] == spawner.thread_id
        assert idents[0] != threading.get_ident()

        def fails() -> None:
            raise OSError(2, "No such file or directory")

        with pytest.raises(OSError, match="No such file"):
            await spawner.run(fails)
        assert await spawner.run(lambda: 42) == 42
    assert spawner.thread_id is None
    with pytest.raises(RuntimeError, match="not running"):
        await spawner.run(lambda: 1)


async def test_the_loop_keeps_running_while_the_spawner_works() -> None:
    """A slow call on the spawner thread (a fork of a large process) does not hold up the
    trio loop: another task keeps ticking meanwhile."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.01)
            ticks += 1

    with Spawner() as spawner:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            await spawner.run(lambda: time.sleep(0.3))
            nursery.cancel_scope.cancel()
    assert ticks >= 10


async def test_a_cancelled_caller_still_gets_what_the_spawner_made() -> None:
    """The wait for the spawner is shielded: a caller cancelled meanwhile still receives the
    result (a process it must clean up) before the cancellation takes effect."""
    got: list[str] = []
    with Spawner() as spawner, trio.move_on_after(0.05) as scope:
        got.append(await spawner.run(lambda: time.sleep(0.2) or "reaper"))
        await trio.sleep(1)
    assert scope.cancelled_caught and got == ["reaper"]


# ---------------------------------------------------------------------------- the agent


@attrs.define
class ScriptedRunner:
    """Runs jobs without processes: a command job takes ``start_s`` to start (its reaper's
    start-up), then runs ``run_s`` unless stopped first. Records how many start at once."""

    start_s: float = 0.05
    run_s: float = 100.0
    not_startable: set[int] = attrs.field(factory=set)
    """Assignment ids whose command cannot be executed."""
    exits_as_stopped: set[int] = attrs.field(factory=set)
    """Assignment ids whose process exits 0 on its own just as the stop comes (the signal
    finds it gone): they end succeeded, not stopped."""
    starting: int = 0
    max_starting: int = 0
    spawned: list[tuple[float, int]] = attrs.field(factory=list)
    """(trio time, assignment id) of every command start."""

    async def __call__(
        self,
        runtime: JobRuntime,
        *,
        job_dir: Path,
        stop: trio.Event,
        stop_grace_s: float,
        fence_deadline_path: Path | None,
        job_nice: int,
        on_started: Callable[[], None],
        **options: Any,
    ) -> JobResult:
        if isinstance(runtime, SleepRuntime):
            return await run_job(runtime, job_dir=job_dir, stop=stop, stop_grace_s=stop_grace_s)
        aid = int(job_dir.name.split("-")[1])
        began = trio.current_time()
        self.spawned.append((trio.current_time(), aid))
        self.starting += 1
        self.max_starting = max(self.max_starting, self.starting)
        await trio.sleep(self.start_s)
        self.starting -= 1
        on_started()
        if aid in self.not_startable:
            return JobResult(
                state=JobState.FAILED,
                stopped=False,
                exit_code=None,
                began_at=began,
                ended_at=trio.current_time(),
                detail="cannot start 'x': [Errno 2] No such file or directory",
                started=False,
            )
        with trio.move_on_after(self.run_s):
            await stop.wait()
            if aid in self.exits_as_stopped:
                return JobResult(
                    state=JobState.SUCCEEDED,
                    stopped=False,
                    exit_code=0,
                    began_at=began,
                    ended_at=trio.current_time(),
                )
            return JobResult(
                state=JobState.CANCELLED,
                stopped=True,
                exit_code=-15,
                began_at=began,
                ended_at=trio.current_time(),
            )
        return JobResult(
            state=JobState.SUCCEEDED,
            stopped=False,
            exit_code=0,
            began_at=began,
            ended_at=trio.current_time(),
        )


@asynccontextmanager
async def agent_with(
    tmp_path: Path, cp: ScriptedControlPlane, runner: ScriptedRunner, **overrides: Any
) -> AsyncIterator[Agent]:
    settings = agent_settings(tmp_path, **overrides)
    agent = Agent(settings, cp, runner=runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run, "127.0.0.1:9")
        await agent.wait_registered()
        yield agent
        nursery.cancel_scope.cancel()


def command_job(aid: int, cpu_millis: int = 10, memory_mb: int = 16) -> JobOrder:
    return JobOrder(
        assignment_id=aid,
        job_id=aid * 10,
        spec=JobSpec(
            name="", cpu_millis=cpu_millis, memory_mb=memory_mb, runtime=CommandRuntime(argv=("true",))
        ),
    )


def assign(agent: Agent, *jobs: JobOrder) -> dict[int, str]:
    assert agent.incarnation is not None
    decision = agent.assign(
        AssignOrder(epoch=1, worker_id="w-1", incarnation=agent.incarnation, assignments=jobs)
    )
    result = {aid: "accepted" for aid in decision.accepted_ids}
    result.update({r.assignment_id: r.reason.value for r in decision.refused})
    return result


def lines(tmp_path: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == event]


async def test_a_batch_of_80_command_jobs_starts_two_at_a_time_and_heartbeats_keep_time(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """80 command jobs accepted in one Assign start at most max_concurrent_starts (2) at a
    time, in order, each pair when the previous pair's reapers have started their jobs; the
    heartbeats go out every interval meanwhile, each listing as running exactly the jobs
    started by then (a growing prefix), so the leader sees how far the worker got."""
    cp = ScriptedControlPlane()
    runner = ScriptedRunner(start_s=0.05, run_s=3.0)
    async with agent_with(tmp_path, cp, runner, max_concurrent_starts=2) as agent:
        t0 = trio.current_time()
        registered_at = cp.registrations[-1][0]
        decision = assign(agent, *(command_job(aid) for aid in range(1, 81)))
        assert decision == {aid: "accepted" for aid in range(1, 81)}
        assert agent.running_assignment_ids == ()  # accepted, none started yet
        assert lines(tmp_path, "start") == []  # nothing starts inside Assign
        await trio.sleep_until(t0 + 2.05)  # 40 pairs x 0.05 s: the last pair starts at 1.95
        heartbeats_while_starting = [(t, r) for t, r in cp.heartbeats if t < t0 + 2.05]
        await trio.sleep_until(t0 + 6.0)  # every job has run its 3 s; outcomes reported
        assert agent.unacknowledged_outcomes == ()
    assert runner.max_starting == 2
    # In acceptance order, a pair every 0.05 s (the two of a pair start in the same instant).
    assert sorted(aid for _, aid in runner.spawned) == list(range(1, 81))
    assert {aid: t - t0 for t, aid in runner.spawned} == pytest.approx(
        {aid: (aid - 1) // 2 * 0.05 for aid in range(1, 81)}
    )
    assert [t - registered_at for t, _ in heartbeats_while_starting] == pytest.approx(
        [HEARTBEAT_S * n for n in range(1, len(heartbeats_while_starting) + 1)]
    )
    assert len(heartbeats_while_starting) == 4
    listed = [r.running_assignment_ids for _, r in heartbeats_while_starting]
    assert all(ids == tuple(range(1, len(ids) + 1)) for ids in listed)  # started in order
    assert [len(ids) for ids in listed] == sorted(len(ids) for ids in listed)
    assert 0 < len(listed[0]) < len(listed[-1]) <= 80
    reported = {o.assignment_id: o.state.value for _, r in cp.heartbeats for o in r.finished}
    assert reported == {aid: "succeeded" for aid in range(1, 81)}
    assert sorted(r["assignment_id"] for r in lines(tmp_path, "start")) == list(range(1, 81))
    assert not agent.self_fenced


async def test_a_job_cancelled_while_waiting_for_a_start_slot_never_starts(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A command job waiting for a start slot holds its capacity but is not reported running
    until it starts; a Cancel stops it at once, without a start or stop line, and frees its
    capacity."""
    cp = ScriptedControlPlane()
    runner = ScriptedRunner(start_s=1.0)
    async with agent_with(tmp_path, cp, runner, max_concurrent_starts=1, cpu_millis=300) as agent:
        assert assign(agent, command_job(1, 100), command_job(2, 100), command_job(3, 100)) == {
            1: "accepted",
            2: "accepted",
            3: "accepted",
        }
        await trio.sleep(0.6)  # job 1 is starting, 2 and 3 wait for the slot; one heartbeat
        assert [aid for _, aid in runner.spawned] == [1]
        assert assign(agent, command_job(4, 100)) == {4: "no_room"}  # the waiters hold theirs
        assert cp.heartbeats[-1][1].running_assignment_ids == (1,)
        with trio.fail_after(0.001):  # no start to wait for
            decision = await agent.cancel(
                CancelOrder(epoch=1, worker_id="w-1", incarnation=1, assignment_ids=(3,))
            )
        assert decision.acknowledged_ids == (3,)
        assert agent.running_assignment_ids == (1,)
        assert assign(agent, command_job(5, 100)) == {5: "accepted"}  # job 3's capacity is free
        await trio.sleep(3.0)
        assert [aid for _, aid in runner.spawned] == [1, 2, 5]
    assert [r["assignment_id"] for r in lines(tmp_path, "start")] == [1, 2, 5]
    assert 3 not in [r["assignment_id"] for r in lines(tmp_path, "stop")]


async def test_a_fence_stops_the_jobs_waiting_for_a_start_slot_before_they_start(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Jobs still waiting for a start slot when the worker fences itself never start: no start
    line, no stop line; the one that was starting is stopped and logged."""
    cp = ScriptedControlPlane()
    runner = ScriptedRunner(start_s=2.0)
    async with agent_with(tmp_path, cp, runner, max_concurrent_starts=1) as agent:
        t0 = trio.current_time()
        cp.mode = "down"
        assign(agent, command_job(1), command_job(2), command_job(3))
        await trio.sleep_until(t0 + 3.5)  # fenced at t0 + 3.0 (FENCE_S after registration)
        assert agent.self_fenced
        await trio.sleep_until(t0 + 4.5)  # job 2's start (2 s from t0 + 2) is over, it stops
        assert agent.running_assignment_ids == ()
    assert [aid for _, aid in runner.spawned] == [1, 2]
    events = [(r["event"], r["assignment_id"]) for r in read_jsonl(tmp_path / "agent.jsonl")]
    assert events == [
        ("register", None),
        ("start", 1),
        ("start", 2),
        ("self_fence", None),
        ("stop", 1),
        ("stop", 2),
        ("leave", None),
    ]


async def test_a_command_that_never_ran_gets_a_stop_line_saying_so(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A command that could not be executed ends failed, reported, with ``started: false`` on
    its stop line; one that ran has ``started: true``."""
    cp = ScriptedControlPlane()
    runner = ScriptedRunner(start_s=0.05, run_s=0.1, not_startable={1})
    async with agent_with(tmp_path, cp, runner) as agent:
        assign(agent, command_job(1), command_job(2))
        await trio.sleep(1.0)
    stops = {r["assignment_id"]: (r["reason"], r["started"]) for r in lines(tmp_path, "stop")}
    assert stops == {1: ("failed", False), 2: ("succeeded", True)}
    assert {o.assignment_id: o.state.value for _, r in cp.heartbeats for o in r.finished} == {
        1: "failed",
        2: "succeeded",
    }


async def test_a_job_that_exits_on_its_own_as_its_cancel_lands_is_finished_not_acknowledged(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Issue 10, fault 1, its narrowest window: the cancel asks to stop a running command that
    exits 0 by itself at that moment. The answer is decided by how the job ended: finished
    (its success reported), while the one the cancel really stopped is acknowledged."""
    cp = ScriptedControlPlane()
    runner = ScriptedRunner(exits_as_stopped={1})
    async with agent_with(tmp_path, cp, runner) as agent:
        assign(agent, command_job(1), command_job(2))
        await trio.sleep(1.0)  # both started
        decision = await agent.cancel(
            CancelOrder(epoch=1, worker_id="w-1", incarnation=1, assignment_ids=(1, 2))
        )
        assert decision.finished_ids == (1,) and decision.acknowledged_ids == (2,)
        await trio.sleep(2 * HEARTBEAT_S)
    reported = {o.assignment_id: o.state.value for _, hb in cp.heartbeats for o in hb.finished}
    assert reported == {1: "succeeded"}

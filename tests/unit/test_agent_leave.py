"""A clean stop: the agent stops every job, then says it leaves, on trio's mock clock.

The control plane is the scripted stand-in of ``test_agent_heartbeat``; the jobs run under a
scripted runner that takes ``STOP_S`` to stop (a command's SIGTERM grace), so the order of
"every job ended" and "leave sent" is visible in exact mock time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from test_agent_heartbeat import HEARTBEAT_S, ScriptedControlPlane, agent_settings, assign, sleep_job

from agent.core import Agent
from agent.job_results import JobResult
from agent.leave import LEAVE_BACKOFF
from agent.messages import JobState, Leave, LeaveAnswer
from runtime.errors import Busy
from runtime.jobs import JobRuntime, SleepRuntime
from runtime.text import read_jsonl

STOP_S = 0.4
LEAVE_TIMEOUT_S = 0.8


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


@attrs.define
class SlowToStop:
    """Runs a sleep job for its duration; asked to stop, it takes ``stop_s`` to end."""

    stop_s: float = STOP_S

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
        assert isinstance(runtime, SleepRuntime)
        on_started()
        began = trio.current_time()
        with trio.move_on_after(runtime.duration_ms / 1000):
            await stop.wait()
            await trio.sleep(self.stop_s)
            return JobResult(
                state=JobState.CANCELLED,
                stopped=True,
                exit_code=None,
                began_at=began,
                ended_at=trio.current_time(),
            )
        return JobResult(
            state=JobState.SUCCEEDED,
            stopped=False,
            exit_code=None,
            began_at=began,
            ended_at=trio.current_time(),
        )


@attrs.define
class LeaveProbe(ScriptedControlPlane):
    """The scripted control plane, also noting what the agent ran when its leave arrived."""

    agent: Agent | None = None
    running_at_leave: list[tuple[int, ...]] = attrs.field(factory=list)
    stops_logged_at_leave: list[int] = attrs.field(factory=list)
    answer: LeaveAnswer | None = None
    """What to answer; None: the stand-in's own (left)."""

    async def leave(self, request: Leave, *, deadline_s: float) -> LeaveAnswer:
        assert self.agent is not None
        self.running_at_leave.append(self.agent.running_assignment_ids)
        log = read_jsonl(self.agent.work_dir / "agent.jsonl")
        self.stops_logged_at_leave.append(sum(1 for r in log if r["event"] == "stop"))
        answer = await super().leave(request, deadline_s=deadline_s)
        return self.answer or answer


async def run_then_stop(
    tmp_path: Path,
    cp: LeaveProbe,
    body: Callable[[Agent], Any],
    *,
    stop_s: float = STOP_S,
    **overrides: Any,
) -> tuple[Agent, float, float]:
    """Run an agent whose jobs take ``stop_s`` to stop, call ``body(agent)`` once it registered,
    then cancel it (SIGTERM's path). Returns the agent, the trio time it was cancelled at and
    the time its run returned."""
    overrides.setdefault("leave_timeout_s", LEAVE_TIMEOUT_S)
    agent = Agent(agent_settings(tmp_path, **overrides), cp, runner=SlowToStop(stop_s=stop_s))
    cp.agent = agent
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run, "127.0.0.1:9")
        await agent.wait_registered()
        await body(agent)
        cancelled_at = trio.current_time()
        nursery.cancel_scope.cancel()
    return agent, cancelled_at, trio.current_time()


def log_events(tmp_path: Path) -> list[dict[str, Any]]:
    return read_jsonl(tmp_path / "agent.jsonl")


async def test_a_clean_stop_leaves_only_after_every_job_has_ended(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Stopped with two jobs running (each takes 0.4 s to stop), the agent sends its leave at
    exactly 0.4 s, when both have ended and their stop lines are written, and not before."""
    cp = LeaveProbe()

    async def two_jobs(agent: Agent) -> None:
        assert assign(agent, sleep_job(1), sleep_job(2)) == {1: "accepted", 2: "accepted"}
        await trio.sleep(0.2)
        assert agent.running_assignment_ids == (1, 2)

    _, cancelled_at, ended_at = await run_then_stop(tmp_path, cp, two_jobs)
    assert [t - cancelled_at for t, _ in cp.leaves] == pytest.approx([STOP_S])
    assert cp.running_at_leave == [()]
    assert cp.stops_logged_at_leave == [2]
    assert ended_at - cancelled_at == pytest.approx(STOP_S)
    events = [(r["event"], r["assignment_id"], r.get("reason")) for r in log_events(tmp_path)]
    # Both stop lines (in no set order: trio runs the two stopping tasks in either), then the leave.
    assert sorted(events[-3:-1]) == [("stop", 1, "shutdown"), ("stop", 2, "shutdown")]
    assert events[-1] == ("leave", None, None)
    assert log_events(tmp_path)[-1]["left"] is True


async def test_the_leave_names_the_incarnation_and_run_and_carries_unacknowledged_outcomes(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """The leave names the current incarnation (2, after a re-registration) and the run id its
    registrations carried, and brings the outcome of a job that succeeded after the last
    heartbeat, which no reply acknowledged yet."""
    cp = LeaveProbe()

    async def reregister_then_finish_a_job(agent: Agent) -> None:
        cp.next_answer = {"reregister": True}
        await trio.sleep(0.6)  # the heartbeat at 0.5 s asks to register again
        assert agent.incarnation == 2
        assign(agent, sleep_job(7, duration_s=0.1))
        await trio.sleep(0.2)  # the job succeeded; the next heartbeat is due later
        assert [o.assignment_id for o in agent.unacknowledged_outcomes] == [7]

    await run_then_stop(tmp_path, cp, reregister_then_finish_a_job)
    [(_, leave)] = cp.leaves
    assert leave.worker_id == "w-1" and leave.incarnation == 2
    assert leave.agent_run_id == cp.registrations[-1][1].agent_run_id != ""
    assert [(o.assignment_id, o.state) for o in leave.finished] == [(7, JobState.SUCCEEDED)]


@pytest.mark.parametrize(
    ("mode", "answer", "ended_after_s"),
    [
        ("hang", None, LEAVE_TIMEOUT_S),  # nobody answers: given up at the bound
        ("up", LeaveAnswer(left=False, epoch=1, detail="incarnation 1 is not current"), 0.0),
    ],
)
async def test_a_leave_that_does_not_get_through_is_logged_as_not_left(
    tmp_path: Path, autojump_clock: Any, mode: str, answer: LeaveAnswer | None, ended_after_s: float
) -> None:
    """A leave nobody answers is given up after leave_timeout_s, and one the control plane
    refuses at once; either way the agent stops, and its leave line says ``left: false``
    (the worker will be declared dead, which the checker knows to be a clean stop)."""
    cp = LeaveProbe(answer=answer)

    async def go_silent(agent: Agent) -> None:
        cp.mode = mode

    _, cancelled_at, ended_at = await run_then_stop(tmp_path, cp, go_silent)
    assert len(cp.leaves) == 1
    assert ended_at - cancelled_at == pytest.approx(ended_after_s)
    leave_line = log_events(tmp_path)[-1]
    assert (leave_line["event"], leave_line["left"], leave_line["incarnation"]) == ("leave", False, 1)


@attrs.define
class RefusesFirst(LeaveProbe):
    """Answers a leave only after refusing the first ``refusals`` attempts at once, as a
    replica that is busy or has no database connection does (``None``: refuses every one)."""

    refusals: int | None = 0

    async def leave(self, request: Leave, *, deadline_s: float) -> LeaveAnswer:
        if self.refusals is None or len(self.leaves) < self.refusals:
            self.leaves.append((trio.current_time(), request))
            raise Busy("busy: cp-1 had no database connection within 5 s, try another replica")
        return await super().leave(request, deadline_s=deadline_s)


async def test_a_leave_refused_as_busy_is_tried_again_until_it_is_recorded(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A leave the control planes refuse three times (busy) is sent again after a growing,
    jittered wait each time, and the fourth attempt is recorded: the leave line says left."""
    cp = RefusesFirst(refusals=3)

    async def nothing(agent: Agent) -> None:
        pass

    _, cancelled_at, ended_at = await run_then_stop(tmp_path, cp, nothing, leave_timeout_s=10.0)
    times = [t - cancelled_at for t, _ in cp.leaves]
    assert len(times) == 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0 <= gap <= LEAVE_BACKOFF.ceiling_s(n) for n, gap in enumerate(gaps))
    assert ended_at - cancelled_at == pytest.approx(times[-1])
    leave_line = log_events(tmp_path)[-1]
    assert (leave_line["event"], leave_line["left"]) == ("leave", True)


async def test_a_leave_refused_every_time_is_given_up_at_leave_timeout(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A leave refused at every attempt is tried again until leave_timeout_s after its first
    attempt, not after it, and the leave line then says it was not recorded."""
    cp = RefusesFirst(refusals=None)

    async def nothing(agent: Agent) -> None:
        pass

    _, cancelled_at, ended_at = await run_then_stop(tmp_path, cp, nothing, leave_timeout_s=5.0)
    first = cp.leaves[0][0]
    assert len(cp.leaves) > 5
    assert all(t - first < 5.0 for t, _ in cp.leaves)
    assert first - cancelled_at == 0.0 and ended_at - first <= 5.0
    leave_line = log_events(tmp_path)[-1]
    assert (leave_line["event"], leave_line["left"]) == ("leave", False)


@attrs.define
class CountsInFlight(ScriptedControlPlane):
    """Answers every leave after ``answer_delay_s``, noting how many were in flight at once."""

    in_flight: int = 0
    most_in_flight: int = 0

    async def leave(self, request: Leave, *, deadline_s: float) -> LeaveAnswer:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await super().leave(request, deadline_s=deadline_s)
        finally:
            self.in_flight -= 1


async def test_workers_stopping_together_take_turns_and_every_one_leaves(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Twelve agents of one process sharing three leave turns, stopped at once while every
    leave takes 0.5 s to answer, never have more than three leaves in flight and all twelve
    leave, although twelve leaves in a row take longer than one leave_timeout_s."""
    cp = CountsInFlight(answer_delay_s=0.5)
    turns = trio.CapacityLimiter(3)
    agents = [
        Agent(
            agent_settings(tmp_path / f"w-{i}", worker_id=f"w-{i}", leave_timeout_s=1.5),
            cp,
            runner=SlowToStop(),
            leave_turns=turns,
        )
        for i in range(1, 13)
    ]
    async with trio.open_nursery() as nursery:
        for agent in agents:
            await nursery.start(agent.run, "127.0.0.1:9")
        for agent in agents:
            await agent.wait_registered()
        nursery.cancel_scope.cancel()
    assert len(cp.leaves) == 12 and cp.most_in_flight == 3
    for agent in agents:
        assert log_events(agent.work_dir)[-1]["left"] is True


@attrs.define
class SlowToLeave(LeaveProbe):
    """Answers heartbeats at once, and refuses leaves (busy) until ``LEAVE_ANSWER_S`` after the
    first one arrived."""

    first_at: float | None = None

    async def leave(self, request: Leave, *, deadline_s: float) -> LeaveAnswer:
        now = trio.current_time()
        self.first_at = now if self.first_at is None else self.first_at
        if now < self.first_at + LEAVE_ANSWER_S:
            raise Busy("busy: cp-1 had no database connection within 5 s, try another replica")
        return await super().leave(request, deadline_s=deadline_s)


LEAVE_ANSWER_S = 3.0
"""Longer than the control planes' dead_after (2.5 s by default)."""


async def test_a_worker_heartbeats_until_its_slow_leave_is_recorded_and_not_after(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A leave refused as busy for 3 s (past dead_after): the worker keeps heartbeating
    every interval meanwhile, reporting nothing running and no outcome, so it is never silent
    long enough to be declared dead, and sends no heartbeat once its leave is recorded."""
    cp = SlowToLeave()

    async def nothing(agent: Agent) -> None:
        pass

    _, cancelled_at, ended_at = await run_then_stop(tmp_path, cp, nothing, leave_timeout_s=10.0)
    assert cp.first_at is not None and ended_at - cp.first_at >= LEAVE_ANSWER_S
    while_leaving = [(t, h) for t, h in cp.heartbeats if t >= cancelled_at]
    times = [cancelled_at, *(t for t, _ in while_leaving), ended_at]
    assert max(b - a for a, b in itertools.pairwise(times)) <= HEARTBEAT_S + 1e-9
    assert all(h.running_assignment_ids == () and h.finished == () for _, h in while_leaving)
    assert all(t < ended_at for t, _ in while_leaving)
    assert log_events(tmp_path)[-1]["left"] is True


async def test_a_worker_heartbeats_while_its_jobs_take_long_to_stop(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A job that takes 3 s to stop (past dead_after): the worker heartbeats every interval
    while it stops, reporting the job as running until it has ended, and then leaves."""
    cp = LeaveProbe()

    async def one_job(agent: Agent) -> None:
        assign(agent, sleep_job(5))
        await trio.sleep(0.2)

    _, cancelled_at, _ = await run_then_stop(tmp_path, cp, one_job, stop_s=3.0)
    [(left_at, _)] = cp.leaves
    assert left_at - cancelled_at == pytest.approx(3.0)
    stopping = [(t, h) for t, h in cp.heartbeats if cancelled_at <= t < left_at]
    times = [cancelled_at, *(t for t, _ in stopping), left_at]
    assert max(b - a for a, b in itertools.pairwise(times)) <= HEARTBEAT_S + 1e-9
    assert {h.running_assignment_ids for _, h in stopping} == {(5,)}
    assert log_events(tmp_path)[-1]["left"] is True

"""Pausing through an outage (DESIGN.md, "Outages"), on trio's mock clock.

With an outage grace (``db_outage_grace_s`` above the fence span) a worker whose heartbeats go
unacknowledged pauses its jobs at the fence deadline instead of stopping them; a heartbeat
that gets through in time resumes those whose assignments are still active and kills the
others; past the grace every paused job is killed and the worker registers again. Sleep jobs
stand for any job here (the reapers' side is in tests/integration/test_agent_reaper.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from test_agent_heartbeat import (
    FENCE_S,
    HEARTBEAT_S,
    ScriptedControlPlane,
    agent_settings,
    assign,
    clocks_follow_mock_time,
    running_agent,
    sleep_job,
    stops,
)

from agent.core import Agent
from agent.job_results import JobResult, reported_state, stop_reason_of
from agent.messages import JobState, StopReason
from agent.sleep_jobs import sleep_end
from runtime.jobs import JobRuntime
from runtime.text import read_jsonl

GRACE_S = 20.0

__all__ = ["clocks_follow_mock_time"]  # a fixture, used by name


def events(tmp_path: Path) -> list[str]:
    return [r["event"] for r in read_jsonl(tmp_path / "agent.jsonl")]


def stop_lines(tmp_path: Path) -> dict[int, dict[str, Any]]:
    return {r["assignment_id"]: r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "stop"}


async def test_an_outage_shorter_than_the_grace_pauses_and_resumes_every_job(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Heartbeats fail for 8 s (past the 3 s fence, within the 20 s grace): the jobs pause at
    the fence deadline, Assign is refused meanwhile, and the first heartbeat answered after
    the outage resumes them in the same incarnation; nothing is stopped."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assert assign(agent, sleep_job(1), sleep_job(2)) == {1: "accepted", 2: "accepted"}
        await trio.sleep(0.1)
        cp.mode = "down"
        t_down = trio.current_time()
        await trio.sleep(FENCE_S + 0.5)
        assert not agent.self_fenced
        assert assign(agent, sleep_job(3)) == {3: "fenced"}
        await trio.sleep(8.0 - (trio.current_time() - t_down))
        cp.mode = "up"
        await trio.sleep(2 * HEARTBEAT_S + 1.5)
        assert agent.running_assignment_ids == (1, 2)
        assert assign(agent, sleep_job(4)) == {4: "accepted"}
        assert agent.incarnation == 1
    assert events(tmp_path)[:5] == ["register", "start", "start", "pause", "resume"]
    assert len(cp.registrations) == 1


async def test_paused_time_does_not_count_against_a_sleep_jobs_duration(
    tmp_path: Path, autojump_clock: Any, clocks_follow_mock_time: None
) -> None:
    """A 10 s sleep job paused for about 6 s ends about 6 s later than it would have, and
    succeeds."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=10.0))
        await trio.sleep(0.01)
        started = trio.current_time()
        await trio.sleep(1.0)
        cp.mode = "down"
        await trio.sleep(9.0)
        cp.mode = "up"
        await trio.sleep(15.0)
    (line,) = stop_lines(tmp_path).values()
    assert line["reason"] == "succeeded"
    pause_line = next(r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "pause")
    resume_line = next(r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "resume")
    start_line = next(r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "start")
    paused_s = resume_line["time"] - pause_line["time"]
    assert 4.0 < paused_s < 9.0
    assert line["time"] - start_line["time"] == pytest.approx(10.0 + paused_s, abs=0.05)
    del started


async def test_a_paused_job_whose_assignment_ended_is_stopped_and_the_rest_resume(
    tmp_path: Path, autojump_clock: Any, clocks_follow_mock_time: None
) -> None:
    """The first heartbeat answered after the outage lists assignment 1 as ended: job 1 is
    stopped (its stop line carries the pause time), job 2 resumes."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1), sleep_job(2))
        await trio.sleep(0.1)
        cp.mode = "down"
        await trio.sleep(6.0)
        cp.next_answer = {"stop_assignment_ids": (1,)}
        cp.mode = "up"
        await trio.sleep(2.0)
        assert agent.running_assignment_ids == (2,)
    lines = stop_lines(tmp_path)
    assert lines[1]["reason"] == "stopped_by_control_plane"
    pause_line = next(r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "pause")
    assert lines[1]["time"] == pytest.approx(pause_line["time"], abs=0.01)
    assert events(tmp_path).index("stop") < events(tmp_path).index("resume")


async def test_paused_jobs_are_killed_at_the_grace_and_the_worker_registers_again(
    tmp_path: Path, autojump_clock: Any, clocks_follow_mock_time: None
) -> None:
    """An outage longer than the grace: every paused job is stopped as self-fenced at the
    grace (its stop line at the pause time), and the worker registers a new incarnation once
    a control plane answers."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        await trio.sleep(0.1)
        cp.mode = "down"
        await trio.sleep(GRACE_S + 1.0)
        assert agent.self_fenced
        assert agent.running_assignment_ids == ()
        cp.mode = "up"
        await trio.sleep(3.0)
        assert agent.incarnation == 2
    assert stops(tmp_path) == {1: "self_fence"}
    assert events(tmp_path)[:5] == ["register", "start", "pause", "self_fence", "stop"]
    pause_line = next(r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "pause")
    assert stop_lines(tmp_path)[1]["time"] == pytest.approx(pause_line["time"], abs=0.01)


async def test_a_worker_holding_no_job_stays_paused_past_the_grace_in_its_incarnation(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """An outage longer than the grace, with no job on the worker: there is nothing to kill,
    so it does not self-fence and throw its incarnation away; the first answer after the
    outage resumes it in the same incarnation, and it takes work again."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        cp.mode = "down"
        await trio.sleep(GRACE_S + 5.0)
        assert not agent.self_fenced
        assert assign(agent, sleep_job(1)) == {1: "fenced"}
        cp.mode = "up"
        await trio.sleep(2 * HEARTBEAT_S + 1.5)
        assert agent.incarnation == 1
        assert assign(agent, sleep_job(2)) == {2: "accepted"}
    assert events(tmp_path)[:3] == ["register", "pause", "resume"]
    assert len(cp.registrations) == 1


async def test_with_no_grace_a_worker_holding_no_job_pauses_rather_than_fences(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """With no outage grace a worker with jobs kills them at the fence deadline; one with no
    job has nothing to kill and keeps its incarnation through the silence."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=0.0) as agent:
        await agent.wait_registered()
        cp.mode = "down"
        await trio.sleep(3 * FENCE_S)
        assert not agent.self_fenced
        cp.mode = "up"
        await trio.sleep(2 * HEARTBEAT_S + 1.5)
        assert agent.incarnation == 1
    assert "self_fence" not in events(tmp_path)
    assert len(cp.registrations) == 1


async def test_a_paused_worker_judges_an_answer_by_the_span_it_tells(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A paused worker whose answers take longer than the self-fence span it registered with
    (3 s) resumes once an answer tells a longer one (dead_after 20 s, interval 2 s: 12 s):
    the cluster judges it by that from the heartbeat's record on. On its first span alone it
    would stay paused until the grace killed its job."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=600.0))
        await trio.sleep(0.1)
        cp.mode = "down"
        await trio.sleep(FENCE_S + 1.0)
        cp.tells = {"heartbeat_interval_s": 2.0, "dead_after_s": 20.0}
        cp.answer_delay_s = FENCE_S + 1.0
        cp.mode = "up"
        await trio.sleep(GRACE_S)
        assert not agent.self_fenced
        assert agent.running_assignment_ids == (1,)
        assert agent.heartbeat_interval_s == 2.0
    assert events(tmp_path)[:4] == ["register", "start", "pause", "resume"]
    assert len(cp.registrations) == 1


async def test_a_paused_worker_waits_longer_for_each_answer_after_calls_that_failed(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Answers take 5 s, longer than the 3 s self-fence span the worker registered with (a
    registration storm beside a short first interval), and a call gives up at its deadline. A
    paused worker's call waits the span less the margin (2.9 s), doubled for each call in a row
    that failed, up to ``register_timeout_s``: its heartbeats get through and are recorded (the
    leader does not declare it dead), and the answer telling a longer span resumes it. On the
    span alone every call would give up before its answer, for ever."""
    cp = ScriptedControlPlane(honour_deadlines=True)
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S, register_timeout_s=8.0) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=600.0))
        cp.answer_delay_s = 5.0
        await trio.sleep(FENCE_S + 8.0)
        assert events(tmp_path)[-1] == "pause"
        paused_calls = cp.heartbeat_deadlines[2:]
        assert paused_calls[0] == pytest.approx(8.0)  # 2.9 s x 2^2, capped at 8 s
        assert len(cp.answered) == 1  # recorded and answered, too late to resume on
        cp.tells = {"heartbeat_interval_s": 2.0, "dead_after_s": 20.0}
        await trio.sleep(GRACE_S - FENCE_S)
        assert not agent.self_fenced
        assert agent.running_assignment_ids == (1,)
    assert all(d <= 8.0 for d in cp.heartbeat_deadlines)
    # A call sent while paused measures the outage, not the replicas: the heartbeat after the
    # one answered too late says no wait.
    answered_late = [t for t, _ in cp.heartbeats].index(cp.answered[0])
    assert cp.heartbeats[answered_late + 1][1].waited_ms == 0
    assert events(tmp_path)[:4] == ["register", "start", "pause", "resume"]
    assert len(cp.registrations) == 1


async def test_a_reply_that_comes_after_its_own_deadline_does_not_resume(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """While paused, a heartbeat answered later than the fence span after it was sent is not
    enough: the jobs stay paused until a fresh one is answered."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        await trio.sleep(0.1)
        cp.mode = "down"
        await trio.sleep(5.0)
        cp.mode = "up"
        cp.answer_delay_s = FENCE_S + 0.5  # every answer now comes too late
        await trio.sleep(10.0)
        assert "resume" not in events(tmp_path)
        cp.answer_delay_s = 0.0
        await trio.sleep(FENCE_S + 2.0)
        assert "resume" in events(tmp_path)
        assert agent.running_assignment_ids == (1,)


async def test_the_registration_after_a_reregister_reply_stops_paused_jobs_first(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """The control plane declared the worker dead during the outage (reply ``reregister``):
    the paused jobs are stopped, never resumed, before the worker registers again."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        await trio.sleep(0.1)
        cp.mode = "down"
        await trio.sleep(6.0)
        cp.next_answer = {"reregister": True}
        cp.mode = "up"
        await trio.sleep(3.0)
        assert agent.incarnation == 2
    assert stops(tmp_path) == {1: "reregister"}
    assert "resume" not in events(tmp_path)


@attrs.define
class EndedAtTheFence:
    """A runner whose every job its reaper ends at the fence while the agent is paused, on its
    own: with ``started``, a job that ran, killed at a kill deadline the agent has not reached
    (the reaper's clock reads the deadline file a little ahead, or reads an older deadline);
    without, one whose reaper found the jobs paused as it came to start it and gave up (as one
    does that cannot read the deadline file)."""

    started: bool

    async def __call__(self, runtime: JobRuntime, *, pause: Any = None, **_: Any) -> JobResult:
        began_at = trio.current_time()
        while pause.paused_since() is None:
            await pause.changed.wait()
        ran = "killed by signal 9" if self.started else "not started: the fence deadline had passed"
        return JobResult(
            state=JobState.CANCELLED,
            stopped=True,
            fenced=True,
            exit_code=-9 if self.started else None,
            began_at=began_at if self.started else 0.0,
            ended_at=trio.current_time() if self.started else 0.0,
            detail=f"killed by its reaper at the fence deadline: {ran}",
            started=self.started,
        )


@pytest.mark.parametrize(
    ("started", "state", "said"),
    [(False, JobState.NOT_STARTED, "not started"), (True, JobState.FENCED, "killed by its reaper")],
)
async def test_a_job_its_reaper_ended_during_a_pause_is_reported_so_the_control_plane_ends_it(
    tmp_path: Path, autojump_clock: Any, started: bool, state: JobState, said: str
) -> None:
    """A job its reaper ends at the fence during a pause that then resumes (the same incarnation
    lives on) is reported, ``not_started`` when it never started and ``fenced`` when it did,
    until a reply acknowledges it, so the control plane ends its assignment: nothing else would
    (a started one stayed running for ever)."""
    cp = ScriptedControlPlane()
    runner = EndedAtTheFence(started=started)
    agent = Agent(agent_settings(tmp_path, db_outage_grace_s=GRACE_S), cp, runner=runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run, "127.0.0.1:9")
        await agent.wait_registered()
        assert assign(agent, sleep_job(1)) == {1: "accepted"}
        await trio.sleep(0.1)
        cp.mode = "down"
        await trio.sleep(FENCE_S + 2.0)
        cp.mode = "up"
        await trio.sleep(2 * HEARTBEAT_S + 1.5)
        assert agent.incarnation == 1 and agent.running_assignment_ids == ()
        nursery.cancel_scope.cancel()
    assert stops(tmp_path) == {1: "self_fence"}
    reported = [(t, o) for t, hb in cp.heartbeats for o in hb.finished]
    assert {o.assignment_id for _, o in reported} == {1}
    assert {o.state for _, o in reported} == {state}
    assert said in reported[0][1].detail
    # Carried until acknowledged, then no more.
    assert cp.heartbeats[-1][1].finished == ()
    assert len(cp.registrations) == 1


def test_sleep_end_adds_the_pauses_that_fall_before_it() -> None:
    """A 10 s sleep begun at 0 with pauses [2, 5) and [11, 12): it has run 10 s at 14."""

    class Pauses:
        spans = [(2.0, 5.0), (11.0, 12.0)]
        changed = trio.Event()

        def paused_since(self) -> float | None:
            return None

        def paused_s_between(self, start: float, end: float) -> float:
            return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.spans)

    assert sleep_end(0.0, 10.0, Pauses(), now=20.0) == pytest.approx(14.0)
    assert sleep_end(0.0, 10.0, Pauses(), now=9.0) == pytest.approx(13.0)  # 5 s run, 5 s to go


def test_a_sleep_job_paused_before_its_end_does_not_end_while_paused() -> None:
    """Begun at 0 for 10 s, paused since 9.9 and still paused at 100: not run out (inf), however
    long the pause."""

    class Paused:
        changed = trio.Event()

        def paused_since(self) -> float | None:
            return 9.9

        def paused_s_between(self, start: float, end: float) -> float:
            return max(0.0, min(end, 100.0) - max(9.9, start))

    assert sleep_end(0.0, 10.0, Paused(), now=100.0) == math.inf


async def test_a_job_paused_just_before_its_end_is_stopped_by_a_reregister_not_succeeded(
    tmp_path: Path, autojump_clock: Any, clocks_follow_mock_time: None
) -> None:
    """A sleep job with 0.05 s left when the worker pauses, and the reply "register again" 6 s
    later: it had not run its duration, so it is stopped (reason reregister) at the pause, not
    reported succeeded (the cluster may already run it elsewhere)."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        registered_at = trio.current_time()
        cp.mode = "down"
        # The fence deadline is FENCE_S after the registration was sent: 0.05 s before its end.
        assign(agent, sleep_job(1, duration_s=FENCE_S + 0.05 - (trio.current_time() - registered_at)))
        await trio.sleep(8.0)
        cp.next_answer = {"reregister": True}
        cp.mode = "up"
        await trio.sleep(3.0)
        assert agent.incarnation == 2
    del registered_at
    assert stops(tmp_path) == {1: "reregister"}
    assert not [o for _, r in cp.heartbeats for o in r.finished]


@pytest.mark.parametrize(
    ("started", "stopped", "fenced", "asked", "state", "reason", "reported"),
    [
        # the fence on its own: told, started or not
        (True, True, True, None, JobState.CANCELLED, StopReason.SELF_FENCE, JobState.FENCED),
        (False, True, True, None, JobState.CANCELLED, StopReason.SELF_FENCE, JobState.NOT_STARTED),
        # the agent's self-fence asked for it: the new registration ends the assignment
        (True, True, True, StopReason.SELF_FENCE, JobState.CANCELLED, StopReason.SELF_FENCE, None),
        # a stop the control plane asked for: it ends the assignment
        (True, True, False, StopReason.CANCELLED, JobState.CANCELLED, StopReason.CANCELLED, None),
        # its own end
        (True, False, False, None, JobState.FAILED, StopReason.FAILED, JobState.FAILED),
        (True, False, False, None, JobState.SUCCEEDED, StopReason.SUCCEEDED, JobState.SUCCEEDED),
        (False, False, False, None, JobState.NOT_STARTED, StopReason.RESTART, JobState.NOT_STARTED),
    ],
)
def test_a_runs_end_says_one_stop_reason_and_reports_what_only_the_worker_knows(
    started: bool,
    stopped: bool,
    fenced: bool,
    asked: StopReason | None,
    state: JobState,
    reason: StopReason,
    reported: JobState | None,
) -> None:
    """The stop line's reason and what the control plane is told, for each way a run ends."""
    result = JobResult(
        state=state,
        stopped=stopped,
        fenced=fenced,
        exit_code=None,
        began_at=0.0,
        ended_at=1.0,
        started=started,
    )
    assert stop_reason_of(result, fenced=fenced, asked=asked) is reason
    assert reported_state(result, fenced=fenced, asked=asked) is reported

"""The database's clock as an agent knows it (agent/dbclock.py) and the job log it dates
(agent/joblog.py); and an agent whose wall clock is stepped while its job runs, on trio's mock
clock with the scripted control plane of ``test_agent_heartbeat``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from test_agent_heartbeat import WALL_AT_ZERO, ScriptedControlPlane, assign, running_agent, sleep_job

from agent.control_plane import outcome_to_pb
from agent.dbclock import MAX_DRIFT, DatabaseClock, Reading
from agent.joblog import JobLog, LogEvent
from runtime.text import read_jsonl


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


@given(
    base=st.floats(1e9, 2e9),
    rate=st.floats(-MAX_DRIFT, MAX_DRIFT),
    sent_at=st.floats(0, 1e4),
    round_trip_s=st.floats(0, 10),
    read_fraction=st.floats(0, 1),
    at=st.floats(0, 1e5),
)
def test_a_reading_brackets_the_databases_clock_at_any_other_instant(
    base: float, rate: float, sent_at: float, round_trip_s: float, read_fraction: float, at: float
) -> None:
    """A database clock that runs at most MAX_DRIFT apart from the agent's, read at any instant
    between a request's send and its reply's arrival: at any instant before or after, it reads
    no earlier than the reading's earliest and no later than its latest."""

    def database(t: float) -> float:
        return base + t * (1 + rate)

    received_at = sent_at + round_trip_s
    read_at = sent_at + read_fraction * round_trip_s
    reading = Reading(database_unix_s=database(read_at), sent_at=sent_at, received_at=received_at)
    slack = 1e-6 * (1 + abs(at) + abs(base) * 1e-9)  # float rounding
    assert reading.earliest(at) - slack <= database(at) <= reading.latest(at) + slack


def test_the_reading_that_brackets_now_most_tightly_is_kept() -> None:
    """A reading with a slower round trip than the one kept is not taken; one as fast, or one a
    little slower once the kept one has aged (its bracket widened), is."""
    clock = DatabaseClock()
    assert not clock.known and clock.earliest(1.0) is None
    assert clock.observe(1000.0, sent_at=0.0, received_at=0.002)
    assert not clock.observe(2000.0, sent_at=1.0, received_at=1.010)  # 10 ms: wider
    assert clock.reading is not None and clock.reading.database_unix_s == 1000.0
    assert clock.observe(1001.0, sent_at=1.0, received_at=1.002)  # as fast, fresher
    # 100 s later the kept bracket has widened by 0.1 s (MAX_DRIFT): a 5 ms round trip is tighter.
    assert clock.observe(1101.0, sent_at=101.0, received_at=101.005)
    assert clock.earliest(101.005) == pytest.approx(1101.0)
    assert clock.latest(101.005) == pytest.approx(1101.005)


async def test_a_control_plane_that_tells_no_time_leaves_the_worker_clock_until_one_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reply without the database's time (an older control plane) makes the times the
    worker's wall clock; the first reply with it makes them the database's for good."""
    monkeypatch.setattr(time, "time", lambda: 5000.0 + trio.current_time())
    clock = DatabaseClock()
    now = trio.current_time()
    assert not clock.observe(None, sent_at=now, received_at=now)
    assert clock.known and clock.worker_clock
    assert clock.earliest(now + 1.0) == pytest.approx(5001.0 + now)
    assert clock.observe(9000.0, sent_at=now, received_at=now)
    assert not clock.worker_clock and clock.earliest(now) == 9000.0
    assert not clock.observe(0.0, sent_at=now, received_at=now)
    assert not clock.worker_clock  # the reading stays


async def test_lines_wait_for_the_clock_and_a_stop_is_never_dated_before_its_start(tmp_path: Path) -> None:
    """Lines written before the clock is known wait, in order, and are written once it is
    (each told its time); a start is dated by the latest the database's clock can read, a stop
    by the earliest but not before its start; lines on the worker's clock say so."""
    log = JobLog(tmp_path / "agent.jsonl", worker_id="w-1")
    log.open()
    written: list[float] = []
    at = trio.current_time()
    assert log.write(LogEvent.STOP, incarnation=1, epoch=1, job_id=1, assignment_id=1, at=at) is None
    assert read_jsonl(tmp_path / "agent.jsonl") == []
    log.write(LogEvent.REGISTER, incarnation=2, epoch=1, on_written=written.append)
    log.clock.observe(1000.0, sent_at=at, received_at=at + 0.5)
    log.flush()
    lines = read_jsonl(tmp_path / "agent.jsonl")
    assert [line["event"] for line in lines] == ["stop", "register"]
    assert lines[0]["time"] == pytest.approx(999.5)  # the earliest, half a second before the reading
    assert written == [lines[1]["time"]] and "clock" not in lines[0]
    start = log.write(LogEvent.START, incarnation=2, epoch=1, job_id=2, assignment_id=2, at=at + 0.5)
    assert start == pytest.approx(1000.5)  # the latest
    stop = log.write(
        LogEvent.STOP, incarnation=2, epoch=1, job_id=2, assignment_id=2, at=at + 0.5, not_before_s=start
    )
    assert stop == start
    log.close()
    worker_log = JobLog(tmp_path / "worker.jsonl", worker_id="w-2")
    worker_log.open()
    worker_log.clock.observe(None, sent_at=at, received_at=at)
    worker_log.write(LogEvent.REGISTER, incarnation=1, epoch=1)
    worker_log.close()
    assert read_jsonl(tmp_path / "worker.jsonl")[0]["clock"] == "worker"


@pytest.mark.parametrize("step_s", [600.0, -600.0])
async def test_an_agent_whose_wall_clock_is_stepped_reports_and_logs_by_the_databases_clock(
    tmp_path: Path, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch, step_s: float
) -> None:
    """An agent's wall clock ten minutes off, stepped twenty minutes the other way while its
    sleep job runs: the outcome says the job ran its duration, and ended as long before its
    report as it did; its start and stop lines are on the database's clock, the duration
    apart."""
    wall = {"offset_s": -step_s}
    monkeypatch.setattr(time, "time", lambda: WALL_AT_ZERO + trio.current_time() + wall["offset_s"])
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        began = trio.current_time()
        assign(agent, sleep_job(1, duration_s=2.0))
        await trio.sleep(1.0)
        wall["offset_s"] = step_s
        await trio.sleep(2.0)  # the job ended at 2.0 s, and a heartbeat carried its outcome
    ((sent_at, outcome),) = [(sent, o) for sent, report in cp.heartbeats for o in report.finished]
    assert outcome.run_s == pytest.approx(2.0)
    assert outcome.ended_at == pytest.approx(began + 2.0)
    message = outcome_to_pb(outcome, now=sent_at)
    assert (message.run_ms, message.ended_ago_ms) == (2000, round((sent_at - began - 2.0) * 1000))
    lines = {line["event"]: line for line in read_jsonl(tmp_path / "agent.jsonl")}
    assert lines["start"]["time"] == pytest.approx(WALL_AT_ZERO + began, abs=0.01)
    assert lines["stop"]["time"] == pytest.approx(WALL_AT_ZERO + began + 2.0, abs=0.01)

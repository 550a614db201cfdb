"""The agent's Prometheus metrics move when their events happen, on trio's mock clock: pauses,
resumes and self-fences, failed heartbeats, job starts and stops by reason, refused and
duplicate assignments, and the gauges read at scrape time (jobs running, the age of the newest
acknowledged heartbeat, the fence state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from prometheus_client import REGISTRY
from test_agent_heartbeat import (
    FENCE_S,
    HEARTBEAT_S,
    ScriptedControlPlane,
    assign,
    running_agent,
    sleep_job,
)

from agent.messages import AssignOrder, CancelOrder, StopReason
from agent.running import stop_metric_reason

GRACE_S = 20.0
WORKER = {"worker_id": "w-1"}


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample of the process's registry now (0 when it has none)."""
    return REGISTRY.get_sample_value(name, {**WORKER, **(labels or {})}) or 0.0


def fence_state() -> str | None:
    """The state whose ``stockade_agent_fence_state`` sample is 1, or None without samples."""
    states = ("registering", "live", "paused", "self_fenced")
    shown = [s for s in states if sample("stockade_agent_fence_state", {"state": s}) == 1.0]
    assert len(shown) <= 1
    return shown[0] if shown else None


async def test_a_pause_and_its_resume_are_counted_and_shown(tmp_path: Path, autojump_clock: Any) -> None:
    """An outage past the fence deadline (within the grace) counts one pause and shows the
    worker paused with its acknowledged heartbeat older than its fence span; the first
    heartbeat answered after it counts one resume and shows it live again."""
    pauses, resumes = sample("stockade_agent_pauses_total"), sample("stockade_agent_resumes_total")
    failures = sample("stockade_agent_heartbeat_failures_total")
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assert fence_state() == "live"
        assert sample("stockade_agent_fence_after_seconds") == FENCE_S
        cp.mode = "down"
        await trio.sleep(FENCE_S + 1.0)
        assert fence_state() == "paused"
        assert sample("stockade_agent_pauses_total") == pauses + 1
        assert sample("stockade_agent_heartbeat_ack_age_seconds") >= FENCE_S
        assert sample("stockade_agent_heartbeat_failures_total") > failures
        cp.mode = "up"
        await trio.sleep(2 * HEARTBEAT_S + 1.5)
        assert fence_state() == "live"
        assert sample("stockade_agent_resumes_total") == resumes + 1
        assert sample("stockade_agent_heartbeat_ack_age_seconds") <= HEARTBEAT_S
    assert sample("stockade_agent_pauses_total") == pauses + 1


async def test_a_self_fence_at_the_kill_deadline_is_counted_with_its_jobs_stops(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """An outage past the grace counts one self-fence and the paused job's stop as
    ``self_fence``; the worker shows self_fenced until it registers again."""
    fences = sample("stockade_agent_self_fences_total")
    fenced_stops = sample("stockade_agent_job_stops_total", {"reason": "self_fence"})
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp, db_outage_grace_s=GRACE_S) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1))
        await trio.sleep(0.1)
        cp.mode = "down"
        await trio.sleep(GRACE_S + 1.0)
        assert fence_state() == "self_fenced"
        assert sample("stockade_agent_self_fences_total") == fences + 1
        assert sample("stockade_agent_job_stops_total", {"reason": "self_fence"}) == fenced_stops + 1
        assert sample("stockade_agent_jobs_running") == 0
        cp.mode = "up"
        await trio.sleep(3.0)
        assert agent.incarnation == 2 and fence_state() == "live"


async def test_starts_stops_and_the_jobs_running_gauge_follow_the_jobs(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Two sleep jobs start (counted by runtime, shown as running); one succeeds, the other is
    cancelled: each stop is counted by its reason and the gauge falls to 0."""
    starts = sample("stockade_agent_job_starts_total", {"runtime": "sleep"})
    succeeded = sample("stockade_agent_job_stops_total", {"reason": "succeeded"})
    cancelled = sample("stockade_agent_job_stops_total", {"reason": "cancelled"})
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1, duration_s=2.0), sleep_job(2))
        await trio.sleep(0.1)
        assert sample("stockade_agent_job_starts_total", {"runtime": "sleep"}) == starts + 2
        assert sample("stockade_agent_jobs_running") == 2
        await trio.sleep(2.0)
        assert sample("stockade_agent_job_stops_total", {"reason": "succeeded"}) == succeeded + 1
        assert sample("stockade_agent_jobs_running") == 1
        await agent.cancel(CancelOrder(epoch=1, worker_id="w-1", incarnation=1, assignment_ids=(2,)))
        assert sample("stockade_agent_job_stops_total", {"reason": "cancelled"}) == cancelled + 1
        assert sample("stockade_agent_jobs_running") == 0


async def test_refusals_are_counted_by_request_and_reason_and_duplicates_apart(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A stale epoch, another incarnation, a cancelled id and a job too large are counted as
    refused, each by its reason; an id sent again is counted as a duplicate, not refused; a
    Cancel for another incarnation is counted under request=cancel."""

    def refused(reason: str, request: str = "assign") -> float:
        return sample("stockade_agent_assignments_refused_total", {"request": request, "reason": reason})

    reasons = ("stale_epoch", "wrong_incarnation", "cancelled", "no_room")
    before = {reason: refused(reason) for reason in reasons}
    cancel_before = refused("wrong_incarnation", "cancel")
    duplicates = sample("stockade_agent_duplicate_assignments_total")
    cp = ScriptedControlPlane(epoch=3)
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assert assign(agent, sleep_job(1), epoch=3) == {1: "accepted"}
        assert assign(agent, sleep_job(1), epoch=3) == {1: "accepted"}  # a duplicate
        assert assign(agent, sleep_job(2), epoch=2) == {2: "stale_epoch"}
        other_life = AssignOrder(epoch=3, worker_id="w-1", incarnation=7, assignments=(sleep_job(3),))
        assert [r.reason.value for r in agent.assign(other_life).refused] == ["wrong_incarnation"]
        await agent.cancel(CancelOrder(epoch=3, worker_id="w-1", incarnation=1, assignment_ids=(4,)))
        assert assign(agent, sleep_job(4), epoch=3) == {4: "cancelled"}
        job = sleep_job(5)
        huge = attrs.evolve(job, spec=attrs.evolve(job.spec, cpu_millis=64000))
        assert assign(agent, huge, epoch=3) == {5: "no_room"}
        await agent.cancel(CancelOrder(epoch=3, worker_id="w-1", incarnation=9, assignment_ids=(1,)))
    assert {reason: refused(reason) - before[reason] for reason in reasons} == dict.fromkeys(reasons, 1.0)
    assert refused("wrong_incarnation", "cancel") == cancel_before + 1
    assert sample("stockade_agent_duplicate_assignments_total") == duplicates + 1


async def test_a_stopped_agent_shows_no_gauges(tmp_path: Path, autojump_clock: Any) -> None:
    """Once its agent has stopped, a worker's scrape-time gauges are gone from the registry."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assert REGISTRY.get_sample_value("stockade_agent_jobs_running", WORKER) == 0
    assert REGISTRY.get_sample_value("stockade_agent_jobs_running", WORKER) is None
    assert fence_state() is None


@pytest.mark.parametrize(
    ("reason", "detail", "label"),
    [
        (StopReason.FAILED, "oom_killed: the kernel killed it (exit code -9)", "oom_killed"),
        (StopReason.FAILED, "timeout: ran past its timeout_s of 2 s and was stopped", "timeout"),
        (StopReason.FAILED, "image_not_found: no image busybox:1 on this worker", "image_not_found"),
        (StopReason.FAILED, "exit code 3", "failed"),
        (StopReason.FAILED, "not started: cannot write the start line: disk full", "failed"),
        (StopReason.SUCCEEDED, "exit code 0", "succeeded"),
        (StopReason.SELF_FENCE, "timeout: stopped while paused", "self_fence"),
    ],
)
def test_a_failures_stop_reason_is_the_reason_its_detail_names(
    reason: StopReason, detail: str, label: str
) -> None:
    """A failure counts under the reason its detail starts with (as the control plane records
    its end_reason), else as failed; any other stop under its own reason."""
    assert stop_metric_reason(reason, detail) == label

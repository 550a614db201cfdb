"""A container job's supervisor command line and its result from the report, without an engine
(:mod:`agent.container`); the runs on a real engine are tests/integration/test_agent_containers.py."""

from __future__ import annotations

import json
import time

import pytest
import trio

from agent.container import container_labels, container_name, supervisor_argv
from agent.job_results import OutputPaths, container_result
from agent.messages import JobState
from agent.runtimes import ContainerJob, forks
from runtime.jobs import ContainerRuntime

JOB = ContainerJob(
    worker_id="w-1",
    job_id=7,
    assignment_id=70,
    cpu_millis=1500,
    memory_mb=64,
    user="999:998",
    owner="0123456789ab",
)
PATHS = OutputPaths(stdout_path="/j/stdout.log", stderr_path="/j/stderr.log")


def _result(
    report: dict[str, str], *, stopped: bool = False, started: bool = True
) -> tuple[JobState, str, bool]:
    result = container_result(report, 0, stopped=stopped, exec_reported=started, began_at=1.0, paths=PATHS)
    return result.state, result.detail, result.started


def test_the_supervisor_gets_the_jobs_names_limits_and_variables() -> None:
    """The container is named and labelled after its worker, job and assignment; its CPU limit
    is cpu_millis x 1,000,000 nano CPUs, its memory and swap memory_mb MiB; it gets the job's
    variables and the worker's id, nothing else; it runs as the job user."""
    argv = supervisor_argv(
        ContainerRuntime(image="app:1", argv=("python3", "-V")),
        JOB,
        started_fd=9,
        stop_grace_s=2.5,
        fence_deadline_path=None,
        job_env={"STOCKADE_JOB_ID": "7"},
    )
    assert argv[1:3] == ["-I", "-c"]
    spec = json.loads(argv[-1])
    assert spec["name"] == container_name(JOB) == "stockade-w-1-0123456789ab-7-70"
    assert (
        spec["labels"]
        == container_labels(JOB)
        == {
            "stockade.job_id": "7",
            "stockade.assignment_id": "70",
            "stockade.worker_id": "w-1",
            "stockade.owner": "0123456789ab",
        }
    )
    assert (spec["nano_cpus"], spec["mem_bytes"]) == (1_500_000_000, 64 * 2**20)
    assert spec["env"] == {"STOCKADE_JOB_ID": "7", "STOCKADE_WORKER_ID": "w-1"}
    assert (spec["image"], spec["argv"], spec["started_fd"], spec["stop_grace_s"]) == (
        "app:1",
        ["python3", "-V"],
        9,
        2.5,
    )
    assert spec["deadline_path"] == ""
    assert spec["user"] == "999:998"


def test_a_container_job_takes_a_start_slot() -> None:
    """Starting one forks its supervisor: it is paced like a command job."""
    assert forks(ContainerRuntime(image="app"))


async def test_an_exit_code_reads_as_a_commands() -> None:
    """0 succeeds, anything else fails, with the exit code as the detail."""
    assert _result({"exit_code": "0", "ended_monotonic_s": "2.0", "stopped": "0", "removed": "1"})[:2] == (
        JobState.SUCCEEDED,
        "exit code 0",
    )
    assert _result({"exit_code": "3", "ended_monotonic_s": "2.0", "stopped": "0"})[:2] == (
        JobState.FAILED,
        "exit code 3",
    )


async def test_a_reason_comes_first_and_fails_the_job() -> None:
    """A report's reason starts the detail (then its words and the exit code) and fails the job,
    even with exit code 0; a stop still reads as cancelled."""
    oom = {
        "exit_code": "137",
        "ended_monotonic_s": "2.0",
        "stopped": "0",
        "reason": "oom_killed",
        "reason_detail": "x",
    }
    assert _result(oom)[:2] == (JobState.FAILED, "oom_killed: x (exit code 137)")
    gone = {
        "ended_monotonic_s": "2.0",
        "stopped": "0",
        "reason": "no_container_engine",
        "reason_detail": "gone",
    }
    assert _result(gone)[:2] == (JobState.FAILED, "no_container_engine: gone")
    assert _result({**gone, "stopped": "1"}, stopped=True)[0] is JobState.CANCELLED


async def test_a_container_that_never_started_says_why() -> None:
    """The report's error (image_not_found ...) is the detail of a job that never ran."""
    state, detail, started = _result(
        {"error": "image_not_found: image 'app:2' is not on this worker", "ended_monotonic_s": "2.0"},
        started=False,
    )
    assert (state, started) == (JobState.FAILED, False)
    assert detail.startswith("image_not_found: ")


async def test_a_fence_kill_stays_a_fence_kill() -> None:
    """A container killed at the fence deadline is fenced, whatever reason the report adds
    (the detail names it)."""
    fenced_at = time.monotonic() - 1.0  # the supervisor's clock: CLOCK_MONOTONIC
    report = {
        "exit_code": "137",
        "ended_monotonic_s": repr(fenced_at + 0.5),
        "stopped": "1",
        "fenced_monotonic_s": repr(fenced_at),
    }
    began_at = trio.current_time() - 5.0
    result = container_result(report, 137, stopped=False, exec_reported=True, began_at=began_at, paths=PATHS)
    assert result.fenced and result.state is JobState.CANCELLED
    assert result.ended_at == pytest.approx(trio.current_time() - 1.0, abs=0.5)
    gone = {**report, "reason": "no_container_engine", "reason_detail": "gone"}
    result = container_result(gone, 1, stopped=False, exec_reported=True, began_at=1.0, paths=PATHS)
    assert result.fenced and result.state is JobState.CANCELLED
    assert result.detail == "killed by its supervisor at the fence deadline; then no_container_engine: gone"

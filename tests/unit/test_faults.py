"""The rules of ops.faults: which worker is the busiest, and when a killed worker's jobs moved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from ops.faults import FaultError, busiest_worker, jobs_moved, new_leader
from ops.launcher.state import StateDir
from protocol import pb

KILLED_AT = 1000.0


def _worker(worker_id: str, cpu: int, jobs: list[int], state: str = "alive") -> pb.WorkerInfo:
    return pb.WorkerInfo(id=worker_id, state=state, cpu_allocated_millis=cpu, job_ids=jobs)


def test_the_busiest_worker_is_the_live_one_with_the_most_cpu_allocated() -> None:
    """Dead workers and workers without a process of their own (in a fleet) are passed over."""
    status = pb.StatusReply(
        workers=[
            _worker("w-1", 2000, [1]),
            _worker("w-2", 3000, [2], state="dead"),
            _worker("w-3", 4000, [3]),
            _worker("w-4", 1000, [4]),
        ]
    )
    chosen = busiest_worker(status, {"w-1", "w-2", "w-4"})
    assert chosen is not None and chosen.id == "w-1"
    assert busiest_worker(status, set()) is None


class _Jobs:
    """A control plane that answers get_job from a table the test changes."""

    def __init__(self, jobs: dict[int, pb.JobInfo]) -> None:
        self.jobs = jobs

    async def call(self, method: str, request: Any, **_: Any) -> pb.JobInfo:
        assert method == "get_job"
        return self.jobs[request.job_id]


def _started(state: StateDir, worker_id: str, job_id: int, at: float) -> None:
    folder = state.work_dir(worker_id)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "agent.jsonl").open("a") as log:
        log.write(json.dumps({"event": "start", "job_id": job_id, "time": at}) + "\n")


async def test_jobs_moved_when_each_started_elsewhere_after_the_kill(tmp_path: Path) -> None:
    """A job that ended on the killed worker needs no move; the others count once another
    worker's log starts them after the kill, timed to the last such start."""
    state = StateDir(tmp_path)
    client = _Jobs(
        {
            1: pb.JobInfo(job_id=1, state="succeeded", worker_id="w-1"),
            2: pb.JobInfo(job_id=2, state="running", worker_id="w-2"),
            3: pb.JobInfo(job_id=3, state="assigned", worker_id="w-3"),
        }
    )
    _started(state, "w-2", 2, KILLED_AT + 1.5)
    _started(state, "w-3", 3, KILLED_AT - 5)  # a start before the kill is not this move
    with trio.move_on_after(0.3):
        await jobs_moved(client, state, "w-1", [1, 2, 3], KILLED_AT, timeout_s=10)  # type: ignore[arg-type]
        pytest.fail("job 3 has not started elsewhere since the kill")
    _started(state, "w-3", 3, KILLED_AT + 2.25)
    moved = await jobs_moved(client, state, "w-1", [1, 2, 3], KILLED_AT, timeout_s=10)  # type: ignore[arg-type]
    assert moved.seconds == 2.25
    assert [j.job_id for j in moved.jobs] == [1, 2, 3]


async def test_jobs_not_moved_in_time_raise_a_fault_error(tmp_path: Path) -> None:
    """A job still pending when the time is up: FaultError, naming the worker and the job that
    held the wait up, with its reason."""
    reason = "unschedulable: gang of 4 needs 4 workers"
    client = _Jobs({1: pb.JobInfo(job_id=1, state="pending", reason=reason)})
    with pytest.raises(
        FaultError,
        match=rf"the jobs of w-1 did not run elsewhere within 0\.2 s of the kill \(job 1 pending: {reason}\)",
    ):
        await jobs_moved(client, StateDir(tmp_path), "w-1", [1], KILLED_AT, timeout_s=0.2)  # type: ignore[arg-type]


class _Stopped:
    """A cluster of three control planes none of which runs."""

    def config(self) -> Any:
        class Spec:
            def __init__(self, id: str) -> None:
                self.id, self.address = id, f"127.0.0.1:{9000 + int(id[-1])}"

        class Config:
            control_planes = [Spec("cp-1"), Spec("cp-2"), Spec("cp-3")]

        return Config()

    def live_process(self, spec: Any) -> None:
        return None


async def test_no_new_leader_is_waited_for_when_no_other_control_plane_runs() -> None:
    """Waiting for a new leader after cp-1 failed, with cp-2 and cp-3 not running, fails at
    once naming them, rather than after the whole wait."""
    with pytest.raises(FaultError) as caught, trio.fail_after(1):
        await new_leader(_Stopped(), "cp-1", 3, since=0.0, timeout_s=30.0, tls=None)  # type: ignore[arg-type]
    assert (
        str(caught.value)
        == "no new leader can follow cp-1: no other control plane runs (cp-2, cp-3 not running)"
    )

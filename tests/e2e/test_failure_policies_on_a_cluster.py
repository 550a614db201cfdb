"""End to end with real processes (the launcher of `stockade up`, as ``test_cluster``): command
jobs that exit with codes their failure policy does or does not retry, and an array whose
max_failed_tasks cancels the rest."""

from __future__ import annotations

import pytest
from test_cluster import Launch, launch, wait_for

from ops import rpc
from protocol import pb

pytestmark = pytest.mark.e2e

__all__ = ["launch"]  # the fixture, shared with test_cluster

ENDED = {"succeeded", "failed", "cancelled"}


def shell(name: str, script: str, **fields: object) -> pb.JobSpec:
    return pb.JobSpec(
        name=name,
        cpu_millis=100,
        memory_mb=64,
        command=pb.CommandRuntime(argv=["sh", "-c", script]),
        retry_backoff_ms=0,
        **fields,
    )


def test_failure_policies_on_real_command_jobs(launch: Launch) -> None:
    """``exit 2`` with retry_on_exit [1, 75] fails at once (one run, its reason saying why);
    ``exit 75`` with retry_on_exit [75] is retried until its 2 attempts are spent; an array of
    4 failing tasks, one at a time, with max_failed_tasks 1 ends with 1 task failed and the
    other 3 cancelled, naming max_failed_tasks."""
    _, ready = launch(1, 2)
    addresses, tls = ready.config.control_plane_addresses, ready.config.client_tls

    def submit(spec: pb.JobSpec) -> int:
        return int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=spec), tls=tls).job_id)

    def job(job_id: int) -> pb.JobInfo:
        info: pb.JobInfo = rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)
        return info

    at_once = submit(shell("at-once", "exit 2", max_attempts=3, retry_on_exit=[1, 75]))
    retried = submit(shell("retried", "exit 75", max_attempts=2, retry_on_exit=[75]))
    tasks = shell("tasks", "exit 1")
    tasks.array = pb.JobArray(first_index=0, last_index=3, max_running=1, max_failed_tasks=1)
    array_id = submit(tasks)

    for job_id in (at_once, retried):
        wait_for(lambda job_id=job_id: job(job_id).state in ENDED, timeout_s=60, what=f"job {job_id} to end")
    first = job(at_once)
    assert (first.state, first.failures, first.attempts, first.exit_code) == ("failed", 1, 1, 2)
    assert first.reason == "exit code 2 is not in retry_on_exit [1, 75]"
    second = job(retried)
    assert (second.state, second.failures, second.attempts, second.exit_code) == ("failed", 2, 2, 75)

    def counts() -> dict[str, int]:
        return {c.state: int(c.count) for c in job(array_id).array_counts}

    wait_for(
        lambda: sum(counts().get(s, 0) for s in ENDED) == 4, timeout_s=60, what=f"array {array_id} to end"
    )
    assert counts() == {"failed": 1, "cancelled": 3}
    cancelled = [
        info
        for info in rpc.call(addresses, "list_jobs", pb.ListJobsRequest(limit=100), tls=tls).jobs
        if info.array_id == array_id and info.state == "cancelled"
    ]
    assert len(cancelled) == 3
    assert all(job(c.job_id).reason.startswith("max_failed_tasks: cancelled because 1 of") for c in cancelled)

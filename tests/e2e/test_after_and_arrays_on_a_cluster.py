"""End to end with real processes (the launcher of `stockade up`, as ``test_cluster``): a job
after another runs only once that one succeeded, and each task of an array of command jobs
sees its own ``STOCKADE_ARRAY_INDEX``."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cluster import Launch, launch, wait_for

from ops import rpc
from protocol import pb

pytestmark = pytest.mark.e2e

__all__ = ["launch"]  # the fixture, shared with test_cluster

ENDED = {"succeeded", "failed", "cancelled"}


def command(name: str, *argv: str, **fields: object) -> pb.JobSpec:
    return pb.JobSpec(
        name=name, cpu_millis=100, memory_mb=64, command=pb.CommandRuntime(argv=list(argv)), **fields
    )


def test_a_job_after_another_runs_only_after_it_succeeded(launch: Launch) -> None:
    """b (after a, a 1.5 s command) is waiting while a runs, then runs and succeeds; it started
    after a finished."""
    _, ready = launch(1, 2)
    addresses, tls = ready.config.control_plane_addresses, ready.config.client_tls

    def job(job_id: int) -> pb.JobInfo:
        info: pb.JobInfo = rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)
        return info

    a = int(
        rpc.call(
            addresses,
            "submit_job",
            pb.SubmitJobRequest(spec=command("a", "python3", "-c", "import time; time.sleep(1.5)")),
            tls=tls,
        ).job_id
    )
    b = int(
        rpc.call(
            addresses, "submit_job", pb.SubmitJobRequest(spec=command("b", "true", after=[a])), tls=tls
        ).job_id
    )
    first = job(b)
    assert (first.state, first.reason) == ("waiting", f"waiting for job {a}")
    wait_for(lambda: job(a).state == "running", timeout_s=30, what=f"job {a} to run")
    assert job(b).state == "waiting"
    wait_for(lambda: job(b).state in ENDED, timeout_s=60, what=f"job {b} to end")
    done_a, done_b = job(a), job(b)
    assert (done_a.state, done_b.state) == ("succeeded", "succeeded")
    assert done_b.started_unix_s >= done_a.finished_unix_s


def test_each_task_of_an_array_sees_its_index(launch: Launch) -> None:
    """An array 0-3%2 of command jobs: every task succeeds and prints its own
    STOCKADE_ARRAY_INDEX and the array's id; GetJob counts 4 succeeded tasks."""
    _, ready = launch(1, 2)
    addresses, tls = ready.config.control_plane_addresses, ready.config.client_tls
    spec = command("arr", "sh", "-c", 'echo "$STOCKADE_ARRAY_INDEX $STOCKADE_ARRAY_ID $STOCKADE_JOB_ID"')
    spec.array = pb.JobArray(first_index=0, last_index=3, max_running=2)
    array_id = int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=spec), tls=tls).job_id)

    def counts() -> dict[str, int]:
        info = rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=array_id), tls=tls)
        return {c.state: int(c.count) for c in info.array_counts}

    wait_for(lambda: counts() == {"succeeded": 4}, timeout_s=60, what=f"array {array_id} to succeed")
    tasks = [
        job
        for job in rpc.call(addresses, "list_jobs", pb.ListJobsRequest(limit=100), tls=tls).jobs
        if job.array_id == array_id
    ]
    printed = {job.array_index: Path(job.stdout_path).read_text().split() for job in tasks}
    assert printed == {
        job.array_index: [str(job.array_index), str(array_id), str(job.job_id)] for job in tasks
    }
    assert sorted(printed) == [0, 1, 2, 3]

"""What ``stockade cancel`` says a cancel came to (issue 10, fault 1)."""

from __future__ import annotations

from ops.cli.render import cancel_verdict
from ops.client.results import job_from_pb
from protocol import pb


def test_a_job_that_ended_on_its_own_first_is_reported_with_its_exit_code() -> None:
    job = job_from_pb(pb.JobInfo(job_id=7, state="succeeded", has_exit_code=True, exit_code=0))
    assert cancel_verdict(7, job) == "job 7: succeeded before the cancel took effect, exit code 0"


def test_a_failed_job_keeps_its_nonzero_exit_code() -> None:
    job = job_from_pb(pb.JobInfo(job_id=7, state="failed", has_exit_code=True, exit_code=3))
    assert cancel_verdict(7, job) == "job 7: failed before the cancel took effect, exit code 3"


def test_a_cancelled_job_and_one_still_on_its_way() -> None:
    assert cancel_verdict(7, job_from_pb(pb.JobInfo(job_id=7, state="cancelled"))) == "job 7: cancelled"
    running = job_from_pb(pb.JobInfo(job_id=7, state="running"))
    assert cancel_verdict(7, running) == "job 7: cancelling (still running)"

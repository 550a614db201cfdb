"""``stockade job --json`` and ``stockade list --json`` print the reply with stable keys, built
from the same reply objects as the tables."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from ops.cli import app
from ops.config import INSECURE_ENV
from protocol import pb
from runtime.client import ControlPlaneClient

FIELD_KEYS = [
    "name",
    "cpu_millis",
    "memory_mb",
    "priority",
    "command",
    "max_attempts",
    "retry_backoff_s",
    "count_lost",
    "timeout_s",
    "constraints",
    "env",
    "workdir",
    "after",
    "array",
    "max_failed_tasks",
    "retry_on_exit",
    "no_retry_on",
    "resources",
    "tasks",
    "spread",
]
"""The fields of a command job, in order, as a job file holds them (``ops.jobfields.fields_of``)."""
STATUS_KEYS = [
    "job_id",
    "state",
    "reason",
    "worker_id",
    "assignment_id",
    "epoch",
    "attempts",
    "failures",
    "exit_code",
    "submitted_unix_s",
    "started_unix_s",
    "finished_unix_s",
    "not_before_unix_s",
    "array_id",
    "array_index",
    "array_counts",
    "attempt_history",
    "stdout_path",
    "stderr_path",
    "owner",
    "gang",
    "schedule",
    "schedule_slot_unix_s",
    "usage",
]
"""The keys of a job's ``status``, in order (documented in ``ops.cli.render.job_status_json``)."""

FINISHED = pb.JobInfo(
    job_id=7,
    spec=pb.JobSpec(
        name="hello", cpu_millis=250, memory_mb=64, priority=3, command=pb.CommandRuntime(argv=["echo", "hi"])
    ),
    state="succeeded",
    owner="alice",
    worker_id="w-2",
    assignment_id=11,
    epoch=4,
    has_exit_code=True,
    exit_code=0,
    submitted_unix_s=1_700_000_000.5,
    started_unix_s=1_700_000_001.0,
    finished_unix_s=1_700_000_002.25,
    stdout_path="/work/w-2/jobs/7-11/stdout.log",
    stderr_path="/work/w-2/jobs/7-11/stderr.log",
    attempts=1,
)
PENDING = pb.JobInfo(
    job_id=8,
    spec=pb.JobSpec(name="nap", cpu_millis=64000, memory_mb=128, sleep=pb.SleepRuntime(duration_ms=2500)),
    state="pending",
    reason="unschedulable: needs 64000 cpu_millis, largest worker has 16000",
    submitted_unix_s=1_700_000_003.0,
)


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The control plane answers get_job with FINISHED and list_jobs with both jobs; the calls
    made are recorded."""
    calls: list[tuple[str, Any]] = []

    async def replica(self: ControlPlaneClient, index: int, name: str, request: Any, **_: object) -> Any:
        calls.append((name, request))
        return FINISHED if name == "get_job" else pb.ListJobsReply(jobs=[PENDING, FINISHED])

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")  # the scripted replica needs no certificate
    return calls


def run_json(*args: str) -> Any:
    result = CliRunner().invoke(app, [*args, "--json", "--control-planes", "127.0.0.1:1"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_job_json_is_a_job_file_with_a_status(answers: list[tuple[str, Any]]) -> None:
    """A finished command job: its fields as a job file holds them, every one given, then what
    the cluster reports under ``status``, every documented key in order with the reply's values."""
    data = run_json("job", "7")
    assert list(data) == [*FIELD_KEYS, "status"]
    assert {k: data[k] for k in FIELD_KEYS} == {
        "name": "hello",
        "cpu_millis": 250,
        "memory_mb": 64,
        "priority": 3,
        "command": ["echo", "hi"],
        "max_attempts": 1,
        "retry_backoff_s": 1.0,
        "count_lost": False,
        "timeout_s": None,
        "constraints": [],
        "env": {},
        "workdir": None,
        "after": [],
        "array": None,
        "max_failed_tasks": None,
        "retry_on_exit": [],
        "no_retry_on": [],
        "resources": {},
        "tasks": None,
        "spread": None,
    }
    assert list(data["status"]) == STATUS_KEYS
    assert data["status"] == {
        "job_id": 7,
        "state": "succeeded",
        "reason": None,
        "worker_id": "w-2",
        "assignment_id": 11,
        "epoch": 4,
        "attempts": 1,
        "failures": 0,
        "exit_code": 0,
        "submitted_unix_s": 1_700_000_000.5,
        "started_unix_s": 1_700_000_001.0,
        "finished_unix_s": 1_700_000_002.25,
        "not_before_unix_s": None,
        "array_id": None,
        "array_index": None,
        "array_counts": {},
        "attempt_history": [],
        "stdout_path": "/work/w-2/jobs/7-11/stdout.log",
        "stderr_path": "/work/w-2/jobs/7-11/stderr.log",
        "owner": "alice",
        "gang": None,
        "schedule": None,
        "schedule_slot_unix_s": None,
        "usage": None,
    }
    assert answers == [("get_job", pb.GetJobRequest(job_id=7))]


def test_list_json_lists_each_job_as_job_json_does(answers: list[tuple[str, Any]]) -> None:
    """``{"jobs": [...]}`` in the reply's order; what a job has not got yet is null, an exit
    code of 0 stays 0."""
    data = run_json("list", "--state", "pending", "--limit", "5")
    assert list(data) == ["jobs"]
    pending, finished = data["jobs"]
    assert [list(job["status"]) for job in data["jobs"]] == [STATUS_KEYS, STATUS_KEYS]
    assert pending["sleep_s"] == 2.5 and "command" not in pending
    status = pending["status"]
    assert status["reason"].startswith("unschedulable: needs 64000 cpu_millis")
    assert {
        k: status[k] for k in ("worker_id", "assignment_id", "epoch", "exit_code", "started_unix_s")
    } == dict.fromkeys(("worker_id", "assignment_id", "epoch", "exit_code", "started_unix_s"))
    assert finished["status"]["exit_code"] == 0
    assert answers == [("list_jobs", pb.ListJobsRequest(state="pending", limit=5))]


def test_json_output_is_the_document_alone(answers: list[tuple[str, Any]]) -> None:
    """--json prints only the JSON document (a script can parse the whole output)."""
    result = CliRunner().invoke(app, ["list", "--json", "--control-planes", "127.0.0.1:1"])
    assert result.output.startswith("{") and result.output.endswith("}\n")


def test_the_sleep_limit_in_the_help_is_the_job_specs() -> None:
    """The longest sleep ``stockade --help`` states without importing the job spec is the one
    the spec's check applies."""
    from ops.cli import jobs
    from runtime.jobs import MAX_SLEEP_MS

    assert jobs.MAX_SLEEP_S * 1000 == MAX_SLEEP_MS


def test_a_container_runtime_is_its_image_and_argv() -> None:
    """A container job's runtime reads ``{"kind": "container", "image": ..., "argv": [...]}``."""
    from ops.cli.render import runtime_json, runtime_text
    from runtime.wire_jobs import job_spec_from_pb

    spec = job_spec_from_pb(pb.JobSpec(container=pb.ContainerRuntime(image="app:1", argv=["echo", "a b"])))
    assert runtime_json(spec) == {"kind": "container", "image": "app:1", "argv": ["echo", "a b"]}
    assert runtime_text(spec) == "container app:1 -- echo 'a b'"

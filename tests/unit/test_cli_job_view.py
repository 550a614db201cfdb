"""`stockade job ID`'s human view of the lifecycle: attempts spent of the most, each run, the
retry wait, timeout, constraints, environment names (not values), workdir, after, arrays."""

from __future__ import annotations

import copy
import json
import re
import time
from datetime import datetime
from pathlib import Path

import attrs
import pytest
from typer.testing import CliRunner

from ops.cli import app
from ops.cli.common import console
from ops.cli.job_view import lifecycle_rows
from ops.cli.render import local_time
from ops.client.results import JobGang, job_from_pb
from ops.config import INSECURE_ENV
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.constraints import parse_constraint
from runtime.jobs import CommandRuntime, JobSpec
from runtime.wire_jobs import job_spec_to_pb

SPEC = JobSpec(
    name="train",
    cpu_millis=500,
    memory_mb=256,
    runtime=CommandRuntime(argv=("false",)),
    max_attempts=3,
    retry_backoff_s=2.0,
    timeout_s=90.0,
    constraints=(parse_constraint("gpu=a100"),),
    env={"TOKEN": "s3cret", "MODE": "fast"},
    workdir="/srv/data",
    after=(4, 5),
)
RETRYING = pb.JobInfo(
    job_id=9,
    spec=job_spec_to_pb(SPEC),
    state="pending",
    attempts=1,
    failures=1,
    not_before_unix_s=1_700_000_010.0,
    array_id=8,
    array_index=3,
    attempt_history=[
        pb.Attempt(
            assignment_id=21,
            worker_id="w-3",
            epoch=2,
            state="finished",
            end_reason="failed",
            has_exit_code=True,
            exit_code=1,
            created_unix_s=1_700_000_000.0,
            ended_unix_s=1_700_000_001.0,
            detail="exit code 1",
            counted=True,
        )
    ],
)


def read_at(read_unix_s: float) -> pb.JobInfo:
    """:data:`RETRYING` as read by the cluster at ``read_unix_s`` (database time)."""
    info = copy.deepcopy(RETRYING)
    info.read_unix_s = read_unix_s
    return info


def test_the_lifecycle_rows_say_what_the_job_was_given_and_spent() -> None:
    """Attempts spent of the most, the retry's wait, and each setting; env names only."""
    rows = dict(lifecycle_rows(job_from_pb(read_at(1_700_000_004.0))))
    assert rows["attempts"] == "1 of 3 spent, 1 run (runs lost with a worker not counted)"
    assert rows["retry"].startswith("retrying after ") and rows["retry"].endswith("(in 6 s)")
    assert rows["timeout"] == "90 s"
    assert rows["constraints"] == "gpu=a100"
    assert rows["env"] == "MODE, TOKEN"
    assert (rows["workdir"], rows["after"], rows["array"]) == ("/srv/data", "4, 5", "task 3 of array 8")


def test_job_shows_each_attempt_and_no_env_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The view lists each run (worker, epoch, end, exit code, detail, counted) and never prints
    an environment value."""
    waiting = pb.JobInfo.parse(bytes(RETRYING))
    waiting.not_before_unix_s = time.time() + 60  # the retry's wait has not passed

    async def replica(*args: object, **kwargs: object) -> pb.JobInfo:
        return waiting

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")  # the scripted replica needs no certificate
    result = CliRunner().invoke(app, ["job", "9", "--control-planes", "127.0.0.1:1"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "attempts" in result.output and "retrying after" in result.output
    run = next(line for line in result.output.splitlines() if " w-3 " in line)
    assert run.split()[:4] == ["1", "21", "w-3", "2"]
    assert "failed" in run and "exit code 1" in run and "yes" in run
    assert "s3cret" not in result.output


def test_the_attempts_table_names_its_time_the_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's time in the attempts table is its assignment's creation, and the column says so
    (``placed``), not ``started``: the run starts on its worker later."""

    async def replica(*args: object, **kwargs: object) -> pb.JobInfo:
        return RETRYING

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")
    result = CliRunner().invoke(app, ["job", "9", "--control-planes", "127.0.0.1:1"], env={"COLUMNS": "160"})
    header = next(line for line in result.output.splitlines() if "assignment" in line and "worker" in line)
    assert header.split()[:6] == ["#", "assignment", "worker", "epoch", "placed", "ended"]
    run = next(line for line in result.output.splitlines() if " w-3 " in line)
    assert local_time(1_700_000_000.0) in run


def test_a_retry_wait_that_has_passed_is_not_shown() -> None:
    """Once its retry wait has passed, a pending job shows no retry row (it waits for room)."""
    assert "retry" not in dict(lifecycle_rows(job_from_pb(read_at(1_700_000_011.0))))


@pytest.mark.parametrize("offset_s", [-600.0, 0.0, 600.0])
def test_the_retry_wait_is_told_by_the_clusters_clock_not_this_machines(
    monkeypatch: pytest.MonkeyPatch, offset_s: float
) -> None:
    """How long a retry wait has left is the job's not_before minus the time the cluster read it
    (database time), whatever this machine's clock says; a reply that says no read time shows
    the wait's end alone."""
    monkeypatch.setattr(time, "time", lambda: 1_700_000_004.0 + offset_s)
    rows = dict(lifecycle_rows(job_from_pb(read_at(1_700_000_004.0))))
    assert rows["retry"].endswith("(in 6 s)")
    assert dict(lifecycle_rows(job_from_pb(RETRYING)))["retry"].endswith(
        datetime.fromtimestamp(1_700_000_010.0).astimezone().strftime("%H:%M:%S")
    )


def test_an_array_shows_its_tasks_by_state() -> None:
    """An array (asked by its id) shows its counts."""
    info = pb.JobInfo(
        job_id=8,
        spec=job_spec_to_pb(SPEC),
        state="running",
        array_counts=[pb.JobCount(state="running", count=10), pb.JobCount(state="pending", count=90)],
    )
    assert dict(lifecycle_rows(job_from_pb(info)))["tasks"] == "running 10  pending 90"


@pytest.mark.parametrize(
    ("state", "expected", "unexpected"),
    [
        ("pending", ["last worker", "w-3 (its last run"], ["stockade logs 9"]),
        ("running", ["on w-3 (`stockade logs 9`)", "on w-3 (`stockade logs 9 --stderr`)"], ["last worker"]),
    ],
)
def test_job_names_a_retrying_jobs_worker_as_its_last_and_where_a_running_jobs_output_is(
    monkeypatch: pytest.MonkeyPatch, state: str, expected: list[str], unexpected: list[str]
) -> None:
    """A job waiting to run again shows its last run's worker as such; a running job's output
    is on its worker, read with `stockade logs`, not a '-' beside the lines printed below."""
    info = pb.JobInfo.parse(bytes(RETRYING))
    info.state, info.worker_id = state, "w-3"

    async def replica(*args: object, **kwargs: object) -> pb.JobInfo:
        return info

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")
    result = CliRunner().invoke(app, ["job", "9", "--control-planes", "127.0.0.1:1"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    for text in expected:
        assert text in result.output
    for text in unexpected:
        assert text not in result.output


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_job_wraps_long_paths_and_never_cuts_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, columns: int
) -> None:
    """At any terminal width the view shows a job's output paths, its workdir and a path in a
    run's detail whole, from their first folder on (wrapped, not cut or made relative to where
    the command runs)."""
    folder = tmp_path / ("jobs-" + "x" * 120)
    stdout, stderr = str(folder / "123-456" / "stdout.log"), str(folder / "123-456" / "stderr.log")
    workdir = "/srv/" + "data-" * 50 + "end"
    detail = f"cannot start: no such file {workdir}/bin/{'y' * 90}"
    info = pb.JobInfo.parse(bytes(RETRYING))
    info.state, info.stdout_path, info.stderr_path = "failed", stdout, stderr
    info.spec.workdir = workdir
    info.attempt_history[0].detail = detail

    async def replica(*args: object, **kwargs: object) -> pb.JobInfo:
        return info

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")
    monkeypatch.chdir(tmp_path)  # the worker's files lie below the folder the command runs in
    console.cache_clear()  # a console of this width
    try:
        result = CliRunner().invoke(
            app, ["job", "9", "--control-planes", "127.0.0.1:1"], env={"COLUMNS": str(columns)}
        )
    finally:
        console.cache_clear()
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    joined = re.sub(r"\s+", "", result.output)
    for path in (stdout, stderr, workdir, "".join(detail.split())):
        assert path in joined
    first = next(line for line in result.output.splitlines() if line.startswith("stdout "))
    assert first.split()[1] == stdout[: len(first.split()[1])]  # from the path's first folder on


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("preempted by job 57", "w-3 (its last run; placed again as soon as there is room)"),
        ("", "w-3 (its last run; placed again after its backoff)"),
    ],
)
def test_a_preempted_job_is_placed_again_at_once_not_after_a_backoff(
    monkeypatch: pytest.MonkeyPatch, reason: str, expected: str
) -> None:
    """A job a preemption put back to pending names its last worker and says it goes again as
    soon as there is room (a preemption waits no backoff); another says it goes after its backoff."""
    info = pb.JobInfo.parse(bytes(RETRYING))
    info.state, info.worker_id, info.reason = "pending", "w-3", reason

    async def replica(*args: object, **kwargs: object) -> pb.JobInfo:
        return info

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")
    result = CliRunner().invoke(app, ["job", "9", "--control-planes", "127.0.0.1:1"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert expected in result.output


def test_a_job_a_schedule_fired_names_its_schedule_and_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """`stockade job` has a schedule row (name, slot in UTC); --json's status has both."""
    fired = pb.JobInfo.parse(bytes(RETRYING))
    fired.schedule = "nightly"
    fired.schedule_slot_unix_s = 1_764_901_800.0  # 2025-12-05 02:30:00 UTC

    async def replica(*args: object, **kwargs: object) -> pb.JobInfo:
        return fired

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")
    result = CliRunner().invoke(app, ["job", "9", "--control-planes", "127.0.0.1:1"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("schedule"))
    assert "nightly, slot 2025-12-05 02:30:00 UTC" in row
    shown = CliRunner().invoke(app, ["job", "9", "--json", "--control-planes", "127.0.0.1:1"])
    status = json.loads(shown.output)["status"]
    assert (status["schedule"], status["schedule_slot_unix_s"]) == ("nightly", 1_764_901_800.0)


def test_a_job_no_schedule_fired_has_no_schedule_row() -> None:
    """Without a schedule the row is left out and the JSON keys are null."""
    from ops.cli.render import job_status_json

    info = job_from_pb(RETRYING)
    assert (info.schedule, info.schedule_slot_unix_s) == (None, None)
    assert job_status_json(info)["schedule"] is None


def test_the_events_say_which_schedule_fired_and_which_replaced_a_job() -> None:
    """The submitted event of a fired job and the cancel a schedule's replace asked say so."""
    from ops.cli.job_view import event_text
    from ops.client.results import JobEvent

    blank = dict.fromkeys(attrs.fields_dict(JobEvent), None)
    fired = JobEvent(
        **{**blank, "kind": "submitted", "detail": "fired by schedule tick's slot 2026-12-05T22:00:00Z"}
    )
    assert event_text(fired) == "fired by schedule tick's slot 2026-12-05T22:00:00Z"
    cancel = JobEvent(
        **{
            **blank,
            "kind": "cancel_requested",
            "detail": "replaced by schedule tick's slot 2026-12-05T22:00:02Z",
        }
    )
    assert event_text(cancel) == "a cancel was asked: replaced by schedule tick's slot 2026-12-05T22:00:02Z"
    assert event_text(JobEvent(**{**blank, "kind": "cancel_requested"})) == "a cancel was asked"


def test_the_view_shows_the_device_units_the_run_holds() -> None:
    """A running job's latest run holding GPUs 0 and 3 shows ``gpu 0,3``; once that run ended
    they are named as freed; a job whose run holds none shows no devices row."""
    from ops.cli.job_view import devices_text

    info = pb.JobInfo(
        job_id=9,
        spec=job_spec_to_pb(SPEC),
        state="running",
        assignment_id=22,
        attempt_history=[
            pb.Attempt(assignment_id=21, state="finished", units=[pb.ResourceUnits(name="gpu", units=["1"])]),
            pb.Attempt(
                assignment_id=22,
                state="active",
                units=[
                    pb.ResourceUnits(name="gpu", units=["0", "3"]),
                    pb.ResourceUnits(name="nic", units=["a"]),
                ],
            ),
        ],
    )
    assert devices_text(job_from_pb(info)) == "gpu 0,3; nic a"
    info.attempt_history[1].state = "finished"
    assert devices_text(job_from_pb(info)) == "gpu 0,3; nic a (freed: its run ended)"
    assert devices_text(job_from_pb(RETRYING)) == ""


def test_a_gang_tasks_json_keeps_its_tasks_and_spread() -> None:
    """``stockade job ID --json`` of a gang's task holds ``tasks`` and ``spread`` (the control
    plane gives them in the spec), so it is submitted again as the same gang."""
    from ops.cli.render import job_json
    from ops.jobfields import spec_of_table

    gang = attrs.evolve(SPEC, max_attempts=1, tasks=4, spread=True)
    info = pb.JobInfo(job_id=120, spec=job_spec_to_pb(gang), state="running")
    shown = json.loads(json.dumps(job_json(job_from_pb(info))))
    assert (shown["tasks"], shown["spread"]) == (4, True)
    assert spec_of_table(shown) == gang


def test_a_gang_tasks_attempts_are_its_gangs() -> None:
    """A gang task's attempts row counts the gang's spent attempts (the gang spends them as a
    whole), not the task's own."""
    info = job_from_pb(read_at(1_700_000_004.0))
    gang = JobGang(gang_id=8, rank=1, size=3, spread=False, state="failed", attempts=2, failures=2, detail="")
    rows = dict(lifecycle_rows(attrs.evolve(info, gang=gang)))
    assert rows["attempts"].startswith("2 of 3 spent by the gang, ")
    assert rows["gang"].startswith("task 1 of gang 8 (3 tasks): failed, placed 2 times, 2 attempts spent")
    once = attrs.evolve(gang, state="live", attempts=1, failures=1)
    assert dict(lifecycle_rows(attrs.evolve(info, gang=once)))["gang"].startswith(
        "task 1 of gang 8 (3 tasks): live, placed 1 time, 1 attempt spent"
    )

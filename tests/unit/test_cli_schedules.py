"""``stockade schedule``: add sends the schedule with the job built from submit's options, list
prints each schedule's slots in its zone and UTC, pause/resume/remove name it, and bad input is
refused before sending."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app
from ops.config import INSECURE_ENV
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import FailedPrecondition

JOB = pb.JobSpec(
    name="backup.sh", cpu_millis=500, memory_mb=256, command=pb.CommandRuntime(argv=["backup.sh"])
)
NIGHTLY = pb.ScheduleInfo(
    id=1,
    spec=pb.ScheduleSpec(
        name="nightly",
        cron="30 2 * * *",
        tz="Europe/Berlin",
        job=JOB,
        concurrency_policy="allow",
        starting_deadline_s=60,
    ),
    owner="alice",
    last_slot_at_ms=1_774_747_800_000,  # 2026-03-29 01:30 UTC... the spring day's 03:00 CEST
    next_slot_at_ms=1_774_834_200_000,
    fired=3,
    skipped=1,
)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The control plane answers every schedule call with nightly; the calls made are recorded."""
    made: list[tuple[str, Any]] = []

    async def replica(self: ControlPlaneClient, index: int, name: str, request: Any, **_: object) -> Any:
        made.append((name, request))
        return pb.ListSchedulesReply(schedules=[NIGHTLY]) if name == "list_schedules" else NIGHTLY

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")
    monkeypatch.setenv("COLUMNS", "160")
    return made


def run(*args: str) -> Any:
    return CliRunner().invoke(app, [*args, "--control-planes", "127.0.0.1:1"])


def test_add_sends_the_schedule_and_the_job_of_submits_options(calls: list[tuple[str, Any]]) -> None:
    """NAME, --cron, --tz, --concurrency-policy and the job options after them become one
    AddSchedule with an idempotency key."""
    result = CliRunner().invoke(
        app,
        [
            "schedule",
            "add",
            "nightly",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--concurrency-policy",
            "forbid",
            "--cpu-millis",
            "500",
            "--memory-mb",
            "256",
            "--max-attempts",
            "2",
            "--control-planes",
            "127.0.0.1:1",
            "--",
            "backup.sh",
            "--all",
        ],
    )
    assert result.exit_code == 0, result.output
    ((rpc, request),) = calls
    assert rpc == "add_schedule" and request.idempotency_key
    spec = request.spec
    assert (spec.name, spec.cron, spec.tz, spec.concurrency_policy) == (
        "nightly",
        "30 2 * * *",
        "Europe/Berlin",
        "forbid",
    )
    assert list(spec.job.command.argv) == ["backup.sh", "--all"] and spec.job.max_attempts == 2


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--cron", "0 0 30 2 *"], "cron must name a time within 5 years"),
        (["--cron", "@daily", "--tz", "Mars/Olympus"], "tz must be an IANA time zone"),
        (["--cron", "@daily", "--after", "3"], "has no option --after"),
    ],
)
def test_bad_input_is_refused_before_sending(
    calls: list[tuple[str, Any]], args: list[str], words: str
) -> None:
    """A cron that never fires, an unknown zone, or a submit option schedules do not take: exit
    EXIT_INVALID (or a usage error), nothing sent."""
    result = run("schedule", "add", "x", *args, "--sleep-s", "1", "--cpu-millis", "100", "--memory-mb", "64")
    assert result.exit_code in (EXIT_INVALID, 2)
    assert words in result.output
    assert calls == []


def test_list_shows_slots_in_the_zone_and_utc(calls: list[tuple[str, Any]]) -> None:
    """The table has the name, cron, zone, policy, last and next slot (local and UTC), fired and
    skipped; --json the same keys."""
    result = run("schedule", "list")
    assert result.exit_code == 0, result.output
    assert "nightly" in result.output and "CEST" in result.output and "UTC" in result.output
    data = json.loads(run("schedule", "list", "--json").output)
    assert data[0]["name"] == "nightly" and (data[0]["fired"], data[0]["skipped"]) == (3, 1)


@pytest.mark.parametrize("verb", ["pause", "resume", "remove"])
def test_pause_resume_remove_name_the_schedule(calls: list[tuple[str, Any]], verb: str) -> None:
    """Each sends its RPC with the name and an idempotency key."""
    result = run("schedule", verb, "nightly")
    assert result.exit_code == 0, result.output
    ((rpc, request),) = calls
    assert rpc == f"{verb}_schedule" and request.name == "nightly" and request.idempotency_key


def test_run_adds_the_schedules_of_a_job_file_read_from_standard_input(calls: list[tuple[str, Any]]) -> None:
    """`stockade run -` reads the file once: its schedule is added (no job submitted), its
    name printed."""
    text = (
        "schedules:\n  - name: weekly\n    cron: '30 2 * * *'\n    tz: Europe/Berlin\n"
        "    job: {cpu_millis: 500, memory_mb: 256, command: [backup.sh]}\n"
    )
    result = CliRunner().invoke(app, ["run", "-", "--control-planes", "127.0.0.1:1"], input=text)
    assert result.exit_code == 0, result.output
    assert [rpc for rpc, _ in calls] == ["list_schedules", "add_schedule"]
    request = calls[1][1]
    assert request.spec.name == "weekly" and request.spec.tz == "Europe/Berlin"
    assert "schedule weekly" in result.output


FILE = """\
[[job]]
name = "once"
cpu_millis = 100
memory_mb = 64
sleep_s = 1

[[job]]
name = "twice"
cpu_millis = 100
memory_mb = 64
sleep_s = 1

[[schedules]]
name = "tick1"
cron = "*/2 * * * * *"
job = {cpu_millis = 100, memory_mb = 64, sleep_s = 0.5}

[[schedules]]
name = "tick2"
cron = "*/2 * * * * *"
job = {cpu_millis = 100, memory_mb = 64, sleep_s = 0.5}

[[schedules]]
name = "tick3"
cron = "*/2 * * * * *"
job = {cpu_millis = 100, memory_mb = 64, sleep_s = 0.5}
"""


def cluster(
    monkeypatch: pytest.MonkeyPatch, *, existing: tuple[str, ...] = (), refuses: str | None = None
) -> list[tuple[str, Any]]:
    """A control plane whose schedules are ``existing`` and that refuses to add ``refuses`` (as
    one added by another run meanwhile); the calls made are recorded."""
    made: list[tuple[str, Any]] = []

    async def replica(self: ControlPlaneClient, index: int, name: str, request: Any, **_: object) -> Any:
        made.append((name, request))
        if name == "list_schedules":
            return pb.ListSchedulesReply(
                schedules=[pb.ScheduleInfo(id=1, spec=pb.ScheduleSpec(name=n, job=JOB)) for n in existing]
            )
        if name == "submit_jobs":
            return pb.SubmitJobsReply(job_ids=[12, 13])
        if name == "add_schedule" and request.spec.name == refuses:
            raise FailedPrecondition(f"schedule {refuses!r} exists: nothing was stored; remove it first")
        return NIGHTLY

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")
    monkeypatch.setenv("COLUMNS", "400")
    return made


def run_file(tmp_path: Path, *extra: str) -> Any:
    path = tmp_path / "jobs.toml"
    path.write_text(FILE)
    return CliRunner().invoke(app, ["run", str(path), "--control-planes", "127.0.0.1:1", *extra])


def test_run_refuses_the_whole_file_when_a_schedule_exists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A schedule of the file's names in the cluster: nothing is submitted or added."""
    made = cluster(monkeypatch, existing=("tick2",))
    result = run_file(tmp_path)
    assert result.exit_code != 0
    assert "schedule 'tick2' exists: nothing was stored" in result.output
    assert [rpc for rpc, _ in made] == ["list_schedules"]


def test_run_says_what_was_stored_when_a_later_schedule_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A schedule refused after the jobs and an earlier schedule were stored (a race): their
    ids and names are printed, and the error names what was stored and what was not."""
    made = cluster(monkeypatch, refuses="tick2")
    result = run_file(tmp_path)
    assert result.exit_code != 0
    assert [rpc for rpc, _ in made] == ["list_schedules", "submit_jobs", "add_schedule", "add_schedule"]
    assert result.stdout.split("\n")[:3] == ["12", "13", "schedule tick1"]
    words = " ".join(result.stderr.split())
    assert "before schedule 'tick2' failed, jobs 12, 13 and schedule 'tick1' were stored" in words
    assert "not stored: 'tick2', 'tick3'" in words


def test_run_under_a_given_key_finds_its_own_schedules(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Run again under its key, a file is not refused for the schedules its first run added:
    the cluster answers each call under its key once."""
    made = cluster(monkeypatch, existing=("tick1", "tick2", "tick3"))
    result = run_file(tmp_path, "--idempotency-key", "k1")
    assert result.exit_code == 0, result.output
    assert [rpc for rpc, _ in made] == ["submit_jobs", "add_schedule", "add_schedule", "add_schedule"]
    assert [r.idempotency_key for _, r in made] == [
        "k1",
        "k1/schedules/1",
        "k1/schedules/2",
        "k1/schedules/3",
    ]


def test_a_schedule_without_an_answer_may_or_may_not_be_stored(tmp_path: Path) -> None:
    """When no control plane answered for a schedule, the words say it may be stored, name the
    later ones not stored, and the command's key to run the file again with."""
    from ops.cli.job_files import _partly_stored
    from ops.jobfile import read_schedules
    from runtime.errors import Unavailable

    file = tmp_path / "jobs.toml"
    file.write_text(FILE)
    schedules = read_schedules(file)
    words = _partly_stored("k1", [12], [], schedules, Unavailable("no answer"))
    assert words.startswith("This file is partly stored: before schedule 'tick1' failed, job 12 was stored")
    assert "schedule 'tick1' may or may not be stored; not stored: 'tick2', 'tick3'" in words
    assert "--idempotency-key k1" in words

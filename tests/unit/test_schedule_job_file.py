"""A job file's ``schedules`` list (ops/jobfile.py, read_schedules): checked as the control plane
checks a schedule, errors naming the file, the line and the field; a file may hold schedules only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.jobfile import read_job_file, read_schedules
from ops.jobfile_syntax import JobFileError

TOML = """\
[[job]]
name = "once"
cpu_millis = 100
memory_mb = 64
sleep_s = 1

[[schedules]]
name = "nightly"
cron = "30 2 * * *"
tz = "Europe/Berlin"
concurrency_policy = "forbid"

[schedules.job]
cpu_millis = 500
memory_mb = 256
command = ["backup.sh", "--all"]
"""


def test_a_toml_file_holds_jobs_and_schedules(tmp_path: Path) -> None:
    """The job is read as before; the schedule with its fields and its job."""
    path = tmp_path / "jobs.toml"
    path.write_text(TOML)
    assert [s.name for s in read_job_file(path)] == ["once"]
    (schedule,) = read_schedules(path)
    assert (schedule.name, schedule.cron, schedule.tz) == ("nightly", "30 2 * * *", "Europe/Berlin")
    assert (schedule.concurrency_policy, schedule.starting_deadline_s) == ("forbid", 60)
    assert schedule.job.cpu_millis == 500


def test_a_file_of_schedules_only_has_no_jobs(tmp_path: Path) -> None:
    """A YAML file with a schedules list alone: no job, one schedule."""
    path = tmp_path / "s.yaml"
    path.write_text(
        "schedules:\n  - name: tick\n    cron: '*/2 * * * * *'\n"
        "    job: {cpu_millis: 100, memory_mb: 64, sleep_s: 0.5}\n"
    )
    assert read_job_file(path) == []
    assert [s.cron for s in read_schedules(path)] == ["*/2 * * * * *"]


@pytest.mark.parametrize(
    ("replace", "by", "line", "words"),
    [
        ('cron = "30 2 * * *"', 'cron = "0 0 30 2 *"', 9, "cron must name a time within 5 years"),
        ('tz = "Europe/Berlin"', 'tz = "Europe/Nowhere"', 10, "tz must be an IANA time zone"),
        ("memory_mb = 256", "memory_mb = 0", 15, "memory_mb must be between"),
        (
            'concurrency_policy = "forbid"',
            'concurrency_policy = "queue"',
            11,
            "concurrency_policy must be one of",
        ),
    ],
)
def test_a_bad_schedule_is_refused_naming_file_line_and_field(
    tmp_path: Path, replace: str, by: str, line: int, words: str
) -> None:
    """Each error starts with jobs.toml:LINE and names the field and the rule."""
    path = tmp_path / "jobs.toml"
    path.write_text(TOML.replace(replace, by))
    with pytest.raises(JobFileError) as refused:
        read_schedules(path)
    assert str(refused.value).startswith(f"{path}:{line}: ")
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("line", "field"), [("after = [1]", "after"), ("tasks = 2", "tasks"), ("spread = true", "spread")]
)
def test_a_schedules_job_may_not_wait_for_others_or_be_a_gang(tmp_path: Path, line: str, field: str) -> None:
    """job.after, job.tasks and job.spread are refused at reading (so `stockade run --check`
    refuses them too): a schedule's job waits for no other job and is no gang."""
    path = tmp_path / "jobs.toml"
    path.write_text(TOML + line + "\n")
    with pytest.raises(JobFileError, match=rf"job.{field} must be empty for a schedule's job"):
        read_schedules(path)


def test_an_unknown_schedule_field_lists_a_schedules_fields(tmp_path: Path) -> None:
    """An unknown field of a [[schedules]] table is placed at its line and the message lists a
    schedule's fields, not a job's."""
    path = tmp_path / "jobs.toml"
    path.write_text(TOML.replace('tz = "Europe/Berlin"', 'timezone = "Europe/Berlin"'))
    with pytest.raises(JobFileError) as refused:
        read_schedules(path)
    words = str(refused.value)
    assert words.startswith(f"{path}:10: unknown field 'timezone'")
    assert "a schedule's fields: name, cron, tz, concurrency_policy, starting_deadline_s, job" in words
    assert "cpu_millis" not in words


def test_an_unknown_field_of_a_schedules_job_is_placed_at_its_own_line(tmp_path: Path) -> None:
    """An unknown field inside [schedules.job] names the field's line, not the header's."""
    path = tmp_path / "jobs.toml"
    path.write_text(TOML.replace("memory_mb = 256", "memory_mb = 256\nmax_attempt = 3"))
    with pytest.raises(JobFileError) as refused:
        read_schedules(path)
    assert str(refused.value).startswith(f"{path}:16: unknown field 'max_attempt'")
    assert "did you mean 'max_attempts'?" in str(refused.value)


def test_an_empty_schedules_list_is_called_empty(tmp_path: Path) -> None:
    """``schedules = []`` is refused as an empty list, not as something other than a list."""
    path = tmp_path / "jobs.toml"
    path.write_text("schedules = []\n" + TOML.split("[[schedules]]")[0])
    with pytest.raises(JobFileError, match=r"'schedules' is an empty list") as refused:
        read_schedules(path)
    assert "must be a list" not in str(refused.value)


def test_a_schedule_named_twice_is_refused_at_its_second_name(tmp_path: Path) -> None:
    """Two schedules of one name in one file: refused at reading, at the second's name line."""
    path = tmp_path / "jobs.toml"
    second = TOML.split("\n\n", 1)[1]
    path.write_text(TOML + "\n" + second)
    with pytest.raises(JobFileError) as refused:
        read_schedules(path)
    assert str(refused.value).startswith(f"{path}:19: name: schedule 'nightly' is named twice")
    assert refused.value.field == "name"


def test_yaml_schedules_named_twice_are_refused(tmp_path: Path) -> None:
    """The same rule in YAML, at the second schedule's name line."""
    path = tmp_path / "s.yaml"
    one = (
        "  - name: tick\n    cron: '*/2 * * * * *'\n    job: {cpu_millis: 100, memory_mb: 64, sleep_s: 0.5}\n"
    )
    path.write_text("schedules:\n" + one + one)
    with pytest.raises(JobFileError, match=r"s\.yaml:5: name: schedule 'tick' is named twice"):
        read_schedules(path)

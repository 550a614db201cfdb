"""`stockade submit`'s lifecycle options: each sent as the spec's field, and each bad value
refused before anything is sent (exit 2, one line naming the option, the value and the limit)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from ops.cli import app
from ops.cli import jobs as cli_jobs
from protocol import pb
from runtime.constraints import Constraint
from runtime.jobs import ArrayRange, JobSpec
from runtime.wire_jobs import job_spec_from_pb, job_spec_to_pb

NOWHERE = "127.0.0.1:1"
BASE = ["submit", "--cpu-millis", "100", "--memory-mb", "64", "--control-planes", NOWHERE]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[pb.JobSpec]:
    """The specs `submit` sends, answered with job id 5 (no cluster is called)."""
    specs: list[pb.JobSpec] = []

    def fake_submit(addresses: list[str], sent: list[JobSpec], **_: Any) -> list[int]:
        specs.extend(job_spec_to_pb(spec) for spec in sent)
        return [5]

    monkeypatch.setattr(cli_jobs, "submit_specs", fake_submit)
    return specs


def test_every_lifecycle_option_reaches_the_spec(sent: list[pb.JobSpec]) -> None:
    """Each option sets its field: repeated --constraint, --env (split at the first =) and
    --after (also comma-separated) accumulate."""
    result = CliRunner().invoke(
        app,
        [
            *BASE,
            "--max-attempts", "3",
            "--retry-backoff-s", "2.5",
            "--count-lost",
            "--timeout-s", "60",
            "--constraint", "gpu=a100",
            "--constraint", "zone in (a,b)",
            "--env", "B=x=y",
            "--env", "A=",
            "--workdir", "/srv/data",
            "--after", "3,4",
            "--after", "9",
            "--array", "1-100%10",
            "--", "echo", "hi",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output == "5\n"
    spec = job_spec_from_pb(sent[0])
    assert (spec.max_attempts, spec.retry_backoff_s, spec.count_lost, spec.timeout_s) == (3, 2.5, True, 60.0)
    assert spec.constraints == (
        Constraint(key="gpu", op="=", values=("a100",)),
        Constraint(key="zone", op="in", values=("a", "b")),
    )
    assert spec.env == (("A", ""), ("B", "x=y"))
    assert (spec.workdir, spec.after) == ("/srv/data", (3, 4, 9))
    assert spec.array == ArrayRange(first_index=1, last_index=100, max_running=10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-attempts", "0"], "--max-attempts must be between 1 and 100, got 0"),
        (["--max-attempts", "1000000000"], "--max-attempts must be between 1 and 100, got 1000000000"),
        (["--max-attempts", "three"], "--max-attempts must be a whole number, got 'three'"),
        (
            ["--retry-backoff-s", "-1"],
            "--retry-backoff-s must be at least 0 and at most 600 seconds, got -1.0",
        ),
        (["--retry-backoff-s", "nan"], "--retry-backoff-s must be a finite number of seconds, got nan"),
        (["--retry-backoff-s", "soon"], "--retry-backoff-s must be a number of seconds, got 'soon'"),
        (["--timeout-s", "0"], "--timeout-s must be at least 0.001 and at most 604800 seconds, got 0.0"),
        (
            ["--timeout-s", "604801"],
            "--timeout-s must be at least 0.001 and at most 604800 seconds, got 604801.0",
        ),
        (["--constraint", "=a100"], "--constraint must be key=value, key!=value, key"),
        (["--constraint", "gpu\x00=a"], "--constraint must not contain NUL bytes"),
        (
            ["--constraint", "gpu ~ a100"],
            "--constraint must be key=value, key!=value, key (the label exists)",
        ),
        (["--constraint", "gpu<a100"], "got 'gpu<a100'"),
        (["--array", "1-10000000"], "--array must have at most 10000 tasks (has 10000000), got '1-10000000'"),
        (["--array", "5-1"], "--array must end at or after its first index"),
        (["--array", "x"], "--array must be FIRST-LAST[%MAX_RUNNING] or INDEX (e.g. 1-100%10), got 'x'"),
        (["--env", "=1"], "--env name must not be empty, got ''"),
        (["--env", "A\x00B=1"], "--env name must not contain NUL bytes"),
        (["--env", "NOEQUALS"], "--env must be NAME=VALUE, got 'NOEQUALS'"),
        (
            ["--env", "A B=x"],
            "--env name must be a letter or _ then letters, digits or _ ([A-Za-z_][A-Za-z0-9_]*), got 'A B'",
        ),
        (["--env", "9LIVES=x"], "--env name must be a letter or _ then letters, digits or _"),
        (["--env", "STOCKADE_X=1"], "--env name must not start with STOCKADE_"),
        (["--env", "A=1", "--env", "A=2"], "--env name must be given once, got 'A'"),
        (["--workdir", "data"], "--workdir must be an absolute path (start with /), got 'data'"),
        (["--after", "0"], "--after[0] must be between 1 and"),
        (["--after", "3,x"], "--after must be job ids separated by commas (e.g. 12,15), got '3,x'"),
        (["--after", "3", "--after", "3"], "--after must name each job once, got [3, 3]"),
    ],
)
def test_bad_lifecycle_values_are_refused_before_sending(
    sent: list[pb.JobSpec], args: list[str], message: str
) -> None:
    """A bad value exits 2 with one line naming the option, the value and the limit; nothing is
    sent."""
    result = CliRunner().invoke(app, [*BASE, *args, "--sleep-s", "1"])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert sent == []


def test_every_lifecycle_option_has_a_line_of_help() -> None:
    """`stockade submit --help` documents each option."""
    result = CliRunner().invoke(app, ["submit", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in (
        "--max-attempts",
        "--retry-backoff-s",
        "--count-lost",
        "--timeout-s",
        "--constraint",
        "--env",
        "--workdir",
        "--after",
        "--array",
    ):
        assert option in result.output, option

"""Job files (`stockade run FILE`): their shape, the spec's rules with the file's line, every
bad file refused whole before anything is sent, and `stockade job --json` read back as a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ops import jobfields, jobfile
from ops.cli import app
from ops.cli import job_files as cli_job_files
from ops.config import INSECURE_ENV
from ops.jobfile import MAX_JOB_FILE_BYTES, read_job_file
from ops.jobfile_syntax import JobFileError
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.constraints import parse_constraint
from runtime.jobs import ArrayRange, CommandRuntime, ContainerRuntime, JobSpec, SleepRuntime
from runtime.wire_jobs import job_spec_from_pb, job_spec_to_pb

NOWHERE = "127.0.0.1:1"
SLEEPER = "[[job]]\ncpu_millis = 1\nmemory_mb = 1\nsleep_s = 1\n"
"""A small job of a TOML file of several (4 lines)."""

EVERY_FIELD = JobSpec(
    name="train",
    cpu_millis=500,
    memory_mb=256,
    priority=7,
    runtime=CommandRuntime(argv=("python3", "-c", "print(1)")),
    max_attempts=3,
    retry_backoff_s=2.5,
    count_lost=True,
    timeout_s=3600.0,
    constraints=(parse_constraint("gpu=a100"), parse_constraint("zone in (a,b)"), parse_constraint("ssd")),
    env={"MODE": "fast", "EMPTY": ""},
    workdir="/srv/data",
    after=(12, 15),
    array=ArrayRange(first_index=1, last_index=100, max_running=10),
)

TOML_EVERY_FIELD = """\
name = "train"
cpu_millis = 500
memory_mb = 256
priority = 7
command = ["python3", "-c", "print(1)"]
max_attempts = 3
retry_backoff_s = 2.5
count_lost = true
timeout_s = 3600
constraints = ["gpu=a100", "zone in (a,b)", "ssd"]
workdir = "/srv/data"
after = [12, 15]
array = "1-100%10"

[env]
MODE = "fast"
EMPTY = ""
"""

YAML_EVERY_FIELD = """\
name: train
cpu_millis: 500
memory_mb: 256
priority: 7
command: [python3, -c, "print(1)"]
max_attempts: 3
retry_backoff_s: 2.5
count_lost: true
timeout_s: 3.6e3
constraints:
  - gpu=a100
  - zone in (a,b)
  - ssd
env:
  MODE: fast
  EMPTY: ""
workdir: /srv/data
after: [12, 15]
array: 1-100%10
"""


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test works in its own folder, so files are named as a user names them."""
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    """A file ``name`` in the working folder holding ``text``, as a relative path."""
    (tmp_path / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return Path(name)


def refused(path: Path) -> str:
    with pytest.raises(JobFileError) as caught:
        read_job_file(path)
    return str(caught.value)


@pytest.mark.parametrize(("name", "text"), [("job.toml", TOML_EVERY_FIELD), ("job.yaml", YAML_EVERY_FIELD)])
def test_a_file_with_every_field_gives_the_spec(tmp_path: Path, name: str, text: str) -> None:
    """One job at the top level, every field set, TOML or YAML: the spec the options give."""
    assert read_job_file(write(tmp_path, name, text)) == [EVERY_FIELD]


def test_several_jobs_in_toml_job_tables(tmp_path: Path) -> None:
    """`[[job]]` tables are the jobs in order; defaults as submit's (the name from the runtime)."""
    path = write(
        tmp_path,
        "jobs.toml",
        "[[job]]\ncpu_millis = 100\nmemory_mb = 64\nsleep_s = 1.5\n\n"
        '[[job]]\ncpu_millis = 10\nmemory_mb = 6\nimage = "reg.example/app:1"\n',
    )
    nap, app_job = read_job_file(path)
    assert (nap.name, nap.runtime) == ("sleep", SleepRuntime(duration_ms=1500))
    assert (app_job.name, app_job.runtime) == ("app", ContainerRuntime(image="reg.example/app:1"))


@pytest.mark.parametrize(
    "text",
    [
        "- {cpu_millis: 1, memory_mb: 1, command: [a]}\n- {cpu_millis: 2, memory_mb: 1, command: [b]}\n",
        "job:\n"
        "  - {cpu_millis: 1, memory_mb: 1, command: [a]}\n"
        "  - {cpu_millis: 2, memory_mb: 1, command: [b]}\n",
    ],
)
def test_several_jobs_in_yaml_as_a_list(tmp_path: Path, text: str) -> None:
    """A YAML list at the top level or under `job:` holds the jobs in order."""
    assert [s.cpu_millis for s in read_job_file(write(tmp_path, "jobs.yaml", text))] == [1, 2]


TOML_BAD = [
    ("max_attempts = 0", "max_attempts must be between 1 and 100, got 0"),
    ("max_attempts = 1_000_000_000", "max_attempts must be between 1 and 100, got 1000000000"),
    ("max_attempts = 2.0", "max_attempts must be a whole number, got 2.0"),
    ("retry_backoff_s = -1", "retry_backoff_s must be at least 0 and at most 600 seconds, got -1.0"),
    ("retry_backoff_s = nan", "retry_backoff_s must be a finite number of seconds, got nan"),
    ("timeout_s = 0", "timeout_s must be at least 0.001 and at most 604800 seconds, got 0.0"),
    ("timeout_s = 604801", "timeout_s must be at least 0.001 and at most 604800 seconds, got 604801.0"),
    ('constraints = ["=a100"]', "constraints[0] must be key=value"),
    ('constraints = ["gpu\\u0000=a"]', "constraints[0] must not contain NUL bytes"),
    ('constraints = ["gpu ~ a100"]', "constraints[0] must be key=value, key!=value, key (the label exists)"),
    ('array = "1-10000000"', "array must have at most 10000 tasks (has 10000000), got '1-10000000'"),
    ('array = "5-1"', "array must end at or after its first index"),
    ('env = { "A=B" = "1" }', "env name must not contain '=' (write NAME=VALUE), got 'A=B'"),
    ('env = { "A\\u0000B" = "1" }', "env name must not contain NUL bytes"),
    ("env = { A = 1 }", "env[A] must be text (in quotes), got 1"),
    ('workdir = "data"', "workdir must be an absolute path (start with /), got 'data'"),
    ("after = [0]", "after[0] must be between 1 and"),
    ('priority = "high"', "priority must be a whole number, got 'high'"),
    ("count_lost = 1", "count_lost must be true or false, got 1"),
    ('image = "app"\nsleep_s = 1', "runtime must be one of sleep_s, command, or image"),
]


@pytest.mark.parametrize(("line", "message"), TOML_BAD)
def test_a_bad_toml_field_is_refused_with_its_line(tmp_path: Path, line: str, message: str) -> None:
    """Each bad value: the file, the line of the field, and the spec's message."""
    text = f'# a job\ncpu_millis = 100\nmemory_mb = 64\ncommand = ["true"]\n{line}\n'
    if "sleep_s" in line:
        text = text.replace('command = ["true"]\n', "")
    got = refused(write(tmp_path, "jobs.toml", text))
    number = text.splitlines().index(line.splitlines()[0]) + 1
    assert got.startswith(f"jobs.toml:{number}: "), got
    assert message in got


def test_a_bad_field_of_the_second_toml_job_names_its_line(tmp_path: Path) -> None:
    """The line is the field's own in the job it belongs to."""
    text = (
        "[[job]]\ncpu_millis = 1\nmemory_mb = 1\nsleep_s = 1\nmax_attempts = 2\n\n"
        "[[job]]\ncpu_millis = 1\nmemory_mb = 1\nsleep_s = 1\nmax_attempts = 0\n"
    )
    assert refused(write(tmp_path, "jobs.toml", text)) == (
        "jobs.toml:11: max_attempts must be between 1 and 100, got 0"
    )


@pytest.mark.parametrize(
    ("lines", "where", "message"),
    [
        (["max_attempts: 0"], 5, "max_attempts must be between 1 and 100, got 0"),
        (["retry_backoff_s: .nan"], 5, "retry_backoff_s must be a finite number of seconds, got nan"),
        (["constraints:", "  - gpu=a100", "  - 'bad key'"], 7, "constraints[1] must be key=value"),
        (["env:", "  OK: '1'", "  A=B: '1'"], 7, "env name must not contain '='"),
        (["env:", "  THREADS: 4"], 6, "env[THREADS] must be text (in quotes), got 4"),
        (["array: 5-1"], 5, "array must end at or after its first index"),
    ],
)
def test_a_bad_yaml_field_is_refused_with_its_line(
    tmp_path: Path, lines: list[str], where: int, message: str
) -> None:
    """YAML: the line of the key, or of the list item, at fault."""
    text = "\n".join(["# a job", "cpu_millis: 100", "memory_mb: 64", "command: [echo]", *lines]) + "\n"
    got = refused(write(tmp_path, "job.yaml", text))
    assert got.startswith(f"job.yaml:{where}: "), got
    assert message in got


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("job.toml", "cpu_millis = 1\nmemory_mb = 1\nsleep_s = 1\nmax_attempt = 3\n", 4),
        ("job.yaml", "cpu_millis: 1\nmemory_mb: 1\nsleep_s: 1\nmax_attempt: 3\n", 4),
    ],
)
def test_an_unknown_field_is_named_with_a_suggestion(
    tmp_path: Path, name: str, text: str, where: int
) -> None:
    """An unknown field is refused, named, with the nearest known field."""
    assert refused(write(tmp_path, name, text)).startswith(
        f"{name}:{where}: unknown field 'max_attempt' (did you mean 'max_attempts'?); a job's fields: name,"
    )


def test_every_unknown_field_is_named(tmp_path: Path) -> None:
    """Several unknown fields: all of them, at the first one's line."""
    got = refused(
        write(tmp_path, "job.toml", "cpu_millis = 1\nmemory_mb = 1\nsleep_s = 1\nfoo = 1\nbar = 2\n")
    )
    assert got.startswith("job.toml:4: unknown fields 'foo', 'bar';")


def test_a_file_that_is_not_utf8_is_refused_with_the_byte(tmp_path: Path) -> None:
    """Latin-1 text: the line and the byte that is not UTF-8."""
    got = refused(write(tmp_path, "job.toml", b'cpu_millis = 1\nname = "caf\xe9"\n'))
    assert got == "job.toml:2: a job file must be UTF-8 text; byte 26 (0xe9) is not UTF-8"


def test_a_50_mb_file_is_refused_by_its_size_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 50 MB file (sparse here) is refused from its size; its content is never parsed."""
    path = Path("big.toml")
    with path.open("wb") as file:
        file.truncate(50 * 1000 * 1000)
    monkeypatch.setattr(jobfile, "_decode", lambda *a: pytest.fail("decoded"))
    assert refused(path) == (
        f"big.toml: a job file must be at most {MAX_JOB_FILE_BYTES} bytes (1 MiB), this one has "
        "50,000,000 bytes (47.7 MiB)"
    )


def test_a_file_just_over_the_limit_says_its_size_in_bytes(tmp_path: Path) -> None:
    """Just over 1 MiB, the size is told in bytes: '1.0 MiB' would not say why it is refused."""
    path = Path("over.toml")
    path.write_bytes(b"#" * (MAX_JOB_FILE_BYTES + 62))
    assert refused(path).endswith(f"this one has {MAX_JOB_FILE_BYTES + 62:,} bytes")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.toml", "a = " + "[" * 10_000 + "]" * 10_000 + "\n"),
        ("deep.yaml", "a: " + "[" * 10_000 + "]" * 10_000 + "\n"),
        ("deep.json", '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}\n"),
        ("deep.yaml", "- " * 10_000 + "x\n"),
    ],
)
def test_a_file_nesting_10000_levels_is_refused_without_a_traceback(
    tmp_path: Path, name: str, text: str
) -> None:
    """10,000 levels of lists or tables: refused as too deep, no RecursionError."""
    assert "a job file must nest at most 16 levels deep" in refused(write(tmp_path, name, text))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.yaml", "x: &a [1]\ncpu_millis: *a\n", "a.yaml:2: a job file must not use aliases"),
        ("a.yaml", "cpu_millis: 1\ncpu_millis: 2\n", "a.yaml:2: not YAML: field 'cpu_millis' is given twice"),
        ("a.yaml", "cpu_millis: 1\n---\ncpu_millis: 2\n", "a.yaml:2: a job file must hold one YAML document"),
        ("a.yaml", "cpu_millis: [1\n", "a.yaml:2: not YAML"),
        ("a.yaml", "", "a.yaml: a job file must hold at least one job"),
        ("a.yaml", "cpu_millis: !!python/object:os.system x\n", "a.yaml:1: not YAML"),
        ("a.toml", "cpu_millis = \n", "a.toml:1: not TOML: Invalid value"),
        ("a.toml", "[[job]]\n[[job]]\n", "a.toml:1: cpu_millis must be given, got None"),
        ("a.txt", "cpu_millis = 1\n", "a.txt: a job file must end in .toml, .yaml, .yml, .json"),
        ("a.toml", "memory_mb = 1\nsleep_s = 1\n", "a.toml:1: cpu_millis must be given, got None"),
    ],
)
def test_malformed_files_are_refused(tmp_path: Path, name: str, text: str, message: str) -> None:
    """Aliases, repeated keys, several documents, syntax errors, unsafe tags, no job, no format."""
    got = refused(write(tmp_path, name, text))
    assert got.replace(str(tmp_path) + "/", "").startswith(message), got


def test_an_array_job_may_share_its_file(tmp_path: Path) -> None:
    """An array and other jobs of one file are read together (one SubmitJobs stores them)."""
    specs = read_job_file(write(tmp_path, "a.toml", SLEEPER + SLEEPER + 'array = "1-3"\n'))
    assert [s.array for s in specs] == [None, ArrayRange(first_index=1, last_index=3)]


def test_the_fields_of_a_spec_read_back_as_the_same_spec() -> None:
    """fields_of then spec_of: the same spec, for every runtime."""
    for runtime in (SleepRuntime(duration_ms=1234), ContainerRuntime(image="app:1"), EVERY_FIELD.runtime):
        spec = JobSpec(**{**_as_dict(EVERY_FIELD), "runtime": runtime, "cpu_millis": 500})
        assert jobfields.spec_of({k: v for k, v in _typed(jobfields.fields_of(spec)).items()}) == spec


def _as_dict(spec: JobSpec) -> dict[str, Any]:
    import attrs

    return attrs.asdict(spec, recurse=False)


def _typed(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: jobfields._READERS[k](k, v) for k, v in fields.items() if v is not None}


# ---------------------------------------------------------------------------- the command


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[list[pb.JobSpec]]:
    """Each `submit_specs` call's specs, answered with ids from 40 (no cluster is called)."""
    made: list[list[pb.JobSpec]] = []

    def fake_submit(addresses: list[str], specs: list[JobSpec], **_: Any) -> list[int]:
        made.append([job_spec_to_pb(spec) for spec in specs])
        return list(range(40, 40 + len(specs)))

    monkeypatch.setattr(cli_job_files, "submit_specs", fake_submit)
    return made


def test_run_submits_every_job_of_a_file_in_one_call(tmp_path: Path, calls: list[list[pb.JobSpec]]) -> None:
    """Three jobs: one call with the three specs (all or none); their ids one a line."""
    text = "".join(f"[[job]]\ncpu_millis = {n}\nmemory_mb = 1\nsleep_s = 1\n" for n in (1, 2, 3))
    result = CliRunner().invoke(
        app, ["run", str(write(tmp_path, "j.toml", text)), "--control-planes", NOWHERE]
    )
    assert result.exit_code == 0, result.output
    assert result.output == "40\n41\n42\n"
    assert [[s.cpu_millis for s in call] for call in calls] == [[1, 2, 3]]


def test_run_refuses_a_bad_file_and_sends_nothing(tmp_path: Path, calls: list[list[pb.JobSpec]]) -> None:
    """A bad second job: exit 2, one line with the file and line, nothing sent."""
    text = SLEEPER + SLEEPER + "timeout_s = 0\n"
    path = write(tmp_path, "j.toml", text)
    result = CliRunner().invoke(app, ["run", str(path), "--control-planes", NOWHERE])
    assert result.exit_code == 2
    assert (
        result.output
        == f"error: {path}:9: timeout_s must be at least 0.001 and at most 604800 seconds, got 0.0\n"
    )
    assert calls == []


def test_a_refused_after_is_placed_at_its_line_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster refuses an `after` naming a job that does not exist (only it can tell): the
    error names the file and the line of the job's `after`, as the file's own errors do."""
    from runtime.aio.grpc_client import _RemoteInvalid

    def refusing_submit(addresses: list[str], specs: list[JobSpec], **_: Any) -> list[int]:
        raise _RemoteInvalid(
            "after must name jobs that exist (a job may wait only for jobs submitted before it), "
            "got [99999] (no job 99999; nothing was stored)"
        )

    monkeypatch.setattr(cli_job_files, "submit_specs", refusing_submit)
    path = write(tmp_path, "j.toml", SLEEPER + SLEEPER + "after = [99999]\n")
    result = CliRunner().invoke(app, ["run", str(path), "--control-planes", NOWHERE])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {path}:9: after must name jobs that exist")


def test_run_check_prints_the_jobs_and_sends_nothing(tmp_path: Path, calls: list[list[pb.JobSpec]]) -> None:
    """--check: the jobs as JSON job fields; no call."""
    result = CliRunner().invoke(app, ["run", "--check", str(write(tmp_path, "j.toml", TOML_EVERY_FIELD))])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [jobfields.fields_of(EVERY_FIELD)]
    assert calls == []


def test_job_json_runs_again_as_the_same_spec(
    tmp_path: Path, calls: list[list[pb.JobSpec]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stockade job ID --json` of a job with every field, then `stockade run` of that output:
    the spec sent is the one the job had (its status is ignored)."""
    info = pb.JobInfo(
        job_id=9,
        spec=job_spec_to_pb(EVERY_FIELD),
        state="failed",
        reason="timeout",
        attempts=2,
        failures=2,
        attempt_history=[
            pb.Attempt(
                assignment_id=3,
                worker_id="w-1",
                epoch=2,
                state="finished",
                end_reason="timeout",
                counted=True,
            )
        ],
    )

    async def replica(*args: object, **kwargs: object) -> pb.JobInfo:
        return info

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setenv(INSECURE_ENV, "1")  # the scripted replica needs no certificate
    exported = CliRunner().invoke(app, ["job", "9", "--json", "--control-planes", NOWHERE])
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.output)["status"]["attempt_history"][0]["end_reason"] == "timeout"
    path = write(tmp_path, "job9.json", exported.output)
    result = CliRunner().invoke(app, ["run", str(path), "--control-planes", NOWHERE])
    assert result.exit_code == 0, result.output
    ((sent,),) = calls
    assert job_spec_from_pb(sent) == EVERY_FIELD


def test_a_file_holds_a_gang_beside_an_array_and_a_job_after_the_gang(tmp_path: Path) -> None:
    """A gang (``tasks``, ``spread``) may sit in a file of several jobs; another job names it in
    ``after``, and the whole file is one batch (:func:`runtime.validation.check_jobs`)."""
    from runtime.validation import check_jobs, pipeline_order

    text = (
        '[[job]]\nname = "train"\ncpu_millis = 1\nmemory_mb = 1\nsleep_s = 1\ntasks = 4\nspread = true\n'
        '[[job]]\nname = "shards"\ncpu_millis = 1\nmemory_mb = 1\nsleep_s = 1\narray = "0-1"\n'
        '[[job]]\nname = "report"\ncpu_millis = 1\nmemory_mb = 1\nsleep_s = 1\nafter = ["train"]\n'
    )
    specs = read_job_file(write(tmp_path, "p.toml", text))
    assert [(s.tasks, s.spread) for s in specs] == [(4, True), (None, False), (None, False)]
    assert check_jobs(specs) == specs
    assert specs[2].after_names == ("train",) and pipeline_order(specs) == [0, 1, 2]

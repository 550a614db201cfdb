"""Job files: ``stockade run FILE`` reads one (:func:`read_job_file`, :func:`read_job_file_placed`).

A file holds one job (its fields, :data:`ops.jobfields.FIELDS`, at the top level) or several,
each a table in the list ``job`` (TOML ``[[job]]``; YAML ``job:`` with a list, or a list at the
top level); a ``status`` table (``stockade job ID --json``'s) is ignored. TOML, YAML or JSON;
every value goes through :meth:`runtime.jobs.JobSpec.check`, and an error names the file, line
and field (``jobs.toml:7: max_attempts must be between 1 and 100, got 0``). Jobs and arrays of
one file may name each other in ``after`` (a pipeline, :func:`runtime.validation.pipeline_order`:
``jobs.toml:9: after: cycle a -> b -> a``). A file is refused
whole, before anything is sent, when it is too large, not UTF-8, nested too deep, names an
unknown field, or holds too many jobs. A top-level ``schedules`` list adds periodic jobs
(docs/schedules.md), each a table of ``name``, ``cron``, ``tz``, ``concurrency_policy``,
``starting_deadline_s`` and ``job`` (a job's table, without ``after`` or ``array``), checked as
the control plane checks them (:func:`read_schedules`); a file may hold schedules only. Plain
Python (no typer, no rich).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.jobfields import FIELDS, STATUS_KEY, spec_of_table, unknown_fields_message
from ops.jobfile_syntax import (
    TOML_HEADER,
    TOML_KEY,
    JobFileError,
    Lines,
    Path_,
    toml_document,
    yaml_document,
)
from runtime.errors import InvalidArgument
from runtime.jobs import JobSpec
from runtime.validation import PipelineError, pipeline_order

MAX_JOB_FILE_BYTES = 1024 * 1024
"""Largest job file, in bytes (1 MiB: 10,000 jobs of 100 bytes each), refused before parsing."""
MAX_FILE_JOBS = 10_000
"""Most jobs of one file: one SubmitJobs call (``runtime.validation.MAX_BATCH_JOBS``), all or none."""
JOBS_KEY = "job"
"""The list of jobs in a file of several."""
FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "yaml"}
"""A file's format by its suffix (JSON is read as YAML, of which it is a subset)."""

SCHEDULES_KEY = "schedules"
"""The list of schedules in a file."""
SCHEDULE_FIELDS = ("name", "cron", "tz", "concurrency_policy", "starting_deadline_s", "job")
"""The fields of a schedule's table (``job``: the job each slot fires)."""
MAX_FILE_SCHEDULES = 100
"""Most schedules of one file."""


@dataclasses.dataclass(frozen=True)
class FileSchedule:
    """A schedule of a job file, checked (:func:`read_schedules`)."""

    name: str
    cron: str
    tz: str
    concurrency_policy: str
    starting_deadline_s: int
    job: JobSpec


# ---------------------------------------------------------------------------- the file


def _error_path(exc: InvalidArgument) -> Path_:
    """Where in a job the error of a field points: ``constraints[2].key`` -> ``("constraints",
    2)``; ``env name`` (of value N) -> ``("env", N)``; ``runtime`` -> ``()``."""
    found = re.match(r"(?P<head>[a-z_]+)(?:\[(?P<sub>[^\]]*)\])?(?P<rest>.*)", exc.field)
    if found is None or found["head"] not in (*FIELDS, "runtime"):
        return ()
    sub = found["sub"]
    if sub is not None:
        return (found["head"], int(sub) if sub.isdigit() else sub)
    if found["head"] == "runtime" and isinstance(exc.value, str) and exc.value != "none":
        return (exc.value.split(" and ")[0],)  # the first runtime field given: its line
    if found["rest"] == " name" and isinstance(exc.value, str):
        return (found["head"], exc.value)
    return (found["head"],)


def read_job_file(path: Path | str, *, text_format: str | None = None) -> list[JobSpec]:
    """The jobs of a job file, each checked (see the module docstring for the shape).

    Args:
        path: the file; ``-`` reads standard input.
        text_format: ``toml`` or ``yaml`` (JSON is YAML); None: by the file's suffix.

    Raises:
        JobFileError: the file cannot be read, is too large, is not UTF-8, does not parse,
            nests too deep, names an unknown field, has no job or too many, or a job breaks a
            rule; the message names the file and line.
    """
    return read_job_file_placed(path, text_format=text_format)[0]


def read_job_file_placed(
    path: Path | str, *, text_format: str | None = None
) -> tuple[list[JobSpec], Callable[[int, str], str]]:
    """The jobs of a job file, as :func:`read_job_file` gives them, and ``where(job, field)``:
    ``jobs.toml:LINE`` of a job's field (``job`` from 0), or the file's name when the line is not
    known, to place refusals only the cluster can make (an ``after`` naming no job).

    Raises:
        JobFileError: as :func:`read_job_file`.
    """
    return _placed(*_source(path, text_format))


def read_job_file_and_schedules(
    path: Path | str, *, text_format: str | None = None
) -> tuple[list[JobSpec], Callable[[int, str], str], list[FileSchedule]]:
    """:func:`read_job_file_placed` and :func:`read_schedules` of one reading of the file (so
    ``-``, standard input, is read once).

    Raises:
        JobFileError: as those two.
    """
    source = _source(path, text_format)
    specs, where = _placed(*source)
    return specs, where, _schedules_of(*source)


def _source(path: Path | str, text_format: str | None) -> tuple[str, str, str]:
    """The file as shown, its format (``toml`` or ``yaml``) and its text."""
    shown = str(path)
    fmt = text_format or FORMATS.get(Path(shown).suffix.lower()) or ("yaml" if shown == "-" else None)
    if fmt not in ("toml", "yaml"):
        raise JobFileError(
            shown, f"a job file must end in {', '.join(FORMATS)} (or give --format toml|yaml)", value=shown
        )
    return shown, fmt, _decode(shown, _read_bytes(shown))


def _placed(shown: str, fmt: str, text: str) -> tuple[list[JobSpec], Callable[[int, str], str]]:
    kind = "JSON" if Path(shown).suffix.lower() == ".json" else "YAML"
    jobs, lines = _parse_toml(shown, text) if fmt == "toml" else _parse_yaml(shown, text, kind)

    def where(job: int, field: str) -> str:
        return where_of(shown, lines, job, (field,))

    return _specs(shown, jobs, lines), where


def read_schedules(path: Path | str, *, text_format: str | None = None) -> list[FileSchedule]:
    """The schedules of a job file's top-level ``schedules`` list (none: an empty list), each
    checked: its own fields as :func:`runtime.schedules.check_schedule` (the cron must name a
    time within 5 years of now), its job as a job's, without ``after`` or ``array``.

    Raises:
        JobFileError: the file cannot be read or parsed (as :func:`read_job_file`), or a
            schedule breaks a rule; the message names the file and, where known, the line.
    """
    return _schedules_of(*_source(path, text_format))


def _schedules_of(shown: str, fmt: str, text: str) -> list[FileSchedule]:
    document, line_of = _document(shown, fmt, text)
    if not isinstance(document, dict) or SCHEDULES_KEY not in document:
        return []

    def where(path: Path_ = ()) -> str:
        line = line_of((SCHEDULES_KEY, *path))
        return shown if line is None else f"{shown}:{line}"

    tables = document[SCHEDULES_KEY]
    if isinstance(tables, dict):
        tables = [tables]
    if not isinstance(tables, list):
        raise JobFileError(where(), f"{SCHEDULES_KEY!r} must be a list of schedules (tables)")
    if not tables:
        raise JobFileError(
            where(), f"{SCHEDULES_KEY!r} is an empty list: give at least one schedule, or leave it out"
        )
    if len(tables) > MAX_FILE_SCHEDULES:
        raise JobFileError(
            where(),
            f"a job file must hold at most {MAX_FILE_SCHEDULES} schedules, this one has {len(tables)}",
        )
    from runtime.schedules import check_schedule

    found: list[FileSchedule] = []
    now = dt.datetime.now(dt.UTC)
    for index, table in enumerate(tables):
        if not isinstance(table, dict):
            raise JobFileError(where((index,)), f"a schedule must be a table of fields, got {table!r}"[:200])
        unknown = [str(k) for k in table if k not in SCHEDULE_FIELDS]
        if unknown:
            raise JobFileError(
                where((index, unknown[0])),
                unknown_fields_message(unknown, SCHEDULE_FIELDS, of="a schedule's"),
                field=unknown[0],
            )
        job_table = table.get("job")
        if not isinstance(job_table, dict):
            raise JobFileError(
                where((index, "job") if "job" in table else (index,)),
                "job must be a table of a job's fields (the job each slot fires)",
                field="job",
                value=job_table,
            )
        for forbidden in ("after", "array", "tasks", "spread"):
            if job_table.get(forbidden):
                raise JobFileError(
                    where((index, "job", forbidden)),
                    f"job.{forbidden} must be empty for a schedule's job (no dependencies, array or gang)",
                    field=f"job.{forbidden}",
                    value=job_table[forbidden],
                )
        unknown = [str(k) for k in job_table if k not in FIELDS and k != STATUS_KEY]
        if unknown:  # at the field's own line, not the ``[schedules.job]`` header's
            raise JobFileError(
                where((index, "job", unknown[0])), unknown_fields_message(unknown, FIELDS), field=unknown[0]
            )
        try:
            job = spec_of_table(job_table)
        except InvalidArgument as exc:
            placed = where((index, "job", *_error_path(exc)))
            raise JobFileError(placed, str(exc), field=exc.field, value=exc.value) from None
        deadline = table.get("starting_deadline_s")
        try:
            if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, int)):
                raise InvalidArgument("starting_deadline_s", deadline, "must be an integer (seconds)")
            for text_field in ("name", "cron", "tz", "concurrency_policy"):
                value = table.get(text_field, "UTC" if text_field == "tz" else "")
                if not isinstance(value, str):
                    raise InvalidArgument(text_field, value, "must be text")
            rules = check_schedule(
                name=table.get("name", ""),
                cron=table.get("cron", ""),
                tz=table.get("tz", "UTC"),
                concurrency_policy=table.get("concurrency_policy", ""),
                starting_deadline_s=deadline,
                now=now,
            )
        except InvalidArgument as exc:
            raise JobFileError(
                where((index, exc.field)), str(exc), field=exc.field, value=exc.value
            ) from None
        twice = next((s for s in found if s.name == rules.name), None)
        if twice is not None:
            raise JobFileError(
                where((index, "name")),
                f"name: schedule {rules.name!r} is named twice in this file (each name once)",
                field="name",
                value=rules.name,
            )
        found.append(
            FileSchedule(
                name=rules.name,
                cron=rules.cron.expression,
                tz=rules.tz,
                concurrency_policy=rules.concurrency_policy,
                starting_deadline_s=rules.starting_deadline_s,
                job=job,
            )
        )
    return found


def _document(shown: str, fmt: str, text: str) -> tuple[Any, Callable[[Path_], int | None]]:
    """The parsed document, and the line of a value by its path from the document's root (None:
    not known; TOML: the ``[[schedules]]`` headers and their keys)."""
    if fmt == "toml":
        return toml_document(shown, text), _toml_schedule_lines(text).get
    document, marks = yaml_document(shown, text, "JSON" if Path(shown).suffix.lower() == ".json" else "YAML")
    return document, marks.get


def _toml_schedule_lines(text: str) -> dict[Path_, int]:
    """Where each schedule's fields are in a TOML text: each ``[[schedules]]`` header, its
    ``key =`` lines, and those of its ``[schedules.job]`` (and deeper) tables."""
    lines: dict[Path_, int] = {}
    index = -1
    section: tuple[str, ...] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        header = TOML_HEADER.match(line)
        if header is not None:
            names = tuple(part.strip().strip("\"'") for part in header[2].split("."))
            if header[1] == "[[" and names == (SCHEDULES_KEY,):
                index += 1
                section = ()
                lines.setdefault((SCHEDULES_KEY, index), number)
            elif names[:1] == (SCHEDULES_KEY,) and index >= 0:
                section = names[1:]
                lines.setdefault((SCHEDULES_KEY, index, *section[:1]), number)
            else:
                section = None
            continue
        key = TOML_KEY.match(line)
        if key is None or section is None:
            continue
        name = key[1] if key[1] is not None else key[2] if key[2] is not None else key[3]
        lines.setdefault((SCHEDULES_KEY, index, *section[:1], name), number)
    return lines


def _read_bytes(shown: str) -> bytes:
    """The file's bytes, refused by its size before it is read when it is a regular file, and
    after :data:`MAX_JOB_FILE_BYTES` + 1 bytes otherwise (a pipe)."""
    import sys

    try:
        if shown == "-":
            data = sys.stdin.buffer.read(MAX_JOB_FILE_BYTES + 1)
        else:
            with open(shown, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size > MAX_JOB_FILE_BYTES:
                    raise JobFileError(shown, _too_large(size), value=size)
                data = file.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as exc:
        raise JobFileError(shown, f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_JOB_FILE_BYTES:
        raise JobFileError(shown, _too_large(len(data)), value=len(data))
    return data


def _too_large(size: int) -> str:
    shown = f"{size:,} bytes" + ("" if size < 2 * 2**20 else f" ({size / 2**20:.1f} MiB)")
    return f"a job file must be at most {MAX_JOB_FILE_BYTES} bytes (1 MiB), this one has {shown}"


def _decode(shown: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise JobFileError(
            f"{shown}:{line}",
            f"a job file must be UTF-8 text; byte {exc.start} (0x{data[exc.start]:02x}) is not UTF-8",
        ) from None
    return text.removeprefix("\ufeff")


def _jobs_of(shown: str, document: Any, line_of: Callable[[Path_], int | None]) -> tuple[list[Any], Path_]:
    """The job tables of a parsed document, and where the first one is: ``()`` for a single
    job at the top level, ``(i,)`` for a list at the top level, ``("job", i)`` in a ``job``
    list (the path of job ``i`` is then the same with ``i``)."""

    def where(path: Path_ = ()) -> str:
        line = line_of(path)
        return shown if line is None else f"{shown}:{line}"

    base: Path_
    if isinstance(document, list):
        tables, base = document, (0,)
    elif isinstance(document, dict) and JOBS_KEY in document:
        extra = sorted(set(document) - {JOBS_KEY})
        if extra:
            raise JobFileError(
                where((extra[0],)),
                f"a file with a {JOBS_KEY!r} list holds nothing else at the top level; got {extra}"
                f" (write each job's fields in its {JOBS_KEY!r} table)",
            )
        tables, base = document[JOBS_KEY], (JOBS_KEY, 0)
        if isinstance(tables, dict):
            tables, base = [tables], (JOBS_KEY,)
        if not isinstance(tables, list):
            raise JobFileError(where((JOBS_KEY,)), f"{JOBS_KEY!r} must be a list of jobs (tables)")
    elif isinstance(document, dict):
        tables, base = [document], ()
    else:
        raise JobFileError(where(), "a job file must hold a job (a table of fields) or a list of jobs")
    if not tables:
        raise JobFileError(where(), "a job file must hold at least one job")
    if len(tables) > MAX_FILE_JOBS:
        raise JobFileError(
            where(), f"a job file must hold at most {MAX_FILE_JOBS} jobs, this one has {len(tables)}"
        )
    return tables, base


def _specs(shown: str, jobs: list[Any], lines: Lines) -> list[JobSpec]:
    specs = []
    for index, table in enumerate(jobs):

        def where(path: Path_ = (), index: int = index) -> str:
            return where_of(shown, lines, index, path)

        label = f"job {index + 1} of {len(jobs)}: " if len(jobs) > 1 else ""
        if not isinstance(table, dict):
            raise JobFileError(where(), f"{label}a job must be a table of fields, got {table!r}"[:200])
        unknown = [k for k in table if k not in FIELDS and k != STATUS_KEY]
        if unknown:
            raise JobFileError(where((str(unknown[0]),)), unknown_fields_message(unknown, FIELDS))
        try:
            spec = spec_of_table(table)
        except InvalidArgument as exc:
            raise JobFileError(where(_error_path(exc)), str(exc), field=exc.field, value=exc.value) from None
        specs.append(spec)
    try:
        pipeline_order(specs)
    except PipelineError as exc:
        field = "name" if exc.field.endswith(".name") else "after"
        raise JobFileError(
            where_of(shown, lines, exc.index, (field,)), exc.words, field=field, value=exc.value
        ) from None
    return specs


def where_of(shown: str, lines: Lines, job: int, path: Path_) -> str:
    """``shown:LINE`` for a value of a job, or ``shown`` when its line is not known."""
    line = lines.line(job, path)
    return shown if line is None else f"{shown}:{line}"


# ---------------------------------------------------------------------------- TOML


def _parse_toml(shown: str, text: str) -> tuple[list[Any], Lines]:
    document = toml_document(shown, text)
    lines = _toml_lines(text)
    document, schedules_only = _without_schedules(document)
    if schedules_only:
        return [], lines
    tables, _ = _jobs_of(shown, document, lambda path: lines.line(0, path))
    return tables, lines


def _without_schedules(document: Any) -> tuple[Any, bool]:
    """The document without its ``schedules`` list, and whether that leaves no job at all (a
    file of schedules only)."""
    if not isinstance(document, dict) or SCHEDULES_KEY not in document:
        return document, False
    rest = {k: v for k, v in document.items() if k != SCHEDULES_KEY}
    return rest, not rest


def _toml_lines(text: str) -> Lines:
    """Where each job's fields are in a TOML text, found by reading its lines: a job's
    ``[[job]]`` header, then each ``key =`` (and ``[job.env]``'s keys) until the next header.
    A hint for messages: a key inside a multi-line string may be taken for one."""
    lines = Lines()
    job = 0
    seen_jobs = 0
    section: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = TOML_HEADER.match(line)
        if header is not None:
            names = tuple(part.strip().strip("\"'") for part in header[2].split("."))
            if header[1] == "[[" and names == (JOBS_KEY,):
                job = seen_jobs
                seen_jobs += 1
                lines.set(job, (), number)
                section = ()
            else:
                section = names[1:] if names[:1] == (JOBS_KEY,) else names
                if section:
                    lines.set(job, (section[0],), number)
            continue
        key = TOML_KEY.match(line)
        if key is None:
            continue
        name = key[1] if key[1] is not None else key[2] if key[2] is not None else key[3]
        path: Path_ = (*section[:1], name) if section else (name,)
        lines.set(job, path, number)
    lines.set(0, (), 1)  # a single job at the top level begins with the file
    return lines


# ---------------------------------------------------------------------------- YAML


def _parse_yaml(shown: str, text: str, kind: str = "YAML") -> tuple[list[Any], Lines]:
    """Parse YAML, or JSON (a subset of YAML: ``kind`` names it in errors)."""
    document, marks = yaml_document(shown, text, kind)
    document, schedules_only = _without_schedules(document)
    if schedules_only:
        return [], Lines()
    tables, base = _jobs_of(shown, document, lambda path: marks.get(path, marks.get(())))
    lines = Lines()
    for index in range(len(tables)):
        prefix = (*base[:-1], index) if base and isinstance(base[-1], int) else base
        for path, line in marks.items():
            if path[: len(prefix)] == prefix:
                lines.set(index, path[len(prefix) :], line)
    return tables, lines

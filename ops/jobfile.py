"""Job files: ``stockade run FILE`` reads one (:func:`read_job_file`, :func:`read_job_file_placed`).

A file holds one job (its fields, :data:`ops.jobfields.FIELDS`, at the top level) or several,
each a table in the list ``job`` (TOML ``[[job]]``; YAML ``job:`` with a list, or a list at the
top level); a ``status`` table (``stockade job ID --json``'s) is ignored. TOML, YAML or JSON;
every value goes through :meth:`runtime.jobs.JobSpec.check`, and an error names the file, line
and field (``jobs.toml:7: max_attempts must be between 1 and 100, got 0``). Jobs and arrays of
one file may name each other in ``after`` (a pipeline, :func:`runtime.validation.pipeline_order`:
``jobs.toml:9: after: cycle a -> b -> a``). A file is refused
whole, before anything is sent, when it is too large, not UTF-8, nested too deep, names an
unknown field, or holds too many jobs. Plain Python (no typer, no rich).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ops.jobfields import FIELDS, STATUS_KEY, spec_of_table, unknown_fields_message
from runtime.errors import InvalidArgument
from runtime.jobs import JobSpec
from runtime.validation import PipelineError, pipeline_order

MAX_JOB_FILE_BYTES = 1024 * 1024
"""Largest job file, in bytes (1 MiB: 10,000 jobs of 100 bytes each), refused before parsing."""
MAX_NESTING = 16
"""Deepest nesting of tables and lists in a job file (``job[i].env`` is 3 levels)."""
_TOO_DEEP = f"a job file must nest at most {MAX_NESTING} levels deep"
MAX_FILE_JOBS = 10_000
"""Most jobs of one file: one SubmitJobs call (``runtime.validation.MAX_BATCH_JOBS``), all or none."""
JOBS_KEY = "job"
"""The list of jobs in a file of several."""
FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "yaml"}
"""A file's format by its suffix (JSON is read as YAML, of which it is a subset)."""

Path_ = tuple[str | int, ...]
"""Where a value sits in one job: ``()`` the job, ``("env",)`` a field, ``("env", "HOME")`` or
``("constraints", 2)`` a part of one."""


class JobFileError(InvalidArgument):
    """A job file that cannot be submitted; nothing was sent. The message starts with the file
    and, where known, the line: ``jobs.toml:7: max_attempts must be between 1 and 100, got 0``.

    Args:
        where: the file as shown, with ``:LINE`` when known.
        message: what is wrong.
        field: the field at fault (``file`` for the file as a whole).
        value: the value at fault.
    """

    def __init__(self, where: str, message: str, *, field: str = "file", value: object = None) -> None:
        super().__init__(field, value, message)
        self.args = (f"{where}: {message}",)


# ---------------------------------------------------------------------------- the file


class _Lines:
    """Where each value of a file's jobs is: ``line(job, path)``, the most precise one known."""

    def __init__(self) -> None:
        self.of: dict[tuple[int, Path_], int] = {}

    def set(self, job: int, path: Path_, line: int) -> None:
        self.of.setdefault((job, path), line)

    def line(self, job: int, path: Path_) -> int | None:
        for length in range(len(path), -1, -1):
            found = self.of.get((job, path[:length]))
            if found is not None:
                return found
        return None


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
    shown = str(path)
    fmt = text_format or FORMATS.get(Path(shown).suffix.lower()) or ("yaml" if shown == "-" else None)
    if fmt not in ("toml", "yaml"):
        raise JobFileError(
            shown, f"a job file must end in {', '.join(FORMATS)} (or give --format toml|yaml)", value=shown
        )
    data = _read_bytes(shown)
    text = _decode(shown, data)
    kind = "JSON" if Path(shown).suffix.lower() == ".json" else "YAML"
    jobs, lines = _parse_toml(shown, text) if fmt == "toml" else _parse_yaml(shown, text, kind)

    def where(job: int, field: str) -> str:
        return where_of(shown, lines, job, (field,))

    return _specs(shown, jobs, lines), where


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


def _specs(shown: str, jobs: list[Any], lines: _Lines) -> list[JobSpec]:
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


def where_of(shown: str, lines: _Lines, job: int, path: Path_) -> str:
    """``shown:LINE`` for a value of a job, or ``shown`` when its line is not known."""
    line = lines.line(job, path)
    return shown if line is None else f"{shown}:{line}"


def _depth(value: Any) -> int:
    """How deep lists and tables nest in ``value`` (a scalar: 0), without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest


# ---------------------------------------------------------------------------- TOML

_TOML_HEADER = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(?:#.*)?$")
_TOML_KEY = re.compile(r"\s*(?:\"([^\"]*)\"|'([^']*)'|([A-Za-z0-9_-]+))\s*(?:\.|=)")


def _parse_toml(shown: str, text: str) -> tuple[list[Any], _Lines]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise JobFileError(f"{shown}:{found[1]}" if found else shown, f"not TOML: {message}") from None
    except RecursionError:
        raise JobFileError(shown, _TOO_DEEP) from None
    if _depth(document) > MAX_NESTING:
        raise JobFileError(shown, _TOO_DEEP)
    lines = _toml_lines(text)
    tables, _ = _jobs_of(shown, document, lambda path: lines.line(0, path))
    return tables, lines


def _toml_lines(text: str) -> _Lines:
    """Where each job's fields are in a TOML text, found by reading its lines: a job's
    ``[[job]]`` header, then each ``key =`` (and ``[job.env]``'s keys) until the next header.
    A hint for messages: a key inside a multi-line string may be taken for one."""
    lines = _Lines()
    job = 0
    seen_jobs = 0
    section: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _TOML_HEADER.match(line)
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
        key = _TOML_KEY.match(line)
        if key is None:
            continue
        name = key[1] if key[1] is not None else key[2] if key[2] is not None else key[3]
        path: Path_ = (*section[:1], name) if section else (name,)
        lines.set(job, path, number)
    lines.set(0, (), 1)  # a single job at the top level begins with the file
    return lines


# ---------------------------------------------------------------------------- YAML


def _yaml_loader() -> type:
    """PyYAML's safe loader (its C one when there is one), reading JSON's and YAML 1.2's
    exponent floats (``1e3``) as numbers too (YAML 1.1 reads them as text)."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return Loader


def _parse_yaml(shown: str, text: str, kind: str = "YAML") -> tuple[list[Any], _Lines]:
    """Parse YAML, or JSON (a subset of YAML: ``kind`` names it in errors)."""
    import yaml

    loader_class = _yaml_loader()
    try:
        _check_yaml_events(shown, yaml.parse(text, Loader=loader_class))
        loader = loader_class(text)
        try:
            root = loader.get_single_node()
            if root is None:
                raise JobFileError(shown, "a job file must hold at least one job")
            document, marks = _yaml_value(loader, root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{shown}:{mark.line + 1}" if mark is not None else shown
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        if "nesting depth" in problem:  # libyaml's own limit, met before the events are seen
            raise JobFileError(where, _TOO_DEEP) from None
        raise JobFileError(where, f"not {kind}: {problem}") from None
    except yaml.YAMLError as exc:
        raise JobFileError(shown, f"not {kind}: {exc}") from None
    tables, base = _jobs_of(shown, document, lambda path: marks.get(path, marks.get(())))
    lines = _Lines()
    for index in range(len(tables)):
        prefix = (*base[:-1], index) if base and isinstance(base[-1], int) else base
        for path, line in marks.items():
            if path[: len(prefix)] == prefix:
                lines.set(index, path[len(prefix) :], line)
    return tables, lines


def _check_yaml_events(shown: str, events: Iterable[Any]) -> None:
    """Refuse, from the parser's events (no recursion, nothing built), a file that nests
    deeper than :data:`MAX_NESTING`, holds an alias or several documents."""
    import yaml

    depth = 0
    documents = 0
    for event in events:
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        where = shown if line is None else f"{shown}:{line}"
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise JobFileError(where, _TOO_DEEP)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            raise JobFileError(where, "a job file must not use aliases (*name): write the value out")
        elif isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise JobFileError(where, "a job file must hold one YAML document")


def _yaml_value(loader: Any, root: Any) -> tuple[Any, dict[Path_, int]]:
    """The Python value of a composed YAML node tree, with the line of every table key and
    list item by its path (tables' keys must be text and given once). Recursion is bounded
    by :data:`MAX_NESTING` (checked on the events first)."""
    import yaml

    marks: dict[Path_, int] = {(): root.start_mark.line + 1}

    def value(node: Any, path: Path_) -> Any:
        if isinstance(node, yaml.MappingNode):
            table: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if not isinstance(key, str):
                    raise yaml.MarkedYAMLError(
                        problem=f"a field's name must be text, got {key!r}", problem_mark=key_node.start_mark
                    )
                if key in table:
                    raise yaml.MarkedYAMLError(
                        problem=f"field {key!r} is given twice", problem_mark=key_node.start_mark
                    )
                marks.setdefault((*path, key), line)
                table[key] = value(value_node, (*path, key))
            return table
        if isinstance(node, yaml.SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                marks.setdefault((*path, index), item.start_mark.line + 1)
                items.append(value(item, (*path, index)))
            return items
        return loader.construct_object(node, deep=True)

    return value(root, ()), marks

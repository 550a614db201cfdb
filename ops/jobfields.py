"""A job as a person writes it: a table of fields (:data:`FIELDS`) named as ``stockade submit``'s
options with ``_`` for ``-``, the shape of a job file (:mod:`ops.jobfile`) and of ``stockade job
ID --json``: :func:`spec_of_table` and :func:`spec_of_options` read one into a checked
:class:`runtime.jobs.JobSpec`, :func:`fields_of` writes one. Plain Python (no typer, no rich).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from runtime.constraints import Constraint, parse_constraint
from runtime.errors import InvalidArgument
from runtime.jobs import (
    MAX_NAME_BYTES,
    MAX_SLEEP_MS,
    CommandRuntime,
    ContainerRuntime,
    JobRuntime,
    JobSpec,
    SleepRuntime,
    check_seconds,
    parse_array,
)
from runtime.resources import merge_asks
from runtime.text import head_bytes

STATUS_KEY = "status"
"""The read-only part of an exported job, which a job file may hold and which is ignored."""
FIELDS: dict[str, str] = {
    "name": "text, for people (default: the command's basename, the image's name, or sleep)",
    "cpu_millis": "integer, required: CPU in millicores (1000 = one core)",
    "memory_mb": "integer, required: memory in MiB",
    "priority": "integer: higher runs first",
    "sleep_s": "seconds: a sleep job holding its resources this long",
    "command": "list of text: the program and its arguments (in the image, with image)",
    "image": "text: run in a Docker container of this image",
    "max_attempts": "integer 1-100: most runs of the job",
    "retry_backoff_s": "seconds 0-600: the base of the backoff before a retry",
    "count_lost": "true or false: a run lost with its worker spends an attempt",
    "timeout_s": "seconds, 0.001 to a week: the longest run",
    "constraints": 'list of text: rules on worker labels, "key=value", "key!=value", "key", "key in (a,b)"',
    "env": "table of text: environment variables",
    "workdir": "text: the working directory, an absolute path on the worker",
    "after": "list of job ids, and names of jobs of the same file: run once all of them have succeeded",
    "array": 'text: "FIRST-LAST[%MAX_RUNNING]", an array of tasks',
    "max_failed_tasks": "integer, with array: once this many tasks failed, cancel the rest, fail the array",
    "retry_on_exit": "list of exit codes 1-255: retry only failures that exit with one of these",
    "no_retry_on": "list of reasons (oom_killed, timeout, ...): fail at once when a run fails for one",
    "resources": "table of integers: countable devices each run holds, e.g. {gpu = 2} (docs/devices.md)",
    "tasks": "integer 1-256: a gang of this many tasks, placed all or nothing (docs/gangs.md)",
    "spread": "true or false: a gang's tasks go to distinct workers",
}
"""Every field of a job, with what it holds (``stockade run --help`` lists them)."""

OPTIONS = {
    "max_attempts": "--max-attempts",
    "retry_backoff_s": "--retry-backoff-s",
    "count_lost": "--count-lost",
    "timeout_s": "--timeout-s",
    "constraints": "--constraint",
    "env": "--env",
    "workdir": "--workdir",
    "after": "--after",
    "array": "--array",
    "max_failed_tasks": "--max-failed-tasks",
    "retry_on_exit": "--retry-on-exit",
    "no_retry_on": "--no-retry-on",
    "resources": "--resource",
    "tasks": "--tasks",
    "spread": "--spread",
}
"""``stockade submit``'s option of each lifecycle field, as its errors name it (the older fields'
errors keep the spec's names, but ``--image`` and ``--sleep-s``)."""
_OPTION_NAMES = {**OPTIONS, "image": "--image", "sleep_s": "--sleep-s"}

_WIRE_NAMES = {
    "after_names": "after",
    "sleep.duration_ms": "sleep_s",
    "command.argv": "command",
    "container.argv": "command",
    "container.image": "image",
}
"""The spec's field names (:meth:`JobSpec.check`'s, the wire's) that a file spells otherwise."""


def default_name(runtime: JobRuntime) -> str:
    """A job's name when none is given: the command's basename, the image's repository name,
    or ``sleep``."""
    match runtime:
        case ContainerRuntime(image=image):
            repository = image.partition("@")[0].rsplit("/", 1)[-1].partition(":")[0]
            return head_bytes(repository or "container", MAX_NAME_BYTES)
        case CommandRuntime(argv=argv):
            return head_bytes(os.path.basename(argv[0]) if argv else "command", MAX_NAME_BYTES) or "command"
        case _:
            return "sleep"


def runtime_of(fields: Mapping[str, Any]) -> JobRuntime:
    """The runtime the fields ``sleep_s``, ``command`` and ``image`` name.

    Raises:
        InvalidArgument: none of them or both kinds (field ``runtime``), or ``sleep_s`` out of
            range.
    """
    given = sorted(k for k in ("sleep_s", "command", "image") if fields.get(k) is not None)
    if given not in (["sleep_s"], ["command"], ["image"], ["command", "image"]):
        raise InvalidArgument(
            "runtime",
            " and ".join(given) if given else "none",
            "must be one of sleep_s, command, or image (with an optional command)",
        )
    if "image" in given:
        return ContainerRuntime(image=fields["image"], argv=fields.get("command") or ())
    if "command" in given:
        return CommandRuntime(argv=fields["command"])
    seconds = check_seconds("sleep_s", fields["sleep_s"], low=0.0, high=MAX_SLEEP_MS / 1000)
    return SleepRuntime(duration_ms=round(seconds * 1000))


def spec_of(fields: Mapping[str, Any]) -> JobSpec:
    """A checked :class:`JobSpec` from typed field values (see :data:`FIELDS`; absent or None:
    the default).

    Raises:
        InvalidArgument: the first rule broken, the field named as a file names it
            (``max_attempts``, ``constraints[2]``, ``env[HOME]``, ``command[0]``, ``image``).
    """
    for required in ("cpu_millis", "memory_mb"):
        if fields.get(required) is None:
            raise InvalidArgument(required, None, "must be given")
    runtime = runtime_of(fields)
    given_apart = ("name", "cpu_millis", "memory_mb", "sleep_s", "command", "image", "max_failed_tasks")
    optional = {k: fields[k] for k in FIELDS if k not in given_apart and fields.get(k) is not None}
    after = tuple(fields.get("after") or ())
    optional["after"] = tuple(item for item in after if not isinstance(item, str))
    optional["after_names"] = tuple(item for item in after if isinstance(item, str))
    max_failed = fields.get("max_failed_tasks")
    if max_failed is not None:
        array = fields.get("array")
        if array is None:
            raise InvalidArgument(
                "max_failed_tasks", max_failed, "must come with an array (array or --array)"
            )
        if (
            isinstance(max_failed, bool)
            or not isinstance(max_failed, int)
            or not 1 <= max_failed <= array.tasks
        ):
            raise InvalidArgument(
                "max_failed_tasks",
                max_failed,
                f"must be between 1 and the array's {array.tasks} tasks (leave it out for no limit)",
            )
        optional["array"] = attrs.evolve(array, max_failed_tasks=max_failed)
    spec = JobSpec(
        name=fields["name"] if fields.get("name") is not None else default_name(runtime),
        cpu_millis=fields["cpu_millis"],
        memory_mb=fields["memory_mb"],
        runtime=runtime,
        **optional,
    )
    try:
        return spec.check()
    except InvalidArgument as exc:
        raise renamed(exc, file_field) from None


def file_field(field: str) -> str:
    """A spec's field name (``container.image``, ``command.argv[2]``) as a file names it
    (``image``, ``command[2]``)."""
    for wire, name in _WIRE_NAMES.items():
        if field == wire or field.startswith((wire + "[", wire + ".")):
            return name + field[len(wire) :]
    return field


def option_field(field: str) -> str:
    """A file's field name as ``stockade submit`` names its option (``--max-attempts``,
    ``--constraint[1]``), for the lifecycle fields; others unchanged."""
    head = re.match(r"[a-z_]+", field)
    if head is not None and head[0] in _OPTION_NAMES:
        return _OPTION_NAMES[head[0]] + field[head.end() :]
    return field


def renamed(exc: InvalidArgument, rename: Callable[[str], str]) -> InvalidArgument:
    """``exc`` with its field renamed (the same value, rule and detail)."""
    return InvalidArgument(rename(exc.field), exc.value, exc.rule, detail=exc.detail)


# ---------------------------------------------------------------------------- values from options


def int_option(option: str, text: str | None) -> int | None:
    """An integer option's value, None when not given; InvalidArgument unless a whole number."""
    if text is None:
        return None
    if re.fullmatch(r"\s*[-+]?[0-9]{1,30}\s*", text) is None:
        raise InvalidArgument(option, text, "must be a whole number")
    return int(text)


def seconds_option(option: str, text: str | None) -> float | None:
    """A seconds option's value, None when not given; InvalidArgument unless a number (NaN and
    infinities are left to the spec's rules)."""
    if text is None:
        return None
    try:
        if not text.isascii():
            raise ValueError(text)
        return float(text)
    except ValueError:
        raise InvalidArgument(option, text, "must be a number of seconds") from None


def env_option(option: str, items: Iterable[str]) -> list[tuple[str, str]]:
    """``--env NAME=VALUE`` values as pairs, split at the first ``=``; InvalidArgument without one."""
    pairs = []
    for item in items:
        name, equals, value = item.partition("=")
        if not equals:
            raise InvalidArgument(option, item, "must be NAME=VALUE")
        pairs.append((name, value))
    return pairs


def ids_option(option: str, items: Iterable[str]) -> list[int]:
    """``--after ID[,ID...]`` values (repeatable) as job ids, in order; InvalidArgument unless
    comma-separated whole numbers."""
    return _whole_numbers(option, items, r"\s*[0-9]{1,30}\s*", "job ids separated by commas (e.g. 12,15)")


def exit_codes_option(option: str, items: Iterable[str]) -> list[int]:
    """``--retry-on-exit CODE[,CODE...]`` values (repeatable) as integers, in order;
    InvalidArgument unless comma-separated whole numbers (the range is the spec's rule)."""
    return _whole_numbers(
        option, items, r"\s*[-+]?[0-9]{1,30}\s*", "exit codes separated by commas (e.g. 1,75)"
    )


def _whole_numbers(option: str, items: Iterable[str], number: str, what: str) -> list[int]:
    """The comma-separated numbers of repeated option values, in order; InvalidArgument naming the
    value when a part does not match the regular expression ``number`` (it "must be ``what``")."""
    numbers = []
    for item in items:
        for part in item.split(","):
            if re.fullmatch(number, part) is None:
                raise InvalidArgument(option, item, f"must be {what}")
            numbers.append(int(part))
    return numbers


def names_option(items: Iterable[str]) -> list[str]:
    """``--no-retry-on REASON[,REASON...]`` values (repeatable) as names, in order (the
    vocabulary is the spec's rule)."""
    return [part.strip() for item in items for part in item.split(",")]


def spec_of_options(options: Mapping[str, Any]) -> JobSpec:
    """:func:`spec_of` for ``stockade submit``, from its options: the older ones as typer read
    them, the lifecycle ones (:data:`OPTIONS`) as text, so that every error names the option and
    the text given (``--max-attempts must be between 1 and 100, got 0``).

    Raises:
        InvalidArgument: the first rule broken.
    """
    try:
        fields = dict(options)
        fields["max_attempts"] = int_option("max_attempts", options.get("max_attempts"))
        fields["retry_backoff_s"] = seconds_option("retry_backoff_s", options.get("retry_backoff_s"))
        fields["timeout_s"] = seconds_option("timeout_s", options.get("timeout_s"))
        fields["constraints"] = tuple(
            parse_constraint(text, field="--constraint") for text in options.get("constraints") or ()
        )
        fields["env"] = env_option("env", options.get("env") or ())
        fields["resources"] = tuple(merge_asks(options.get("resources") or (), field="resources").items())
        fields["after"] = ids_option("after", options.get("after") or ())
        fields["max_failed_tasks"] = int_option("max_failed_tasks", options.get("max_failed_tasks"))
        fields["retry_on_exit"] = exit_codes_option("retry_on_exit", options.get("retry_on_exit") or ())
        fields["no_retry_on"] = names_option(options.get("no_retry_on") or ())
        array = options.get("array")
        fields["array"] = None if array is None else parse_array(array, field="array")
        fields["tasks"] = int_option("tasks", options.get("tasks"))
        fields["spread"] = bool(options.get("spread")) or None
        return spec_of(fields)
    except InvalidArgument as exc:
        raise renamed(exc, option_field) from None


# ---------------------------------------------------------------------------- values from a file

_Item = TypeVar("_Item")


def _whole(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, value, "must be a whole number")
    return value


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(field, value, "must be a number of seconds")
    return float(value)


def _text(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(field, value, "must be text (in quotes)")
    return value


def _flag(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(field, value, "must be true or false")
    return value


def _list_of(read: Callable[[str, Any], _Item], what: str) -> Callable[[str, Any], tuple[_Item, ...]]:
    """A reader of a list of ``what`` (its error's words), each item read by ``read`` and named
    ``field[index]`` in its error."""

    def read_list(field: str, value: Any) -> tuple[_Item, ...]:
        if not isinstance(value, list):
            raise InvalidArgument(field, value, f"must be a list of {what}")
        return tuple(read(f"{field}[{index}]", item) for index, item in enumerate(value))

    return read_list


def _table_of(
    read: Callable[[str, Any], _Item], what: str
) -> Callable[[str, Any], tuple[tuple[str, _Item], ...]]:
    """A reader of a table of ``what`` (its error's words): (name, value) pairs in the file's
    order, each value read by ``read`` and named ``field[name]`` in its error."""

    def read_table(field: str, value: Any) -> tuple[tuple[str, _Item], ...]:
        if not isinstance(value, dict):
            raise InvalidArgument(field, value, f"must be a table of {what}")
        return tuple((name, read(f"{field}[{name}]", item)) for name, item in value.items())

    return read_table


def _constraint(field: str, value: Any) -> Constraint:
    return parse_constraint(_text(field, value), field=field)


def _after(field: str, value: Any) -> tuple[int | str, ...]:
    """Job ids (whole numbers) and names of jobs of the same file (text), in the file's order."""
    items = value if isinstance(value, list) else [value]
    return tuple(
        item if isinstance(item, str) else _whole(f"{field}[{index}]", item)
        for index, item in enumerate(items)
    )


def _array(field: str, value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return parse_array(_text(field, value), field=field)


_READERS: dict[str, Callable[[str, Any], Any]] = {
    "name": _text,
    "cpu_millis": _whole,
    "memory_mb": _whole,
    "priority": _whole,
    "sleep_s": _number,
    "command": _list_of(_text, 'text, e.g. ["python3", "-c", "print(1)"]'),
    "image": _text,
    "max_attempts": _whole,
    "retry_backoff_s": _number,
    "count_lost": _flag,
    "timeout_s": _number,
    "constraints": _list_of(_constraint, 'constraints, e.g. ["gpu=a100"]'),
    "env": _table_of(_text, 'NAME = "value"'),
    "workdir": _text,
    "after": _after,
    "array": _array,
    "max_failed_tasks": _whole,
    "retry_on_exit": _list_of(_whole, "exit codes, e.g. [1, 75]"),
    "no_retry_on": _list_of(_text, 'reasons, e.g. ["oom_killed"]'),
    "resources": _table_of(_whole, "NAME = COUNT (e.g. gpu = 2)"),
    "tasks": _whole,
    "spread": _flag,
}
"""How each field's value in a file is read (its type; the rules are the spec's)."""
assert _READERS.keys() == FIELDS.keys()


def spec_of_table(table: Mapping[str, Any]) -> JobSpec:
    """A checked :class:`JobSpec` from one job's table of fields, with the values a file's
    parser gives (None or absent: the default), with a job file's errors but its name and line.
    ``status`` is ignored.

    Raises:
        InvalidArgument: an unknown field (with a suggestion), a value of the wrong type, or
            the first rule broken (:func:`spec_of`).
    """
    unknown = [str(k) for k in table if k not in FIELDS and k != STATUS_KEY]
    if unknown:
        error = InvalidArgument(unknown[0], table[unknown[0]], "is not a field of a job")
        error.args = (unknown_fields_message(unknown, FIELDS),)
        raise error
    fields = {
        name: _READERS[name](name, value)
        for name, value in table.items()
        if name != STATUS_KEY and value is not None
    }
    return spec_of(fields)


def unknown_fields_message(names: Iterable[str], known: Iterable[str], *, of: str = "a job's") -> str:
    """``unknown field 'max_attempt' (did you mean 'max_attempts'?)`` for each name, and the
    fields ``known`` (``of``: whose they are, ``a schedule's``)."""
    known = list(known)
    parts = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        parts.append(repr(name) + (f" (did you mean {close[0]!r}?)" if close else ""))
    noun = "field" if len(parts) == 1 else "fields"
    return f"unknown {noun} {', '.join(parts)}; {of} fields: {', '.join(known)}"


def fields_of(spec: JobSpec) -> dict[str, Any]:
    """A spec as the fields of a job file (JSON-ready), every field given: reading them back
    (:func:`spec_of`) gives the same spec."""
    fields: dict[str, Any] = {
        "name": spec.name,
        "cpu_millis": spec.cpu_millis,
        "memory_mb": spec.memory_mb,
        "priority": spec.priority,
    }
    match spec.runtime:
        case SleepRuntime(duration_ms=duration_ms):
            fields["sleep_s"] = duration_ms / 1000
        case CommandRuntime(argv=argv):
            fields["command"] = list(argv)
        case ContainerRuntime(image=image, argv=argv):
            fields["image"] = image
            fields["command"] = list(argv) if argv else None
        case None:
            pass
    fields.update(
        {
            "max_attempts": spec.max_attempts,
            "retry_backoff_s": spec.retry_backoff_s,
            "count_lost": spec.count_lost,
            "timeout_s": spec.timeout_s,
            "constraints": [c.describe() for c in spec.constraints],
            "env": dict(spec.env),
            "workdir": spec.workdir or None,
            "after": [*spec.after, *spec.after_names],
            "array": spec.array.describe() if spec.array is not None else None,
            "max_failed_tasks": spec.array.max_failed_tasks or None if spec.array is not None else None,
            "retry_on_exit": list(spec.retry_on_exit),
            "no_retry_on": list(spec.no_retry_on),
            "resources": dict(spec.resources),
            "tasks": spec.tasks,
            "spread": spec.spread or None,
        }
    )
    return fields

"""Checks on what clients and workers send, before anything is stored.

Each check raises :class:`runtime.errors.InvalidArgument` naming the field, the value and the
limit (``cpu_millis must be between 1 and 1000000, got 0``); nothing is written when one fails.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TypeVar

import attrs

from runtime.errors import InvalidArgument

T = TypeVar("T")

MAX_CPU_MILLIS = 1_000_000  # 1000 cores
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB
MAX_NAME_CHARS = 128
MAX_PRIORITY = 1_000_000
MAX_SLEEP_MS = 7 * 24 * 3600 * 1000  # one week
MAX_ARGV_ITEMS = 256
MAX_ARGV_BYTES = 64 * 1024
MAX_LABELS = 64
MAX_LABEL_CHARS = 256
MAX_LIST_LIMIT = 10_000
WORKER_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
JOB_STATES = ("pending", "assigned", "running", "succeeded", "failed", "cancelled")


@attrs.frozen(kw_only=True)
class JobRequest:
    """A checked job submission. Exactly one of ``sleep_ms`` and ``argv`` is set."""

    name: str
    cpu_millis: int
    memory_mb: int
    priority: int
    sleep_ms: int | None
    argv: tuple[str, ...] | None

    @property
    def runtime(self) -> str:
        """``sleep`` or ``command``."""
        return "sleep" if self.argv is None else "command"


def _text(
    field: str, value: str, *, max_chars: int, allow_empty: bool = False, printable: bool = False
) -> str:
    if "\x00" in value:
        raise InvalidArgument(field, value, "must not contain NUL bytes")
    if printable and any(unicodedata.category(c) == "Cc" for c in value):
        raise InvalidArgument(field, value, "must not contain control characters (newlines, escapes)")
    if not value and not allow_empty:
        raise InvalidArgument(field, value, "must not be empty")
    if len(value) > max_chars:
        raise InvalidArgument(field, value, f"must be at most {max_chars} characters (has {len(value)})")
    return value


def _int_between(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(field, value, f"must be between {low} and {high}")
    return value


def check_job(
    *,
    name: str,
    cpu_millis: int,
    memory_mb: int,
    priority: int,
    sleep_ms: int | None,
    argv: Sequence[str] | None,
) -> JobRequest:
    """Check a submission.

    Raises:
        InvalidArgument: a field is empty, too long, out of range or holds a NUL byte, or the
            job names no runtime (or both).
    """
    _text("name", name, max_chars=MAX_NAME_CHARS, printable=True)
    _int_between("cpu_millis", cpu_millis, 1, MAX_CPU_MILLIS)
    _int_between("memory_mb", memory_mb, 1, MAX_MEMORY_MB)
    _int_between("priority", priority, -MAX_PRIORITY, MAX_PRIORITY)
    if (sleep_ms is None) == (argv is None):
        raise InvalidArgument(
            "runtime", None if sleep_ms is None else "both", "must be exactly one of sleep or command"
        )
    if sleep_ms is not None:
        _int_between("sleep.duration_ms", sleep_ms, 0, MAX_SLEEP_MS)
    checked_argv: tuple[str, ...] | None = None
    if argv is not None:
        if not argv:
            raise InvalidArgument("command.argv", list(argv), "must name a program")
        if len(argv) > MAX_ARGV_ITEMS:
            raise InvalidArgument(
                "command.argv", f"{len(argv)} items", f"must have at most {MAX_ARGV_ITEMS} items"
            )
        for index, arg in enumerate(argv):
            _text(f"command.argv[{index}]", arg, max_chars=MAX_ARGV_BYTES, allow_empty=index > 0)
        total = sum(len(a.encode()) for a in argv)
        if total > MAX_ARGV_BYTES:
            raise InvalidArgument(
                "command.argv", f"{total} bytes", f"must total at most {MAX_ARGV_BYTES} bytes"
            )
        checked_argv = tuple(argv)
    return JobRequest(
        name=name,
        cpu_millis=cpu_millis,
        memory_mb=memory_mb,
        priority=priority,
        sleep_ms=sleep_ms,
        argv=checked_argv,
    )


MAX_BATCH_JOBS = 10_000


def check_jobs(specs: Sequence[Mapping[str, object]]) -> list[JobRequest]:
    """Check a batch (each item the keyword arguments of :func:`check_job`).

    Raises:
        InvalidArgument: an empty or too large batch, or a bad job; the field is named with
            its index, e.g. ``specs[3].cpu_millis``.
    """
    steps = check_jobs_steps(specs, fields=dict, step_jobs=len(specs) + 1)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            checked: list[JobRequest] = done.value
            return checked


def check_jobs_steps(
    specs: Sequence[T], *, fields: Callable[[T], Mapping[str, object]], step_jobs: int
) -> Generator[None, None, list[JobRequest]]:
    """:func:`check_jobs` in steps: a generator that yields after every ``step_jobs`` jobs it
    checked and returns the checked jobs, so a large batch need not hold the event loop.

    Args:
        specs: the batch.
        fields: turns one item of ``specs`` into the keyword arguments of :func:`check_job`.
        step_jobs: jobs checked between two yields (at least 1).

    Raises:
        InvalidArgument: as :func:`check_jobs`.
    """
    if not specs:
        raise InvalidArgument("specs", [], "must hold at least one job")
    if len(specs) > MAX_BATCH_JOBS:
        raise InvalidArgument("specs", f"{len(specs)} jobs", f"must hold at most {MAX_BATCH_JOBS}")
    checked = []
    for index, spec in enumerate(specs):
        try:
            checked.append(check_job(**fields(spec)))  # type: ignore[arg-type]
        except InvalidArgument as exc:
            raise InvalidArgument(f"specs[{index}].{exc.field}", exc.value, exc.rule) from None
        if (index + 1) % step_jobs == 0:
            yield
    return checked


def check_worker_id(worker_id: str) -> str:
    """Raises InvalidArgument unless ``worker_id`` is 1-64 of ``[A-Za-z0-9._-]``, starting alnum."""
    _text("worker_id", worker_id, max_chars=64)
    if not WORKER_ID_PATTERN.fullmatch(worker_id):
        raise InvalidArgument(
            "worker_id",
            worker_id,
            "must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit",
        )
    return worker_id


MAX_AGENT_RUN_ID_CHARS = 64


def check_registration(
    *,
    worker_id: str,
    address: str,
    cpu_millis: int,
    memory_mb: int,
    labels: Mapping[str, str],
    agent_run_id: str = "",
    registration_seq: int = 0,
) -> None:
    """Check a worker registration.

    Raises:
        InvalidArgument: bad id, address not ``host:port``, capacity out of range, bad labels,
            an agent run id longer than 64 characters, or a registration number outside
            0..MAX_ID (1 or more with a run id).
    """
    check_worker_id(worker_id)
    _text("agent_run_id", agent_run_id, max_chars=MAX_AGENT_RUN_ID_CHARS, allow_empty=True)
    _int_between("registration_seq", registration_seq, 1 if agent_run_id else 0, MAX_ID)
    _text("address", address, max_chars=256)
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument("address", address, "must be host:port with a port in 1..65535")
    _int_between("cpu_millis", cpu_millis, 1, MAX_CPU_MILLIS)
    _int_between("memory_mb", memory_mb, 1, MAX_MEMORY_MB)
    if len(labels) > MAX_LABELS:
        raise InvalidArgument("labels", f"{len(labels)} labels", f"must have at most {MAX_LABELS}")
    for key, value in labels.items():
        _text("labels key", key, max_chars=MAX_LABEL_CHARS)
        _text(f"labels[{key}]", value, max_chars=MAX_LABEL_CHARS, allow_empty=True)


MAX_ID = 2**63 - 1
"""Ids are PostgreSQL bigints."""


def check_leave(*, worker_id: str, incarnation: int, agent_run_id: str) -> None:
    """Check a worker's leave (a clean stop).

    Raises:
        InvalidArgument: bad id, an incarnation outside 1..MAX_ID (a leave names the life that
            stopped, and incarnations start at 1), or an agent run id empty (only an agent that
            registered with one can leave) or longer than 64 characters.
    """
    check_worker_id(worker_id)
    _int_between("incarnation", incarnation, 1, MAX_ID)
    _text("agent_run_id", agent_run_id, max_chars=MAX_AGENT_RUN_ID_CHARS)


def check_job_id(job_id: int) -> int:
    """Raises InvalidArgument outside 1..MAX_ID (ids start at 1 and are bigints)."""
    return _int_between("job_id", job_id, 1, MAX_ID)


def check_incarnation(incarnation: int) -> int:
    """Raises InvalidArgument outside 0..MAX_ID."""
    return _int_between("incarnation", incarnation, 0, MAX_ID)


OUTCOME_STATES = ("succeeded", "failed", "cancelled")
"""The states a worker reports for an ended job (``agent.messages.JobState``)."""
MAX_OUTCOMES = 10_000
"""Most outcomes one heartbeat or registration may carry."""
MAX_PATH_CHARS = 4096
"""Longest stdout or stderr path an outcome may name (PATH_MAX on Linux)."""
MAX_DETAIL_CHARS = 4096
"""Longest detail an outcome may carry."""


def check_outcome(
    field: str,
    *,
    assignment_id: int,
    job_id: int,
    state: str,
    started_unix_s: float,
    finished_unix_s: float,
    stdout_path: str,
    stderr_path: str,
    detail: str,
) -> None:
    """Check one reported job outcome; ``field`` names it in errors (``finished[2]``).

    Raises:
        InvalidArgument: an assignment id outside 1..MAX_ID, a job id outside 0..MAX_ID (0:
            not given), a state not in :data:`OUTCOME_STATES`, a time that is not a finite
            number >= 0 (0: unknown), or a path or detail holding a NUL byte or too long; the
            field is named with its place, e.g. ``finished[2].detail``.
    """
    _int_between(f"{field}.assignment_id", assignment_id, 1, MAX_ID)
    _int_between(f"{field}.job_id", job_id, 0, MAX_ID)
    if state not in OUTCOME_STATES:
        raise InvalidArgument(f"{field}.state", state, f"must be one of {', '.join(OUTCOME_STATES)}")
    for name, value in (("started_unix_s", started_unix_s), ("finished_unix_s", finished_unix_s)):
        if not (math.isfinite(value) and value >= 0):
            raise InvalidArgument(
                f"{field}.{name}", value, "must be a finite number of seconds >= 0 (0: unknown)"
            )
    _text(f"{field}.stdout_path", stdout_path, max_chars=MAX_PATH_CHARS, allow_empty=True)
    _text(f"{field}.stderr_path", stderr_path, max_chars=MAX_PATH_CHARS, allow_empty=True)
    _text(f"{field}.detail", detail, max_chars=MAX_DETAIL_CHARS, allow_empty=True)


def check_outcomes(outcomes: Sequence[Mapping[str, object]], *, field: str = "finished") -> None:
    """Check the outcomes of a heartbeat or a registration (each item the keyword arguments
    of :func:`check_outcome` but ``field``).

    Raises:
        InvalidArgument: more than :data:`MAX_OUTCOMES`, or a bad outcome, named by its index
            (``finished[2].state``).
    """
    if len(outcomes) > MAX_OUTCOMES:
        raise InvalidArgument(field, f"{len(outcomes)} outcomes", f"must hold at most {MAX_OUTCOMES}")
    for index, outcome in enumerate(outcomes):
        check_outcome(f"{field}[{index}]", **outcome)  # type: ignore[arg-type]


def check_list(state: str, limit: int) -> tuple[str, int]:
    """Check a ListJobs request; a limit of 0 means 100.

    Raises:
        InvalidArgument: unknown state, or limit above the maximum.
    """
    if state and state not in JOB_STATES:
        raise InvalidArgument("state", state, f"must be empty or one of {', '.join(JOB_STATES)}")
    if limit > MAX_LIST_LIMIT:
        raise InvalidArgument("limit", limit, f"must be at most {MAX_LIST_LIMIT}")
    return state, limit or 100

"""Checks on what clients and workers send, before anything is stored.

Each check raises :class:`runtime.errors.InvalidArgument` naming the field, the value and the
limit (``cpu_millis must be between 1 and 1000000, got 0``); nothing is written when one fails.

Every size is counted in bytes of UTF-8. :data:`LIMITS` lists every limit, also those of
:meth:`runtime.jobs.JobSpec.check` and :mod:`runtime.validation`; the table in
``docs/limits.md`` is :func:`limits_table` (a test compares the two). This module checks what
only the control plane receives (registrations, heartbeats, outcomes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from actors.schedule_plan import MAX_SLOTS_PER_PASS
from runtime import accounts as _accounts
from runtime import identifiers
from runtime.checks import check_int_between as _int_between
from runtime.checks import check_text as _text
from runtime.constraints import MAX_CONSTRAINTS, MAX_IN_VALUES
from runtime.errors import InvalidArgument
from runtime.jobs import (
    FAILURE_REASONS,
    MAX_AFTER,
    MAX_ARGV_BYTES,
    MAX_ARGV_ITEMS,
    MAX_ARRAY_INDEX,
    MAX_ARRAY_TASKS,
    MAX_ATTEMPTS,
    MAX_CPU_MILLIS,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_BYTES,
    MAX_ENV_VARS,
    MAX_GANG_TASKS,
    MAX_IMAGE_BYTES,
    MAX_MEMORY_MB,
    MAX_NAME_BYTES,
    MAX_PRIORITY,
    MAX_RETRY_BACKOFF_S,
    MAX_RETRY_EXIT_CODE,
    MAX_SLEEP_MS,
    MAX_TIMEOUT_S,
    MAX_WORKDIR_BYTES,
    MIN_RETRY_EXIT_CODE,
    MIN_TIMEOUT_S,
)
from runtime.resources import (
    MAX_RESOURCE_KINDS,
    MAX_RESOURCE_NAME_BYTES,
    MAX_RESOURCE_UNITS,
    MAX_UNIT_ID_BYTES,
)
from runtime.schedules import (
    CRON_HORIZON_YEARS,
    MAX_CATCH_UP_SLOTS,
    MAX_CRON_BYTES,
    MAX_STARTING_DEADLINE_S,
    MAX_TZ_BYTES,
    MIN_STARTING_DEADLINE_S,
)
from runtime.settings import agent as agent_settings
from runtime.validation import (
    MAX_AUDIT_SINCE_S,
    MAX_BATCH_JOBS,
    MAX_CANCEL_GRACE_MS,
    MAX_DRAIN_DEADLINE_MS,
    MAX_DRAIN_DEADLINE_S,
    MAX_ID,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_LIST_LIMIT,
    MAX_TAIL_LINES,
)

# The identity fields' limits, for LIMITS (runtime.identifiers: ASCII only, a character is a byte).
MAX_ID_BYTES = identifiers.MAX_ID_CHARS
MAX_HOST_NAME_BYTES = identifiers.MAX_HOST_NAME_CHARS
MAX_LABELS = identifiers.MAX_LABELS
MAX_LABEL_NAME_BYTES = identifiers.MAX_LABEL_NAME_CHARS


def check_registration(
    *,
    worker_id: str,
    address: str,
    cpu_millis: int,
    memory_mb: int,
    labels: Mapping[str, str],
    agent_run_id: str,
    registration_seq: int,
) -> None:
    """Check a worker registration (ids, address and labels parsed by :mod:`runtime.identifiers`).

    Raises:
        InvalidArgument: a bad id or agent run id (not empty: with ``registration_seq`` it is the
            registration's idempotency key), address, capacity or labels, or a registration
            number outside 1..MAX_ID.
    """
    identifiers.check_id(worker_id, field="worker_id")
    _text("agent_run_id", agent_run_id, max_bytes=MAX_ID_BYTES, printable=True)
    identifiers.check_id(agent_run_id, field="agent_run_id")
    _int_between("registration_seq", registration_seq, 1, MAX_ID)
    identifiers.parse_address(address, field="address")
    _int_between("cpu_millis", cpu_millis, 1, MAX_CPU_MILLIS)
    _int_between("memory_mb", memory_mb, 1, MAX_MEMORY_MB)
    identifiers.check_labels(labels, field="labels")


def check_leave(*, worker_id: str, incarnation: int, agent_run_id: str) -> None:
    """Check a worker's leave (a clean stop).

    Raises:
        InvalidArgument: bad id, an incarnation outside 1..MAX_ID, or an agent run id empty or
            not an id.
    """
    identifiers.check_id(worker_id, field="worker_id")
    _int_between("incarnation", incarnation, 1, MAX_ID)
    _text("agent_run_id", agent_run_id, max_bytes=MAX_ID_BYTES, printable=True)
    identifiers.check_id(agent_run_id, field="agent_run_id")


def check_assignment_id(assignment_id: int) -> int:
    """Raises InvalidArgument outside 1..MAX_ID."""
    return _int_between("assignment_id", assignment_id, 1, MAX_ID)


def check_incarnation(incarnation: int) -> int:
    """Raises InvalidArgument outside 0..MAX_ID."""
    return _int_between("incarnation", incarnation, 0, MAX_ID)


MAX_HELD_ASSIGNMENTS = 100_000
"""Most assignments a restarted agent may say it holds in one registration."""
MAX_RESTART_HOLD_S = int(agent_settings.MAX_RESTART_HOLD_S)
"""The longest restart hold a heartbeat may ask for, in seconds: a longer restart is an outage."""
MAX_RESTART_HOLD_MS = MAX_RESTART_HOLD_S * 1000


def check_resume(*, resume_incarnation: int, held_assignment_ids: Sequence[int]) -> tuple[int, ...]:
    """Check RegisterWorker's ``resume_incarnation`` and ``held_assignment_ids``; returns the
    held ids, each once, in order.

    Raises:
        InvalidArgument: an incarnation outside 0..MAX_ID; held assignments without one (0), more
            than :data:`MAX_HELD_ASSIGNMENTS`, or an id outside 1..MAX_ID (named by its index).
    """
    _int_between("resume_incarnation", resume_incarnation, 0, MAX_ID)
    held = f"{len(held_assignment_ids)} ids"
    if held_assignment_ids and resume_incarnation == 0:
        rule = "must be empty unless resume_incarnation names the incarnation they belong to"
        raise InvalidArgument("held_assignment_ids", held, rule)
    if len(held_assignment_ids) > MAX_HELD_ASSIGNMENTS:
        raise InvalidArgument("held_assignment_ids", held, f"must hold at most {MAX_HELD_ASSIGNMENTS}")
    for index, aid in enumerate(held_assignment_ids):
        _int_between(f"held_assignment_ids[{index}]", aid, 1, MAX_ID)
    return tuple(dict.fromkeys(held_assignment_ids))


def check_restart_hold_ms(hold_ms: int) -> int:
    """Check a heartbeat's ``restart_hold_ms`` (0: none); raises InvalidArgument outside
    0..MAX_RESTART_HOLD_MS."""
    return _int_between("restart_hold_ms", hold_ms, 0, MAX_RESTART_HOLD_MS)


OUTCOME_STATES = ("succeeded", "failed", "cancelled", "not_started", "fenced")
"""The states a worker reports for an ended job (``agent.messages.JobState``)."""
MAX_OUTCOMES = 10_000
"""Most outcomes one heartbeat or registration may carry."""
MAX_PATH_BYTES = 4096
"""Longest stdout or stderr path an outcome may name (PATH_MAX on Linux, in bytes)."""
MAX_DETAIL_BYTES = 4096
"""Longest detail an outcome may carry (``agent.messages.MAX_OUTCOME_DETAIL_BYTES`` fits it)."""
MAX_OUTCOME_MS = 100 * 365 * 24 * 3600 * 1000
"""Most milliseconds an outcome's ``run_ms`` and ``ended_ago_ms`` may say (100 years, far inside
PostgreSQL's intervals; ``agent.messages.MAX_OUTCOME_MS``)."""


def check_outcome(
    field: str,
    *,
    assignment_id: int,
    job_id: int,
    state: str,
    run_ms: int,
    ended_ago_ms: int,
    stdout_path: str,
    stderr_path: str,
    detail: str,
) -> None:
    """Check one reported job outcome; ``field`` names it in errors (``finished[2]``).

    Raises:
        InvalidArgument: an id, state, duration, path or detail out of its limits, named with
            its place, e.g. ``finished[2].detail``.
    """
    _int_between(f"{field}.assignment_id", assignment_id, 1, MAX_ID)
    _int_between(f"{field}.job_id", job_id, 0, MAX_ID)
    if state not in OUTCOME_STATES:
        raise InvalidArgument(f"{field}.state", state, f"must be one of {', '.join(OUTCOME_STATES)}")
    _int_between(f"{field}.run_ms", run_ms, 0, MAX_OUTCOME_MS)
    _int_between(f"{field}.ended_ago_ms", ended_ago_ms, 0, MAX_OUTCOME_MS)
    _text(f"{field}.stdout_path", stdout_path, max_bytes=MAX_PATH_BYTES, allow_empty=True)
    _text(f"{field}.stderr_path", stderr_path, max_bytes=MAX_PATH_BYTES, allow_empty=True)
    _text(f"{field}.detail", detail, max_bytes=MAX_DETAIL_BYTES, allow_empty=True)


def check_outcomes(outcomes: Sequence[Mapping[str, object]], *, field: str = "finished") -> None:
    """Check the outcomes of a heartbeat or a registration (each item the keyword arguments
    of :func:`check_outcome` but ``field``); raises InvalidArgument for more than
    :data:`MAX_OUTCOMES` or a bad outcome."""
    if len(outcomes) > MAX_OUTCOMES:
        raise InvalidArgument(field, len(outcomes), f"must hold at most {MAX_OUTCOMES} outcomes")
    for index, outcome in enumerate(outcomes):
        check_outcome(f"{field}[{index}]", **outcome)  # type: ignore[arg-type]


@attrs.frozen
class Limit:
    """One limit on what clients and workers send, as the table in ``docs/limits.md`` lists it."""

    fields: str
    """The fields it applies to, named as in the errors (Markdown)."""
    rule: str
    """What is allowed, from the constants it names."""
    constants: tuple[str, ...]
    """The names of this module's constants the rule states."""


def _n(value: int) -> str:
    return f"{value:,}"


LIMITS = (
    Limit("job `name`", f"1 to {_n(MAX_NAME_BYTES)} bytes; no control characters", ("MAX_NAME_BYTES",)),
    Limit("job and worker `cpu_millis`", f"1 to {_n(MAX_CPU_MILLIS)}", ("MAX_CPU_MILLIS",)),
    Limit("job and worker `memory_mb`", f"1 to {_n(MAX_MEMORY_MB)} (16 TiB)", ("MAX_MEMORY_MB",)),
    Limit("job `priority`", f"{_n(-MAX_PRIORITY)} to {_n(MAX_PRIORITY)}", ("MAX_PRIORITY",)),
    Limit("job `sleep.duration_ms`", f"0 to {_n(MAX_SLEEP_MS)} (one week)", ("MAX_SLEEP_MS",)),
    Limit(
        "job `command.argv`",
        f"1 to {_n(MAX_ARGV_ITEMS)} elements, {_n(MAX_ARGV_BYTES)} bytes (64 KiB) in all; the first "
        "not empty",
        ("MAX_ARGV_ITEMS", "MAX_ARGV_BYTES"),
    ),
    Limit(
        "job `container.image`",
        f"1 to {_n(MAX_IMAGE_BYTES)} bytes; a Docker image reference `repository[:tag][@digest]` "
        "(lowercase path components); no whitespace, shell metacharacters or paths",
        ("MAX_IMAGE_BYTES",),
    ),
    Limit("job `container.argv`", "as `command.argv`, but may be empty (the image's own command)", ()),
    Limit("job `max_attempts` (`--max-attempts`)", f"1 to {_n(MAX_ATTEMPTS)}", ("MAX_ATTEMPTS",)),
    Limit(
        "job `retry_backoff_s` (`--retry-backoff-s`)",
        f"0 to {MAX_RETRY_BACKOFF_S:g} seconds, a finite number; also the cap of every retry delay",
        ("MAX_RETRY_BACKOFF_S",),
    ),
    Limit(
        "job `timeout_s` (`--timeout-s`)",
        f"{MIN_TIMEOUT_S:g} to {_n(int(MAX_TIMEOUT_S))} seconds (one week); none by default",
        ("MAX_TIMEOUT_S",),
    ),
    Limit(
        "job `constraints` (`--constraint`)",
        f"at most {_n(MAX_CONSTRAINTS)}; each `key=value`, `key!=value`, `key` or `key in (a,b)` (at "
        f"most {_n(MAX_IN_VALUES)} values), keys and values as worker labels'",
        ("MAX_CONSTRAINTS", "MAX_IN_VALUES"),
    ),
    Limit(
        "job `env` (`--env`)",
        f"at most {_n(MAX_ENV_VARS)} names of 1 to {_n(MAX_ENV_NAME_BYTES)} bytes, each of "
        "`[A-Za-z_][A-Za-z0-9_]*` (a letter or `_`, then letters, digits or `_`) and not starting with "
        f"`STOCKADE_`; values without NUL; {_n(MAX_ENV_BYTES)} bytes (64 KiB) in all",
        ("MAX_ENV_VARS", "MAX_ENV_NAME_BYTES", "MAX_ENV_BYTES"),
    ),
    Limit(
        "job `workdir` (`--workdir`)",
        f"empty, or an absolute path of at most {_n(MAX_WORKDIR_BYTES)} bytes; no control characters",
        ("MAX_WORKDIR_BYTES",),
    ),
    Limit(
        "job `after` (`--after`) and `after_names`",
        f"at most {_n(MAX_AFTER)} job ids and names of jobs of the same batch (a job file's `after` "
        "holds both), each once; names of 1 to 128 bytes",
        ("MAX_AFTER",),
    ),
    Limit(
        "job `array` (`--array FIRST-LAST[%MAX_RUNNING]`)",
        f"indexes 0 to {_n(MAX_ARRAY_INDEX)}, LAST not below FIRST, at most {_n(MAX_ARRAY_TASKS)} tasks",
        ("MAX_ARRAY_INDEX", "MAX_ARRAY_TASKS"),
    ),
    Limit(
        "job `array.max_failed_tasks` (`--max-failed-tasks`)",
        "1 to the array's tasks, with an array only; none (0 on the wire): no limit",
        (),
    ),
    Limit(
        "job `retry_on_exit` (`--retry-on-exit`)",
        f"exit codes {MIN_RETRY_EXIT_CODE} to {MAX_RETRY_EXIT_CODE}, each once; "
        "only with `max_attempts` above 1",
        ("MAX_RETRY_EXIT_CODE",),
    ),
    Limit(
        "job `no_retry_on` (`--no-retry-on`)",
        "failure reasons, each once: "
        + ", ".join(f"`{r}`" for r in FAILURE_REASONS)
        + "; only with `max_attempts` above 1",
        (),
    ),
    Limit(
        "job `resources` (`--resource NAME=COUNT`) and worker `resources` (`stockade agent --resource "
        "NAME=ID,ID,...`)",
        f"at most {_n(MAX_RESOURCE_KINDS)} names of 1 to {_n(MAX_RESOURCE_NAME_BYTES)} characters of "
        f"`[a-z][a-z0-9_-]*`, each once; a job asks 0 to {_n(MAX_RESOURCE_UNITS)} units of each; a worker "
        f"offers at most {_n(MAX_RESOURCE_UNITS)} unit ids of each, each once, of 1 to "
        f"{_n(MAX_UNIT_ID_BYTES)} characters of `A-Z a-z 0-9 . _ : -` starting with a letter or digit",
        ("MAX_RESOURCE_KINDS", "MAX_RESOURCE_NAME_BYTES", "MAX_RESOURCE_UNITS", "MAX_UNIT_ID_BYTES"),
    ),
    Limit(
        "job `tasks` (`--tasks N`: a gang, docs/gangs.md)",
        f"1 to {_n(MAX_GANG_TASKS)} tasks; not with `array`; `spread` only with `tasks`",
        ("MAX_GANG_TASKS",),
    ),
    Limit(
        "`specs` of one SubmitJobs request (`stockade jobs` splits larger batches)",
        f"1 to {_n(MAX_BATCH_JOBS)} jobs, and at most {_n(MAX_BATCH_JOBS)} rows with each array's "
        "and gang's tasks counted",
        ("MAX_BATCH_JOBS",),
    ),
    Limit(
        "ListJobs `limit` (`stockade list --limit`)",
        f"0 to {_n(MAX_LIST_LIMIT)} (0: 100)",
        ("MAX_LIST_LIMIT",),
    ),
    Limit(
        "ListAudit `since_s` (`stockade audit --since-s`)",
        f"0 to {_n(MAX_AUDIT_SINCE_S)} seconds (about 31 years)",
        ("MAX_AUDIT_SINCE_S",),
    ),
    Limit(
        "ids and numbers: `job_id`, a worker's `incarnation` and `registration_seq`, an outcome's "
        "`assignment_id`",
        f"at most {_n(MAX_ID)} (a bigint); job and assignment ids from 1",
        ("MAX_ID",),
    ),
    Limit(
        "`worker_id`, a worker's `agent_run_id`",
        f"1 to {_n(MAX_ID_BYTES)} of `A-Z a-z 0-9 . _ -`, starting with a letter or digit",
        ("MAX_ID_BYTES",),
    ),
    Limit(
        "worker `address`",
        "`host:port`: an IPv4 address, an IPv6 address in brackets or an RFC 1123 host name (at most "
        f"{_n(MAX_HOST_NAME_BYTES)} bytes); a port 1 to 65,535 without leading zeros",
        ("MAX_HOST_NAME_BYTES",),
    ),
    Limit(
        "worker `labels`",
        f"at most {_n(MAX_LABELS)}; keys `[prefix/]name`, values empty or a name: a name is 1 to "
        f"{_n(MAX_LABEL_NAME_BYTES)} of `A-Z a-z 0-9 - _ .`, starting and ending with a letter or "
        "digit (Kubernetes' label syntax)",
        ("MAX_LABELS", "MAX_LABEL_NAME_BYTES"),
    ),
    Limit(
        "`idempotency_key` of a submission or a cancel (`--idempotency-key`)",
        f"1 to {_n(MAX_IDEMPOTENCY_KEY_BYTES)} bytes; no control characters",
        ("MAX_IDEMPOTENCY_KEY_BYTES",),
    ),
    Limit(
        "outcomes (`finished`) of one heartbeat or registration",
        f"at most {_n(MAX_OUTCOMES)}",
        ("MAX_OUTCOMES",),
    ),
    Limit(
        "an outcome's `stdout_path` and `stderr_path`",
        f"at most {_n(MAX_PATH_BYTES)} bytes (PATH_MAX)",
        ("MAX_PATH_BYTES",),
    ),
    Limit("an outcome's `detail`", f"at most {_n(MAX_DETAIL_BYTES)} bytes", ("MAX_DETAIL_BYTES",)),
    Limit(
        "an outcome's `run_ms` and `ended_ago_ms` (the worker's monotonic measures of its run)",
        f"0 to {_n(MAX_OUTCOME_MS)} ms (100 years)",
        ("MAX_OUTCOME_MS",),
    ),
    Limit(
        "ReadJobLogs `tail_lines` (`stockade logs --tail`)",
        f"0 to {_n(MAX_TAIL_LINES)}; `stream` is `stdout` (or empty) or `stderr`",
        ("MAX_TAIL_LINES",),
    ),
    Limit(
        "a restarted agent's `held_assignment_ids` (RegisterWorker, with `resume_incarnation`)",
        f"at most {_n(MAX_HELD_ASSIGNMENTS)}, each an assignment id; none without `resume_incarnation`",
        ("MAX_HELD_ASSIGNMENTS",),
    ),
    Limit(
        "an account's caps (`stockade account set`): `cpu_millis`, `memory_mb`, `max_pending`",
        f"0 to {_n(_accounts.MAX_CAPS['cpu_millis'])}, 0 to {_n(_accounts.MAX_CAPS['memory_mb'])} (the "
        f"largest job's times {_n(_accounts.MAX_QUOTA_WORKERS)} workers), 0 to "
        f"{_n(_accounts.MAX_CAPS['max_pending'])}; `max_priority` {_n(-MAX_PRIORITY)} to "
        f"{_n(MAX_PRIORITY)} (a job's `priority`); `weight` a finite number from "
        f"{_accounts.MIN_WEIGHT:g} to "
        f"{_n(int(_accounts.MAX_WEIGHT))}; the account's `name` as `worker_id`",
        (),
    ),
    Limit(
        "a planned restart's hold: Heartbeat `restart_hold_ms`, `stockade agent --restart-hold-s`",
        f"0 to {_n(MAX_RESTART_HOLD_MS)} ms, 0 to {_n(MAX_RESTART_HOLD_S)} s (ten minutes)",
        ("MAX_RESTART_HOLD_MS", "MAX_RESTART_HOLD_S"),
    ),
    Limit(
        "a drain's deadline: DrainWorker `deadline_ms`, `stockade drain --deadline-s`",
        f"0 to {_n(MAX_DRAIN_DEADLINE_MS)} ms, 0 to {_n(MAX_DRAIN_DEADLINE_S)} s (one week); not NaN",
        ("MAX_DRAIN_DEADLINE_MS", "MAX_DRAIN_DEADLINE_S"),
    ),
    Limit(
        "a Cancel's grace (a preemption's): CancelRequest `grace_ms`",
        f"0 to {_n(MAX_CANCEL_GRACE_MS)} ms (ten minutes); 0: the worker's own `stop_grace_s`",
        ("MAX_CANCEL_GRACE_MS",),
    ),
    Limit(
        "a schedule's `cron` (`stockade schedule add --cron`)",
        f"at most {_n(MAX_CRON_BYTES)} bytes; 5 fields, 6 with a leading second field, or an @alias; "
        f"must name a time within {CRON_HORIZON_YEARS} years (`CRON_HORIZON_YEARS`)",
        ("MAX_CRON_BYTES",),
    ),
    Limit(
        "a schedule's `tz` (`--tz`)",
        f"an IANA time zone name of 1 to {_n(MAX_TZ_BYTES)} bytes",
        ("MAX_TZ_BYTES",),
    ),
    Limit(
        "a schedule's `starting_deadline_s` (`--starting-deadline-s`)",
        f"{MIN_STARTING_DEADLINE_S} to {_n(MAX_STARTING_DEADLINE_S)} seconds (one week); 0: 60",
        ("MAX_STARTING_DEADLINE_S",),
    ),
    Limit(
        "a schedule's catch-up after an outage",
        f"at most {_n(MAX_CATCH_UP_SLOTS)} slots within `starting_deadline_s` fire per pass (the newest); "
        f"older ones are recorded skipped; a pass decides at most {_n(MAX_SLOTS_PER_PASS)} slots of a "
        "schedule (the rest wait for the next passes)",
        ("MAX_CATCH_UP_SLOTS", "MAX_SLOTS_PER_PASS"),
    ),
)
"""Every limit of this module, in the order of ``docs/limits.md``'s table (:func:`limits_table`)."""


def limits_table() -> str:
    """:data:`LIMITS` as the Markdown table of ``docs/limits.md`` (sizes in UTF-8 bytes)."""
    rows = ["| input | limit |", "|---|---|"]
    rows += [f"| {limit.fields} | {limit.rule} |" for limit in LIMITS]
    return "\n".join(rows) + "\n"

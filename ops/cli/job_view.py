"""How ``stockade job`` shows one job (:func:`print_job`) and, with ``--events``, its history
(:func:`events_table`, :func:`events_json`). Imported only when the command runs (it loads rich)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import rich.box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ops.cli.common import console
from ops.cli.render import local_time, runtime_text
from runtime.text import cut_line

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ops.cli.logs import OutputTail
    from ops.client.results import Attempt, Job, JobEvent, JobHistory


def _output_place(info: Job, path: str | None, flag: str) -> str:
    """Where a job's stdout or stderr is: its file on the worker (as the worker names it) once
    the run reported it, or, while it runs, the worker that writes it and the command that reads it."""
    if path:
        return path
    if info.worker_id and info.state in ("assigned", "running"):
        return f"on {info.worker_id} (`stockade logs {info.job_id}{flag}`)"
    return "-"


def print_job(info: Job, tails: list[OutputTail]) -> None:
    """``stockade job``'s view: the job's fields, its runs, then the end of its stdout and stderr."""
    spec = info.spec
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # a value without spaces (a path) wraps, never cut
    duration = "-"
    if info.started_unix_s and info.finished_unix_s:
        duration = f"{info.finished_unix_s - info.started_unix_s:.2f} s"
    rows = [
        ("job", str(info.job_id)),
        ("name", spec.name if spec else "-"),
        ("state", info.state + (f" ({info.reason})" if info.reason else "")),
        ("runtime", cut_line(runtime_text(spec))),
        ("cpu_millis", str(spec.cpu_millis) if spec else "-"),
        ("memory_mb", str(spec.memory_mb) if spec else "-"),
        *((("used", info.usage.describe()),) if info.usage else ()),
        ("priority", str(spec.priority) if spec else "-"),
        # A job waiting to be placed again still names its last run's worker: say so.
        *(
            (("last worker", f"{info.worker_id} (its last run; {_again(info.reason)})"),)
            if info.worker_id and info.state in ("pending", "waiting")
            else (("worker", info.worker_id or "-"),)
        ),
        *((("schedule", schedule_text(info)),) if info.schedule else ()),
        ("assignment", str(info.assignment_id or "-")),
        *((("devices", devices),) if (devices := devices_text(info)) else ()),
        ("epoch", str(info.epoch or "-")),
        *lifecycle_rows(info),
        ("exit code", str(info.exit_code) if info.exit_code is not None else "-"),
        ("submitted", local_time(info.submitted_unix_s)),
        ("started", local_time(info.started_unix_s)),
        ("finished", local_time(info.finished_unix_s)),
        ("duration", duration),
        ("stdout", _output_place(info, info.stdout_path, "")),
        ("stderr", _output_place(info, info.stderr_path, " --stderr")),
    ]
    for key, value in rows:
        table.add_row(key, Text(value))
    console().print(table)
    if info.attempt_history:
        console().print(attempts_view(info.attempt_history, console()))
    for output in tails:
        label = output.stream
        if output.tail is None:
            console().print(Text(f"({label} cannot be read now: {output.error})", style="dim"))
            continue
        if output.dropped_bytes:
            console().print(
                Text(
                    f"({label}: worker {output.worker_id} no longer keeps its first "
                    f"{output.dropped_bytes:,} bytes: over its max_output_mb)",
                    style="dim",
                )
            )
        if not output.tail.lines:
            console().print(f"{label}: empty", style="dim")
            continue
        lines = len(output.tail.lines)
        console().rule(
            f"{label} (last {lines} line{'' if lines == 1 else 's'}, from {output.worker_id})",
            align="left",
            style="dim",
        )
        for line in output.tail.lines:
            console().print(line, markup=False, highlight=False, soft_wrap=True)


def devices_text(info: Job) -> str:
    """The device units its latest run holds (``gpu 0,3``; several resources separated by ``;``),
    ``(freed)`` after them once that run ended; empty when it holds none (docs/devices.md)."""
    run = next((a for a in reversed(info.attempt_history) if a.assignment_id == info.assignment_id), None)
    if run is None or not run.units:
        return ""
    held = "; ".join(f"{name} {','.join(units)}" for name, units in run.units)
    return held if run.state == "active" else f"{held} (freed: its run ended)"


def lifecycle_rows(info: Job) -> list[tuple[str, str]]:
    """``stockade job``'s rows of a job's lifecycle. The retry wait left is told against the time
    the cluster read the job (database time), never this machine's clock; the environment's
    names only (its values may be secrets)."""
    from runtime.jobs import JobSpec

    spec = info.spec or JobSpec(name="", cpu_millis=0, memory_mb=0, runtime=None)
    runs = f"{info.attempts} run{'' if info.attempts == 1 else 's'}"
    lost = "runs lost with a worker count" if spec.count_lost else "runs lost with a worker not counted"
    # A gang's attempts are the gang's, spent by the gang as a whole (its row below).
    spent = info.failures if info.gang is None else info.gang.failures
    whose = "" if info.gang is None else " by the gang"
    rows = [("attempts", f"{spent} of {spec.max_attempts} spent{whose}, {runs} ({lost})")]
    not_before = info.not_before_unix_s or 0.0
    read = info.read_unix_s
    if not_before and (read is None or not_before > read) and info.state in ("pending", "waiting"):
        # Only while the wait lasts: once it has passed the job waits for room like any other.
        clock = datetime.fromtimestamp(not_before).astimezone().strftime("%H:%M:%S")
        left = "" if read is None else f" (in {not_before - read:.0f} s)"
        rows.append(("retry", f"retrying after {clock}{left}"))
    if spec.max_attempts > 1:
        rows.append(("backoff", f"{spec.retry_backoff_s:g} s base, doubling, at most 600 s, jittered"))
    if spec.retry_on_exit or spec.no_retry_on:
        policy = []
        if spec.retry_on_exit:
            policy.append("retried only on exit codes " + ", ".join(map(str, spec.retry_on_exit)))
        if spec.no_retry_on:
            policy.append("failed at once on " + ", ".join(spec.no_retry_on))
        rows.append(("retry policy", "; ".join(policy)))
    rows += [
        ("timeout", "-" if spec.timeout_s is None else f"{spec.timeout_s:g} s"),
        ("constraints", ", ".join(c.describe() for c in spec.constraints) or "-"),
        ("env", ", ".join(name for name, _ in spec.env) or "-"),
        ("workdir", spec.workdir or "- (the job's own folder on its worker)"),
        ("after", ", ".join(map(str, spec.after)) or "-"),
    ]
    if info.array_id:
        rows.append(("array", f"task {info.array_index} of array {info.array_id}"))
    elif spec.array is not None:
        limit = spec.array.max_failed_tasks
        failing = f", failed once {limit} tasks have failed (max_failed_tasks)" if limit else ""
        rows.append(("array", f"{spec.array.describe()} ({spec.array.tasks} tasks{failing})"))
    if info.gang is not None:
        gang = info.gang
        spread = ", spread" if gang.spread else ""
        rows.append(
            (
                "gang",
                f"task {gang.rank} of gang {gang.gang_id} ({gang.size} tasks{spread}): {gang.state}, "
                f"placed {gang.attempts} time{'' if gang.attempts == 1 else 's'}, "
                f"{gang.failures} attempt{'' if gang.failures == 1 else 's'} spent"
                + (f"; {gang.detail}" if gang.detail else ""),
            )
        )
    if info.array_counts:
        rows.append(("tasks", "  ".join(f"{state} {count}" for state, count in info.array_counts)))
    return rows


def attempts_table(attempts: Sequence[Attempt]) -> Table:
    """A job's runs, oldest first, the worker's detail wrapped, never cut."""
    table = Table(box=rich.box.SIMPLE_HEAD, padding=(0, 1), title="attempts", title_justify="left")
    for column in ATTEMPT_COLUMNS:
        table.add_column(
            column, no_wrap=True, justify="right" if column in ("#", "epoch", "exit") else "left"
        )
    table.add_column("detail", ratio=1, min_width=ATTEMPT_DETAIL_MIN_WIDTH, overflow="fold")
    for number, attempt in enumerate(attempts, start=1):
        table.add_row(*_attempt_cells(number, attempt), Text(attempt.detail or "-"))
    return table


ATTEMPT_DETAIL_MIN_WIDTH = 16
ATTEMPT_COLUMNS = ("#", "assignment", "worker", "epoch", "placed", "ended", "end", "exit", "counted")
"""The attempts table's columns before ``detail``, each kept on one line. ``placed`` is when the
leader committed the assignment, not when the run started on its worker."""


def _attempt_cells(number: int, attempt: Attempt) -> tuple[str, ...]:
    return (
        str(number),
        str(attempt.assignment_id),
        attempt.worker_id or "-",
        str(attempt.epoch),
        local_time(attempt.created_unix_s),
        local_time(attempt.ended_unix_s)[11:] or "-",  # the time of day: a run is short
        attempt.end_reason or attempt.state,
        str(attempt.exit_code) if attempt.exit_code is not None else "-",
        "yes" if attempt.counted else "no",
    )


def _table_width(attempts: Sequence[Attempt]) -> int:
    """The columns :func:`attempts_table` needs to show its runs uncut, each detail given
    :data:`ATTEMPT_DETAIL_MIN_WIDTH` (measured on the table drawn 1000 columns wide)."""
    from rich.cells import cell_len

    narrow = [attrs.evolve(attempt, detail="x" * ATTEMPT_DETAIL_MIN_WIDTH) for attempt in attempts]
    wide = Console(width=1000, color_system=None)
    lines = ["".join(segment.text for segment in line) for line in wide.render_lines(attempts_table(narrow))]
    return max(cell_len(line.rstrip()) for line in lines if "─" not in line)


def attempts_view(attempts: Sequence[Attempt], console: Console) -> Group:
    """:func:`attempts_table` when it fits in ``console``'s width, else one paragraph a run
    (``run 1: assignment 21, worker w-3, ...``) that wraps, so that no value is cut."""
    if _table_width(attempts) <= console.width:
        return Group(attempts_table(attempts))
    parts: list[Text] = [Text("attempts", style="italic")]
    for number, attempt in enumerate(attempts, start=1):
        cells = dict(zip(ATTEMPT_COLUMNS, _attempt_cells(number, attempt), strict=True))
        said = ", ".join(f"{column} {cells[column]}" for column in ATTEMPT_COLUMNS[1:])
        parts.append(Text(f"run {number}: {said}: {attempt.detail or '-'}", overflow="fold"))
    return Group(*parts)


def schedule_text(info: Job) -> str:
    """The ``schedule`` row of a job a schedule fired: ``nightly, slot 2026-12-05 01:30:00 UTC
    (02:30:00 CET)``, the slot in UTC and in this machine's local time."""
    if not info.schedule_slot_unix_s:
        return info.schedule or "-"
    slot = datetime.fromtimestamp(info.schedule_slot_unix_s, UTC)
    local = slot.astimezone()
    return f"{info.schedule}, slot {slot:%Y-%m-%d %H:%M:%S} UTC ({local:%H:%M:%S %Z})"


def event_time(unix_s: float | None) -> str:
    """``unix_s`` as local time to the millisecond, ``2026-12-01 12:00:00.123``; ``-`` for none."""
    if not unix_s:
        return "-"
    return datetime.fromtimestamp(unix_s).astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _epoch_text(event: JobEvent) -> str:
    return f"epoch {event.epoch}" + (f" ({event.leader})" if event.leader else "")


def event_text(event: JobEvent) -> str:
    """What ``stockade job ID --events`` says of one event, after its time and kind, e.g.
    ``assignment 5 on w-1 (incarnation 3), epoch 2 (cp-1)``."""
    run = f"assignment {event.assignment_id}"
    exit_code = "" if event.exit_code is None else f", exit code {event.exit_code}"
    # A detail that only repeats the exit code ("exit code 0") is not said twice.
    detail = f": {event.detail}" if event.detail and event.detail != f"exit code {event.exit_code}" else ""
    match event.kind:
        case "placed":
            return f"{run} on {event.worker_id} (incarnation {event.incarnation}), {_epoch_text(event)}"
        case "confirmed":
            return f"{run} running on {event.worker_id} (its first heartbeat listing it)"
        case "worker_dead":
            last = f"; {event.detail}" if event.detail else ""
            return (
                f"{event.worker_id} (incarnation {event.incarnation}) declared dead, "
                f"{_epoch_text(event)}{last}"
            )
        case "ended":
            outcome = f", reported {event.outcome}" if event.outcome and event.outcome != event.reason else ""
            fenced = f", fenced at {_epoch_text(event)}" if event.epoch else ""
            return f"{run} {event.state} ({event.reason}){outcome}{exit_code}{fenced}{detail}"
        case "requeued":
            wait = ""
            if event.not_before_unix_s:
                wait = f", not placed before {event_time(event.not_before_unix_s)}"
            return f"pending again after {run}{wait}"
        case "final":
            return f"{event.state}{exit_code}{detail}"
        case "cancel_requested":
            return "a cancel was asked" + (f": {event.detail}" if event.detail else "")
        case _:
            return event.detail or ""


def events_table(history: JobHistory) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True, style="bold")
    table.add_column(ratio=1)
    for event in history.events:
        table.add_row(event_time(event.at_unix_s), event.kind, Text(event_text(event)))
    if not history.events or history.events[-1].kind != "final":
        table.add_row("now", history.state, Text(""))
    return table


_EVENT_KEYS = (
    "kind", "at_unix_s", "assignment_id", "worker_id", "incarnation", "epoch", "leader", "state", "reason",
    "outcome", "exit_code", "detail", "not_before_unix_s",
)  # fmt: skip
"""The keys of :func:`event_json`, in its order: the names of :class:`JobEvent`'s fields."""


def event_json(event: JobEvent) -> dict[str, Any]:
    """One event of a job's history as JSON, every key of :data:`_EVENT_KEYS` always present
    (null where it does not apply: :class:`ops.client.results.JobEvent`)."""
    return {key: getattr(event, key) for key in _EVENT_KEYS}


def events_json(history: JobHistory) -> list[dict[str, Any]]:
    """``stockade job ID --events --json``: the events, oldest first, then for a job that has
    not ended an entry of kind ``now`` with its state (every other key null)."""
    listed = [event_json(event) for event in history.events]
    if not history.events or history.events[-1].kind != "final":
        now = dict.fromkeys(_EVENT_KEYS)
        listed.append({**now, "kind": "now", "state": history.state})
    return listed


def _again(reason: str | None) -> str:
    """When a pending job that ran before is placed again, by its reason: a preempted or
    drained job at once (no backoff), any other after its backoff, if any."""
    if (reason or "").startswith("preempted by job"):
        return "placed again as soon as there is room"
    return "placed again after its backoff"

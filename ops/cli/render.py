"""How client commands show what the control planes answer: the status view, a job's runtime
in one line, times, a job's history (``job --events``), and the JSON of ``status``, ``job``,
``job --events`` and ``list`` (each built from the same result the table is). They read the
client's typed results (:mod:`ops.client.results`), never protobuf messages.

Imported only by the commands that render, when they run (it loads rich): ``stockade --help``
does not pay for it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs
import rich.box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ops.client.results import Attempt, ClusterStatus, Job, JobEvent, JobHistory, Worker
    from runtime.jobs import JobSpec


def local_time(unix_s: float | None) -> str:
    """``unix_s`` as local time, ``2026-12-01 12:00:00``; ``-`` for none."""
    if not unix_s:
        return "-"
    return datetime.fromtimestamp(unix_s).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _bar(used: int, total: int, unit: str, width: int = 14) -> Text:
    fraction = min(1.0, used / total) if total > 0 else 0.0
    filled = round(fraction * width)
    colour = "green" if fraction < 0.7 else ("yellow" if fraction < 0.9 else "red")
    text = Text()
    text.append("█" * filled, style=colour)
    text.append("░" * (width - filled), style="grey50")
    text.append(f" {used}/{total}{unit}")
    return text


def _job_ids(ids: list[int], limit: int = 10) -> str:
    shown = " ".join(str(i) for i in ids[:limit])
    if len(ids) > limit:
        shown += f" +{len(ids) - limit} more"
    return shown or "-"


def _counts(status: ClusterStatus) -> dict[str, int]:
    """Jobs per state, every state in the order the control plane sends them (all of them,
    pending first, zeros included)."""
    return dict(status.job_counts)


def status_json(status: ClusterStatus, metrics: dict[str, str] | None = None) -> dict[str, Any]:
    """The stable JSON shape of ``stockade status --json``.

    Keys: ``leader`` (id or null), ``epoch``, ``control_planes`` ({id, address, role}),
    ``workers`` ({id, state, cpu_millis, memory_mb, cpu_allocated_millis,
    memory_allocated_mb, jobs, cordoned, draining, drained, drain_deadline_unix_s, labels,
    unhealthy, unhealthy_reason, unhealthy_since_unix_s}: cordoned,
    no new placements, a drain cordons too; draining, a drain asked and jobs left on it;
    drained, a drain asked and no job left; the drain's deadline in Unix seconds, or null for
    none; labels, key -> value; unhealthy, its recent runs fail where the same jobs do not
    fail elsewhere (no new placement but a probe), why (null when healthy) and since when in Unix
    seconds (null when healthy)), ``jobs`` (counts keyed by state), ``unschedulable``
    ({job_id, reason}), ``heartbeat`` ({interval_s, dead_after_s, reason}: the heartbeat
    interval the cluster tells its workers, how long a silent worker goes before it is declared
    dead, and why; nulls when the control plane did not say) and ``metrics`` (id of a process
    or worker of the local cluster -> ``host:port`` of its Prometheus /metrics; empty for a
    cluster that is not local).
    """
    return {
        "leader": status.leader,
        "epoch": status.epoch,
        "control_planes": [
            {"id": cp.id, "address": cp.address, "role": cp.role} for cp in status.control_planes
        ],
        "workers": [
            {
                "id": w.id,
                "state": w.state,
                "cpu_millis": w.cpu_millis,
                "memory_mb": w.memory_mb,
                "cpu_allocated_millis": w.cpu_allocated_millis,
                "memory_allocated_mb": w.memory_allocated_mb,
                "jobs": list(w.job_ids),
                "cordoned": w.cordoned,
                "draining": w.draining,
                "drained": w.drained,
                "drain_deadline_unix_s": w.drain_deadline_unix_s,
                "labels": dict(w.labels),
                "unhealthy": w.unhealthy,
                "unhealthy_reason": w.unhealthy_reason or None,
                "unhealthy_since_unix_s": w.unhealthy_since_unix_s,
            }
            for w in status.workers
        ],
        "jobs": _counts(status),
        "unschedulable": [{"job_id": j.job_id, "reason": j.reason or ""} for j in status.unschedulable],
        "heartbeat": {
            "interval_s": status.heartbeat_interval_s,
            "dead_after_s": status.dead_after_s,
            "reason": status.heartbeat_policy or None,
        },
        "metrics": dict(metrics or {}),
    }


def worker_schedule(worker: Worker) -> str:
    """A worker's drain or cordon in a word, for the status table's state column: ``drained``,
    ``draining`` (with ``until HH:MM:SS`` when it has a deadline), ``cordoned``, or ``""``."""
    if worker.drained:
        return "drained"
    if worker.draining:
        if worker.drain_deadline_unix_s:
            until = datetime.fromtimestamp(worker.drain_deadline_unix_s).astimezone().strftime("%H:%M:%S")
            return f"draining until {until}"
        return "draining"
    return "cordoned" if worker.cordoned else ""


def render_status(status: ClusterStatus, metrics: dict[str, str] | None = None) -> Group:
    """The status view: leader, control planes, workers with bars, job counts, unschedulable;
    with ``metrics`` (id -> ``host:port``, see :func:`status_json`) a metrics column too."""
    metrics = metrics or {}
    parts: list[Any] = []
    if status.leader:
        parts.append(
            Text.assemble(
                ("leader ", "bold"),
                (status.leader, "bold green"),
                f"  epoch {status.epoch}  (answered by {status.answered_by})",
            )
        )
    else:
        parts.append(
            Text.assemble(
                ("no leader", "bold red"), f"  last epoch {status.epoch}  (answered by {status.answered_by})"
            )
        )

    if status.heartbeat_interval_s is not None and status.dead_after_s is not None:
        parts.append(
            Text(
                f"heartbeats every {status.heartbeat_interval_s:g} s; a silent worker is declared dead"
                f" after {status.dead_after_s:g} s ({status.heartbeat_policy or 'not said why'})",
                style="dim",
            )
        )

    cps = Table(box=rich.box.SIMPLE_HEAD, title="control planes", title_justify="left")
    for column in ("id", "address", "role", *(("metrics",) if metrics else ())):
        cps.add_column(column)
    role_style = {"leader": "bold green", "standby": "", "down": "red"}
    for cp in status.control_planes:
        cps.add_row(
            cp.id,
            cp.address,
            Text(cp.role, style=role_style.get(cp.role, "")),
            *((metrics.get(cp.id, "-"),) if metrics else ()),
        )
    parts.append(cps)

    workers = Table(box=rich.box.SIMPLE_HEAD, title="workers", title_justify="left")
    for column in (
        "id",
        "state",
        "cpu (millis)",
        "memory (MiB)",
        "labels",
        "jobs",
        *(("metrics",) if metrics else ()),
    ):
        # Labels wrap at their commas rather than being cut (a narrow terminal).
        workers.add_column(column, overflow="fold" if column == "labels" else "ellipsis")
    for w in status.workers:
        state = Text(w.state, style={"alive": "green", "left": "yellow"}.get(w.state, "red"))
        schedule = worker_schedule(w)
        if schedule:
            state.append(f", {schedule}", style="yellow")
        if w.unhealthy:
            state.append(", unhealthy", style="bold red")
        workers.add_row(
            w.id,
            state,
            _bar(w.cpu_allocated_millis, w.cpu_millis, ""),
            _bar(w.memory_allocated_mb, w.memory_mb, ""),
            Text(", ".join(f"{k}={v}" for k, v in w.labels) or "-"),
            _job_ids(list(w.job_ids)),
            *((metrics.get(w.id, "-"),) if metrics else ()),
        )
    parts.append(workers)
    sick = [w for w in status.workers if w.unhealthy]
    if sick:
        # Why each unhealthy worker takes no placements (a probe now and then), and since when.
        table = Table(box=rich.box.SIMPLE_HEAD, title="unhealthy workers", title_justify="left")
        for column in ("worker", "since", "reason"):
            table.add_column(column, overflow="fold" if column == "reason" else "ellipsis")
        for w in sick:
            since = w.unhealthy_since_unix_s
            at = "-" if since is None else datetime.fromtimestamp(since).astimezone().strftime("%H:%M:%S")
            table.add_row(w.id, at, Text(w.unhealthy_reason))
        parts.append(table)

    counts = _counts(status)
    parts.append(Text("jobs  " + "  ".join(f"{state} {count}" for state, count in counts.items())))
    if status.unschedulable:
        stuck = Table(box=rich.box.SIMPLE_HEAD, title="unschedulable", title_justify="left")
        stuck.add_column("job")
        stuck.add_column("reason")
        for job in status.unschedulable:
            stuck.add_row(str(job.job_id), Text(job.reason or ""))
        parts.append(stuck)
    return Group(*parts)


def runtime_text(spec: JobSpec | None) -> str:
    """A job's runtime in one line (``sleep 2.5 s``, ``command: echo 'a b'``, ``container app:1 --
    echo hi``), ``-`` if none."""
    return "-" if spec is None else spec.describe()


def lifecycle_rows(info: Job) -> list[tuple[str, str]]:
    """``stockade job``'s rows of a job's lifecycle: attempts spent of its most, the retry
    wait (``retrying after 14:02:07 (in 3 s)``: how long is left is told against the time the
    cluster read the job, database time, never this machine's clock; without that time, the
    wait's end alone), backoff, timeout, constraints, the names of its environment (not the
    values: they may be secrets), working directory, the jobs it waits for, its array."""
    from runtime.jobs import JobSpec

    spec = info.spec or JobSpec(name="", cpu_millis=0, memory_mb=0, runtime=None)
    runs = f"{info.attempts} run{'' if info.attempts == 1 else 's'}"
    lost = "runs lost with a worker count" if spec.count_lost else "runs lost with a worker not counted"
    rows = [("attempts", f"{info.failures} of {spec.max_attempts} spent, {runs} ({lost})")]
    not_before = info.not_before_unix_s or 0.0
    read = info.read_unix_s
    if not_before and (read is None or not_before > read) and info.state in ("pending", "waiting"):
        # Only while the wait lasts: once it has passed the job waits for room like any other.
        clock = datetime.fromtimestamp(not_before).astimezone().strftime("%H:%M:%S")
        left = "" if read is None else f" (in {not_before - read:.0f} s)"
        rows.append(("retry", f"retrying after {clock}{left}"))
    if spec.max_attempts > 1:
        rows.append(("backoff", f"{spec.retry_backoff_s:g} s base, doubling, at most 600 s, jittered"))
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
        rows.append(("array", f"{spec.array.describe()} ({spec.array.tasks} tasks)"))
    if info.array_counts:
        rows.append(("tasks", "  ".join(f"{state} {count}" for state, count in info.array_counts)))
    return rows


def attempts_table(attempts: Sequence[Attempt]) -> Table:
    """A job's runs, oldest first: assignment, worker, epoch, start and end, how it ended, exit
    code, whether it spent an attempt, and the worker's detail (wrapped, never cut)."""
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
"""The fewest columns the attempts table gives a run's detail."""
ATTEMPT_COLUMNS = ("#", "assignment", "worker", "epoch", "placed", "ended", "end", "exit", "counted")
"""The attempts table's columns before ``detail``: short values, each kept on one line. ``placed``
is when the leader committed the assignment (``created_unix_s``), not when the run started on
its worker (a later heartbeat confirms that; the job's own ``started`` is its first run's)."""


def _attempt_cells(number: int, attempt: Attempt) -> tuple[str, ...]:
    """One run's values in :data:`ATTEMPT_COLUMNS` order."""
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
    :data:`ATTEMPT_DETAIL_MIN_WIDTH` (measured on the table drawn where nothing limits it: its
    rows' text up to their last character; the rule under the header spans any width)."""
    from rich.cells import cell_len

    narrow = [attrs.evolve(attempt, detail="x" * ATTEMPT_DETAIL_MIN_WIDTH) for attempt in attempts]
    wide = Console(width=1000, color_system=None)
    lines = ["".join(segment.text for segment in line) for line in wide.render_lines(attempts_table(narrow))]
    return max(cell_len(line.rstrip()) for line in lines if "─" not in line)


def attempts_view(attempts: Sequence[Attempt], console: Console) -> Group:
    """A job's runs as ``console`` can show them: :func:`attempts_table` when it fits in its
    width, else one paragraph a run (``run 1: assignment 21, worker w-3, ...``) that wraps where
    the terminal ends, so that no value is cut."""
    if _table_width(attempts) <= console.width:
        return Group(attempts_table(attempts))
    parts: list[Text] = [Text("attempts", style="italic")]
    for number, attempt in enumerate(attempts, start=1):
        cells = dict(zip(ATTEMPT_COLUMNS, _attempt_cells(number, attempt), strict=True))
        said = ", ".join(f"{column} {cells[column]}" for column in ATTEMPT_COLUMNS[1:])
        parts.append(Text(f"run {number}: {said}: {attempt.detail or '-'}", overflow="fold"))
    return Group(*parts)


def seconds_text(value: float | None) -> str:
    """``value`` seconds as ``1.23 s``, or ``-`` when there is none."""
    return "-" if value is None else f"{value:.2f} s"


def runtime_json(spec: JobSpec | None) -> dict[str, Any] | None:
    """A job's runtime as JSON: ``{"kind": "command", "argv": [...]}``,
    ``{"kind": "container", "image": "app:1", "argv": [...]}``, ``{"kind": "sleep",
    "duration_s": 2.5}``, or null when it has none."""
    from runtime.jobs import CommandRuntime, ContainerRuntime, SleepRuntime

    match None if spec is None else spec.runtime:
        case CommandRuntime(argv=argv):
            return {"kind": "command", "argv": list(argv)}
        case ContainerRuntime(image=image, argv=argv):
            return {"kind": "container", "image": image, "argv": list(argv)}
        case SleepRuntime(duration_ms=duration_ms):
            return {"kind": "sleep", "duration_s": duration_ms / 1000}
        case _:
            return None


def attempt_json(attempt: Attempt) -> dict[str, Any]:
    """One run of a job as JSON: ``assignment_id``, ``worker_id``, ``epoch``, ``state`` (active,
    finished, cancelled, lost, stopped), ``end_reason`` (or null while active), ``exit_code``
    (or null), ``created_unix_s``, ``ended_unix_s`` (or null), ``detail`` (or null) and
    ``counted`` (whether it spent one of the job's attempts)."""
    return {
        "assignment_id": attempt.assignment_id,
        "worker_id": attempt.worker_id,
        "epoch": attempt.epoch,
        "state": attempt.state,
        "end_reason": attempt.end_reason,
        "exit_code": attempt.exit_code,
        "created_unix_s": attempt.created_unix_s,
        "ended_unix_s": attempt.ended_unix_s,
        "detail": attempt.detail,
        "counted": attempt.counted,
    }


def job_status_json(info: Job) -> dict[str, Any]:
    """What the cluster reports of a job, apart from its spec: the ``status`` of :func:`job_json`.

    Keys: ``job_id``, ``state`` (waiting, pending, assigned, running, succeeded, failed,
    cancelled), ``reason`` (why it is in that state, or null), ``worker_id``,
    ``assignment_id`` and ``epoch`` (of its latest assignment, or null before any),
    ``attempts`` (times placed), ``failures`` (attempts spent), ``exit_code`` (or null),
    ``submitted_unix_s``, ``started_unix_s``, ``finished_unix_s`` and ``not_before_unix_s``
    (a retry's earliest start; Unix seconds, or null), ``array_id`` and ``array_index`` (of an
    array's task, else null), ``array_counts`` (of an array: tasks by state), ``attempt_history``
    (each run, oldest first, as :func:`attempt_json` gives it), ``stdout_path`` and
    ``stderr_path`` (on the worker's machine, or null).
    """
    return {
        "job_id": info.job_id,
        "state": info.state,
        "reason": info.reason,
        "worker_id": info.worker_id,
        "assignment_id": info.assignment_id,
        "epoch": info.epoch,
        "attempts": info.attempts,
        "failures": info.failures,
        "exit_code": info.exit_code,
        "submitted_unix_s": info.submitted_unix_s,
        "started_unix_s": info.started_unix_s,
        "finished_unix_s": info.finished_unix_s,
        "not_before_unix_s": info.not_before_unix_s,
        "array_id": info.array_id,
        "array_index": info.array_index,
        "array_counts": dict(info.array_counts),
        "attempt_history": [attempt_json(a) for a in info.attempt_history],
        "stdout_path": info.stdout_path,
        "stderr_path": info.stderr_path,
    }


def job_json(info: Job) -> dict[str, Any]:
    """The stable JSON shape of one job, as ``stockade job --json`` prints it and ``stockade
    list --json`` lists it: a job file (:mod:`ops.jobfile`), so ``stockade run`` submits it
    again as it is.

    Keys: the job's fields, every one given (``name``, ``cpu_millis``, ``memory_mb``,
    ``priority``, the runtime: ``sleep_s``, or ``command``, or ``image`` and ``command``; then
    ``max_attempts``, ``retry_backoff_s``, ``count_lost``, ``timeout_s``, ``constraints``,
    ``env``, ``workdir``, ``after``, ``array``; null for none: :func:`ops.jobfile.fields_of`),
    then ``status``, what the cluster reports (:func:`job_status_json`), which a job file
    may hold and ``stockade run`` ignores. A reply without its spec has ``status`` alone.
    """
    from ops.jobfile import fields_of

    fields = {} if info.spec is None else fields_of(info.spec)
    return {**fields, "status": job_status_json(info)}


def list_json(jobs: Sequence[Job]) -> dict[str, Any]:
    """The stable JSON shape of ``stockade list --json``.

    Keys: ``jobs``, newest first, each as :func:`job_json` gives it.
    """
    return {"jobs": [job_json(info) for info in jobs]}


def event_time(unix_s: float | None) -> str:
    """``unix_s`` as local time to the millisecond, ``2026-12-01 12:00:00.123``; ``-`` for none."""
    if not unix_s:
        return "-"
    return datetime.fromtimestamp(unix_s).astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _epoch_text(event: JobEvent) -> str:
    return f"epoch {event.epoch}" + (f" ({event.leader})" if event.leader else "")


def event_text(event: JobEvent) -> str:
    """What ``stockade job ID --events`` says of one event, after its time and kind: for a
    placement ``assignment 5 on w-1 (incarnation 3), epoch 2 (cp-1)``, for a death ``w-1
    (incarnation 3) declared dead, epoch 3 (cp-2); last heartbeat 12:00:01.250 UTC``, for an end
    ``assignment 5 lost (worker_dead), fenced at epoch 3 (cp-2)``."""
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
            return "a cancel was asked"
        case _:
            return event.detail or ""


def events_table(history: JobHistory) -> Table:
    """``stockade job ID --events``: one row per event, oldest first: time, kind, what."""
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
    "kind",
    "at_unix_s",
    "assignment_id",
    "worker_id",
    "incarnation",
    "epoch",
    "leader",
    "state",
    "reason",
    "outcome",
    "exit_code",
    "detail",
    "not_before_unix_s",
)
"""The keys of :func:`event_json`, in its order: the names of :class:`JobEvent`'s fields."""


def event_json(event: JobEvent) -> dict[str, Any]:
    """One event of a job's history as JSON, every key always present (null where it does not
    apply): ``kind``, ``at_unix_s``, ``assignment_id``, ``worker_id``, ``incarnation``,
    ``epoch``, ``leader``, ``state``, ``reason``, ``outcome``, ``exit_code``, ``detail``,
    ``not_before_unix_s`` (:class:`ops.client.results.JobEvent` says which kind has which)."""
    return {key: getattr(event, key) for key in _EVENT_KEYS}


def events_json(history: JobHistory) -> list[dict[str, Any]]:
    """``stockade job ID --events --json``: the events as a JSON list, oldest first
    (:func:`event_json`); for a job that has not ended, a last entry of kind ``now`` with its
    state now (every other key null), as the table's last row."""
    listed = [event_json(event) for event in history.events]
    if not history.events or history.events[-1].kind != "final":
        now = dict.fromkeys(_EVENT_KEYS)
        listed.append({**now, "kind": "now", "state": history.state})
    return listed

"""How client commands show what the control planes answer (:mod:`ops.client.results`): the
status view, the tables of ``jobs`` and ``list``, what a ``cancel`` came to, and the JSON of
``status``, ``job`` and ``list``. Imported only when a command renders: it loads rich.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs
import rich.box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ops.cli.status_json import devices_in_use, status_json  # noqa: F401  (status_json: its old home)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ops.client.admin_results import Account, AuditEntry
    from ops.client.results import Attempt, ClusterStatus, Job, Worker
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
    text.append(f"\n{used}/{total}{unit}")
    return text


_WHOLE_COLUMNS = frozenset({"id", "cpu (millis)", "memory (MiB)", "labels", "metrics"})
"""The status view's worker columns that are never wrapped to fit a narrow terminal."""


def _job_ids(ids: list[int], limit: int = 10) -> str:
    shown = " ".join(str(i) for i in ids[:limit])
    if len(ids) > limit:
        shown += f" +{len(ids) - limit} more"
    return shown or "-"


def worker_devices(worker: Worker) -> str:
    """A worker's devices in one cell: ``gpu 3/8`` (in use / offered) per resource; ``-`` for none."""
    held = dict(worker.resources_in_use)
    return (
        ", ".join(f"{name} {len(held.get(name, ()))}/{len(units)}" for name, units in worker.resources) or "-"
    )


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

    def table(title: str) -> Table:
        return Table(box=rich.box.SIMPLE_HEAD, title=title, title_justify="left")

    cps = table("control planes")
    for column in ("id", "address", "role", *(("metrics",) if metrics else ())):
        cps.add_column(column)
    role_style = {"leader": "bold green", "standby": "", "down": "red"}
    # Cells are Text, not str: rich would read a str as markup and emoji codes (an IPv6
    # address's "[::1]" vanished) and run its highlighter over it.
    for cp in status.control_planes:
        cps.add_row(
            Text(cp.id),
            Text(cp.address),
            Text(cp.role, style=role_style.get(cp.role, "")),
            *((Text(metrics.get(cp.id, "-")),) if metrics else ()),
        )
    parts.append(cps)

    workers = table("workers")
    for column in (
        "id",
        "state",
        "cpu (millis)",
        "memory (MiB)",
        "labels",
        *(("devices",) if any(w.resources for w in status.workers) else ()),
        *(("used",) if any(w.usage for w in status.workers) else ()),
        "jobs",
        *(("metrics",) if metrics else ()),
    ):
        # A narrow terminal wraps the state, usage and jobs at their spaces (and folds a word
        # longer than its column rather than cut it); an id, a bar (its figures below it), the
        # labels (one to a line) and an address are never wrapped, down to about 100 columns.
        whole = column in _WHOLE_COLUMNS
        workers.add_column(column, no_wrap=whole, overflow="ellipsis" if whole else "fold")
    for w in status.workers:
        state = Text(w.state, style={"alive": "green", "left": "yellow"}.get(w.state, "red"))
        schedule = worker_schedule(w)
        if schedule:
            state.append(f", {schedule}", style="yellow")
        if w.unhealthy:
            state.append(", unhealthy", style="bold red")
        workers.add_row(
            Text(w.id),
            state,
            _bar(w.cpu_allocated_millis, w.cpu_millis, ""),
            _bar(w.memory_allocated_mb, w.memory_mb, ""),
            Text("\n".join(f"{k}={v}" for k, v in w.labels) or "-"),
            *((Text(worker_devices(w)),) if any(x.resources for x in status.workers) else ()),
            *(
                (Text(w.usage.describe() if w.usage else "-"),)
                if any(x.usage for x in status.workers)
                else ()
            ),
            Text(_job_ids(list(w.job_ids))),
            *((Text(metrics.get(w.id, "-")),) if metrics else ()),
        )
    parts.append(workers)
    sick = [w for w in status.workers if w.unhealthy]
    if sick:
        unhealthy = table("unhealthy workers")
        for column in ("worker", "since", "reason"):
            unhealthy.add_column(column, overflow="fold" if column == "reason" else "ellipsis")
        for w in sick:
            since = w.unhealthy_since_unix_s
            at = "-" if since is None else datetime.fromtimestamp(since).astimezone().strftime("%H:%M:%S")
            unhealthy.add_row(Text(w.id), Text(at), Text(w.unhealthy_reason))
        parts.append(unhealthy)

    devices = devices_in_use(status)
    if devices:
        parts.append(
            Text(
                "devices in use  "
                + "  ".join(f"{name} {d['in_use']}/{d['offered']}" for name, d in devices.items())
            )
        )
    counts = dict(status.job_counts)
    parts.append(Text("jobs  " + "  ".join(f"{state} {count}" for state, count in counts.items())))
    if status.unschedulable:
        stuck = table("unschedulable")
        stuck.add_column("job")
        stuck.add_column("reason")
        for job in status.unschedulable:
            gang = "" if job.gang is None else f" (gang of {job.gang.size})"
            stuck.add_row(Text(f"{job.job_id}{gang}"), Text(job.reason or ""))
        parts.append(stuck)
    return Group(*parts)


def runtime_text(spec: JobSpec | None) -> str:
    """A job's runtime in one line (``sleep 2.5 s``, ``command: echo 'a b'``, ``container app:1 --
    echo hi``), ``-`` if none."""
    return "-" if spec is None else spec.describe()


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
    """One run of a job as JSON: its fields by name, in order (``assignment_id``, ``worker_id``,
    ``epoch``, ``state``, ``end_reason``, ``exit_code``, ``created_unix_s``, ``ended_unix_s``,
    ``detail``, ``counted``; null where the client's :class:`~ops.client.results.Attempt` has None)."""
    import attrs

    return attrs.asdict(attempt)


def job_status_json(info: Job) -> dict[str, Any]:
    """What the cluster reports of a job, apart from its spec: the ``status`` of :func:`job_json`.

    Keys: ``job_id``, ``state``, ``reason`` (or null), ``worker_id``, ``assignment_id`` and
    ``epoch`` (of its latest assignment, or null), ``attempts`` (times placed), ``failures``
    (attempts spent), ``exit_code``, ``submitted_unix_s``, ``started_unix_s``,
    ``finished_unix_s`` and ``not_before_unix_s`` (Unix seconds, or null), ``array_id`` and
    ``array_index`` (or null), ``array_counts`` (tasks by state), ``attempt_history`` (oldest
    first, :func:`attempt_json`), ``stdout_path`` and ``stderr_path`` (or null), ``owner`` (the
    account that submitted it, or null), ``gang`` (a gang's task: its gang's id, its rank, the
    gang's size, spread, state, attempts, failures and detail; or null), ``schedule`` and
    ``schedule_slot_unix_s`` (a job a schedule fired: its name and the slot; or null),
    ``usage`` ({cpu_millis, memory_mb, age_s}: what its current run used lately, from its
    cgroup; or null).
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
        "owner": info.owner,
        "gang": None if info.gang is None else attrs.asdict(info.gang),
        "schedule": info.schedule,
        "schedule_slot_unix_s": info.schedule_slot_unix_s,
        "usage": None if info.usage is None else attrs.asdict(info.usage),
    }


def job_json(info: Job) -> dict[str, Any]:
    """The stable JSON shape of one job, as ``stockade job --json`` prints it and ``stockade
    list --json`` lists it: a job file (:mod:`ops.jobfile`), so ``stockade run`` submits it
    again as it is.

    Keys: the job's fields, every one given (:func:`ops.jobfields.fields_of`), then ``status``
    (:func:`job_status_json`), which ``stockade run`` ignores. A reply without its spec has
    ``status`` alone.
    """
    from ops.jobfields import fields_of

    fields = {} if info.spec is None else fields_of(info.spec)
    return {**fields, "status": job_status_json(info)}


def list_json(jobs: Sequence[Job]) -> dict[str, Any]:
    """``stockade list --json``: ``{"jobs": [...]}``, newest first, each as :func:`job_json`."""
    return {"jobs": [job_json(info) for info in jobs]}


def print_submitted(ids: list[int], specs: list[JobSpec]) -> None:
    """``stockade jobs``' table of the sleep jobs it submitted, then their ids on one line."""
    from ops.cli.common import console
    from runtime.jobs import SleepRuntime

    table = Table(box=rich.box.SIMPLE_HEAD)
    for column in ("job", "name", "cpu_millis", "memory_mb", "sleep"):
        table.add_column(column, justify="right" if column != "name" else "left")
    for job_id, spec in zip(ids, specs, strict=True):
        assert isinstance(spec.runtime, SleepRuntime)
        duration = f"{spec.runtime.duration_ms / 1000:g} s"
        table.add_row(str(job_id), spec.name, str(spec.cpu_millis), str(spec.memory_mb), duration)
    console().print(table)
    console().print(f"submitted {len(ids)} jobs: {' '.join(map(str, ids))}")


def print_jobs(jobs: tuple[Job, ...]) -> None:
    """``stockade list``'s table, one job a row, and how many there are."""
    from ops.cli.common import console
    from runtime.jobs import task_name
    from runtime.text import cut_line

    table = Table(box=rich.box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("job", justify="right", no_wrap=True)
    table.add_column("name", no_wrap=True, max_width=20)
    table.add_column("owner", no_wrap=True, max_width=16)
    table.add_column("state", no_wrap=True)
    table.add_column("cpu", justify="right", no_wrap=True)
    table.add_column("MiB", justify="right", no_wrap=True)
    table.add_column("worker", no_wrap=True)
    table.add_column("tries", justify="right", no_wrap=True)
    table.add_column("exit", justify="right", no_wrap=True)
    table.add_column("runtime / reason", ratio=1)
    for info in jobs:
        spec = info.spec
        detail = cut_line(runtime_text(spec)) + (f"  ({info.reason})" if info.reason else "")
        table.add_row(
            str(info.job_id),
            Text(task_name(spec.name, info.array_index if info.gang is None else info.gang.rank))
            if spec
            else "-",
            Text(info.owner or "-"),
            info.state,
            str(spec.cpu_millis) if spec else "-",
            str(spec.memory_mb) if spec else "-",
            info.worker_id or "-",
            str(info.attempts),
            str(info.exit_code) if info.exit_code is not None else "-",
            Text(detail),
        )
    console().print(table)
    console().print(f"{len(jobs)} job{'' if len(jobs) == 1 else 's'}")


def cancel_verdict(job_id: int, job: Job) -> str:
    """What a cancel came to, from the job's state: cancelled, or ended on its own first (with
    the exit code when there is one), or still on its way (``cancelling``)."""
    exit_code = f", exit code {job.exit_code}" if job.exit_code is not None else ""
    if job.state == "cancelled":
        return f"job {job_id}: cancelled"
    if job.state in ("succeeded", "failed"):
        return f"job {job_id}: {job.state} before the cancel took effect{exit_code}"
    return f"job {job_id}: cancelling (still {job.state})"


def array_cancel_verdict(array_id: int, tasks: int, job: Job | None) -> str:
    """What a cancel of ``tasks`` tasks of an array came to; ``job`` (its first task, or None)
    carries the array's counts."""
    from ops.client.results import OPEN_STATES

    counts = {} if job is None else dict(job.array_counts)
    still = sum(counts.get(state, 0) for state in OPEN_STATES)
    if job is not None and not still:
        return f"array {array_id}: {tasks} tasks cancelled"
    return f"array {array_id}: cancelling {tasks} tasks" + (f" ({still} not ended yet)" if still else "")


def audit_json(entries: Sequence[AuditEntry]) -> dict[str, Any]:
    """``stockade audit --json``: ``{"entries": [...]}``, newest first, each with ``id``,
    ``at_unix_s``, ``role``, ``actor_id``, ``account``, ``address``, ``action``, ``target_ids``
    and ``arguments``."""
    keys = ("id", "at_unix_s", "role", "actor_id", "account", "address", "action")
    return {
        "entries": [
            {
                **{key: getattr(e, key) for key in keys},
                "target_ids": list(e.target_ids),
                "arguments": e.arguments,
            }
            for e in entries
        ]
    }


def print_audit(entries: Sequence[AuditEntry]) -> None:
    """``stockade audit``'s table, one change a row, newest first, and how many there are; the
    account a caller acted as is shown only where it is not its id (today it always is)."""
    import json

    from ops.cli.common import console

    table = Table(box=rich.box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("at", no_wrap=True)
    table.add_column("who", no_wrap=True, max_width=24)
    table.add_column("from", no_wrap=True)
    table.add_column("action", no_wrap=True)
    table.add_column("targets", overflow="fold", max_width=24)
    table.add_column("arguments", overflow="fold")
    for e in entries:
        targets = ", ".join(str(t) for t in e.target_ids[:10]) + (" ..." if len(e.target_ids) > 10 else "")
        table.add_row(
            str(e.id),
            local_time(e.at_unix_s),
            Text(f"{e.role}/{e.actor_id}" + ("" if e.account == e.actor_id else f" as {e.account}")),
            Text(e.address),
            e.action,
            Text(targets or "-"),
            Text(" ".join(f"{k}={json.dumps(v)}" for k, v in sorted(e.arguments.items())) or "-"),
        )
    console().print(table)
    console().print(f"{len(entries)} row{'' if len(entries) == 1 else 's'}")


def account_json(account: Account) -> dict[str, Any]:
    """An account as ``stockade account show --json`` prints it: ``name``, the caps
    ``cpu_millis``, ``memory_mb`` and ``max_pending`` (null: none), ``max_priority`` (null: the
    default, 0), ``weight``, and what it uses now: ``used_cpu_millis``, ``used_memory_mb``,
    ``queued_jobs``."""
    return attrs.asdict(account)


def print_accounts(accounts: Sequence[Account]) -> None:
    """``stockade account list``'s (and ``show``'s) table: one account a row, each cap beside
    what it uses now (``-``: no cap), its max priority (``0 (default)`` when not set), and how
    many accounts there are."""
    from ops.cli.common import console
    from runtime.accounts import DEFAULT_MAX_PRIORITY

    def of(used: int, cap: int | None) -> str:
        return f"{used} / -" if cap is None else f"{used} / {cap}"

    table = Table(box=rich.box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("account", no_wrap=True)
    table.add_column("cpu_millis used / cap", justify="right", no_wrap=True)
    table.add_column("memory_mb used / cap", justify="right", no_wrap=True)
    table.add_column("pending+waiting / max", justify="right", no_wrap=True)
    table.add_column("max priority", justify="right", no_wrap=True)
    table.add_column("weight", justify="right", no_wrap=True)
    for a in accounts:
        table.add_row(
            Text(a.name),
            of(a.used_cpu_millis, a.cpu_millis),
            of(a.used_memory_mb, a.memory_mb),
            of(a.queued_jobs, a.max_pending),
            f"{DEFAULT_MAX_PRIORITY} (default)" if a.max_priority is None else str(a.max_priority),
            f"{a.weight:g}",
        )
    console().print(table)
    console().print(f"{len(accounts)} account{'' if len(accounts) == 1 else 's'}")

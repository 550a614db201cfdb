"""How client commands show what the control planes answer: the status view, a job's runtime
in one line, times, the extent of an output tail, and the JSON of ``status``, ``job`` and
``list`` (each built from the same reply the table is).

Imported only by the commands that render, when they run (it loads rich): ``stockade --help``
does not pay for it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import rich.box
from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from protocol import pb
    from runtime.text import Tail


def local_time(unix_s: float) -> str:
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


def _counts(status: pb.StatusReply) -> dict[str, int]:
    """Jobs per state, every state in the order the control plane sends them (all of them,
    pending first, zeros included)."""
    return {item.state: int(item.count) for item in status.jobs}


def status_json(status: pb.StatusReply, metrics: dict[str, str] | None = None) -> dict[str, Any]:
    """The stable JSON shape of ``stockade status --json``.

    Keys: ``leader`` (id or null), ``epoch``, ``control_planes`` ({id, address, role}),
    ``workers`` ({id, state, cpu_millis, memory_mb, cpu_allocated_millis,
    memory_allocated_mb, jobs, cordoned, draining, drained, drain_deadline_unix_s}: cordoned,
    no new placements, a drain cordons too; draining, a drain asked and jobs left on it;
    drained, a drain asked and no job left; the drain's deadline in Unix seconds, or null for
    none), ``jobs`` (counts keyed by state), ``unschedulable``
    ({job_id, reason}) and ``metrics`` (id of a process or worker of the local cluster ->
    ``host:port`` of its Prometheus /metrics; empty for a cluster that is not local).
    """
    return {
        "leader": status.leader or None,
        "epoch": int(status.epoch),
        "control_planes": [
            {"id": cp.id, "address": cp.address, "role": cp.role} for cp in status.control_planes
        ],
        "workers": [
            {
                "id": w.id,
                "state": w.state,
                "cpu_millis": int(w.cpu_millis),
                "memory_mb": int(w.memory_mb),
                "cpu_allocated_millis": int(w.cpu_allocated_millis),
                "memory_allocated_mb": int(w.memory_allocated_mb),
                "jobs": [int(j) for j in w.job_ids],
                "cordoned": bool(w.cordoned),
                "draining": bool(w.draining),
                "drained": bool(w.drained),
                "drain_deadline_unix_s": _unix_s_or_none(w.drain_deadline_unix_s),
            }
            for w in status.workers
        ],
        "jobs": _counts(status),
        "unschedulable": [{"job_id": int(j.job_id), "reason": j.reason} for j in status.unschedulable],
        "metrics": dict(metrics or {}),
    }


def worker_schedule(worker: pb.WorkerInfo) -> str:
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


def render_status(status: pb.StatusReply, metrics: dict[str, str] | None = None) -> Group:
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
    for column in ("id", "state", "cpu (millis)", "memory (MiB)", "jobs", *(("metrics",) if metrics else ())):
        workers.add_column(column)
    for w in status.workers:
        state = Text(w.state, style={"alive": "green", "left": "yellow"}.get(w.state, "red"))
        schedule = worker_schedule(w)
        if schedule:
            state.append(f", {schedule}", style="yellow")
        workers.add_row(
            w.id,
            state,
            _bar(int(w.cpu_allocated_millis), int(w.cpu_millis), ""),
            _bar(int(w.memory_allocated_mb), int(w.memory_mb), ""),
            _job_ids([int(j) for j in w.job_ids]),
            *((metrics.get(w.id, "-"),) if metrics else ()),
        )
    parts.append(workers)

    counts = _counts(status)
    parts.append(Text("jobs  " + "  ".join(f"{state} {count}" for state, count in counts.items())))
    if status.unschedulable:
        stuck = Table(box=rich.box.SIMPLE_HEAD, title="unschedulable", title_justify="left")
        stuck.add_column("job")
        stuck.add_column("reason")
        for job in status.unschedulable:
            stuck.add_row(str(job.job_id), Text(job.reason))
        parts.append(stuck)
    return Group(*parts)


def runtime_text(spec: pb.JobSpec | None) -> str:
    """A job's runtime in one line (``sleep 2.5 s``, ``command: echo 'a b'``, ``container app:1 --
    echo hi``), ``-`` if none."""
    from runtime.wire_jobs import job_spec_from_pb

    return "-" if spec is None else job_spec_from_pb(spec, strict=False).describe()


def tail_extent(tail: Tail) -> str:
    """What part of a file ``tail`` shows, e.g. ``last 50 lines of the last 64 KiB of 200.0 MiB``."""
    shown = f"last {len(tail.lines)} line{'' if len(tail.lines) == 1 else 's'}"
    if tail.whole:
        return shown
    return f"{shown} of the last {tail.read_bytes // 1024} KiB of {tail.size_bytes / 2**20:.1f} MiB"


def seconds_text(value: float | None) -> str:
    """``value`` seconds as ``1.23 s``, or ``-`` when there is none."""
    return "-" if value is None else f"{value:.2f} s"


def _unix_s_or_none(value: float) -> float | None:
    return float(value) if value else None


def runtime_json(spec: pb.JobSpec | None) -> dict[str, Any] | None:
    """A job's runtime as JSON: ``{"kind": "command", "argv": [...]}``,
    ``{"kind": "container", "image": "app:1", "argv": [...]}``, ``{"kind": "sleep",
    "duration_s": 2.5}``, or null when it has none."""
    if spec is not None and spec.command is not None:
        return {"kind": "command", "argv": list(spec.command.argv)}
    if spec is not None and spec.container is not None:
        return {"kind": "container", "image": spec.container.image, "argv": list(spec.container.argv)}
    if spec is not None and spec.sleep is not None:
        return {"kind": "sleep", "duration_s": spec.sleep.duration_ms / 1000}
    return None


def job_json(info: pb.JobInfo) -> dict[str, Any]:
    """The stable JSON shape of one job, as ``stockade job --json`` prints it and ``stockade
    list --json`` lists it.

    Keys: ``job_id``, ``name``, ``state`` (pending, assigned, running, succeeded, failed,
    cancelled), ``reason`` (why it is in that state, or null), ``runtime``
    (:func:`runtime_json`), ``cpu_millis``, ``memory_mb``, ``priority``, ``worker_id``,
    ``assignment_id`` and ``epoch`` (of its latest assignment, or null before any),
    ``attempts``, ``exit_code`` (or null), ``submitted_unix_s``, ``started_unix_s`` and
    ``finished_unix_s`` (Unix seconds, or null), ``stdout_path`` and ``stderr_path`` (on the
    worker's machine, or null). ``name``, ``cpu_millis``, ``memory_mb`` and ``priority`` are
    null only for a reply without its spec.
    """
    spec = info.spec
    return {
        "job_id": int(info.job_id),
        "name": spec.name if spec is not None else None,
        "state": info.state,
        "reason": info.reason or None,
        "runtime": runtime_json(spec),
        "cpu_millis": int(spec.cpu_millis) if spec is not None else None,
        "memory_mb": int(spec.memory_mb) if spec is not None else None,
        "priority": int(spec.priority) if spec is not None else None,
        "worker_id": info.worker_id or None,
        "assignment_id": int(info.assignment_id) or None,
        "epoch": int(info.epoch) or None,
        "attempts": int(info.attempts),
        "exit_code": int(info.exit_code) if info.has_exit_code else None,
        "submitted_unix_s": _unix_s_or_none(info.submitted_unix_s),
        "started_unix_s": _unix_s_or_none(info.started_unix_s),
        "finished_unix_s": _unix_s_or_none(info.finished_unix_s),
        "stdout_path": info.stdout_path or None,
        "stderr_path": info.stderr_path or None,
    }


def list_json(reply: pb.ListJobsReply) -> dict[str, Any]:
    """The stable JSON shape of ``stockade list --json``.

    Keys: ``jobs``, newest first, each as :func:`job_json` gives it.
    """
    return {"jobs": [job_json(info) for info in reply.jobs]}

"""How client commands show what the control planes answer: the status view and its JSON,
a job's runtime in one line, times and the extent of an output tail.

Imported only by the commands that render (it loads rich and the protocol).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import rich.box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from actors.validation import JOB_STATES
from protocol import pb
from runtime.text import Tail
from runtime.wire_jobs import job_spec_from_pb


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
    counts = dict.fromkeys(JOB_STATES, 0)
    for item in status.jobs:
        counts[item.state] = int(item.count)
    return counts


def status_json(status: pb.StatusReply) -> dict[str, Any]:
    """The stable JSON shape of ``stockade status --json``.

    Keys: ``leader`` (id or null), ``epoch``, ``control_planes`` ({id, address, role}),
    ``workers`` ({id, state, cpu_millis, memory_mb, cpu_allocated_millis,
    memory_allocated_mb, jobs}), ``jobs`` (counts keyed by state) and ``unschedulable``
    ({job_id, reason}).
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
            }
            for w in status.workers
        ],
        "jobs": _counts(status),
        "unschedulable": [{"job_id": int(j.job_id), "reason": j.reason} for j in status.unschedulable],
    }


def render_status(status: pb.StatusReply) -> Group:
    """The status view: leader, control planes, workers with bars, job counts, unschedulable."""
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
    for column in ("id", "address", "role"):
        cps.add_column(column)
    role_style = {"leader": "bold green", "standby": "", "down": "red"}
    for cp in status.control_planes:
        cps.add_row(cp.id, cp.address, Text(cp.role, style=role_style.get(cp.role, "")))
    parts.append(cps)

    workers = Table(box=rich.box.SIMPLE_HEAD, title="workers", title_justify="left")
    for column in ("id", "state", "cpu (millis)", "memory (MiB)", "jobs"):
        workers.add_column(column)
    for w in status.workers:
        workers.add_row(
            w.id,
            Text(w.state, style={"alive": "green", "left": "yellow"}.get(w.state, "red")),
            _bar(int(w.cpu_allocated_millis), int(w.cpu_millis), ""),
            _bar(int(w.memory_allocated_mb), int(w.memory_mb), ""),
            _job_ids([int(j) for j in w.job_ids]),
        )
    parts.append(workers)

    counts = _counts(status)
    parts.append(Text("jobs  " + "  ".join(f"{state} {counts[state]}" for state in JOB_STATES)))
    if status.unschedulable:
        stuck = Table(box=rich.box.SIMPLE_HEAD, title="unschedulable", title_justify="left")
        stuck.add_column("job")
        stuck.add_column("reason")
        for job in status.unschedulable:
            stuck.add_row(str(job.job_id), Text(job.reason))
        parts.append(stuck)
    return Group(*parts)


def runtime_text(spec: pb.JobSpec | None) -> str:
    """A job's runtime in one line (``sleep 2.5 s``, ``command: echo 'a b'``), ``-`` if none."""
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

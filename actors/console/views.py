"""What the console's pages show, as pure functions of database rows: no trio, no SQL, no HTML.

The templates get plain values from here: a worker's state as one word, ages and instants as
text, the geometry of capacity bars and of the packing chart.
"""

from __future__ import annotations

import collections
import datetime
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from actors.ingest_replies import schedule_of
from runtime.jobs import task_name
from runtime.validation import JOB_STATES

__all__ = [
    "Bar",
    "ChartFrame",
    "PackingChart",
    "PackingRing",
    "PackingSample",
    "bar",
    "chart_frame",
    "clock",
    "duration",
    "job_name",
    "labels_of",
    "packing_chart",
    "printable",
    "time_ticks",
    "worker_state",
]


def duration(seconds: float | None) -> str:
    """``seconds`` for people: ``0.4 s``, ``12 s``, ``3 min 4 s``, ``2 h 5 min``, ``3 d 4 h``;
    ``-`` for None (a negative age, from clocks a little apart, reads as 0)."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def clock(unix_s: float | None) -> str:
    """An instant as ``2026-12-01 12:03:04 UTC``; ``-`` for None."""
    if unix_s is None:
        return "-"
    return datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def job_counts(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """Jobs per state (rows of ``state``, ``count``): every one of ``JOB_STATES`` in order, 0: none."""
    by_state = {r["state"]: int(r["count"]) for r in rows}
    return [(s, by_state.get(s, 0)) for s in JOB_STATES]


def job_name(row: Mapping[str, Any]) -> str:
    """A job row's name as people read it, as ``stockade list`` names it: an array's task as
    ``name[index]``, a gang's task as ``name[rank]``."""
    index = row["array_index"]
    return task_name(str(row["name"]), row.get("gang_rank") if index is None else index)


def whole_number(text: str) -> int | None:
    """``text`` as a whole number of at most 19 ASCII digits (a job id, a byte offset), else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None


_TASK = re.compile(r"^(.*)\[(\d{1,9})\]$")


def task_filter(name: str) -> tuple[str, int | None]:
    """A name filter as (a part of the name, an array task's index or None): ``sh[3]`` is task
    3 of a job whose name holds ``sh``; anything else is a part of the name."""
    match = _TASK.match(name)
    if match is None:
        return name, None
    return match.group(1), int(match.group(2))


def size(n_bytes: int) -> str:
    """A byte count for people: ``512 B``, ``64.0 KiB``, ``3.2 MiB``."""
    if n_bytes < 1024:
        return f"{n_bytes} B"
    if n_bytes < 1024 * 1024:
        return f"{n_bytes / 1024:.1f} KiB"
    return f"{n_bytes / (1024 * 1024):.1f} MiB"


def event_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of :data:`actors.queries.console.CONSOLE_JOB_EVENTS` as the timeline shows it: its
    ``kind``, ``at_unix_s`` and ``worker_id``, and ``what`` (its other fields as text, those that
    apply, e.g. ``assignment 4, epoch 2 (cp-1), succeeded (exit code 0)``)."""
    parts = []
    if row["assignment_id"] is not None:
        parts.append(f"assignment {row['assignment_id']}")
    if row["incarnation"] is not None:
        parts.append(f"incarnation {row['incarnation']}")
    if row["epoch"] is not None:
        parts.append(f"epoch {row['epoch']}" + (f" ({row['leader']})" if row["leader"] else ""))
    ended = " ".join(str(row[k]) for k in ("state", "reason") if row[k])
    if row["outcome"] and row["outcome"] != row["reason"]:
        ended += f", reported {row['outcome']}"
    if row["exit_code"] is not None:
        ended += f", exit code {row['exit_code']}"
    if ended:
        parts.append(ended.strip(", "))
    if row["not_before_unix_s"] is not None:
        parts.append(f"not before {clock(row['not_before_unix_s'])}")
    if row["detail"] and row["detail"] != f"exit code {row['exit_code']}":
        parts.append(str(row["detail"]))
    return {
        "kind": row["kind"],
        "at_unix_s": row["at_unix_s"],
        "worker_id": row["worker_id"],
        "what": "; ".join(parts),
    }


def action_outcome(action: str, target: str, reply: Any) -> str:
    """What an action did, from its RPC's reply (``CancelJobReply``, ``WorkerScheduleReply``),
    e.g. ``job 7: cancelling`` or ``worker w-1: cordoned, draining; 2 active jobs``."""
    if action.startswith("cancel"):
        tasks = f" ({reply.tasks} task{'' if reply.tasks == 1 else 's'})" if reply.tasks else ""
        return f"job {target}: {reply.state}{tasks}"
    flags = [
        name
        for name, on in (
            ("cordoned", reply.cordoned),
            ("draining", reply.draining),
            ("drained", reply.drained),
            ("unhealthy", reply.unhealthy),
        )
        if on
    ]
    deadline = f", deadline {clock(reply.drain_deadline_unix_s)}" if reply.drain_deadline_unix_s else ""
    jobs = len(reply.job_ids)
    return (
        f"worker {target}: {', '.join(flags) or 'takes placements'}{deadline}; "
        f"{jobs} active job{'' if jobs == 1 else 's'}"
    )


def worker_state(row: Mapping[str, Any]) -> str:
    """One word for a worker row of :data:`actors.queries.console.CONSOLE_WORKERS`: its state
    but alive, else ``draining``, ``drained``, ``unhealthy``, ``cordoned``, ``held`` (a planned
    restart's hold is ahead) or ``alive``."""
    if row["state"] != "alive":
        return str(row["state"])
    drain_requested, active_jobs = bool(row["drain_requested"]), int(row["job_count"])
    schedule = schedule_of(
        cordoned=bool(row["cordoned"]), drain_requested=drain_requested, active_jobs=active_jobs
    )
    if schedule.draining:
        return "draining"
    if schedule.drained:
        return "drained"
    if row.get("unhealthy"):
        return "unhealthy"
    if schedule.cordoned:
        return "cordoned"
    if row["hold_for_s"] is not None and row["hold_for_s"] > 0:
        return "held"
    return "alive"


def labels_of(text: str | None) -> list[tuple[str, str]]:
    """A worker's labels (``workers.labels`` as JSON text) as sorted (key, value) pairs."""
    if not text:
        return []
    value = json.loads(text)
    return sorted((str(k), str(v)) for k, v in value.items()) if isinstance(value, dict) else []


def devices_of(offered: str | None, in_use: str | None) -> list[dict[str, Any]]:
    """A worker's devices (``workers.resources`` as JSON text, and the units its active
    assignments hold as JSON [[name, unit], ...]) as ``{name, offered, in_use}`` per resource,
    sorted by name: ``offered`` a count, ``in_use`` the unit ids held (docs/devices.md)."""
    held: dict[str, list[str]] = {}
    for name, unit in json.loads(in_use) if in_use else ():
        held.setdefault(str(name), []).append(str(unit))
    units = json.loads(offered) if offered else {}
    return [{"name": n, "offered": len(u), "in_use": held.get(n, [])} for n, u in sorted(units.items())]


_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_ANSI_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def printable(data: bytes) -> str:
    """A job's output bytes as text to show: UTF-8 (invalid bytes as U+FFFD), terminal colour
    sequences dropped, other control characters but tab and newline as U+FFFD."""
    text = _ANSI_SEQUENCE.sub("", data.decode("utf-8", errors="replace"))
    return _UNPRINTABLE.sub("\ufffd", text)


@attrs.frozen(kw_only=True)
class Bar:
    """A capacity bar: how much of ``total`` is used, as a fraction and as text."""

    used: int
    total: int
    fraction: float
    """``used / total`` clamped to [0, 1] (an allocation above capacity fills the bar)."""
    over: bool
    """The allocation exceeds the capacity (a restarted agent that offers less)."""
    text: str

    @property
    def percent(self) -> float:
        """``fraction`` in percent, one decimal."""
        return round(self.fraction * 100, 1)


def bar(used: int, total: int, unit: str) -> Bar:
    """A :class:`Bar` of ``used`` out of ``total`` (``unit`` names them: ``m`` for
    millicores, ``MiB``)."""
    fraction = used / total if total > 0 else 0.0
    return Bar(
        used=used,
        total=total,
        fraction=min(1.0, max(0.0, fraction)),
        over=used > total,
        text=f"{used:,} / {total:,} {unit} ({fraction * 100:.0f}%)",
    )


@attrs.frozen(kw_only=True)
class PackingSample:
    """One sample of the cluster's packing: alive workers' capacity and what active assignments
    hold on them, at ``unix_s`` (wall clock, Unix seconds)."""

    unix_s: float
    cpu_allocated_millis: int
    cpu_capacity_millis: int
    memory_allocated_mb: int
    memory_capacity_mb: int
    job_count: int
    worker_count: int

    @classmethod
    def of_row(cls, unix_s: float, row: Mapping[str, Any]) -> PackingSample:
        """A sample from a row of :data:`actors.queries.console.CONSOLE_PACKING_SAMPLE`."""
        return cls(unix_s=unix_s, **{f.name: int(row[f.name]) for f in attrs.fields(cls)[1:]})


@attrs.define
class PackingRing:
    """The last ``size`` samples, oldest first (in memory: it starts empty with the replica)."""

    size: int
    _samples: collections.deque[PackingSample] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._samples = collections.deque(maxlen=self.size)

    def add(self, sample: PackingSample) -> None:
        """Keep ``sample``, dropping the oldest when full."""
        self._samples.append(sample)

    def samples(self) -> list[PackingSample]:
        """Every sample kept, oldest first."""
        return list(self._samples)


@attrs.frozen(kw_only=True)
class ChartFrame:
    """A chart's size and its plot's place, in SVG user units: the plot spans ``x0..x1`` by
    ``y0..y1`` (``y1`` at the bottom of the scale, ``y0`` at its top)."""

    width: int
    height: int
    x0: int
    x1: int
    y0: int
    y1: int


def chart_frame(width: int, height: int) -> ChartFrame:
    """The frame of a chart ``width`` by ``height``, with room left for the ticks' labels (48
    on the left, 28 below, 12 above and on the right)."""
    return ChartFrame(width=width, height=height, x0=48, x1=width - 12, y0=12, y1=height - 28)


@attrs.frozen(kw_only=True)
class PackingChart(ChartFrame):
    """The geometry of the packing chart (``y1`` at 0%, ``y0`` at 100%), one polyline per
    resource."""

    cpu_points: str
    """``"x,y x,y ..."`` of the allocated CPU in percent of the capacity."""
    memory_points: str
    """The same for memory."""
    x_ticks: tuple[tuple[float, str], ...]
    """(x, label) of the time axis: how long before the newest sample."""
    y_ticks: tuple[tuple[float, str], ...]
    """(y, label) of the percent axis."""
    span_s: float
    samples: int


def _ago(seconds: int) -> str:
    """A tick's distance back in time: ``30 s``, ``5 min``, ``1 h``."""
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600 or seconds % 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _percent(used: int, total: int) -> float:
    return 0.0 if total <= 0 else min(100.0, max(0.0, used * 100 / total))


def time_ticks(
    x_of: Callable[[float], float], now_unix_s: float, span_s: float
) -> tuple[tuple[float, str], ...]:
    """(x, label) of a chart's time axis over the ``span_s`` seconds up to ``now_unix_s``: at most
    seven ticks, each labelled with how long before ``now_unix_s`` it is (``x_of`` places an
    instant, in Unix seconds)."""
    step_s = next((s for s in (30, 60, 120, 300, 600, 900, 1800, 3600) if span_s / s <= 6), 3600)
    return tuple(
        (x_of(now_unix_s - ago_s), "now" if ago_s == 0 else f"-{_ago(ago_s)}")
        for ago_s in range(0, int(span_s) + 1, step_s)
    )


def packing_chart(
    samples: Sequence[PackingSample], *, now_unix_s: float, span_s: float, width: int = 720, height: int = 240
) -> PackingChart:
    """The chart of ``samples`` over the ``span_s`` seconds up to ``now_unix_s``: time runs
    left to right, the allocated share of the capacity (0 to 100%) bottom to top; samples older
    than the span are left out."""
    frame = chart_frame(width, height)
    x0, x1, y0, y1 = frame.x0, frame.x1, frame.y0, frame.y1

    def x_of(unix_s: float) -> float:
        return x1 - (now_unix_s - unix_s) / span_s * (x1 - x0)

    def y_of(percent: float) -> float:
        return y1 - percent / 100 * (y1 - y0)

    shown = [s for s in samples if now_unix_s - span_s <= s.unix_s <= now_unix_s]

    def points(values: Iterable[tuple[float, float]]) -> str:
        return " ".join(f"{x_of(t):.1f},{y_of(p):.1f}" for t, p in values)

    x_ticks = time_ticks(x_of, now_unix_s, span_s)
    return PackingChart(
        **attrs.asdict(frame),
        cpu_points=points((s.unix_s, _percent(s.cpu_allocated_millis, s.cpu_capacity_millis)) for s in shown),
        memory_points=points(
            (s.unix_s, _percent(s.memory_allocated_mb, s.memory_capacity_mb)) for s in shown
        ),
        x_ticks=x_ticks,
        y_ticks=tuple((y_of(p), f"{p}%") for p in (0, 25, 50, 75, 100)),
        span_s=span_s,
        samples=len(shown),
    )

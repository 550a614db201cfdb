"""The usage section of the console's job and worker pages (docs/console.md, "Usage"): what a job,
or all a worker's jobs together, used lately, from the samples its worker reported (the rows of
:data:`actors.queries.console.CONSOLE_JOB_USAGE` and ``CONSOLE_WORKER_USAGE``), as figures and
the geometry of two small inline SVG line charts (:func:`usage_view`). Pure: no SQL, no HTML.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from actors.console.views import ChartFrame, chart_frame, time_ticks

__all__ = [
    "JOB_NO_USAGE",
    "USAGE_SAMPLES_SHOWN",
    "USAGE_SPAN_S",
    "WORKER_NO_USAGE",
    "LineChart",
    "Usage",
    "usage_values",
    "usage_view",
]

USAGE_SPAN_S = 900.0
"""How far back the charts reach, in seconds (15 minutes)."""
USAGE_SAMPLES_SHOWN = 1_000
"""Most samples a chart draws (the newest): at the default 5 s interval, 15 minutes are 180."""
JOB_NO_USAGE = (
    "a worker reports what a running command job uses every usage_interval_s, from its cgroup "
    "(sleep and container jobs, and jobs on a worker without cgroups, have none)"
)
"""Why a job's page may show no usage."""
WORKER_NO_USAGE = (
    "a worker reports what its command jobs use every usage_interval_s while they run, from "
    "their cgroups (none without cgroups, nor from an older agent)"
)
"""Why a worker's page may show no usage."""


@attrs.frozen(kw_only=True)
class LineChart(ChartFrame):
    """One series over time (``y1`` at 0, ``y0`` at the top of the scale)."""

    points: str
    """``"x,y x,y ..."`` of the series."""
    asked_y: float | None
    """y of what the job asked for (a dashed line); None: nothing asked (a worker's total)."""
    x_ticks: tuple[tuple[float, str], ...]
    y_ticks: tuple[tuple[float, str], ...]


@attrs.frozen(kw_only=True)
class Usage:
    """The usage section: the newest sample's figures and the charts of the span."""

    cores: float
    """CPU used over the newest sample's span, in cores (1.0 = one core busy all along)."""
    cpu_millis: int
    memory_mb: int
    age_s: float
    """How long ago the newest sample was recorded, in seconds (database time)."""
    samples: int
    span_s: float
    cpu_chart: LineChart
    """CPU in cores."""
    memory_chart: LineChart
    """Memory in MiB."""


def _scale_top(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value`` (> 0)."""
    power = 10.0 ** math.floor(math.log10(value))
    return next(power * m for m in (1, 2, 2.5, 5, 10) if power * m >= value)


def _number(value: float) -> str:
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def line_chart(
    series: Sequence[tuple[float, float]],
    *,
    now_unix_s: float,
    span_s: float,
    asked: float | None,
    width: int = 360,
    height: int = 150,
) -> LineChart:
    """The chart of ``series`` ((unix s, value), oldest first) over the ``span_s`` seconds up to
    ``now_unix_s``, its scale from 0 to above both its largest value and ``asked`` (the dashed
    line; None: none), at least 1 (the unit is said beside the chart)."""
    frame = chart_frame(width, height)
    x0, x1, y0, y1 = frame.x0, frame.x1, frame.y0, frame.y1
    shown = [(t, v) for t, v in series if now_unix_s - span_s <= t <= now_unix_s]
    top = _scale_top(max([asked or 0.0, *(v for _, v in shown), 1.0]) * 1.05)  # at least 1 unit

    def x_of(unix_s: float) -> float:
        return x1 - (now_unix_s - unix_s) / span_s * (x1 - x0)

    def y_of(value: float) -> float:
        return y1 - min(value, top) / top * (y1 - y0)

    return LineChart(
        **attrs.asdict(frame),
        points=" ".join(f"{x_of(t):.1f},{y_of(v):.1f}" for t, v in shown),
        asked_y=None if asked is None else y_of(asked),
        x_ticks=time_ticks(x_of, now_unix_s, span_s),
        y_ticks=tuple((y_of(v), _number(v)) for v in (0.0, top / 2, top)),
    )


def usage_view(
    row: Mapping[str, Any],
    *,
    span_s: float = USAGE_SPAN_S,
    cpu_asked_millis: int | None = None,
    memory_asked_mb: int | None = None,
) -> Usage | None:
    """The usage section of a series ``row`` (``now_unix_s``, and ``unix_s``, ``cpu_millis``,
    ``memory_mb`` as arrays, oldest first) over ``span_s`` seconds, with a job's ask drawn as a
    dashed line (None: a worker's total, nothing asked); None when it holds no sample."""
    instants = list(row["unix_s"])
    if not instants:
        return None
    now = float(row["now_unix_s"])
    cpu, memory = list(row["cpu_millis"]), list(row["memory_mb"])
    common: dict[str, Any] = {"now_unix_s": now, "span_s": span_s}
    return Usage(
        cores=cpu[-1] / 1000,
        cpu_millis=cpu[-1],
        memory_mb=memory[-1],
        age_s=max(0.0, now - instants[-1]),
        samples=len(instants),
        span_s=span_s,
        cpu_chart=line_chart(
            [(t, m / 1000) for t, m in zip(instants, cpu, strict=True)],
            asked=None if cpu_asked_millis is None else cpu_asked_millis / 1000,
            **common,
        ),
        memory_chart=line_chart(
            list(zip(instants, (float(m) for m in memory), strict=True)),
            asked=None if memory_asked_mb is None else float(memory_asked_mb),
            **common,
        ),
    )


def usage_values(
    row: Any,
    *,
    of: str,
    none: str,
    cpu_asked_millis: int | None = None,
    memory_asked_mb: int | None = None,
) -> dict[str, Any]:
    """What ``parts/usage.html`` shows of the series ``row`` (a row read by the query, as
    :func:`usage_view` takes it; None: no row, no sample): whose usage it is (``of``), and why
    there may be none (``none``)."""
    return {
        "usage": None
        if row is None
        else usage_view(row, cpu_asked_millis=cpu_asked_millis, memory_asked_mb=memory_asked_mb),
        "usage_of": of,
        "usage_none": none,
        "usage_span_s": USAGE_SPAN_S,
        "usage_asked_cpu_millis": cpu_asked_millis,
        "usage_asked_memory_mb": memory_asked_mb,
    }

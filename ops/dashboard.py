"""The Grafana dashboard of a Stockade cluster, made from a short list of panels (:data:`ROWS`),
written to ``ops/grafana/stockade.json`` (``python -m ops.dashboard``; ``--check`` fails when
the file differs). Its layout and queries: docs/design.md, "The Grafana dashboard";
docs/metrics.md lists the metrics and how to run it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import attrs

DASHBOARD_PATH = Path(__file__).with_name("grafana") / "stockade.json"
UID = "stockade-cluster"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
CP = 'role="cp"'
WORKERS = 'role=~"agent|fleet"'
LEADER = f"and on(instance) (stockade_lease_epoch{{{CP}}} > 0)"
"""Appended to a control-plane selector: keep the leader's series only."""


@attrs.frozen(kw_only=True)
class Query:
    """One PromQL query of a panel and its legend (Grafana's ``{{label}}`` templates)."""

    expr: str
    legend: str = ""


@attrs.frozen(kw_only=True)
class Panel:
    """One panel: ``kind`` is a Grafana panel type (timeseries, stat); ``width`` of 24 columns;
    ``unit`` a Grafana unit id (s, short, ops...); ``bars`` draws a time series as bars (counts
    per interval); ``stack`` stacks its series."""

    title: str
    description: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"
    width: int = 8
    height: int = 8
    unit: str = "short"
    bars: bool = False
    stack: bool = False


@attrs.frozen(kw_only=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def q(expr: str, legend: str = "") -> Query:
    return Query(expr=expr, legend=legend)


def _per(function: str, metric: str, selector: str, by: str = "", *, legend: str | None = None) -> Query:
    """A counter's ``rate`` or ``increase`` (``function``) over the rate interval, summed over
    ``selector``'s processes (by the labels ``by``); the legend defaults to those labels."""
    summed = f"sum by ({by}) " if by else "sum"
    if legend is None:
        legend = " ".join(f"{{{{{label}}}}}" for label in by.split(", "))
    return q(f"{summed}({function}({metric}{{{selector}}}[{RATE}]))", legend)


def _quantiles(metric: str, selector: str, by: str = "") -> tuple[Query, ...]:
    group = f"le{', ' + by if by else ''}"
    prefix = f"{{{{{by}}}}} " if by else ""
    return tuple(
        q(
            f"histogram_quantile({quantile}, sum by ({group}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"{prefix}p{round(quantile * 100)}",
        )
        for quantile in (0.5, 0.99)
    )


ROWS: tuple[Row, ...] = (
    Row(
        title="Leadership",
        panels=(
            Panel(
                title="Leader",
                description="The control plane that leads now (its epoch is above 0).",
                queries=(q(f"max by (process) (stockade_lease_epoch{{{CP}}}) > 0", "{{process}}"),),
                kind="stat",
                width=4,
            ),
            Panel(
                title="Epoch",
                description="The newest epoch led: bumped at every takeover.",
                queries=(q(f"max(stockade_lease_epoch{{{CP}}})", "epoch"),),
                kind="stat",
                width=4,
            ),
            Panel(
                title="Epoch led by each control plane",
                description="stockade_lease_epoch: the epoch each replica leads under, 0 while it is a "
                "standby. A failover is one line falling to 0 and another rising to a higher epoch.",
                queries=(q(f"max by (process) (stockade_lease_epoch{{{CP}}})", "{{process}}"),),
                width=16,
                height=8,
            ),
            Panel(
                title="Elections",
                description="Takeovers won, per control plane, in each interval.",
                queries=(_per("increase", "stockade_lease_elections_total", CP, "process"),),
                width=8,
                bars=True,
            ),
            Panel(
                title="Step-downs by cause",
                description="Times a leader stopped leading: deposed (the database gave the lease to "
                "another), renewal_late, main_loop_stalled, epoch_superseded (a fenced write saw a newer "
                "epoch), released (clean stop).",
                queries=(_per("increase", "stockade_lease_step_downs_total", CP, "process, cause"),),
                width=8,
                bars=True,
            ),
            Panel(
                title="Fenced writes refused",
                description="Decisions of a deposed leader that the database refused (rows of "
                "stale_writes), by write and reason: the fence at work.",
                queries=(
                    _per(
                        "increase",
                        "stockade_fenced_writes_refused_total",
                        CP,
                        "process, write, reason",
                        legend="{{process}} {{write}} ({{reason}})",
                    ),
                ),
                width=8,
                bars=True,
            ),
        ),
    ),
    Row(
        title="Database",
        panels=(
            Panel(
                title="Lease renewal time",
                description="From sending a lease renewal to its answer, on the leader: the lease is "
                "lost once renewals fail for lease_ttl_s - step_down_margin_s (1.6 s by default).",
                queries=_quantiles("stockade_lease_renewal_seconds", CP),
                width=6,
                unit="s",
            ),
            Panel(
                title="Oldest open transaction",
                description="Age of the oldest transaction open in the database (any session's but the "
                "sampler's), as each control plane samples it every 5 s. While one stays open, vacuum "
                "removes no dead row: a warning is logged past oldest_transaction_warn_s (60 s), naming "
                "its session.",
                queries=(
                    q(f"max(stockade_database_oldest_transaction_seconds{{{CP}}})", "oldest transaction"),
                ),
                width=6,
                unit="s",
            ),
            Panel(
                title="Dead rows of the hot tables",
                description="Row versions of workers, jobs, assignments and lease that vacuum has not "
                "removed yet (pg_stat_user_tables.n_dead_tup). They pile up while a transaction stays "
                "open, and slow every read of the table.",
                queries=(q(f"max by (table) (stockade_database_dead_rows{{{CP}}})", "{{table}}"),),
                width=6,
            ),
            Panel(
                title="Dead rows per live row",
                description="Dead rows of each hot table per live one: a warning is logged past "
                "dead_rows_warn_ratio (10) with more than dead_rows_warn_min (1000) dead rows. Vacuum "
                "left to itself keeps it near 0.2.",
                queries=(
                    q(
                        f"max by (table) (stockade_database_dead_rows{{{CP}}}) "
                        f"/ clamp_min(max by (table) (stockade_database_live_rows{{{CP}}}), 1)",
                        "{{table}}",
                    ),
                ),
                width=6,
            ),
        ),
    ),
    Row(
        title="Heartbeats and fencing",
        panels=(
            Panel(
                title="Heartbeats recorded per second",
                description="Heartbeats each control plane recorded for an alive incarnation, and those "
                "it answered with reregister (the incarnation is no longer alive).",
                queries=(
                    _per("rate", "stockade_heartbeats_recorded_total", CP, "process"),
                    _per("rate", "stockade_heartbeats_reregister_total", CP, legend="reregister (all)"),
                ),
                unit="reqps",
                stack=True,
            ),
            Panel(
                title="Heartbeat round trip",
                description="From sending a heartbeat to taking its answer, over every worker; failed "
                "heartbeats are counted apart.",
                queries=(
                    *_quantiles("stockade_agent_heartbeat_round_trip_seconds", WORKERS),
                    _per(
                        "rate", "stockade_agent_heartbeat_failures_total", WORKERS, legend="failed per second"
                    ),
                ),
                unit="s",
            ),
            Panel(
                title="Heartbeat age against the fence span",
                description="Seconds since each worker sent its newest acknowledged heartbeat. Its jobs "
                "pause when this reaches the fence span (dashed).",
                queries=(
                    q(
                        f"max by (worker_id) (stockade_agent_heartbeat_ack_age_seconds{{{WORKERS}}})",
                        "{{worker_id}}",
                    ),
                    q(f"min(stockade_agent_fence_after_seconds{{{WORKERS}}})", "fence span"),
                ),
                unit="s",
            ),
            Panel(
                title="Agent fence events",
                description="Pauses (no heartbeat acknowledged within the fence span), resumes (a fresh "
                "one came in time) and self-fences (jobs killed at the kill deadline), per worker.",
                queries=tuple(
                    _per("increase", f"stockade_agent_{counter}_total", WORKERS, "worker_id", legend=legend)
                    for counter, legend in (
                        ("pauses", "pause {{worker_id}}"),
                        ("resumes", "resume {{worker_id}}"),
                        ("self_fences", "self-fence {{worker_id}}"),
                    )
                ),
                width=12,
                bars=True,
            ),
            Panel(
                title="Workers by fence state",
                description="How many workers are registering, live, paused or self-fenced now.",
                queries=(q(f"sum by (state) (stockade_agent_fence_state{{{WORKERS}}})", "{{state}}"),),
                width=12,
                stack=True,
            ),
        ),
    ),
    Row(
        title="Placement and packing",
        panels=(
            Panel(
                title="Placer round time",
                description="Rounds while jobs were pending (read, decide, commit, dispatch), and the "
                "reconciler's passes, on the leader.",
                queries=(
                    *_quantiles("stockade_placer_round_seconds", CP),
                    *(
                        attrs.evolve(query, legend=f"reconcile {query.legend}")
                        for query in _quantiles("stockade_reconcile_pass_seconds", CP)
                    ),
                ),
                unit="s",
            ),
            Panel(
                title="Pending jobs and placements",
                description="Jobs the leader's placer holds pending, and the assignments it commits "
                "per second.",
                queries=(
                    q(f"max(stockade_placer_pending_jobs{{{CP}}} {LEADER})", "pending"),
                    _per("rate", "stockade_placements_total", CP, legend="placed per second"),
                ),
            ),
            Panel(
                title="Live workers",
                description="Live workers the leader's placer read in its last round, and those the "
                "leader's health judgement marked unhealthy (no new placement but a probe).",
                queries=(
                    q(f"max(stockade_cluster_live_workers{{{CP}}})", "live workers"),
                    q(f"max(stockade_unhealthy_workers{{{CP}}})", "unhealthy"),
                ),
            ),
            *(
                Panel(
                    title=f"{resource} allocated against capacity",
                    description=f"{amount} the active assignments hold, and what the live workers offer, "
                    f"as the leader's placer read them.",
                    queries=(
                        q(f"max(stockade_cluster_{metric}_allocated_{unit}{{{CP}}})", "allocated"),
                        q(f"max(stockade_cluster_{metric}_capacity_{unit}{{{CP}}})", "capacity"),
                    ),
                    width=12,
                )
                for resource, amount, metric, unit in (
                    ("CPU", "Millicores", "cpu", "millis"),
                    ("Memory", "MiB", "memory", "mb"),
                )
            ),
        ),
    ),
    Row(
        title="Jobs",
        panels=(
            Panel(
                title="Jobs running",
                description="Jobs started and not ended, per worker (stacked: the cluster's total).",
                queries=(
                    q(f"sum by (worker_id) (stockade_agent_jobs_running{{{WORKERS}}})", "{{worker_id}}"),
                ),
                width=12,
                stack=True,
            ),
            Panel(
                title="Job starts by runtime",
                description="Jobs the workers started per second.",
                queries=(_per("rate", "stockade_agent_job_starts_total", WORKERS, "runtime"),),
                width=12,
                unit="ops",
            ),
            Panel(
                title="Job stops by reason",
                description="Jobs that ended on the workers per second, by reason (succeeded, failed, "
                "oom_killed, timeout, cancelled, self_fence, ...).",
                queries=(_per("rate", "stockade_agent_job_stops_total", WORKERS, "reason"),),
                width=12,
                unit="ops",
                stack=True,
            ),
            Panel(
                title="Assignments refused",
                description="Assignment ids the workers refused, by request and reason (stale_epoch, "
                "wrong_incarnation, cancelled, no_room, fenced, ...), and duplicates acknowledged "
                "without running twice.",
                queries=(
                    _per("increase", "stockade_agent_assignments_refused_total", WORKERS, "request, reason"),
                    _per(
                        "increase", "stockade_agent_duplicate_assignments_total", WORKERS, legend="duplicate"
                    ),
                ),
                width=12,
                bars=True,
            ),
        ),
    ),
)

ANNOTATIONS: tuple[tuple[str, str, str], ...] = (
    ("Elections", f"sum(increase(stockade_lease_elections_total{{{CP}}}[{RATE}])) > 0", "red"),
    ("Self-fences", f"sum(increase(stockade_agent_self_fences_total{{{WORKERS}}}[{RATE}])) > 0", "orange"),
)
"""(name, expr, colour) of the annotations drawn across every panel."""


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    custom: dict[str, Any] = {}
    options: dict[str, Any]
    if panel.kind == "timeseries":
        custom = {
            "drawStyle": "bars" if panel.bars else "line",
            "lineWidth": 1,
            "fillOpacity": 60 if panel.bars else (30 if panel.stack else 10),
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        }
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "name" if panel.title == "Leader" else "value",
            "colorMode": "value",
            "graphMode": "none",
        }
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit, "custom": custom}, "overrides": []},
        "options": options,
        "targets": [
            {
                "datasource": DATASOURCE,
                "refId": chr(ord("A") + index),
                "expr": query.expr,
                "legendFormat": query.legend,
                "range": True,
                "instant": False,
            }
            for index, query in enumerate(panel.queries)
        ],
    }


def _layout(rows: tuple[Row, ...]) -> list[dict[str, Any]]:
    """Rows of panels placed left to right, wrapping at 24 columns (each panel in the highest
    free spot, leftmost first), each row below the one before."""
    placed: list[dict[str, Any]] = []
    next_id = 1
    y = 0
    for row in rows:
        placed.append(
            {
                "id": next_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        heights = [0] * 24  # the lowest filled row of each column, relative to y
        for panel in row.panels:
            x, top = _free_spot(heights, panel.width)
            placed.append(_panel(panel, next_id, x, y + top))
            next_id += 1
            for column in range(x, x + panel.width):
                heights[column] = top + panel.height
        y += max(heights)
    return placed


def _free_spot(heights: list[int], width: int) -> tuple[int, int]:
    """The leftmost of the highest spots ``width`` columns wide: (x, top)."""
    best: tuple[int, int] | None = None
    for x in range(0, 25 - width):
        top = max(heights[x : x + width])
        if best is None or top < best[1]:
            best = (x, top)
    assert best is not None
    return best


def build_dashboard() -> dict[str, Any]:
    """The dashboard model (Grafana's JSON, schema version 39) with a data source variable."""
    return {
        "uid": UID,
        "title": "Stockade cluster",
        "description": "Leadership, heartbeats and fencing, placement and packing, and jobs of a "
        "Stockade cluster (made by ops/dashboard.py; metrics in docs/metrics.md).",
        "tags": ["stockade"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "timepicker": {},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                }
            ]
        },
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                *(
                    {
                        "datasource": DATASOURCE,
                        "enable": True,
                        "expr": expr,
                        "iconColor": colour,
                        "name": name,
                        "step": "1s",
                        "titleFormat": name,
                        "useValueForTime": False,
                    }
                    for name, expr, colour in ANNOTATIONS
                ),
            ]
        },
        "panels": _layout(ROWS),
    }


def dashboard_text() -> str:
    """The dashboard as the file holds it: indented JSON and a final newline."""
    return json.dumps(build_dashboard(), indent=2) + "\n"


def exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of ``dashboard``: its panels' queries and its annotations'."""
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    found += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    return found


def main(argv: list[str] | None = None) -> int:
    """Write :data:`DASHBOARD_PATH`; with ``--check``, exit 1 when it differs from what would be
    written instead."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if the file is not current")
    args = parser.parse_args(argv)
    text = dashboard_text()
    if args.check:
        current = DASHBOARD_PATH.read_text(encoding="utf-8") if DASHBOARD_PATH.exists() else ""
        if current != text:
            print(f"{DASHBOARD_PATH} is stale: run python -m ops.dashboard", file=sys.stderr)
            return 1
        return 0
    DASHBOARD_PATH.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

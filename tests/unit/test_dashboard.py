"""The Grafana dashboard (ops/grafana/stockade.json, made by :mod:`ops.dashboard`) cannot rot:
the file is what the module makes, it is a well-formed dashboard model, every metric and label
its queries name is one the processes' registry has, and Prometheus' own parser accepts them."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from ops import dashboard
from runtime import metrics

TARGET_LABELS = {"process", "role", "instance", "job"}
"""Labels Prometheus adds to every sample: the targets file's and its own."""

SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def exposed_names() -> dict[str, set[str]]:
    """Every sample name a Stockade process exposes -> the label names its samples carry (the
    registry of :mod:`runtime.metrics`, which every control plane, agent and fleet serves)."""
    labels: dict[str, set[str]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            names = set(value._labelnames)
            for suffix in SUFFIXES[value._type]:
                labels[value._name + suffix] = names | ({"le"} if suffix == "_bucket" else set())
    for family in REGISTRY.collect():  # the families read at scrape time (runtime.metrics.WorkerGauges)
        if family.type == "gauge" and family.name not in labels:
            labels[family.name] = set(getattr(family, "_labelnames", ()))
    return labels


def parsed(expr: str) -> Any:
    """``expr`` parsed as Prometheus would run it (Grafana's interval variable filled in)."""
    return promql_parser.parse(expr.replace("$__rate_interval", "1m"))


def used(expr: str) -> tuple[set[str], set[str]]:
    """The metric names ``expr`` selects and the label names it matches or groups by."""
    names: set[str] = set()
    labels: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)
            labels.update(m.name for m in node.matchers.matchers)
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            labels.update(node.modifier.labels)
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                labels.update(matching.labels)

    promql_parser.walk(parsed(expr), visit)
    return names, labels


def test_the_committed_dashboard_is_the_one_the_module_makes() -> None:
    """ops/grafana/stockade.json equals what ``python -m ops.dashboard`` writes."""
    assert dashboard.main(["--check"]) == 0, "run: python -m ops.dashboard"


def test_the_dashboard_is_a_well_formed_model() -> None:
    """Unique panel ids, panels inside the 24-column grid and never overlapping, every query
    with its own refId and the data source variable, which the templating defines."""
    model = dashboard.build_dashboard()
    panels = model["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert [v["name"] for v in model["templating"]["list"]] == ["datasource"]
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        mine = set(
            itertools.product(
                range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
            )
        )
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        assert all(t["datasource"] == panel["datasource"] and t["expr"] for t in panel["targets"])


def test_every_metric_and_label_the_dashboard_names_exists() -> None:
    """Each metric a query selects is exposed by the processes, and each label it matches or
    groups by is one of that metric's (or a target label Prometheus adds)."""
    exposed = exposed_names()
    model = dashboard.build_dashboard()
    for expr in dashboard.exprs(model):
        names, labels = used(expr)
        assert names, expr
        missing = names - exposed.keys()
        assert not missing, f"{expr}: no process exposes {sorted(missing)}"
        known = TARGET_LABELS.union(*(exposed[n] for n in names))
        assert labels <= known, f"{expr}: unknown labels {sorted(labels - known)}"


def test_the_dashboard_covers_the_metrics_the_issue_asks_for() -> None:
    """Leadership, step-downs, refused writes, heartbeats, fencing, round time, packing and jobs
    each have a query."""
    names = set().union(*(used(e)[0] for e in dashboard.exprs(dashboard.build_dashboard())))
    assert {
        "stockade_lease_epoch",
        "stockade_lease_elections_total",
        "stockade_lease_step_downs_total",
        "stockade_fenced_writes_refused_total",
        "stockade_heartbeats_recorded_total",
        "stockade_agent_heartbeat_round_trip_seconds_bucket",
        "stockade_agent_pauses_total",
        "stockade_agent_self_fences_total",
        "stockade_placer_round_seconds_bucket",
        "stockade_cluster_cpu_allocated_millis",
        "stockade_cluster_cpu_capacity_millis",
        "stockade_cluster_memory_allocated_mb",
        "stockade_cluster_memory_capacity_mb",
        "stockade_agent_jobs_running",
        "stockade_agent_job_starts_total",
        "stockade_agent_job_stops_total",
    } <= names


def test_the_name_check_notices_a_metric_no_process_has() -> None:
    """The check above is not vacuous: a misspelt metric is not among the exposed names."""
    names, labels = used('sum by (cause) (rate(stockade_lease_stepdowns_total{role="cp"}[$__rate_interval]))')
    assert names == {"stockade_lease_stepdowns_total"} and labels == {"cause", "role"}
    assert "stockade_lease_stepdowns_total" not in exposed_names()
    assert exposed_names()["stockade_lease_step_downs_total"] == {"cause"}


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_parses_every_query_of_the_dashboard(tmp_path: Path) -> None:
    """Prometheus' own parser accepts each query (checked as recording rules)."""
    assert PROMTOOL is not None
    rules = [
        {"record": f"stockade:dashboard_query_{index}", "expr": expr.replace("$__rate_interval", "1m")}
        for index, expr in enumerate(dashboard.exprs(dashboard.build_dashboard()))
    ]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_docs_metrics_lists_every_metric_of_every_process() -> None:
    """docs/metrics.md names each metric the processes expose (a counter by its ``_total``
    sample), so a new metric cannot go undocumented."""
    text = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(stockade_[a-z0-9_]+)`", text))
    expected = set()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            expected.add(value._name + ("_total" if value._type == "counter" else ""))
    expected |= {"stockade_agent_jobs_running", "stockade_agent_heartbeat_ack_age_seconds"}
    expected |= {"stockade_agent_fence_after_seconds", "stockade_agent_fence_state"}
    assert not expected - documented, sorted(expected - documented)
    assert not documented - expected, sorted(documented - expected)

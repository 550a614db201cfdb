"""A Prometheus configuration that scrapes every process of a local cluster, made from its
``cluster.json`` (docs/design.md, "Prometheus configuration of a local cluster"; docs/metrics.md
says how to run Prometheus and Grafana with it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import yaml

from ops.launcher.state import ClusterConfig

PROMETHEUS_CONFIG_FILE = "prometheus.yml"
TARGETS_FILE = "stockade-targets.json"
JOB_NAME = "stockade"
DEFAULT_SCRAPE_INTERVAL_S = 1.0
"""One scrape a second: a failover takes about two seconds (the lease ttl), and a slower scrape
would show it as one sample or none."""


@attrs.frozen(kw_only=True)
class PrometheusFiles:
    """What :func:`write_prometheus_config` wrote."""

    config_path: Path
    targets_path: Path
    targets: int
    """How many processes the targets file lists."""


def scrape_targets(config: ClusterConfig) -> list[dict[str, Any]]:
    """The ``file_sd_configs`` target groups of ``config``: one per process that serves metrics,
    in cluster.json's order, ``{"targets": ["host:port"], "labels": {"process": id, "role": kind}}``.
    A worker hosted in a fleet is scraped through its fleet (its samples carry ``worker_id``)."""
    addresses = config.metrics_addresses()
    return [
        {"targets": [addresses[spec.id]], "labels": {"process": spec.id, "role": spec.kind}}
        for spec in config.processes
        if spec.id in addresses
    ]


def prometheus_config(
    *, targets_file: str = TARGETS_FILE, scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
) -> dict[str, Any]:
    """``prometheus.yml`` as a mapping: one job, ``stockade``, scraping the targets listed in
    ``targets_file`` (relative to the configuration's folder) every ``scrape_interval_s`` seconds.

    Raises:
        ValueError: ``scrape_interval_s`` is not positive.
    """
    if not scrape_interval_s > 0:
        raise ValueError(f"scrape_interval_s must be > 0, got {scrape_interval_s}")
    interval = _duration(scrape_interval_s)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": JOB_NAME,
                "scrape_interval": interval,
                "scrape_timeout": _duration(min(scrape_interval_s, 10.0)),
                "file_sd_configs": [{"files": [targets_file], "refresh_interval": "5s"}],
            }
        ],
    }


def _duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as ``5s``, else milliseconds (``250ms``)."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def write_prometheus_config(
    config: ClusterConfig, out_dir: Path, *, scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
) -> PrometheusFiles:
    """Write ``prometheus.yml`` and ``stockade-targets.json`` for ``config`` into ``out_dir``
    (made if missing), each replaced atomically.

    Raises:
        ValueError: ``scrape_interval_s`` is not positive.
        OSError: a file cannot be written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = scrape_targets(config)
    text = yaml.safe_dump(prometheus_config(scrape_interval_s=scrape_interval_s), sort_keys=False)
    config_path = out_dir / PROMETHEUS_CONFIG_FILE
    targets_path = out_dir / TARGETS_FILE
    _replace(targets_path, json.dumps(targets, indent=2) + "\n")
    _replace(config_path, "# Written by `stockade prometheus-config` from cluster.json.\n" + text)
    return PrometheusFiles(config_path=config_path, targets_path=targets_path, targets=len(targets))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)

"""The Prometheus configuration of a local cluster (:mod:`ops.monitoring`, ``stockade
prometheus-config``): every process that serves metrics is a target, labelled with its id and
role, and Prometheus' own checker accepts the files."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ops.cli import app
from ops.cluster import ClusterConfig, StateDir
from ops.launcher.plan import LaunchOptions, plan
from ops.monitoring import prometheus_config, scrape_targets, write_prometheus_config


def planned(root: Path, *, workers: int = 5, fleet_size: int = 0, metrics: bool = True) -> ClusterConfig:
    """A new cluster of 3 control planes and ``workers`` workers as ``up`` would record it."""
    ports = itertools.count(7000)
    return plan(
        None,
        state=StateDir(root),
        database_url="postgresql://db/x",
        pg_port=None,
        control_planes=3,
        workers=workers,
        running=(),
        options=LaunchOptions(fleet_size=fleet_size, metrics=metrics),
        free_port=ports.__next__,
    ).config


def test_every_process_of_the_cluster_is_a_target_with_its_id_and_role(tmp_path: Path) -> None:
    """Control planes, agents and fleets each appear once, at the metrics address cluster.json
    records for them, labelled process and role; workers hosted in a fleet are not targets of
    their own (their fleet serves their samples)."""
    config = planned(tmp_path, workers=6, fleet_size=4)
    targets = scrape_targets(config)
    addresses = config.metrics_addresses()
    assert [t["labels"]["process"] for t in targets] == [p.id for p in config.processes]
    assert [t["labels"]["process"] for t in targets] == ["cp-1", "cp-2", "cp-3", "fleet-1", "fleet-2"]
    for target in targets:
        process = config.process(target["labels"]["process"])
        assert target == {
            "targets": [addresses[process.id]],
            "labels": {"process": process.id, "role": process.kind},
        }
    lone = scrape_targets(planned(tmp_path / "lone"))
    assert {t["labels"]["role"] for t in lone} == {"cp", "agent"} and len(lone) == 8


def test_a_cluster_planned_without_metrics_has_no_target(tmp_path: Path) -> None:
    """No process serves metrics: the targets list is empty, not wrong."""
    assert scrape_targets(planned(tmp_path, metrics=False)) == []


def test_the_configuration_scrapes_the_targets_file_at_the_interval_asked(tmp_path: Path) -> None:
    """prometheus.yml has one job that reads its targets from the file written beside it."""
    files = write_prometheus_config(planned(tmp_path), tmp_path / "out", scrape_interval_s=0.5)
    written = yaml.safe_load(files.config_path.read_text())
    assert written == prometheus_config(scrape_interval_s=0.5)
    (job,) = written["scrape_configs"]
    assert job["scrape_interval"] == "500ms" and job["job_name"] == "stockade"
    assert job["file_sd_configs"] == [{"files": [files.targets_path.name], "refresh_interval": "5s"}]
    assert json.loads(files.targets_path.read_text()) == scrape_targets(planned(tmp_path))
    assert files.targets == 8
    with pytest.raises(ValueError, match="scrape_interval_s must be > 0, got 0"):
        prometheus_config(scrape_interval_s=0)


def test_the_command_writes_the_recorded_clusters_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stockade prometheus-config`` writes both files into prometheus/ of the state folder (or
    --out), from cluster.json; with no cluster recorded it fails saying so."""
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("STOCKADE_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    missing = runner.invoke(app, ["prometheus-config"])
    assert missing.exit_code == 1 and "run `stockade up` first" in missing.output
    state = StateDir(tmp_path / "state")
    state.save(planned(state.root))
    result = runner.invoke(app, ["prometheus-config"])
    assert result.exit_code == 0, result.output
    targets = json.loads((state.root / "prometheus" / "stockade-targets.json").read_text())
    assert len(targets) == 8
    result = runner.invoke(app, ["prometheus-config", "--out", str(tmp_path / "elsewhere")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "elsewhere" / "prometheus.yml").exists()


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_accepts_the_generated_configuration(tmp_path: Path) -> None:
    """Prometheus' own checker accepts prometheus.yml and the targets file it names."""
    assert PROMTOOL is not None
    files = write_prometheus_config(planned(tmp_path, workers=4, fleet_size=2), tmp_path / "out")
    checked = subprocess.run(
        [PROMTOOL, "check", "config", str(files.config_path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr

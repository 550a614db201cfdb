"""``stockade chaos`` builds its :class:`ChaosSettings` from its options, whose defaults are the
settings class's, and its cluster from the others; nothing is started here (the harness is
replaced by one that stops at its construction)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import typer
from typer.testing import CliRunner

from ops.chaos_settings import ChaosSettings
from ops.cli import app
from ops.cluster import DockerCluster, LocalCluster, StateDir


def harness_given(args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``stockade chaos ARGS`` gives its harness (settings, cluster, progress)."""
    given: dict[str, Any] = {}

    def harness(**arguments: Any) -> None:
        given.update(arguments)
        raise typer.Exit(0)

    monkeypatch.setattr("ops.chaos.Harness", harness)
    result = CliRunner().invoke(app, ["chaos", *args], env={"DATABASE_URL": ""})
    assert result.exit_code == 0, result.output
    return given


def test_no_option_runs_the_settings_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without options a run is ``ChaosSettings()``, on a local cluster with TLS in the folder given."""
    given = harness_given(["--state-dir", str(tmp_path)], monkeypatch)
    assert given["settings"] == ChaosSettings()
    assert given["cluster"] == LocalCluster(StateDir(tmp_path), insecure=False, ha_db=False)


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        (["7"], "failovers", 7),
        (["--worker-kills", "2"], "worker_kills", 2),
        (["--worker-restarts", "3"], "worker_restarts", 3),
        (["--partitions", "4"], "partitions", 4),
        (["--partition-s", "5.5"], "partition_s", 5.5),
        (["--mass-partitions", "1"], "mass_partitions", 1),
        (["--mass-partition-s", "11"], "mass_partition_s", 11.0),
        (["--db-restarts", "2"], "db_restarts", 2),
        (["--workers", "4"], "workers", 4),
        (["--rate", "3.5"], "submit_rate_per_s", 3.5),
        (["--failing-share", "0.25"], "failing_share", 0.25),
        (["--gangs"], "gangs", True),
        (["--seed", "9"], "seed", 9),
        (["--accounts", "3"], "accounts", 3),
        (["--preemption"], "preemption", True),
        (["--schedule-every-s", "0"], "schedule_every_s", 0),
        (["--no-devices"], "devices", False),
    ],
)
def test_an_option_sets_its_field(
    args: list[str], field: str, value: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The failovers argument and each settings option set the field they name (``--rate``:
    ``submit_rate_per_s``) and no other."""
    given = harness_given([*args, "--state-dir", str(tmp_path)], monkeypatch)
    assert given["settings"] == attrs.evolve(ChaosSettings(), **{field: value})


def test_the_clusters_options_reach_the_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--insecure and --state-dir make the cluster (with --keep taken too)."""
    given = harness_given(["--insecure", "--keep", "--state-dir", str(tmp_path)], monkeypatch)
    assert given["cluster"] == LocalCluster(StateDir(tmp_path), insecure=True, ha_db=False)


def test_docker_runs_in_containers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--docker`` sets the field and makes the cluster one of containers."""
    given = harness_given(["0", "--docker", "--state-dir", str(tmp_path)], monkeypatch)
    assert given["settings"] == ChaosSettings(failovers=0, docker=True)
    assert isinstance(given["cluster"], DockerCluster)
    assert given["cluster"].state == StateDir(tmp_path)

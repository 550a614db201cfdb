"""A gang asking devices end to end (docs/gangs.md, "Devices"): a local cluster of real processes
whose two workers offer four fake gpu units each; a gang of 2 tasks asking 2 gpu each
(``stockade submit --tasks 2 --resource gpu=2``) runs with disjoint units named in each task's
environment, and the checker finds no unit held twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cluster import fetch, wait_for
from test_device_jobs_on_a_cluster import check_units
from test_job_resources_on_a_cluster import stockade

from ops.cluster import LocalCluster

pytestmark = pytest.mark.e2e


def test_a_gangs_tasks_get_disjoint_units_in_their_environment(tmp_path: Path, database_url: str) -> None:
    """Both tasks of a gang of 2 asking 2 gpu go to one worker by best fit, and each sees its own
    two units in STOCKADE_RESOURCE_GPU and CUDA_VISIBLE_DEVICES: 0,1 and 2,3."""
    cluster = LocalCluster(
        tmp_path / "state", database_url=database_url, agent_args=("--resource", "gpu=0,1,2,3")
    )
    try:
        ready = cluster.up(control_planes=1, workers=2)
        config = ready.config
        script = 'echo "$STOCKADE_RESOURCE_GPU $CUDA_VISIBLE_DEVICES"; sleep 1'
        submitted = stockade(
            config, "submit", "--tasks", "2", "--cpu-millis", "100", "--memory-mb", "32",
            "--resource", "gpu=2", "--", "sh", "-c", script,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        gang_id = int(submitted.stdout.strip())

        def tasks() -> list[tuple[int, str]]:
            rows = fetch(
                config.database_url,
                "SELECT id, state FROM jobs WHERE gang_id = $1 ORDER BY gang_rank",
                gang_id,
            )
            return [(int(r["id"]), r["state"]) for r in rows]

        wait_for(
            lambda: [s for _, s in tasks()] == ["succeeded"] * 2,
            timeout_s=60,
            what=f"gang {gang_id} to succeed",
        )
        seen = [stockade(config, "logs", str(job_id)).stdout.split() for job_id, _ in tasks()]
        assert sorted(seen) == [["0,1", "0,1"], ["2,3", "2,3"]]
        workers = fetch(
            config.database_url,
            "SELECT DISTINCT a.worker_id FROM assignments a JOIN jobs j ON j.id = a.job_id"
            " WHERE j.gang_id = $1",
            gang_id,
        )
        assert len(workers) == 1

        checked = check_units(cluster, config)
        assert checked.shared_units == 0 and checked.device_assignments == 2, checked.details
    finally:
        cluster.down()

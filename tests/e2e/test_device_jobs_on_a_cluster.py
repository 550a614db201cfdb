"""Countable devices end to end (docs/devices.md): a local cluster of real processes whose one
worker offers four fake gpu units (``stockade agent --resource gpu=0,1,2,3``); jobs submitted
with ``stockade submit --resource gpu=2`` get two units each, named in their environment, no
unit twice; a job asking a resource no worker offers waits, saying so; the checker finds no
unit held twice; ``stockade status`` shows the units."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import trio
from test_cluster import wait_for
from test_job_resources_on_a_cluster import stockade

from ops import checker
from ops.cluster import ClusterConfig, LocalCluster
from runtime.aio import asyncio_bridge

pytestmark = pytest.mark.e2e


def check_units(cluster: LocalCluster, config: ClusterConfig) -> checker.CheckReport:
    """The checker's report on ``cluster`` (as ``config`` records it): its history and its
    workers' logs, jobs still running allowed (``shared_units``, ``device_assignments``)."""

    async def report() -> checker.CheckReport:
        async with asyncio_bridge():
            history = await checker.load_history(config.database_url)
        return checker.check_logs(
            history, [cluster.state.work_dir(w.id) for w in config.workers], finish_required=False
        )

    return trio.run(report)


def test_jobs_get_distinct_units_named_in_their_environment(tmp_path: Path, database_url: str) -> None:
    """Two jobs asking 2 gpu each on a worker of 4 run at once on distinct units, each seeing
    STOCKADE_RESOURCE_GPU and CUDA_VISIBLE_DEVICES with its own ids, and one asking none sees
    CUDA_VISIBLE_DEVICES empty; a job asking 1 tpu stays pending with the reason that no worker
    offers tpu; the checker finds no unit held twice."""
    # Both gpu jobs hold their units until the test has seen both running: at once, whatever the
    # machine's load (a job that ended before the other started would free its units). The
    # jobs run as users of their own, so the folder they wait on is outside the test's.
    barrier = Path(tempfile.mkdtemp(prefix="stockade-barrier-"))
    barrier.chmod(0o755)
    go = barrier / "go"
    cluster = LocalCluster(
        tmp_path / "state", database_url=database_url, agent_args=("--resource", "gpu=0,1,2,3")
    )
    try:
        ready = cluster.up(control_planes=1, workers=1)
        config = ready.config
        script = (
            f'echo "$STOCKADE_RESOURCE_GPU $CUDA_VISIBLE_DEVICES"; while [ ! -e {go} ]; do sleep 0.1; done'
        )
        ids = []
        for _ in range(2):
            submitted = stockade(
                config, "submit", "--cpu-millis", "100", "--memory-mb", "32", "--resource", "gpu=2", "--",
                "sh", "-c", script,
            )  # fmt: skip
            assert submitted.returncode == 0, submitted.stderr
            ids.append(submitted.stdout.strip())
        plain = stockade(
            config, "submit", "--cpu-millis", "100", "--memory-mb", "32", "--",
            "sh", "-c", 'echo "[${CUDA_VISIBLE_DEVICES-unset}]"',
        )  # fmt: skip
        assert plain.returncode == 0, plain.stderr
        waiting = stockade(
            config, "submit", "--cpu-millis", "100", "--memory-mb", "32", "--resource", "tpu=1", "--", "true"
        )
        assert waiting.returncode == 0, waiting.stderr

        def state(job_id: str) -> dict[str, object]:
            shown = stockade(config, "job", job_id, "--json")
            assert shown.returncode == 0, shown.stderr
            return json.loads(shown.stdout)  # type: ignore[no-any-return]

        wait_for(
            lambda: all(state(i)["status"]["state"] == "running" for i in ids),  # type: ignore[index]
            timeout_s=60,
            what="both gpu jobs to run",
        )
        go.touch()
        wait_for(
            lambda: all(state(i)["status"]["state"] == "succeeded" for i in [*ids, plain.stdout.strip()]),  # type: ignore[index]
            timeout_s=60,
            what="the gpu jobs to succeed",
        )
        assert state(ids[0])["resources"] == {"gpu": 2}
        seen = [stockade(config, "logs", job_id).stdout.split() for job_id in ids]
        assert sorted(seen) == [["0,1", "0,1"], ["2,3", "2,3"]]
        # A job asking no gpu on a gpu worker is shown no device.
        assert stockade(config, "logs", plain.stdout.strip()).stdout.split() == ["[]"]
        pending = state(waiting.stdout.strip())["status"]
        assert pending["state"] == "pending"  # type: ignore[index]
        assert pending["reason"] == "unschedulable: needs 1 tpu, no worker offers tpu"  # type: ignore[index]
        status = json.loads(stockade(config, "status", "--json").stdout)
        assert status["workers"][0]["resources"] == {"gpu": ["0", "1", "2", "3"]}
        assert status["devices"] == {"gpu": {"in_use": 0, "offered": 4}}

        checked = check_units(cluster, config)
        assert checked.shared_units == 0 and checked.device_assignments == 2, checked.details
    finally:
        cluster.down()
        shutil.rmtree(barrier, ignore_errors=True)

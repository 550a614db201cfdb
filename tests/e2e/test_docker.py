"""The cluster in containers (``stockade up --docker``) on a real Docker engine: jobs run, the
leader's container dies and another leads, ``down`` removes exactly what the cluster made; and
a short chaos run on containers (docker kill, docker pause, network cuts, a database container
restart) keeps every safety count at zero. Skipped, saying why, where no engine answers or the
image cannot be built."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from ops.chaos import Harness
from ops.chaos_settings import ChaosSettings
from ops.cluster import DockerCluster, StateDir
from ops.launcher.docker_engine import CLUSTER_LABEL
from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.client import ControlPlaneClient

pytestmark = pytest.mark.e2e


def _labelled(state: StateDir) -> tuple[list[str], list[str]]:
    """Names of the containers and networks carrying ``state``'s cluster label."""
    import docker

    client = docker.from_env()
    label = {"label": f"{CLUSTER_LABEL}={state.root}"}
    return (
        [c.name for c in client.containers.list(all=True, filters=label)],
        [n.name for n in client.networks.list(filters=label)],
    )


async def test_a_cluster_in_containers_runs_jobs_survives_its_leader_and_goes_away(
    tmp_path: Path, stockade_image: str
) -> None:
    """Two control planes and two workers in containers: a command job runs in a worker's
    container and its output lands in the state folder; the leader's container is killed and
    the other replica leads at a higher epoch; ``down`` removes every container and the network
    it made, and a container of another cluster stays."""
    import docker

    state = StateDir(tmp_path / "state")
    cluster = DockerCluster(state, image=stockade_image)
    bystander = docker.from_env().containers.create(
        stockade_image, ["true"], labels={CLUSTER_LABEL: str(tmp_path / "another")}
    )
    try:
        result = await trio.to_thread.run_sync(lambda: cluster.up(control_planes=2, workers=2))
        config = result.config
        assert config.docker is not None and len(config.workers) == 2
        assert all(p.address.startswith(config.docker.subnet.rsplit(".", 1)[0]) for p in config.processes)
        async with asyncio_bridge():
            client = ControlPlaneClient(config.control_plane_addresses, timeout_s=2.0, tls=config.client_tls)
            try:
                spec = pb.JobSpec(
                    name="hello",
                    cpu_millis=100,
                    memory_mb=64,
                    command=pb.CommandRuntime(argv=["sh", "-c", "echo hello from $(hostname)"]),
                )
                job_id = (await client.call("submit_job", pb.SubmitJobRequest(spec=spec))).job_id
                with trio.fail_after(30):
                    while (job := await client.call("get_job", pb.GetJobRequest(job_id=job_id))).state != (
                        "succeeded"
                    ):
                        assert job.state not in ("failed", "cancelled"), job
                        await trio.sleep(0.2)
                output = (state.work_dir(job.worker_id) / "jobs").glob(f"{job_id}-*/stdout.log")
                assert [p.read_text() for p in output] == [f"hello from {job.worker_id}\n"]

                before = await client.call("status", pb.StatusRequest())
                await trio.to_thread.run_sync(cluster.kill, before.leader)
                with trio.fail_after(30):
                    while True:
                        try:
                            after = await client.call("status", pb.StatusRequest())
                            if after.leader and after.leader != before.leader and after.epoch > before.epoch:
                                break
                        except Exception:  # the killed replica's address: the client tries the next
                            pass
                        await trio.sleep(0.1)
            finally:
                client.close()
    finally:
        report = await trio.to_thread.run_sync(cluster.down)
        try:
            assert _labelled(state) == ([], [])
            bystander.reload()
            assert bystander.status == "created"
        finally:
            bystander.remove(force=True)
    assert report.database_stopped
    assert set(report.terminated) >= {"w-1", "w-2"}


async def test_a_short_chaos_run_on_containers_places_and_runs_every_job_once(
    tmp_path: Path, stockade_image: str
) -> None:
    """Failovers by docker kill and docker pause (one inside a fenced transaction), a worker
    container killed, a worker cut off the network and a database container restart, under a
    steady job stream: every job finishes, none is placed or run twice, no worker is declared
    dead falsely and the outage kills nothing."""
    state = StateDir(tmp_path / "chaos")
    cluster = DockerCluster(state, image=stockade_image)
    settings = ChaosSettings(
        failovers=4,
        worker_kills=1,
        partitions=1,
        db_restarts=1,
        workers=4,
        submit_rate_per_s=6.0,
        docker=True,
        seed=5,
    )
    started = time.monotonic()
    try:
        result = await Harness(settings=settings, cluster=cluster, progress=lambda line: None).run()
    finally:
        await trio.to_thread.run_sync(cluster.down)
    data = result.to_json()
    assert not result.errors, result.errors
    assert (data["double_placements"], data["double_runs"], data["false_deaths"]) == (0, 0, 0), data[
        "details"
    ]
    assert (data["jobs_killed_by_outage"], data["acknowledged_submissions_lost"]) == (0, 0)
    assert data["jobs_finished"] == data["jobs_submitted"] > 0
    assert data["failovers"]["frozen_in_transaction"] == 1 and data["stale_writes_rejected"] >= 1
    assert result.ok, (data, time.monotonic() - started)
    assert _labelled(state) == ([], [])

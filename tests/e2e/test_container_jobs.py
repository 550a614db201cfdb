"""Container jobs end to end: a cluster started by the launcher of `stockade up` places them on
its workers (whose agents found the engine), runs them in containers and records how they
ended; the workers' containers are gone afterwards. Skips, saying why, without an engine."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from container_images import remove_containers

from ops import rpc
from ops.cluster import LocalCluster, UpResult
from protocol import pb

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path, database_url: str, job_image: str) -> Iterator[tuple[LocalCluster, UpResult]]:
    """One control plane and one worker on the test's database, brought down afterwards."""
    local = LocalCluster(tmp_path / "stockade", database_url=database_url)
    try:
        yield local, local.up(control_planes=1, workers=1)
    finally:
        local.down()
        remove_containers("w-1")


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


def test_container_jobs_run_on_a_worker_with_an_engine_and_say_how_they_ended(
    cluster: tuple[LocalCluster, UpResult], job_image: str
) -> None:
    """The worker registers container=docker; a container job succeeds with its output in its
    stdout file, one past its memory fails as oom_killed, one with a missing image as
    image_not_found, each shown by GetJob."""
    _, ready = cluster
    addresses, tls = ready.config.control_plane_addresses, ready.config.client_tls

    def submit(image: str, argv: list[str], memory_mb: int = 256) -> int:
        spec = pb.JobSpec(
            name="c",
            cpu_millis=500,
            memory_mb=memory_mb,
            container=pb.ContainerRuntime(image=image, argv=argv),
        )
        return int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=spec), tls=tls).job_id)

    ok = submit(job_image, ["python3", "-c", "print('hello')"])
    oom = submit(job_image, ["python3", "-c", "bytearray(200 * 2**20)"], memory_mb=64)
    missing = submit("stockade-no-such-image:0", ["true"])

    def job(job_id: int) -> pb.JobInfo:
        return rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)

    _wait_for(
        lambda: all(job(j).state in ("succeeded", "failed") for j in (ok, oom, missing)),
        timeout_s=90,
        what="the container jobs to end",
    )
    done = job(ok)
    assert done.state == "succeeded" and done.exit_code == 0
    assert Path(done.stdout_path).read_text() == "hello\n"
    assert job(oom).state == "failed" and job(oom).reason.startswith("oom_killed: ")
    assert job(missing).state == "failed" and job(missing).reason.startswith("image_not_found: ")

"""`stockade run FILE` against a real cluster (one control plane, one worker, started by the
launcher of `stockade up`): a file's jobs stored in one call and run, and a job exported with
`stockade job ID --json` submitted again as the same spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ops import rpc
from ops.cluster import LocalCluster, UpResult
from protocol import pb
from runtime.wire_jobs import job_spec_from_pb

pytestmark = pytest.mark.e2e

Launch = Callable[[int, int], UpResult]


@pytest.fixture
def launch(tmp_path: Path, database_url: str) -> Iterator[Launch]:
    """Start a local cluster on the test's database; it is brought down afterwards."""
    clusters: list[LocalCluster] = []

    def start(control_planes: int, workers: int) -> UpResult:
        cluster = LocalCluster(tmp_path / "stockade", database_url=database_url)
        clusters.append(cluster)
        return cluster.up(control_planes=control_planes, workers=workers)

    try:
        yield start
    finally:
        for cluster in clusters:
            cluster.down()


def wait_for(predicate: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


JOB_FILE = """\
[[job]]
name = "hello"
cpu_millis = 100
memory_mb = 64
command = ["sh", "-c", "echo hello"]
max_attempts = 2
retry_backoff_s = 0.5
timeout_s = 60
constraints = ["container"]
env = { MODE = "fast" }
workdir = "/tmp"

[[job]]
name = "nap"
cpu_millis = 100
memory_mb = 64
sleep_s = 0.2
"""


def stockade(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_a_job_file_runs_and_its_export_runs_again_as_the_same_spec(launch: Launch, tmp_path: Path) -> None:
    """Two jobs from a TOML file: both stored, with every field as written, and both succeed;
    `stockade job ID --json` of the first, run again with `stockade run`, stores the same spec."""
    ready = launch(1, 1)
    addresses = ready.config.control_plane_addresses
    tls = ready.config.client_tls
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env["STOCKADE_CERTS_DIR"] = str(ready.config.cert_dir)  # the cluster's operator certificate
    where = ["--control-planes", ",".join(addresses)]
    path = tmp_path / "jobs.toml"
    path.write_text(JOB_FILE)

    completed = stockade("run", str(path), *where, env=env)
    assert completed.returncode == 0, completed.stderr
    hello_id, nap_id = (int(line) for line in completed.stdout.split())

    def info(job_id: int) -> pb.JobInfo:
        return rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)

    hello = job_spec_from_pb(info(hello_id).spec)
    assert (hello.name, hello.max_attempts, hello.retry_backoff_s, hello.timeout_s) == ("hello", 2, 0.5, 60.0)
    assert [c.describe() for c in hello.constraints] == ["container"]
    assert (hello.env, hello.workdir) == ((("MODE", "fast"),), "/tmp")
    for job_id in (hello_id, nap_id):
        wait_for(lambda job_id=job_id: info(job_id).state == "succeeded", timeout_s=60, what=f"job {job_id}")

    exported = stockade("job", str(hello_id), "--json", *where, env=env)
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["status"]["state"] == "succeeded"
    again = tmp_path / "hello.json"
    again.write_text(exported.stdout)
    completed = stockade("run", str(again), *where, env=env)
    assert completed.returncode == 0, completed.stderr
    assert job_spec_from_pb(info(int(completed.stdout)).spec) == hello


def test_a_bad_job_file_stores_nothing(launch: Launch, tmp_path: Path) -> None:
    """A file whose second job breaks a rule: exit 2 naming the line, and no job stored."""
    ready = launch(1, 1)
    addresses = ready.config.control_plane_addresses
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env["STOCKADE_CERTS_DIR"] = str(ready.config.cert_dir)
    path = tmp_path / "jobs.toml"
    path.write_text(JOB_FILE + "max_attempts = 0\n")
    completed = stockade("run", str(path), "--control-planes", ",".join(addresses), env=env)
    assert completed.returncode == 2
    assert completed.stderr.strip() == f"error: {path}:18: max_attempts must be between 1 and 100, got 0"
    reply = rpc.call(addresses, "list_jobs", pb.ListJobsRequest(limit=10), tls=ready.config.client_tls)
    assert list(reply.jobs) == []

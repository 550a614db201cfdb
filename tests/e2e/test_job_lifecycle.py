"""The job lifecycle end to end, on a real local cluster: retries with backoff, timeouts,
constraints, the environment and the working directory."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ops import rpc
from ops.cluster import LocalCluster, UpResult
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.constraints import parse_constraint
from runtime.jobs import CommandRuntime, JobSpec, SleepRuntime
from runtime.tls import TlsFiles
from runtime.wire_jobs import job_spec_to_pb

pytestmark = pytest.mark.e2e

TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[tuple[LocalCluster, UpResult]]:
    """One control plane and two workers on the test's database, brought down afterwards."""
    local = LocalCluster(tmp_path / "stockade", database_url=database_url)
    try:
        yield local, local.up(control_planes=1, workers=2)
    finally:
        local.down()


def _submit(addresses: list[str], tls: TlsFiles | None, specs: list[JobSpec]) -> list[int]:
    async def body(client: ControlPlaneClient) -> list[int]:
        ids = []
        for spec in specs:
            reply = await client.call("submit_job", pb.SubmitJobRequest(spec=job_spec_to_pb(spec.check())))
            ids.append(int(reply.job_id))
        return ids

    return rpc.with_client(addresses, body, tls=tls)


def _job(addresses: list[str], tls: TlsFiles | None, job_id: int) -> pb.JobInfo:
    reply = rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)
    assert isinstance(reply, pb.JobInfo)
    return reply


def _wait(predicate: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may write to (jobs run as the agent's job user when it is root)."""
    folder = Path(tempfile.mkdtemp(prefix="stockade-e2e-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_retries_timeouts_constraints_env_and_workdir(
    cluster: tuple[LocalCluster, UpResult], tmp_path: Path, shared: Path
) -> None:
    """A job that always fails runs max_attempts times and ends failed with each attempt
    listed; one that fails once then succeeds ends succeeded on its second attempt; a job past
    its timeout ends failed with reason timeout; a job constrained to a label no worker has
    waits, saying which; a job with a missing workdir fails naming it; env reaches the job."""
    _, ready = cluster
    addresses, tls = ready.config.control_plane_addresses, ready.config.client_tls
    mark = shared / "flaky.mark"
    out = shared / "env.out"
    command = {"cpu_millis": 100, "memory_mb": 64}
    always_fails, flaky, too_long, constrained, no_workdir, env = _submit(
        addresses,
        tls,
        [
            JobSpec(
                name="always-fails",
                runtime=CommandRuntime(argv=("sh", "-c", "exit 3")),
                max_attempts=3,
                retry_backoff_s=0.2,
                **command,
            ),
            JobSpec(
                name="flaky",
                runtime=CommandRuntime(argv=("sh", "-c", 'test -e "$MARK" && exit 0; : > "$MARK"; exit 1')),
                max_attempts=2,
                retry_backoff_s=0.1,
                env={"MARK": str(mark)},
                **command,
            ),
            JobSpec(
                name="too-long",
                runtime=CommandRuntime(argv=("sleep", "60")),
                timeout_s=1.0,
                **command,
            ),
            JobSpec(
                name="constrained",
                runtime=SleepRuntime(duration_ms=10),
                constraints=(parse_constraint("gpu=a100"),),
                **command,
            ),
            JobSpec(
                name="no-workdir",
                runtime=CommandRuntime(argv=("true",)),
                workdir=str(tmp_path / "missing"),
                **command,
            ),
            JobSpec(
                name="env",
                runtime=CommandRuntime(argv=("sh", "-c", 'printf %s "$GREETING" > "$OUT"')),
                env={"GREETING": "hello", "OUT": str(out)},
                workdir=str(shared),
                **command,
            ),
        ],
    )
    ended = [always_fails, flaky, too_long, no_workdir, env]
    _wait(
        lambda: all(_job(addresses, tls, j).state in TERMINAL for j in ended),
        timeout_s=60,
        what="the jobs to end",
    )

    info = _job(addresses, tls, always_fails)
    assert (info.state, info.attempts, info.failures) == ("failed", 3, 3)
    assert [a.end_reason for a in info.attempt_history] == ["failed"] * 3
    assert all(a.counted and a.exit_code == 3 for a in info.attempt_history)

    info = _job(addresses, tls, flaky)
    assert (info.state, info.attempts, info.failures) == ("succeeded", 2, 1)
    assert [a.end_reason for a in info.attempt_history] == ["failed", "succeeded"]

    info = _job(addresses, tls, too_long)
    assert info.state == "failed" and info.attempt_history[-1].end_reason == "timeout"
    assert info.reason.startswith("timeout:")

    info = _job(addresses, tls, no_workdir)
    assert info.state == "failed" and info.reason.startswith("workdir_not_found:")

    assert _job(addresses, tls, env).state == "succeeded"
    assert out.read_text() == "hello"

    _wait(
        lambda: _job(addresses, tls, constrained).reason.startswith("unschedulable"),
        timeout_s=10,
        what="the constrained job's reason",
    )
    info = _job(addresses, tls, constrained)
    assert info.state == "pending"
    assert info.reason == "unschedulable: no live worker has gpu=a100"

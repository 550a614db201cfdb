"""`stockade logs` on a real local cluster (two control planes and a worker, started by the
launcher of `stockade up`, over mutual TLS), whose worker listens on 127.0.0.2, another address
than the control planes' and the client's: following a running job streams its output as it
comes, and goes on through the other control plane when the one relaying it is killed;
`stockade job` shows its last lines, and the bad inputs (an unknown job, a job whose
worker is gone) exit with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ops import rpc
from ops.cluster import LocalCluster, UpResult
from protocol import pb
from runtime.os_users import ensure_traversable

pytestmark = pytest.mark.e2e

WORKER_HOST = "127.0.0.2"


def gated_steps(gate: Path) -> str:
    """A job that prints two lines, waits (at most a minute) until ``gate`` exists, then prints
    two more: it is surely running when its first lines are read."""
    return (
        "import os, time\n"
        "print('step 1', flush=True)\n"
        "print('step 2', flush=True)\n"
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print('step 3', flush=True)\n"
        "print('step 4', flush=True)\n"
    )


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[tuple[LocalCluster, UpResult]]:
    """cp-1, cp-2 and w-1, whose agent listens on 127.0.0.2; brought down afterwards."""
    local = LocalCluster(tmp_path / "stockade", database_url=database_url, agent_args=("--host", WORKER_HOST))
    try:
        yield local, local.up(control_planes=2, workers=1)
    finally:
        local.down()


def wait_for(predicate: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


class Client:
    """The cluster's operator, through the library and through the CLI."""

    def __init__(self, ready: UpResult) -> None:
        self.addresses = ready.config.control_plane_addresses
        self.tls = ready.config.client_tls
        self.env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
        self.env["STOCKADE_CERTS_DIR"] = str(ready.config.cert_dir)
        self.where = ["--control-planes", ",".join(self.addresses)]

    def submit(self, script: str, **lifecycle: int) -> int:
        spec = pb.JobSpec(
            name="steps",
            cpu_millis=100,
            memory_mb=64,
            command=pb.CommandRuntime(argv=[sys.executable, "-c", script]),
            **lifecycle,
        )
        reply = rpc.call(self.addresses, "submit_job", pb.SubmitJobRequest(spec=spec), tls=self.tls)
        return int(reply.job_id)

    def job(self, job_id: int) -> pb.JobInfo:
        return rpc.call(self.addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=self.tls)

    def stockade(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ops.cli", *args, *self.where],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
            check=False,
        )

    def follow(self, job_id: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "logs", str(job_id), "--follow", *self.where],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )


def follow_gated(client: Client, between: Callable[[int], None]) -> tuple[int, str, str, int]:
    """Submit :func:`gated_steps`, follow it with `stockade logs --follow`, and once its first
    two lines were printed call ``between(job_id)``, then open the gate; returns the job id,
    what the command printed, its stderr and its exit status."""
    # In /tmp itself, which the job's user (not the test's, when the agent runs as root) can look in.
    gate = Path("/tmp") / f"stockade-logs-gate-{uuid.uuid4().hex}"
    job_id = client.submit(gated_steps(gate))
    follower = client.follow(job_id)
    try:
        assert follower.stdout is not None and follower.stderr is not None
        lines = [follower.stdout.readline(), follower.stdout.readline()]
        between(job_id)
        gate.touch()
        lines.append(follower.stdout.read())
        follower.wait(60)
        errors = follower.stderr.read()
    finally:
        follower.kill()
        gate.unlink(missing_ok=True)
    return job_id, "".join(lines), errors, follower.returncode


def test_logs_follow_streams_a_running_jobs_output_from_a_worker_on_another_address(
    cluster: tuple[LocalCluster, UpResult],
) -> None:
    """Followed from submission: `stockade logs --follow` prints the job's first lines while it
    runs (it waits, holding its end, until they were read), then the rest as it comes, and
    exits 0 when the job ends; then `stockade job` shows those lines, read from w-1 at
    127.0.0.2 as well."""
    _, ready = cluster
    client = Client(ready)
    (worker,) = rpc.status(client.addresses, tls=client.tls).workers
    assert worker.address.startswith(f"{WORKER_HOST}:")
    states: list[str] = []
    job_id, printed, errors, code = follow_gated(
        client, lambda job_id: states.append(client.job(job_id).state)
    )
    assert states == ["running"], errors
    assert printed == "step 1\nstep 2\nstep 3\nstep 4\n", errors
    assert code == 0, errors
    wait_for(lambda: client.job(job_id).state == "succeeded", timeout_s=30, what=f"job {job_id} to succeed")
    shown = client.stockade("job", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert "stdout (last 4 lines, from w-1)" in shown.stdout
    assert "step 4" in shown.stdout


def test_logs_follow_goes_on_through_another_control_plane_when_its_own_is_killed(
    cluster: tuple[LocalCluster, UpResult],
) -> None:
    """While `stockade logs --follow` streams a running job through cp-1 (the first address it
    is given), cp-1 is killed: the stream is opened again through cp-2 from where it broke, so
    every line comes exactly once, and it exits 0 when the job ends."""
    local, ready = cluster
    (spec,) = [p for p in ready.config.processes if p.id == "cp-1"]

    def kill_cp_1(job_id: int) -> None:
        process = local.live_process(spec)
        assert process is not None
        process.kill()
        process.wait(10)

    _, printed, errors, code = follow_gated(Client(ready), kill_cp_1)
    assert printed == "step 1\nstep 2\nstep 3\nstep 4\n", errors
    assert code == 0, errors


def test_logs_follow_goes_on_through_the_runs_of_a_job_that_is_retried(
    cluster: tuple[LocalCluster, UpResult], tmp_path: Path
) -> None:
    """A job that fails its first run and succeeds its second (max_attempts 2): followed from
    submission, each run's output comes in turn, with a notice between them naming the new
    run, and the command exits 0 once the job has succeeded."""
    _, ready = cluster
    client = Client(ready)
    # Not in /tmp itself: what a run's uid leaves there is removed when the run ends
    # (docs/tenancy.md); a folder the test shares with the jobs keeps it.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    ensure_traversable(shared)
    marker = shared / f"stockade-logs-retry-{uuid.uuid4().hex}"
    script = (
        "import os, sys, time\n"
        f"first = not os.path.exists({str(marker)!r})\n"
        f"first and open({str(marker)!r}, 'a').close()\n"  # the second run's uid may not open it
        "print('first run' if first else 'second run', flush=True)\n"
        "time.sleep(0.5)\n"
        "sys.exit(1 if first else 0)\n"
    )
    try:
        job_id = client.submit(script, max_attempts=2, retry_backoff_ms=200)
        follower = client.follow(job_id)
        try:
            out, errors = follower.communicate(timeout=90)
        finally:
            follower.kill()
    finally:
        marker.unlink(missing_ok=True)
    assert follower.returncode == 0, errors
    assert out == "first run\nsecond run\n", errors
    assert f"job {job_id} runs again (assignment" in errors
    assert client.job(job_id).state == "succeeded"


def test_logs_follow_goes_on_with_the_next_run_when_the_worker_running_it_is_killed(
    tmp_path: Path, database_url: str
) -> None:
    """Following a job whose worker is SIGKILLed mid-run (two workers): the follower waits
    while the run is active, says once its worker is declared dead that the rest of that run's
    output stays on it, prints the next run's output (the job placed again on the other
    worker) and exits 0 with the job."""
    local = LocalCluster(tmp_path / "stockade", database_url=database_url)
    try:
        ready = local.up(control_planes=2, workers=2)
        client = Client(ready)

        def kill_its_worker(job_id: int) -> None:
            (running,) = [a for a in client.job(job_id).attempt_history if a.state == "active"]
            (spec,) = [p for p in ready.config.processes if p.id == running.worker_id]
            process = local.live_process(spec)
            assert process is not None
            process.kill()
            process.wait(10)

        job_id, out, errors, code = follow_gated(client, kill_its_worker)
    finally:
        local.down()
    assert code == 0, errors
    assert out == "step 1\nstep 2\nstep 1\nstep 2\nstep 3\nstep 4\n", errors
    assert "ended while its worker did not answer: the rest of its stdout is kept on that worker only" in (
        errors
    )
    assert f"job {job_id} runs again" in errors


def test_logs_follow_opened_after_a_retried_job_ended_prints_every_run(
    cluster: tuple[LocalCluster, UpResult],
) -> None:
    """A job whose two short runs both failed before anyone followed it: `stockade logs
    --follow` prints both runs' output, in order, with a notice between them, and exits 0."""
    _, ready = cluster
    client = Client(ready)
    job_id = client.submit("print('try')\nraise SystemExit(1)\n", max_attempts=2, retry_backoff_ms=200)
    wait_for(lambda: client.job(job_id).state == "failed", timeout_s=60, what=f"job {job_id} to fail")
    follower = client.follow(job_id)
    try:
        out, errors = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 0, errors
    assert out == "try\ntry\n", errors
    assert errors.count(f"job {job_id} runs again") == 1, errors


def test_logs_of_an_unknown_job_exit_2(cluster: tuple[LocalCluster, UpResult]) -> None:
    """`stockade logs 9999` of a cluster without that job: one line naming it, exit 2."""
    _, ready = cluster
    done = Client(ready).stockade("logs", "9999")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: job_id 9999 not found"


def test_logs_of_a_job_whose_worker_is_gone_name_the_worker_exit_1(
    cluster: tuple[LocalCluster, UpResult],
) -> None:
    """The job's worker killed (nothing listens at its address any more): every control plane
    says it cannot reach w-1 at its 127.0.0.2 address; one line, exit 1."""
    local, ready = cluster
    client = Client(ready)
    job_id = client.submit("print('done')")
    wait_for(lambda: client.job(job_id).state == "succeeded", timeout_s=60, what=f"job {job_id} to succeed")
    assert client.stockade("logs", str(job_id)).stdout == "done\n"
    (spec,) = [p for p in ready.config.processes if p.id == "w-1"]
    process = local.live_process(spec)
    assert process is not None
    process.kill()
    process.wait(10)
    (worker,) = rpc.status(client.addresses, tls=client.tls).workers
    done = client.stockade("logs", str(job_id))
    assert done.returncode == 1
    assert f"worker w-1 at {worker.address}" in done.stderr
    assert "asked 2 control planes" in done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1

"""Preemption end to end (docs/preemption.md): a local cluster of real processes whose control
plane runs with ``--preemption``; a high-priority job that fits nowhere stops a low-priority one,
which runs again afterwards with no attempt spent, and ``stockade check`` tells the preempted
run from a double run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cluster import fetch, list_jobs, wait_for
from test_drain_on_a_cluster import gates_folder

from ops import rpc
from ops.cluster import STATE_DIR_ENV, LocalCluster
from protocol import pb

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[LocalCluster]:
    """One control plane that preempts (a grace of 1 s) and one worker; brought down after."""
    cluster = LocalCluster(
        tmp_path / "stockade",
        database_url=database_url,
        cp_args=["--preemption", "--preempt-grace-s", "1"],
    )
    try:
        yield cluster
    finally:
        cluster.down()


def test_a_high_priority_job_preempts_a_low_one_which_runs_again_after_it(
    cluster: LocalCluster, database_url: str, tmp_path: Path
) -> None:
    """w-1 is filled by a priority-0 command job that runs until its gate opens; a priority-10
    sleep job of the same size preempts it: the low run is stopped (assignment stopped,
    'preempted'), the high job runs on w-1 and succeeds, then the low job runs again there and,
    its gate open, succeeds with one failure-free attempt left unspent; `stockade check` counts
    one preemption and no double run."""
    gate = gates_folder(tmp_path) / "low"
    up = cluster.up(control_planes=1, workers=1)
    addresses, tls = up.config.control_plane_addresses, up.config.client_tls
    (worker,) = up.status.workers
    size = {"cpu_millis": worker.cpu_millis, "memory_mb": min(worker.memory_mb, 256)}
    low_spec = pb.JobSpec(
        name="low",
        priority=0,
        command=pb.CommandRuntime(argv=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]),
        **size,
    )
    low = int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=low_spec), tls=tls).job_id)
    wait_for(
        lambda: list_jobs(addresses, tls)[low].state == "running", timeout_s=30, what="the low job to run"
    )

    high_spec = pb.JobSpec(name="high", priority=10, sleep=pb.SleepRuntime(duration_ms=1000), **size)
    high = int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=high_spec), tls=tls).job_id)
    wait_for(
        lambda: list_jobs(addresses, tls)[high].state == "succeeded",
        timeout_s=60,
        what="the high job to succeed",
    )
    gate.touch()
    wait_for(
        lambda: list_jobs(addresses, tls)[low].state == "succeeded",
        timeout_s=60,
        what="the low job to succeed",
    )

    rows = fetch(
        database_url,
        "SELECT job_id, worker_id, state, end_reason, preempted_by FROM assignments ORDER BY id",
    )
    assert [(r["job_id"], r["state"], r["end_reason"], r["preempted_by"]) for r in rows] == [
        (low, "stopped", "preempted", high),
        (high, "finished", "succeeded", None),
        (low, "finished", "succeeded", None),
    ]
    job = fetch(database_url, "SELECT failures, losses FROM jobs WHERE id = $1", low)[0]
    assert (job["failures"], job["losses"]) == (0, 0)

    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env[STATE_DIR_ENV] = str(cluster.state.root)
    checked = subprocess.run(
        [sys.executable, "-m", "ops.cli", "check", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    report = json.loads(checked.stdout)
    assert (report["preemptions"], report["double_runs"], report["double_placements"]) == (1, 0, 0), report
    assert checked.returncode == 0, report

"""End to end: a cluster stopped cleanly and started again passes the checker.

The operator's sequence: ``stockade up``, ``stockade jobs 12``, wait for them, ``stockade
down``, ``stockade up``, ``stockade check``. The workers stopped by ``down`` leave the cluster
(their rows become ``left``); none may be declared dead afterwards, and the checker must pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ops import rpc
from ops.cluster import STATE_DIR_ENV, LocalCluster
from protocol import pb
from runtime.settings import ReconcilerSettings

pytestmark = pytest.mark.e2e

JOBS_DONE_TIMEOUT_S = 90.0
DEAD_AFTER_S = ReconcilerSettings().dead_after_s
TERMINAL_STATES = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[LocalCluster]:
    """The default cluster's shape on the test's database, brought down afterwards."""
    local = LocalCluster(tmp_path / "stockade", database_url=database_url)
    try:
        yield local
    finally:
        local.down()


def stockade(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``stockade ARGS`` as an operator would, against the cluster of ``state``."""
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env[STATE_DIR_ENV] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def wait_until_silent(database_url: str, silent_s: float) -> None:
    """Return once no worker row has had a heartbeat for ``silent_s`` (database time)."""

    async def silent() -> bool:
        connection = await asyncpg.connect(database_url, timeout=10)
        try:
            return bool(
                await connection.fetchval(
                    "SELECT coalesce(bool_and(last_heartbeat_at < now() - make_interval(secs => $1)), true)"
                    " FROM workers",
                    silent_s,
                )
            )
        finally:
            await connection.close()

    while not asyncio.run(silent()):
        time.sleep(0.2)


def wait_until_done(addresses: list[str], job_ids: list[int]) -> None:
    deadline = time.monotonic() + JOBS_DONE_TIMEOUT_S
    while True:
        reply = rpc.call(addresses, "list_jobs", pb.ListJobsRequest(limit=1000))
        states = {int(j.job_id): j.state for j in reply.jobs}
        if all(states.get(j) in TERMINAL_STATES for j in job_ids):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs not finished after {JOBS_DONE_TIMEOUT_S:g} s: {states}")
        time.sleep(0.5)


def test_down_then_up_then_check_passes(cluster: LocalCluster, database_url: str) -> None:
    """up, jobs 12, wait, down, up, check: no worker is declared dead and the check exits 0."""
    state = cluster.state.root
    ready = cluster.up(control_planes=3, workers=5)
    addresses = ready.config.control_plane_addresses
    submitted = stockade(state, "jobs", "12")
    assert submitted.returncode == 0, submitted.stderr
    job_ids = [int(word) for word in submitted.stdout.rsplit(":", 1)[1].split()]
    assert len(job_ids) == 12
    wait_until_done(addresses, job_ids)

    cluster.down()
    # An operator's pause: long enough for every worker row to be silent past dead_after.
    wait_until_silent(database_url, DEAD_AFTER_S)
    # Ready means every worker registered a new incarnation: a declaration of an old one
    # (what a false death is here) could only have happened before.
    again = cluster.up(control_planes=3, workers=5)

    checked = stockade(state, "check", "--json")
    report: dict[str, Any] = json.loads(checked.stdout)
    assert report["false_deaths"] == 0, report["details"]
    assert report["worker_deaths"] == 0, report["details"]
    assert checked.returncode == 0, report
    assert {w.id: w.state for w in again.status.workers} == dict.fromkeys(
        (f"w-{i}" for i in range(1, 6)), "alive"
    )

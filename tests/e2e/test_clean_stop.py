"""End to end: a cluster stopped cleanly and started again passes the checker.

The operator's sequence: ``stockade up``, ``stockade jobs 12``, wait for them, ``stockade
down``, ``stockade up``, ``stockade check``. On a loaded machine the workers come back one by
one; a worker row that still looked alive from before ``down`` was then declared dead by the
new leader (a false death for the checker, exit 1). Here two workers are held back at the
second ``up`` (``held_launcher.py``) so that the leader judges the rows while three workers are
back and two are not, as it did on the loaded machine, every time. The workers stopped by
``down`` must have left (their rows ``left``), so none is declared dead, and the check passes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ops import rpc
from ops.cluster import STATE_DIR_ENV, LocalCluster, UpResult
from protocol import pb
from runtime.settings.leader import ReconcilerSettings
from runtime.tls import TlsFiles

pytestmark = pytest.mark.e2e

HELD_LAUNCHER = (str(Path(__file__).with_name("held_launcher.py")), "ops.cli")
WORKERS = 5
HELD = ("w-4", "w-5")
"""Fewer than the reconciler's mass_silence_min_workers (3): it would judge them one by one."""
RECONCILER = ReconcilerSettings()
JUDGED_AFTER_S = 8 * RECONCILER.reconcile_interval_s
"""How long the held workers stay away once the others are back: eight reconcile passes."""
JOBS_DONE_TIMEOUT_S = 90.0
TERMINAL_STATES = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[LocalCluster]:
    """The default cluster's shape on the test's database, brought down afterwards."""
    holds = tmp_path / "holds"
    holds.mkdir()
    local = LocalCluster(
        tmp_path / "stockade",
        database_url=database_url,
        launcher=HELD_LAUNCHER,
        extra_env={"STOCKADE_TEST_HOLD_DIR": str(holds)},
    )
    try:
        yield local
    finally:
        for hold in holds.iterdir():
            hold.unlink()
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


def query(database_url: str, sql: str, *args: Any) -> Any:
    async def run() -> Any:
        connection = await asyncpg.connect(database_url, timeout=10)
        try:
            return await connection.fetchval(sql, *args)
        finally:
            await connection.close()

    return asyncio.run(run())


def wait_for(database_url: str, sql: str, *args: Any, timeout_s: float = 60.0) -> None:
    """Poll until ``sql`` returns true."""
    deadline = time.monotonic() + timeout_s
    while not query(database_url, sql, *args):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for: {sql} {args}")
        time.sleep(0.1)


def wait_until_done(addresses: list[str], job_ids: list[int], tls: TlsFiles | None) -> None:
    deadline = time.monotonic() + JOBS_DONE_TIMEOUT_S
    while True:
        reply = rpc.call(addresses, "list_jobs", pb.ListJobsRequest(limit=1000), tls=tls)
        states = {int(j.job_id): j.state for j in reply.jobs}
        if all(states.get(j) in TERMINAL_STATES for j in job_ids):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs not finished after {JOBS_DONE_TIMEOUT_S:g} s: {states}")
        time.sleep(0.5)


def test_down_then_up_then_check_passes(cluster: LocalCluster, database_url: str, tmp_path: Path) -> None:
    """up, jobs 12, wait, down, up (two workers slow to come back), check: every worker left at
    down, none is declared dead, and the check exits 0 with no false death."""
    state = cluster.state.root
    ready = cluster.up(control_planes=3, workers=WORKERS)
    submitted = stockade(state, "jobs", "12")
    assert submitted.returncode == 0, submitted.stderr
    job_ids = [int(word) for word in submitted.stdout.rsplit(":", 1)[1].split()]
    assert len(job_ids) == 12
    wait_until_done(ready.config.control_plane_addresses, job_ids, ready.config.client_tls)

    cluster.down()
    assert query(database_url, "SELECT array_agg(DISTINCT state) FROM workers") == ["left"]
    assert query(database_url, "SELECT count(*) FROM worker_leaves") == WORKERS
    epoch_before = query(database_url, "SELECT epoch FROM lease")
    incarnation_before = query(database_url, "SELECT max(incarnation) FROM workers")
    # An operator's pause: every row silent past dead_after, as after any pause of a second or two.
    wait_for(
        database_url,
        "SELECT bool_and(last_heartbeat_at < now() - make_interval(secs => $1)) FROM workers",
        RECONCILER.dead_after_s,
    )

    for worker_id in HELD:
        (tmp_path / "holds" / f"hold-{worker_id}").touch()
    started: list[UpResult] = []
    up = threading.Thread(target=lambda: started.append(cluster.up(control_planes=3, workers=WORKERS)))
    up.start()
    try:
        # A new leader, and every worker back but the held ones: the leader now judges two
        # silent rows of five.
        wait_for(database_url, "SELECT epoch > $1 AND expires_at > now() FROM lease", epoch_before)
        wait_for(
            database_url,
            "SELECT count(*) = $1 FROM workers WHERE state = 'alive' AND incarnation > $2",
            WORKERS - len(HELD),
            incarnation_before,
        )
        judged_by = time.monotonic() + JUDGED_AFTER_S
        while time.monotonic() < judged_by and not query(database_url, "SELECT count(*) FROM worker_deaths"):
            time.sleep(0.1)
    finally:
        for worker_id in HELD:
            (tmp_path / "holds" / f"hold-{worker_id}").unlink()
        up.join()
    assert started, "the second up did not finish"
    assert {w.id: w.state for w in started[0].status.workers} == {
        f"w-{i}": "alive" for i in range(1, WORKERS + 1)
    }

    checked = stockade(state, "check", "--json")
    report: dict[str, Any] = json.loads(checked.stdout)
    assert (report["false_deaths"], report["worker_deaths"]) == (0, 0), report["details"]
    assert report["worker_leaves"] == WORKERS
    assert checked.returncode == 0, report

"""A worker whose wall clock is ten minutes off, then stepped twenty minutes back while its jobs
run, in a local cluster of real processes: the agent runs under Debian's libfaketime
(``faked_clock_launcher.py``; the control plane, the database and this test keep the true
clock). What `stockade job` shows, what `stockade job ID --events --json` lists and what the
checker reads of the worker's log are all on the database's clock, in order.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cluster import fetch, wait_for

from ops import checker, invariants, rpc
from ops.cluster import LocalCluster
from protocol import pb
from runtime.text import read_jsonl

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
LAUNCHER = (str(Path(__file__).with_name("faked_clock_launcher.py")), "ops.cli")
RUN_S = 3.0
"""How long each job runs."""


def libfaketime() -> Path | None:
    """Debian's libfaketime (package faketime), or None."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1")) + sorted(
        Path("/usr/lib/faketime").glob("libfaketime.so.1")
    )
    return found[0] if found else None


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[tuple[LocalCluster, Path]]:
    """One control plane and one worker whose agent's wall clock is the true one moved by the
    offset in the returned file (+600 s to begin with); brought down after."""
    lib = libfaketime()
    if lib is None:
        pytest.skip(
            "libfaketime is not installed (Debian: apt-get install faketime): it fakes the agent's clock"
        )
    offset = tmp_path / "faketime"
    offset.write_text("+600\n")
    cluster = LocalCluster(
        tmp_path / "stockade",
        database_url=database_url,
        launcher=LAUNCHER,
        extra_env={"STOCKADE_TEST_FAKETIME_LIB": str(lib), "STOCKADE_TEST_FAKETIME_FILE": str(offset)},
        # Certificates are judged by each peer's wall clock: the agent's is off by more than
        # their allowance for skew, which this test is not about.
        insecure=True,
    )
    try:
        yield cluster, offset
    finally:
        cluster.down()


def cli(cluster: LocalCluster, *args: str) -> str:
    """``stockade ARGS`` run as a command in the cluster's state folder; its standard output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_") or k == "STOCKADE_CONFIG"}
    env.update(STOCKADE_STATE_DIR=str(cluster.state.root), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_jobs_on_a_worker_whose_clock_is_off_and_stepped_read_in_database_time(
    cluster: tuple[LocalCluster, Path], database_url: str
) -> None:
    """A command job and a sleep job on a worker whose clock is ten minutes ahead, then ten
    minutes behind from the middle of their runs: each started no earlier than it was submitted
    and placed, finished at least its run's length later and no later than its assignment
    ended; `stockade job` shows that duration, `--events` lists its history in time order,
    ending with its final event; and the worker's log, as the checker reads it, has each run
    within its assignment, once."""
    local, offset = cluster
    ready = local.up(control_planes=1, workers=1)
    addresses = ready.config.control_plane_addresses
    specs = [
        pb.JobSpec(
            name="command",
            cpu_millis=100,
            memory_mb=32,
            command=pb.CommandRuntime(argv=["sh", "-c", f"sleep {RUN_S:g}"]),
        ),
        pb.JobSpec(
            name="sleep", cpu_millis=100, memory_mb=32, sleep=pb.SleepRuntime(duration_ms=int(RUN_S * 1000))
        ),
    ]
    job_ids = [
        int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=spec)).job_id) for spec in specs
    ]

    def states() -> list[str]:
        return [rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=j)).state for j in job_ids]

    wait_for(lambda: states() == ["running", "running"], timeout_s=30, what="both jobs to run")
    offset.write_text("-600\n")  # stepped back twenty minutes while they run
    wait_for(lambda: states() == ["succeeded", "succeeded"], timeout_s=30, what="both jobs to succeed")

    records = read_jsonl(local.state.work_dir("w-1") / "agent.jsonl")
    runs = {run.job_id: run for run in checker.runs_from_records(records)}
    assert sorted(runs) == sorted(job_ids) and not invariants.double_runs(runs.values())
    for job_id in job_ids:
        (t,) = fetch(
            database_url,
            "SELECT extract(epoch FROM j.submitted_at)::float8 AS submitted,"
            " extract(epoch FROM a.created_at)::float8 AS created,"
            " extract(epoch FROM j.started_at)::float8 AS started,"
            " extract(epoch FROM j.finished_at)::float8 AS finished,"
            " extract(epoch FROM a.ended_at)::float8 AS ended"
            " FROM jobs j JOIN assignments a ON a.job_id = j.id WHERE j.id = $1",
            job_id,
        )
        assert t["submitted"] <= t["created"] <= t["started"] <= t["finished"] <= t["ended"]
        assert t["finished"] - t["started"] >= RUN_S - 1e-3  # its run's length (a float's error aside)
        run = runs[job_id]
        assert t["created"] <= run.started_at <= run.ended_at <= t["ended"]

        shown = re.search(r"^duration\s+(-?[0-9.]+) s\b", cli(local, "job", str(job_id)), re.MULTILINE)
        assert shown is not None and float(shown.group(1)) >= RUN_S

        events: list[dict[str, Any]] = json.loads(cli(local, "job", str(job_id), "--events", "--json"))
        assert [e["kind"] for e in events] == ["submitted", "placed", "confirmed", "ended", "final"]
        at = [e["at_unix_s"] for e in events]
        assert at == sorted(at)

"""Drain and cordon end to end: a local cluster of real processes (the launcher of `stockade up`),
the operator's commands run as `stockade ...` processes.

Each test gets a fresh database (tests/conftest.py) and a state folder under ``tmp_path``; the
``launch`` fixture (tests/e2e/test_cluster.py) stops every process it started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_cluster import Launch, fetch, launch, list_jobs, wait_for  # noqa: F401 (launch: a fixture)

from ops import rpc
from ops.cluster import ClusterConfig
from protocol import pb
from runtime.os_users import ensure_traversable

pytestmark = pytest.mark.e2e


def gated(name: str, gate: Path) -> pb.JobSpec:
    """A command job that runs until the file ``gate`` exists, then succeeds: it is still
    running whenever the test needs it to be, however slow the machine."""
    return pb.JobSpec(
        name=name,
        cpu_millis=1000,
        memory_mb=128,
        command=pb.CommandRuntime(argv=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]),
    )


def gates_folder(tmp_path: Path) -> Path:
    """A folder the jobs can see (they run as the agent's job user when the tests run as root)."""
    folder = tmp_path / "gates"
    folder.mkdir()
    folder.chmod(0o1777)
    ensure_traversable(folder)
    return folder


def stockade(config: ClusterConfig, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``stockade ARGS`` against the cluster, as its operator."""
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env["STOCKADE_CERTS_DIR"] = str(config.cert_dir)  # the cluster's operator certificate
    addresses = ",".join(config.control_plane_addresses)
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args, "--control-planes", addresses],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_a_drained_worker_moves_its_jobs_and_stops_with_nothing_lost(
    launch: Launch,  # noqa: F811 (the fixture imported above)
    database_url: str,
    tmp_path: Path,
) -> None:
    """Four jobs run on w-1, each until the test opens its gate; the first two are let finish
    there. `stockade drain w-1 --deadline-s 2` cordons it: the two still running (their gate
    opens only after the drain) are stopped at the deadline and run again on w-2, with no loss
    counted; the command answers `drained`, and `status --json` says so. w-1's agent is then
    stopped cleanly, and every job succeeds."""
    folder = gates_folder(tmp_path)
    short_gate, long_gate = folder / "short", folder / "long"
    cluster, ready = launch(1, 2)
    config = ready.config
    addresses, tls = config.control_plane_addresses, config.client_tls

    cordon = stockade(config, "cordon", "w-2")  # so that all four land on w-1
    assert cordon.returncode == 0, cordon.stderr
    assert cordon.stdout.strip() == "w-2: cordoned, no new placements; no job there"
    jobs = []
    for index, gate in enumerate((short_gate, short_gate, long_gate, long_gate)):
        spec = gated(f"drain-{index}", gate)
        jobs.append(int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=spec), tls=tls).job_id))

    def all_running() -> bool:
        return all(j.state == "running" for j in (list_jobs(addresses, tls)[i] for i in jobs))

    wait_for(all_running, timeout_s=30, what="the four jobs to run")
    assert {list_jobs(addresses, tls)[i].worker_id for i in jobs} == {"w-1"}
    short_gate.touch()

    def short_ones_succeeded() -> bool:
        return all(list_jobs(addresses, tls)[i].state == "succeeded" for i in jobs[:2])

    wait_for(short_ones_succeeded, timeout_s=30, what="the two short jobs to succeed on w-1")
    uncordon = stockade(config, "uncordon", "w-2")
    assert uncordon.returncode == 0, uncordon.stderr

    drain = stockade(config, "drain", "w-1", "--deadline-s", "2", "--wait-s", "60")
    assert drain.returncode == 0, drain.stderr
    said = drain.stdout.strip().splitlines()
    assert said[0].startswith("w-1: draining, ") and "stopped and placed elsewhere at" in said[0]
    assert said[-1] == "w-1: drained, no job left; its agent can be stopped"

    status = stockade(config, "status", "--json")
    assert status.returncode == 0, status.stderr
    w1 = next(w for w in json.loads(status.stdout)["workers"] if w["id"] == "w-1")
    assert (w1["cordoned"], w1["draining"], w1["drained"], w1["jobs"]) == (True, False, True, [])
    assert isinstance(w1["drain_deadline_unix_s"], float)

    cluster.kill("w-1", signal.SIGTERM)  # a clean stop: the agent leaves
    long_gate.touch()  # the two jobs, placed again on w-2, may end now

    def all_succeeded() -> bool:
        return all(list_jobs(addresses, tls)[i].state == "succeeded" for i in jobs)

    wait_for(all_succeeded, timeout_s=60, what="every job to succeed")
    rows = fetch(
        database_url,
        "SELECT a.job_id, a.worker_id, a.state, a.end_reason, j.losses FROM assignments a"
        " JOIN jobs j ON j.id = a.job_id WHERE a.job_id = ANY($1::bigint[]) ORDER BY a.id",
        jobs,
    )
    by_job = {
        job: [(r["worker_id"], r["state"], r["end_reason"]) for r in rows if r["job_id"] == job]
        for job in jobs
    }
    for job in jobs[:2]:
        assert by_job[job] == [("w-1", "finished", "succeeded")]
    for job in jobs[2:]:
        assert by_job[job] == [("w-1", "stopped", "drained"), ("w-2", "finished", "succeeded")]
    assert {r["losses"] for r in rows} == {0}
    assert fetch(database_url, "SELECT count(*) AS n FROM worker_deaths")[0]["n"] == 0
    after = rpc.status(addresses, tls=tls)
    assert next(w for w in after.workers if w.id == "w-1").state == "left"

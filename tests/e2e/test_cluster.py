"""End to end with real processes: control planes and agents started by the launcher of `stockade up`.

Each test gets a fresh database (tests/conftest.py) and a state folder under ``tmp_path``;
the ``launch`` fixture stops every process it started, also when the test fails.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ops import rpc
from ops.cluster import LocalCluster, UpResult
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.tls import TlsFiles

pytestmark = pytest.mark.e2e

JOB_COUNT = 30
JOBS_DONE_TIMEOUT_S = 90.0
TERMINAL_STATES = {"succeeded", "failed", "cancelled"}

Launch = Callable[[int, int], tuple[LocalCluster, UpResult]]


@pytest.fixture
def launch(tmp_path: Path, database_url: str) -> Iterator[Launch]:
    """Start a local cluster on the test's database; every one started is brought down afterwards."""
    clusters: list[LocalCluster] = []

    def start(control_planes: int, workers: int) -> tuple[LocalCluster, UpResult]:
        cluster = LocalCluster(tmp_path / f"stockade-{len(clusters)}", database_url=database_url)
        clusters.append(cluster)
        return cluster, cluster.up(control_planes=control_planes, workers=workers)

    try:
        yield start
    finally:
        for cluster in clusters:
            cluster.down()


def submit_sleep_jobs(
    addresses: list[str], durations_s: list[float], rng: random.Random, tls: TlsFiles | None
) -> list[int]:
    async def body(client: ControlPlaneClient) -> list[int]:
        ids = []
        for index, duration_s in enumerate(durations_s):
            spec = pb.JobSpec(
                name=f"e2e-{index}",
                cpu_millis=rng.choice((500, 1000, 2000)),
                memory_mb=rng.choice((128, 256, 1024)),
                sleep=pb.SleepRuntime(duration_ms=int(duration_s * 1000)),
            )
            reply = await client.call("submit_job", pb.SubmitJobRequest(spec=spec))
            ids.append(int(reply.job_id))
        return ids

    return rpc.with_client(addresses, body, tls=tls)


def list_jobs(addresses: list[str], tls: TlsFiles | None) -> dict[int, pb.JobInfo]:
    reply = rpc.call(addresses, "list_jobs", pb.ListJobsRequest(limit=1000), tls=tls)
    return {int(job.job_id): job for job in reply.jobs}


def wait_for(predicate: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


def fetch(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            return await connection.fetch(query, *args)
        finally:
            await connection.close()

    return asyncio.run(run())


def read_agent_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_thirty_jobs_run_exactly_once_across_a_leader_kill(launch: Launch, database_url: str) -> None:
    """30 sleep jobs all succeed exactly once, on one worker each, when the leader is SIGKILLed midway."""
    cluster, ready = launch(3, 3)
    addresses = ready.config.control_plane_addresses
    tls = ready.config.client_tls
    old_leader, old_epoch = ready.status.leader, int(ready.status.epoch)
    rng = random.Random(30)
    durations_s = [round(rng.uniform(1.0, 3.0), 1) for _ in range(JOB_COUNT)]

    job_ids = submit_sleep_jobs(addresses, durations_s[: JOB_COUNT // 2], rng, tls)

    def some_jobs_started() -> bool:
        jobs = list_jobs(addresses, tls)
        return sum(j.state in ("running", "succeeded") for j in jobs.values()) >= 5

    wait_for(some_jobs_started, timeout_s=30, what="5 jobs to start")
    cluster.kill(old_leader)
    # Submissions are recorded by any replica, also while no one leads.
    job_ids += submit_sleep_jobs(addresses, durations_s[JOB_COUNT // 2 :], rng, tls)
    assert len(set(job_ids)) == JOB_COUNT

    def all_done() -> bool:
        jobs = list_jobs(addresses, tls)
        return all(jobs[j].state in TERMINAL_STATES for j in job_ids)

    wait_for(all_done, timeout_s=JOBS_DONE_TIMEOUT_S, what=f"all {JOB_COUNT} jobs to finish")

    jobs = list_jobs(addresses, tls)
    assert {j: jobs[j].state for j in job_ids} == dict.fromkeys(job_ids, "succeeded")

    after = rpc.status(addresses, tls=tls)
    assert after.leader and after.leader != old_leader
    assert after.epoch > old_epoch

    # The assignment table: one finished assignment per job, and never two active at once.
    rows = fetch(
        database_url,
        "SELECT job_id, id, state, created_at, ended_at FROM assignments "
        "WHERE job_id = ANY($1::bigint[]) ORDER BY job_id, created_at, id",
        job_ids,
    )
    by_job: dict[int, list[asyncpg.Record]] = collections.defaultdict(list)
    for row in rows:
        by_job[row["job_id"]].append(row)
    for job_id in job_ids:
        assignments = by_job[job_id]
        finished = [a for a in assignments if a["state"] == "finished"]
        assert len(finished) == 1, f"job {job_id} has assignments {[dict(a) for a in assignments]}"
        assert all(a["ended_at"] is not None for a in assignments), f"job {job_id} still has an active one"
        for earlier, later in itertools.pairwise(assignments):
            assert earlier["ended_at"] <= later["created_at"], (
                f"job {job_id}: assignments {earlier['id']} and {later['id']} were active together"
            )

    # The workers' logs: one start per job, on one worker.
    starts: dict[int, list[tuple[str, int]]] = collections.defaultdict(list)
    for spec in ready.config.workers:
        for record in read_agent_log(cluster.state.work_dir(spec.id) / "agent.jsonl"):
            if record["event"] == "start":
                assert record["worker_id"] == spec.id
                starts[record["job_id"]].append((spec.id, record["assignment_id"]))
    for job_id in job_ids:
        assert len(starts[job_id]) == 1, f"job {job_id} started {starts[job_id]}"
        worker_id, assignment_id = starts[job_id][0]
        assert (worker_id, assignment_id) == (jobs[job_id].worker_id, jobs[job_id].assignment_id)


def test_status_json_prints_the_stable_keys(launch: Launch) -> None:
    """`stockade status --json --control-planes ...` prints the documented keys and nothing else."""
    _, ready = launch(2, 2)
    addresses = ",".join(ready.config.control_plane_addresses)
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env["STOCKADE_CERTS_DIR"] = str(ready.config.cert_dir)  # the cluster's operator certificate
    completed = subprocess.run(
        [sys.executable, "-m", "ops.cli", "status", "--json", "--control-planes", addresses],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert set(data) == {
        "leader",
        "epoch",
        "control_planes",
        "workers",
        "devices",
        "jobs",
        "unschedulable",
        "heartbeat",
        "metrics",
    }
    assert data["devices"] == {}
    assert data["heartbeat"] == {
        "interval_s": 0.25,
        "dead_after_s": 2.5,
        "reason": "the control planes' settings",
    }
    assert isinstance(data["metrics"], dict)
    assert data["leader"] in {"cp-1", "cp-2"}
    assert isinstance(data["epoch"], int) and data["epoch"] >= 1
    assert [cp["id"] for cp in data["control_planes"]] == ["cp-1", "cp-2"]
    assert all(set(cp) == {"id", "address", "role"} for cp in data["control_planes"])
    assert {cp["role"] for cp in data["control_planes"]} == {"leader", "standby"}
    assert [w["id"] for w in data["workers"]] == ["w-1", "w-2"]
    for worker in data["workers"]:
        assert set(worker) == {
            "id",
            "state",
            "cpu_millis",
            "memory_mb",
            "cpu_allocated_millis",
            "memory_allocated_mb",
            "jobs",
            "cordoned",
            "draining",
            "drained",
            "drain_deadline_unix_s",
            "labels",
            "unhealthy",
            "unhealthy_reason",
            "unhealthy_since_unix_s",
            "resources",
            "resources_in_use",
            "usage",
        }
        assert (worker["resources"], worker["resources_in_use"]) == ({}, {})
        # what the worker uses, from its latest sample (None until its first is stored)
        assert worker["usage"] is None or set(worker["usage"]) == {"cpu_millis", "memory_mb", "age_s"}
        assert worker["state"] == "alive"
        assert (worker["unhealthy"], worker["unhealthy_reason"], worker["unhealthy_since_unix_s"]) == (
            False,
            None,
            None,
        )
        assert (worker["cordoned"], worker["draining"], worker["drained"]) == (False, False, False)
        assert worker["drain_deadline_unix_s"] is None
        assert worker["jobs"] == []
    assert (data["workers"][0]["cpu_millis"], data["workers"][0]["memory_mb"]) == (4000, 8192)
    assert data["jobs"] == {
        "waiting": 0,
        "pending": 0,
        "assigned": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
    }
    assert data["unschedulable"] == []


CANCEL_TRIES = 4


def test_a_cancel_racing_a_job_that_ends_says_what_happened_and_keeps_it(launch: Launch) -> None:
    """Issue 10, fault 1, as a user meets it: a 0.3 s sleep job (2,000 cpu_millis, 1,024
    memory_mb), cancelled with `stockade cancel` as soon as it is placed, four times. Whichever way
    each race goes, the command, the database and the worker's own log agree: cancelled with
    a `cancelled` stop line (the command exits 0), or succeeded with exit code 0 and a
    `succeeded` stop line (the command exits 3: too late), never a success recorded as
    cancelled."""
    cluster, ready = launch(1, 2)
    addresses = ready.config.control_plane_addresses
    tls = ready.config.client_tls
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env["STOCKADE_CERTS_DIR"] = str(ready.config.cert_dir)  # the cluster's operator certificate
    outcomes = []
    for attempt in range(CANCEL_TRIES):
        spec = pb.JobSpec(
            name=f"race-{attempt}", cpu_millis=2000, memory_mb=1024, sleep=pb.SleepRuntime(duration_ms=300)
        )
        job_id = int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=spec), tls=tls).job_id)

        def placed(job_id: int = job_id) -> bool:
            info = rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)
            return info.state != "pending"

        wait_for(placed, timeout_s=30, what=f"job {job_id} to be placed")
        completed = subprocess.run(
            [sys.executable, "-m", "ops.cli", "cancel", str(job_id), "--control-planes", ",".join(addresses)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        info = rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)
        assert completed.returncode == (3 if info.state == "succeeded" else 0), completed.stderr
        stops = [
            record["reason"]
            for spec_ in ready.config.workers
            for record in read_agent_log(cluster.state.work_dir(spec_.id) / "agent.jsonl")
            if record["event"] == "stop" and record["job_id"] == job_id
        ]
        said = completed.stdout.strip()
        if info.state == "succeeded":
            assert (info.has_exit_code, info.exit_code) == (True, 0)
            assert said == f"job {job_id}: succeeded before the cancel took effect, exit code 0"
            assert stops == ["succeeded"], stops
        else:
            assert info.state == "cancelled", info
            assert said == f"job {job_id}: cancelled"
            assert stops in ([], ["cancelled"]), stops  # [] when it never started
        outcomes.append(info.state)
    assert len(outcomes) == CANCEL_TRIES


def test_up_with_other_counts_resizes_the_running_cluster(launch: Launch) -> None:
    """`up` asked for fewer workers and control planes stops the surplus ones cleanly (the
    workers leave, they are not declared dead) and drops them from cluster.json; asked for
    more, it starts only the new ones; asked for nothing, it keeps the size. Every process
    serves its Prometheus metrics at the address cluster.json records."""
    cluster, _ = launch(3, 3)
    metrics = cluster.metrics_addresses()
    assert list(metrics) == ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"]
    for address in metrics.values():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as page:
            assert b"# TYPE" in page.read()

    smaller = cluster.up(control_planes=2, workers=1)
    assert smaller.stopped == ("w-2", "w-3", "cp-3") and smaller.started == ()
    assert [p.id for p in cluster.config().processes] == ["cp-1", "cp-2", "w-1"]
    states = {w.id: w.state for w in smaller.status.workers}
    assert states == {"w-1": "alive", "w-2": "left", "w-3": "left"}
    for gone in ("w-2", "w-3", "cp-3"):
        assert gone not in cluster.pids()

    again = cluster.up()
    assert again.started == () and again.stopped == () and len(again.config.workers) == 1

    bigger = cluster.up(workers=2)
    assert bigger.started == ("w-2",)
    assert {w.id: w.state for w in bigger.status.workers}["w-2"] == "alive"

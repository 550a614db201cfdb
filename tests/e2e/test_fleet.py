"""End to end with workers hosted in fleets: 12 workers in 3 `stockade fleet` processes of 4.

Each worker in a fleet must behave like a lone agent: its own port and address, its own
registrations and incarnations, its own agent.jsonl; and `down` must leave nothing behind.
Stopped on purpose, 40 workers of two fleets at once, each must leave cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest

from ops import checker, invariants, rpc
from ops.cluster import MARKER_ENV, ClusterError, LocalCluster
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.tls import TlsFiles

pytestmark = pytest.mark.e2e

WORKERS = 12
FLEET_SIZE = 4
JOB_COUNT = 30
JOB_SLEEP_MS = 500
TERMINAL_STATES = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[LocalCluster]:
    """A fleet cluster on the test's database, brought down afterwards also when the test fails."""
    fleets = LocalCluster(tmp_path / "stockade", database_url=database_url, fleet_size=FLEET_SIZE)
    try:
        yield fleets
    finally:
        fleets.down()


def _submit(addresses: list[str], count: int, tls: TlsFiles | None) -> list[int]:
    rng = random.Random(12)

    async def body(client: ControlPlaneClient) -> list[int]:
        ids = []
        for index in range(count):
            spec = pb.JobSpec(
                name=f"fleet-{index}",
                cpu_millis=rng.choice((500, 1000, 2000)),
                memory_mb=rng.choice((128, 256, 1024)),
                sleep=pb.SleepRuntime(duration_ms=JOB_SLEEP_MS),
            )
            ids.append(int((await client.call("submit_job", pb.SubmitJobRequest(spec=spec))).job_id))
        return ids

    return rpc.with_client(addresses, body, tls=tls)


def _jobs(addresses: list[str], tls: TlsFiles | None) -> dict[int, pb.JobInfo]:
    reply = rpc.call(addresses, "list_jobs", pb.ListJobsRequest(limit=1000), tls=tls)
    return {int(job.job_id): job for job in reply.jobs}


def _read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fetch(url: str, query: str) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            return await connection.fetch(query)
        finally:
            await connection.close()

    return asyncio.run(run())


def _marked(root: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARKER_ENV) == str(root) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_workers_in_fleets_run_jobs_like_lone_agents(cluster: LocalCluster) -> None:
    """12 workers in 3 fleets of 4 each register on their own port and incarnations, run 30
    sleep jobs to success, each exactly once and logged in the agent.jsonl of the worker that
    ran it, and `down` leaves no process behind."""
    ready = cluster.up(control_planes=2, workers=WORKERS)
    config = ready.config

    # The layout: 3 fleet processes of 4, each worker still listed on its own.
    assert [f.id for f in config.fleets] == ["fleet-1", "fleet-2", "fleet-3"]
    assert [p.kind for p in config.processes] == ["cp", "cp", "fleet", "fleet", "fleet"]
    assert [w.id for w in config.workers] == [f"w-{i}" for i in range(1, WORKERS + 1)]
    for index, fleet in enumerate(config.fleets):
        assert [w.id for w in config.workers_in(fleet.id)] == [
            f"w-{i}" for i in range(index * FLEET_SIZE + 1, (index + 1) * FLEET_SIZE + 1)
        ]
        assert fleet.id in ready.pids
    assert len({w.address for w in config.workers}) == WORKERS
    assert len({w.port for w in config.workers}) == WORKERS
    assert all(cluster.state.fleet_spec_path(f.id).is_file() for f in config.fleets)
    with pytest.raises(ClusterError, match="w-7 runs in fleet-2"):
        cluster.kill("w-7")

    # Registration: each worker with its recorded address and an incarnation of its own.
    registered = {w.id: w for w in ready.status.workers}
    assert set(registered) == {w.id for w in config.workers}
    for worker in config.workers:
        assert registered[worker.id].address == worker.address
        assert (registered[worker.id].cpu_millis, registered[worker.id].memory_mb) == (
            worker.cpu_millis,
            worker.memory_mb,
        )
        assert registered[worker.id].state == "alive"
    incarnations = [int(w.incarnation) for w in registered.values()]
    assert all(i > 0 for i in incarnations) and len(set(incarnations)) == WORKERS

    addresses = config.control_plane_addresses
    job_ids = _submit(addresses, JOB_COUNT, config.client_tls)
    deadline = time.monotonic() + 30
    while True:
        jobs = _jobs(addresses, config.client_tls)
        if all(jobs[j].state in TERMINAL_STATES for j in job_ids):
            break
        assert time.monotonic() < deadline, {j: jobs[j].state for j in job_ids}
        time.sleep(0.2)
    assert {j: jobs[j].state for j in job_ids} == dict.fromkeys(job_ids, "succeeded")

    # Each worker's own log: its register lines carry incarnations of its own, and each start
    # line is the worker's, under the incarnation it had registered last. A worker that fenced
    # itself under load (its heartbeats answered late) registers again and may have its jobs
    # placed again, so neither one registration per worker nor one start per job is promised:
    # what is, is that every job succeeded exactly once, on the worker the database names, no
    # assignment ran twice and no job ran in two places at once.
    ran_on = {j: jobs[j].worker_id for j in job_ids}
    used = set(ran_on.values())
    assert len(used) > 1, f"every job ran on {used}"
    registrations: dict[str, list[int]] = {}
    for worker in config.workers:
        records = _read_log(cluster.state.work_dir(worker.id) / "agent.jsonl")
        assert {r["worker_id"] for r in records} == {worker.id}
        mine: list[int] = []
        for record in records:
            if record["event"] == "register":
                mine.append(record["incarnation"])
            elif record["event"] == "start":
                assert mine and record["incarnation"] == mine[-1], (worker.id, record)
            elif record["event"] == "stop":
                assert record["incarnation"] in mine, (worker.id, record)
        assert mine == sorted(set(mine)), f"{worker.id} registered an incarnation twice: {mine}"
        assert int(registered[worker.id].incarnation) in mine, worker.id
        registrations[worker.id] = mine
    every_incarnation = [i for mine in registrations.values() for i in mine]
    assert len(every_incarnation) == len(set(every_incarnation)), registrations
    runs = checker.load_runs([cluster.state.work_dir(w.id) for w in config.workers])
    assert all(run.ended_at < math.inf for run in runs), "a job started with no stop line"
    assert len({run.assignment_id for run in runs}) == len(runs), "an assignment ran twice"
    assert invariants.double_runs(runs) == {}
    succeeded_on: dict[int, list[str]] = {}
    for run in runs:
        if run.stop_reason == "succeeded":
            succeeded_on.setdefault(run.job_id, []).append(run.worker_id)
    assert succeeded_on == {j: [ran_on[j]] for j in job_ids}

    pids = list(cluster.pids().values())
    cluster.down()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert _marked(cluster.state.root) == []
    # Every worker of every fleet left on the way down: none will be declared dead.
    states = _fetch(config.database_url, "SELECT id, state FROM workers")
    assert {r["id"]: r["state"] for r in states} == {w.id: "left" for w in config.workers}


STOPPED_FLEETS = 2
STOPPED_FLEET_SIZE = 20
STOPPED_WORKERS = STOPPED_FLEETS * STOPPED_FLEET_SIZE
CPU_BURNERS = 2
LONG_MS = 600_000
"""Jobs run this long: still running when their workers are stopped."""


@contextlib.contextmanager
def cpu_burners(count: int) -> Iterator[None]:
    """``count`` processes that each keep a core busy, for as long as the block runs."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def _submit_running(addresses: list[str], tls: TlsFiles | None) -> list[int]:
    """Submit a sleep job for every worker and a command job for every fourth, each running long
    past the test."""
    specs = [
        pb.JobSpec(
            name=f"leave-{i}", cpu_millis=500, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=LONG_MS)
        )
        for i in range(STOPPED_WORKERS)
    ] + [
        pb.JobSpec(
            name=f"leave-cmd-{i}",
            cpu_millis=500,
            memory_mb=64,
            command=pb.CommandRuntime(argv=["sleep", str(LONG_MS // 1000)]),
        )
        for i in range(STOPPED_WORKERS // 4)
    ]
    reply = rpc.call(addresses, "submit_jobs", pb.SubmitJobsRequest(specs=specs), tls=tls)
    return [int(job_id) for job_id in reply.job_ids]


def _said_of(cluster: LocalCluster, worker_id: str) -> list[str]:
    """What the processes' logs said of ``worker_id``'s leave or death: the lines that explain a
    leave not recorded (the agent's reason, a control plane's verdict, a declaration)."""
    words = ("leave", "left", "dead", "death", "silent")
    return [
        line.strip()
        for path in sorted((cluster.state.root / "logs").glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if (f"worker_id={worker_id} " in f"{line} " and any(w in line for w in words))
        or ("dead_workers=[" in line and f"'{worker_id}'" in line)
    ]


def test_every_worker_of_fleets_an_up_stops_together_leaves_cleanly(
    tmp_path: Path, database_url: str
) -> None:
    """40 workers in 2 fleets of 20, running jobs, stopped together by `up --workers 0` beside two
    CPU-burning processes: every one of the 40 logs a leave a control plane recorded (a
    worker_leaves row for the incarnation it left, its row left), none is declared dead after
    the stop began, and the launcher SIGKILLed neither fleet."""
    # No mass-silence hold: 40 of 40 workers silent at once would otherwise hold every death
    # declaration for a minute, and hide a worker declared dead before its leave arrived.
    cluster = LocalCluster(
        tmp_path / "stockade",
        database_url=database_url,
        fleet_size=STOPPED_FLEET_SIZE,
        cp_args=("--mass-silence-max-s", "0.001"),
    )
    try:
        ready = cluster.up(control_planes=3, workers=STOPPED_WORKERS, timeout_s=240)
        config = ready.config
        assert [f.id for f in config.fleets] == ["fleet-1", "fleet-2"]
        addresses = config.control_plane_addresses
        with cpu_burners(CPU_BURNERS):
            job_ids = _submit_running(addresses, config.client_tls)
            deadline = time.monotonic() + 120
            while (
                sum(1 for j in job_ids if _jobs(addresses, config.client_tls)[j].state == "running")
                < len(job_ids) // 2
            ):
                assert time.monotonic() < deadline, "the jobs did not start"
                time.sleep(0.5)
            (stop_began,) = [r["now"] for r in _fetch(database_url, "SELECT now()")]
            shrunk = cluster.up(workers=0, timeout_s=240)
        assert sorted(shrunk.stopped) == ["fleet-1", "fleet-2"] and shrunk.killed == ()

        left_as: dict[str, int] = {}
        for worker in config.workers:
            leaves = [
                r
                for r in _read_log(cluster.state.work_dir(worker.id) / "agent.jsonl")
                if r["event"] == "leave"
            ]
            assert leaves and leaves[-1]["left"] is True, (worker.id, leaves, _said_of(cluster, worker.id))
            left_as[worker.id] = leaves[-1]["incarnation"]
        recorded = {
            (r["worker_id"], r["incarnation"]) for r in _fetch(database_url, "SELECT * FROM worker_leaves")
        }
        assert set(left_as.items()) <= recorded
        states = {r["id"]: r["state"] for r in _fetch(database_url, "SELECT id, state FROM workers")}
        assert states == {w.id: "left" for w in config.workers}
        deaths = _fetch(database_url, "SELECT worker_id, declared_at FROM worker_deaths")
        assert [d["worker_id"] for d in deaths if d["declared_at"] >= stop_began] == []
    finally:
        cluster.down()

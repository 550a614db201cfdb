"""Outages with real processes (DESIGN in docs/design.md, "Outages"): the database restarted
under running jobs kills none of them; a worker cut off and a leader frozen during a database
outage run no job twice; every worker cut off at once loses no job, while one cut off alone
has its jobs moved.

Each test runs its own cluster with its own embedded PostgreSQL (the shared test database
cannot be restarted), so these are the slowest e2e tests but one.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import pytest
import trio

from ops import checker
from ops.chaos import Harness
from ops.chaos_settings import ChaosSettings
from ops.cluster import LocalCluster
from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.errors import StockadeError
from runtime.text import read_jsonl

pytestmark = pytest.mark.e2e


def long_job(seconds: float, cpu_millis: int = 500) -> pb.JobSpec:
    return pb.JobSpec(
        name="long",
        cpu_millis=cpu_millis,
        memory_mb=64,
        sleep=pb.SleepRuntime(duration_ms=int(seconds * 1000)),
    )


def command_job(seconds: float) -> pb.JobSpec:
    return pb.JobSpec(
        name="cmd", cpu_millis=200, memory_mb=32, command=pb.CommandRuntime(argv=["sleep", f"{seconds:g}"])
    )


async def _counts(client: ControlPlaneClient) -> dict[str, int]:
    status = await client.call("status", pb.StatusRequest())
    return {c.state: c.count for c in status.jobs}


async def _wait_running(client: ControlPlaneClient, count: int) -> None:
    with trio.fail_after(20):
        while (await _counts(client)).get("running", 0) < count:  # noqa: ASYNC110 (polling the cluster)
            await trio.sleep(0.1)


async def _proxied_cluster_running(
    harness: Harness, network: trio.Nursery, jobs: int, seconds: float
) -> ControlPlaneClient:
    """A fresh cluster whose workers talk through the harness's fault proxies, running ``jobs``
    sleep jobs of ``seconds``; returns a client of it (the caller closes it)."""
    await harness._start_proxies(network)
    await trio.to_thread.run_sync(harness.fresh_cluster)
    config = harness.cluster.config()
    client = ControlPlaneClient(config.control_plane_addresses, timeout_s=1.0, tls=config.client_tls)
    for _ in range(jobs):
        await client.call("submit_job", pb.SubmitJobRequest(spec=long_job(seconds)))
    await _wait_running(client, jobs)
    return client


async def _cut_off_until_dead(harness: Harness, client: ControlPlaneClient, worker_id: str) -> None:
    """Cut ``worker_id`` off from every control plane until one reports it dead (at most 90 s),
    then heal it: the death waits for the database and a leader, however slow the machine."""
    cut_at = time.time()
    await harness._sever(worker_id)
    try:
        with trio.fail_after(90):
            while True:
                try:
                    status = await client.call("status", pb.StatusRequest())
                except StockadeError:
                    status = None  # the database or the leader is away: ask again
                if status is not None and any(
                    w.id == worker_id and w.state == "dead" for w in status.workers
                ):
                    break
                await trio.sleep(0.2)
    finally:
        with trio.CancelScope(shield=True):
            await harness._heal(worker_id)
        harness.cluster.state.record_fault("partition", worker_id, cut_at, time.time())


def _report(harness: Harness, cluster: LocalCluster, history: checker.History) -> checker.CheckReport:
    config = cluster.config()
    faults = checker.load_events(cluster.state.events_path)
    return checker.check_logs(history, [cluster.state.work_dir(w.id) for w in config.workers], faults)


def _all_back_since(cluster: LocalCluster, since: float) -> bool:
    """Whether every worker logged a ``resume`` (or a registration) at or after ``since``."""
    for worker in cluster.config().workers:
        log = cluster.state.work_dir(worker.id) / "agent.jsonl"
        records = read_jsonl(log) if log.exists() else []
        if not any(r["event"] in ("resume", "register") and r["time"] >= since for r in records):
            return False
    return True


def _events(cluster: LocalCluster) -> list[str]:
    found = []
    for worker in cluster.config().workers:
        log = cluster.state.work_dir(worker.id) / "agent.jsonl"
        if log.exists():
            found += [r["event"] for r in read_jsonl(log)]
    return found


async def test_a_database_restart_pauses_running_jobs_and_kills_none(tmp_path: Path) -> None:
    """The database is SIGKILLed under eight running jobs (sleeps and commands) and started
    again 6 s later: every worker pauses, then resumes, in the same incarnation; every job
    succeeds, none was stopped, none ran twice, no worker was declared dead, and no job a
    client was told about is missing."""
    cluster = LocalCluster(tmp_path / "state")
    settings = ChaosSettings(failovers=0, workers=3, db_restarts=1, db_down_s=(6.0, 6.0), seed=7)
    harness = Harness(settings=settings, cluster=cluster, progress=lambda line: None)
    try:
        async with asyncio_bridge():
            await trio.to_thread.run_sync(harness.fresh_cluster)
            config = cluster.config()
            client = ControlPlaneClient(config.control_plane_addresses, timeout_s=1.0, tls=config.client_tls)
            try:
                ids = []
                for n in range(8):
                    spec = long_job(10.0) if n % 2 else command_job(10.0)
                    ids.append((await client.call("submit_job", pb.SubmitJobRequest(spec=spec))).job_id)
                await _wait_running(client, 8)
                before = await client.call("status", pb.StatusRequest())
                await harness.restart_database(client, how="kill")
                await harness._wait_finished(client)
                after = await client.call("status", pb.StatusRequest())
                states = [(await client.call("get_job", pb.GetJobRequest(job_id=j))).state for j in ids]
            finally:
                client.close()
            history = await checker.load_history(config.database_url)
        report = checker.check_logs(
            history,
            [cluster.state.work_dir(w.id) for w in config.workers],
            checker.load_events(cluster.state.events_path),
            acknowledged_job_ids=ids,
        )
    finally:
        await trio.to_thread.run_sync(cluster.down)
    assert report.ok, report.details
    assert states == ["succeeded"] * 8
    assert (report.jobs_killed_by_outage, report.worker_deaths, report.self_fences) == (0, 0, 0)
    assert report.extra_assignments == 0  # nothing was placed again
    incarnations = {w.id: w.incarnation for w in before.workers}
    assert {w.id: w.incarnation for w in after.workers} == incarnations
    events = _events(cluster)
    assert events.count("pause") >= 1 and events.count("pause") == events.count("resume")


async def test_a_worker_cut_off_and_a_leader_frozen_during_a_database_outage_run_no_job_twice(
    tmp_path: Path,
) -> None:
    """During an 8 s database outage, one worker is cut off from every control plane (until it
    is declared dead) and the leader is SIGSTOPped until 3 s after the database is back. The
    cut-off worker is declared dead once the database is back and its silence has counted for
    dead_after, its paused jobs run elsewhere and never resume where they were; the frozen
    leader's writes are refused. No job ran twice and every job finished; the other workers'
    jobs were not stopped."""
    cluster = LocalCluster(tmp_path / "state")
    settings = ChaosSettings(
        failovers=0, workers=3, partitions=1, partition_s=14.0, db_restarts=1, db_down_s=(8.0, 8.0), seed=11
    )
    harness = Harness(settings=settings, cluster=cluster, progress=lambda line: None)
    try:
        async with asyncio_bridge(), trio.open_nursery() as network:
            client = await _proxied_cluster_running(harness, network, 9, 20.0)
            config = cluster.config()
            try:
                leader, _ = await harness.leader(client)
                leader_pid = cluster.pids()[leader]
                async with trio.open_nursery() as faults:
                    faults.start_soon(functools.partial(harness.restart_database, client, how="fast"))
                    # Cut off before its workers pause (1.25 s at the earliest), so the checker
                    # sees the worker's own fault, not the outage, in its runs' ends.
                    await trio.sleep(0.2)
                    faults.start_soon(_cut_off_until_dead, harness, client, "w-1")
                    await trio.sleep(1.3)
                    frozen_at = time.time()
                    os.kill(leader_pid, signal.SIGSTOP)
                    with trio.fail_after(30):
                        while not harness.result.db_outages:  # noqa: ASYNC110 (the restart's record)
                            await trio.sleep(0.1)
                    await trio.sleep(3.0)
                    os.kill(leader_pid, signal.SIGCONT)
                    cluster.state.record_fault("freeze", leader, frozen_at, time.time())
                await harness._wait_finished(client)
            finally:
                client.close()
            network.cancel_scope.cancel()
        async with asyncio_bridge():
            history = await checker.load_history(config.database_url)
        report = _report(harness, cluster, history)
    finally:
        await trio.to_thread.run_sync(cluster.down)
    assert report.ok, report.details  # no double placement or run, no false death, all finished
    assert [d.worker_id for d in history.deaths] == ["w-1"]
    moved = [a for a in history.assignments if a.worker_id == "w-1" and a.end_reason == "worker_dead"]
    assert moved, "the cut-off worker's jobs were not moved"
    assert report.jobs_killed_by_outage == 0, report.details


async def test_every_worker_cut_off_loses_no_job_and_one_cut_off_alone_is_declared_dead(
    tmp_path: Path,
) -> None:
    """Every worker is cut off from every control plane for 10 s: nobody is declared dead, no
    job is stopped or placed again, and the paused jobs resume. Then one worker alone is cut
    off for 10 s: it is declared dead and its jobs move."""
    cluster = LocalCluster(tmp_path / "state")
    settings = ChaosSettings(
        failovers=0,
        workers=4,
        partitions=1,
        partition_s=10.0,
        mass_partitions=1,
        mass_partition_s=10.0,
        seed=13,
    )
    harness = Harness(settings=settings, cluster=cluster, progress=lambda line: None)
    try:
        async with asyncio_bridge(), trio.open_nursery() as network:
            client = await _proxied_cluster_running(harness, network, 8, 16.0)
            config = cluster.config()
            try:
                await harness.partition_every_worker()
                with trio.fail_after(10):
                    while (await _counts(client)).get("running", 0) < 8:  # noqa: ASYNC110 (polling)
                        await trio.sleep(0.1)
                _, healed_at = harness.result.mass_partitions[0]
                with trio.fail_after(20):  # every worker has resumed before one is cut off alone
                    while not _all_back_since(cluster, healed_at):  # noqa: ASYNC110 (polling logs)
                        await trio.sleep(0.1)
                deaths_after_mass = len(await _deaths(config.database_url))
                status = await client.call("status", pb.StatusRequest())
                busiest = max(status.workers, key=lambda w: len(w.job_ids))
                await harness.partition_worker(busiest.id)
                await harness._wait_finished(client)
            finally:
                client.close()
            network.cancel_scope.cancel()
        async with asyncio_bridge():
            history = await checker.load_history(config.database_url)
        report = _report(harness, cluster, history)
    finally:
        await trio.to_thread.run_sync(cluster.down)
    assert deaths_after_mass == 0
    assert report.ok, report.details
    assert [d.worker_id for d in history.deaths] == [busiest.id]
    mass_at, _ = harness.result.mass_partitions[0]
    _, alone_at, _ = harness.result.partitions[0]
    ended_otherwise = [
        a
        for a in history.assignments
        if a.ended_at is not None and mass_at <= a.ended_at <= alone_at and a.end_reason != "succeeded"
    ]
    assert not ended_otherwise, "the cut-off of every worker ended work"
    assert report.jobs_killed_by_outage == 0, report.details


async def _deaths(database_url: str) -> list[checker.DeathRecord]:
    return list((await checker.load_history(database_url)).deaths)

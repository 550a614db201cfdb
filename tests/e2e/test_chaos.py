"""Chaos with real processes: a short failover run, a leader frozen inside its fenced
transaction (its commit refused), a leader frozen just before its placement statement (the
statement refused), and the negative control (fencing off: the checker must find the double
placement, which proves the harness can fail)."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from ops import checker, invariants
from ops.chaos import Harness
from ops.chaos_settings import ChaosSettings
from ops.cluster import LocalCluster
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.client import ControlPlaneClient

pytestmark = pytest.mark.e2e

UNFENCED_LAUNCHER = (str(Path(__file__).with_name("unfenced_launcher.py")), "ops.cli")


async def test_a_short_chaos_run_places_and_runs_every_job_once(tmp_path: Path, database_url: str) -> None:
    """Six failovers (kill, freeze, kill, freeze inside a fenced transaction, ...) and a worker
    kill under a steady job stream and a schedule every 2 s: every job finishes, none twice, no
    false death, every slot of the schedule recorded exactly once (fired with its one job, or
    skipped with why), and the database refused at least the in-transaction leader's write."""
    cluster = LocalCluster(tmp_path / "chaos", database_url=database_url)
    settings = ChaosSettings(failovers=6, worker_kills=1, workers=5, submit_rate_per_s=8.0, seed=3)
    try:
        result = await Harness(settings=settings, cluster=cluster, progress=lambda line: None).run()
    finally:
        await trio.to_thread.run_sync(cluster.down)
    data = result.to_json()
    assert data["failovers"] == {"killed": 3, "frozen": 3, "frozen_in_transaction": 1}
    assert (data["double_placements"], data["double_runs"], data["false_deaths"]) == (0, 0, 0), data[
        "details"
    ]
    assert data["jobs_finished"] == data["jobs_submitted"] > 0
    assert data["stale_writes_rejected"] >= 1
    assert data["worker_kills"] == 1 and result.ok
    assert data["schedule_slot_errors"] == 0 and data["schedule_slots_fired"] > 0


PLACEMENT_STATEMENT = "ledger.commit_placements.before_statement"
DECLARATION_TRANSACTION = "ledger.declare_dead_workers.after_epoch_check"


async def _freeze_leader_at(
    tmp_path: Path, database_url: str, fault_point: str, *, fenced: bool
) -> tuple[checker.CheckReport, list[str]]:
    """Park the leader's ledger at ``fault_point`` (just before the placement statement of the
    job this submits, or inside a dead-worker declaration's transaction after its epoch check,
    with that placement queued behind it), SIGSTOP it there, let the standby take over and run
    the job to the end, then SIGCONT the old leader and let it finish what it was doing.
    Returns the checker's report and the refused writes."""
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    cluster = LocalCluster(
        tmp_path / "state",
        database_url=database_url,
        extra_env={
            "STOCKADE_ENABLE_FAULTS": "1",
            "STOCKADE_FAULTS": f"{fault_point}=park:{fault_dir}",
        },
        launcher=("-m", "ops.cli") if fenced else UNFENCED_LAUNCHER,
    )
    try:
        await trio.to_thread.run_sync(lambda: cluster.up(control_planes=2, workers=1))
        config = cluster.config()
        async with asyncio_bridge():
            client = ControlPlaneClient(config.control_plane_addresses, timeout_s=0.5, tls=config.client_tls)
            try:
                status = await client.call("status", pb.StatusRequest())
                leader, epoch = status.leader, status.epoch
                leader_pid = cluster.pids()[leader]
                (fault_dir / "arm").touch()
                spec = pb.JobSpec(
                    name="once", cpu_millis=500, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=500)
                )
                job_id = (await client.call("submit_job", pb.SubmitJobRequest(spec=spec))).job_id
                parked = fault_dir / f"parked.{leader_pid}"
                with trio.fail_after(10):
                    while not parked.exists():  # noqa: ASYNC110 (the leader process writes it)
                        await trio.sleep(0.01)
                os.kill(leader_pid, signal.SIGSTOP)
                frozen_at = time.time()
                with trio.fail_after(30):
                    while True:
                        status = await client.call("status", pb.StatusRequest())
                        job = await client.call("get_job", pb.GetJobRequest(job_id=job_id))
                        if status.epoch > epoch and status.leader and job.state == "succeeded":
                            break
                        await trio.sleep(0.1)
                parked.unlink()
                os.kill(leader_pid, signal.SIGCONT)
                cluster.state.record_fault("freeze", leader, frozen_at, time.time())
                await trio.sleep(3.0)  # the old leader wakes, tries to commit, steps down
            finally:
                client.close()
            history = await checker.load_history(config.database_url)
            conn = await PgConnection.connect(config.database_url)
            try:
                refused = [
                    r["what"]
                    for r in await conn.fetch("SELECT what FROM stale_writes WHERE epoch = $1", epoch)
                ]
            finally:
                await conn.close()
        faults = checker.load_events(cluster.state.events_path)
        runs = checker.load_runs([cluster.state.work_dir(w.id) for w in config.workers], faults)
        return invariants.check(history, runs, faults), refused
    finally:
        await trio.to_thread.run_sync(cluster.down)


async def test_a_leader_frozen_inside_its_fenced_transaction_cannot_commit(
    tmp_path: Path, database_url: str
) -> None:
    """With fencing on, the frozen leader's session is ended by idle_in_transaction_session_timeout,
    the standby takes over and runs the job, and the old leader's commit on waking is refused by
    the database and recorded, as is the placement it had queued; the job was placed and run
    once."""
    report, refused = await _freeze_leader_at(tmp_path, database_url, DECLARATION_TRANSACTION, fenced=True)
    assert any("declare dead workers" in what and "session ended" in what for what in refused), refused
    assert (report.double_placements, report.double_runs, report.false_deaths) == (0, 0, 0), report.details
    assert report.stale_writes_rejected >= 1


async def test_a_leader_frozen_before_its_placement_statement_cannot_place(
    tmp_path: Path, database_url: str
) -> None:
    """With fencing on, the placement statement the old leader sends on waking sees the newer
    epoch under FOR KEY SHARE, writes nothing, and is recorded; the job was placed and run once."""
    report, refused = await _freeze_leader_at(tmp_path, database_url, PLACEMENT_STATEMENT, fenced=True)
    assert "commit 1 placements" in refused, refused
    assert (report.double_placements, report.double_runs, report.false_deaths) == (0, 0, 0), report.details
    assert report.stale_writes_rejected >= 1


async def test_negative_control_without_fencing_the_checker_finds_a_double_placement(
    tmp_path: Path, database_url: str
) -> None:
    """With fencing switched off (test-only launcher), the same freeze lets the old leader commit
    a placement of the job that already finished: the checker must report it."""
    report, _ = await _freeze_leader_at(tmp_path, database_url, PLACEMENT_STATEMENT, fenced=False)
    assert report.double_placements >= 1, report.details
    assert any("epoch 1" in line and "job" in line for line in report.details), report.details
    assert not report.ok


async def _counts(client: ControlPlaneClient) -> dict[str, int]:
    status = await client.call("status", pb.StatusRequest())
    return {c.state: c.count for c in status.jobs}


def scrape(address: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples a process serves on ``address``'s /metrics now: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5.0) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def fence_events(address: str, worker_id: str) -> tuple[float, float]:
    """(pauses, self-fences) the agent on ``address`` counted for ``worker_id`` so far."""
    samples = scrape(address)
    labels = frozenset({("worker_id", worker_id)})
    return (
        samples.get(("stockade_agent_pauses_total", labels), 0.0),
        samples.get(("stockade_agent_self_fences_total", labels), 0.0),
    )


async def test_a_partitioned_worker_stops_its_jobs_before_they_move_and_rejoins(
    tmp_path: Path, database_url: str
) -> None:
    """A worker cut off from every control plane (its process still running) fences itself
    before its jobs are placed elsewhere, so no job runs in two places, and its /metrics shows
    the fence (a pause or a self-fence counted); healed, it registers again and gets work."""
    cluster = LocalCluster(tmp_path / "partition", database_url=database_url)
    settings = ChaosSettings(failovers=0, workers=2, partitions=1, partition_s=4.0, seed=5)
    harness = Harness(settings=settings, cluster=cluster, progress=lambda line: None)
    try:
        async with asyncio_bridge(), trio.open_nursery() as network:
            await harness._start_proxies(network)
            await trio.to_thread.run_sync(harness.fresh_cluster)
            client = ControlPlaneClient(
                cluster.config().control_plane_addresses, timeout_s=1.0, tls=cluster.config().client_tls
            )
            try:
                long = pb.JobSpec(
                    name="long", cpu_millis=1000, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=6000)
                )
                for _ in range(4):
                    await client.call("submit_job", pb.SubmitJobRequest(spec=long))
                with trio.fail_after(10):
                    while (await _counts(client)).get("running", 0) < 4:  # noqa: ASYNC110 (polling the cluster)
                        await trio.sleep(0.1)
                status = await client.call("status", pb.StatusRequest())
                busiest = max(status.workers, key=lambda w: len(w.job_ids))
                metrics_at = cluster.config().metrics_addresses()[busiest.id]
                fenced_before = await trio.to_thread.run_sync(fence_events, metrics_at, busiest.id)
                await harness.partition_worker(busiest.id)
                fenced_after = await trio.to_thread.run_sync(fence_events, metrics_at, busiest.id)
                with trio.fail_after(10):  # healed: it registers again
                    while True:
                        status = await client.call("status", pb.StatusRequest())
                        again = next(w for w in status.workers if w.id == busiest.id)
                        if again.state == "alive" and again.incarnation > busiest.incarnation:
                            break
                        await trio.sleep(0.1)
                after = pb.JobSpec(
                    name="after", cpu_millis=3500, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=300)
                )
                for _ in range(4):
                    await client.call("submit_job", pb.SubmitJobRequest(spec=after))
                await harness._wait_finished(client)
            finally:
                client.close()
            network.cancel_scope.cancel()
        config = cluster.config()
        async with asyncio_bridge():
            history = await checker.load_history(config.database_url)
        faults = checker.load_events(cluster.state.events_path)
        runs = checker.load_runs([cluster.state.work_dir(w.id) for w in config.workers], faults)
        report = invariants.check(history, runs, faults)
    finally:
        await trio.to_thread.run_sync(cluster.down)
    assert report.ok, report.details  # no job ran in two places, no false death, all finished
    assert any(d.worker_id == busiest.id for d in history.deaths)
    moved = [a for a in history.assignments if a.worker_id == busiest.id and a.end_reason == "worker_dead"]
    assert moved  # its jobs were moved while it was cut off
    assert harness._rejoined(config) == (1, 1)  # registered again after the heal, then ran a job
    assert sum(fenced_after) > sum(fenced_before), (fenced_before, fenced_after)

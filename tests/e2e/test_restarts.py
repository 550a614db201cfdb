"""Agent restarts that keep jobs, end to end: a local cluster of real processes (the launcher of
`stockade up`), a worker's agent killed or restarted by the operator, and started again with the
same id and work folder as `stockade up` does.

Each job appends ``INDEX TIME`` to a file of its own every 0.2 s until the test creates its gate
file (``release`` in the jobs' folder), then exits 0; the third test's jobs write ``LINES`` lines
and exit. A job that ran once leaves the indexes 0, 1, 2, ... in order; a second run would add a
second series. That no job paused is shown by the deadlines the jobs' reapers hold them to (the
agent's fence-deadline file, in ``CLOCK_MONOTONIC`` seconds, which the test reads too): the
agent was back before the pause deadline its dead predecessor last wrote, so no reaper paused
(the time the machine took to start the agent is measured, not assumed).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import trio
from test_cluster import fetch, list_jobs, wait_for

from agent.deadman import read_fence_deadline
from ops import checker, rpc
from ops.cluster import LocalCluster, UpResult
from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.os_users import ensure_traversable
from runtime.text import read_jsonl

pytestmark = pytest.mark.e2e

JOBS = 10
LINES = 40
"""Lines each job of the third test writes, one every 0.2 s: it runs some 8 s."""
CRASH_TIMINGS = (("--dead-after-s", "40"), ("--self-fence-after-s", "30"))
"""Control-plane and agent timings of the crash-restart test: a fence of 30 s (dead_after 40 s),
so that a loaded test machine, which took 11 s to start an agent process at a load of 15-18, is
back in time; the test asserts that it was (against the deadline the reapers read), and no test
waits for this fence to pass. The rule tested is the same with the defaults (1.5 s, 2.5 s), only
the window is wider."""
GATE = "release"
"""The file, in the jobs' folder, whose creation ends the gated jobs."""


def start(
    tmp_path: Path,
    database_url: str,
    *,
    cp_args: tuple[str, ...] = (),
    agent_args: tuple[str, ...] = (),
    workers: int = 1,
) -> tuple[LocalCluster, UpResult]:
    cluster = LocalCluster(
        tmp_path / "stockade", database_url=database_url, cp_args=cp_args, agent_args=agent_args
    )
    return cluster, cluster.up(control_planes=1, workers=workers)


def writer(folder: Path, index: int, *, gated: bool = True) -> pb.JobSpec:
    """A job writing a line every 0.2 s: until the gate file exists, or ``LINES`` lines. Each
    run of a job is a uid of its own (docs/tenancy.md), so the file is made writable by all
    (umask 0): a later run appends to what an earlier one began."""
    path = folder / f"job-{index}"
    until = f"[ ! -e {folder / GATE} ]" if gated else f"[ $i -lt {LINES} ]"
    loop = f"umask 0; i=0; while {until}; do echo $i $(date +%s.%N) >> {path}; sleep 0.2; i=$((i+1)); done"
    return pb.JobSpec(
        name=f"writer-{index}",
        cpu_millis=100,
        memory_mb=16,
        command=pb.CommandRuntime(argv=["sh", "-c", loop]),
    )


def shared_folder(tmp_path: Path) -> Path:
    """A folder the jobs may write (each runs as a uid of its own when the tests run as root);
    not sticky, so that a run may append to a file an earlier run (another uid) made, which a
    sticky folder refuses where ``fs.protected_regular`` is set."""
    folder = tmp_path / "out"
    folder.mkdir()
    folder.chmod(0o777)
    ensure_traversable(folder)
    return folder


def submit(up: UpResult, folder: Path, count: int = JOBS, *, gated: bool = True) -> list[int]:
    config = up.config
    return [
        int(
            rpc.call(
                config.control_plane_addresses,
                "submit_job",
                pb.SubmitJobRequest(spec=writer(folder, i, gated=gated)),
                tls=config.client_tls,
            ).job_id
        )
        for i in range(count)
    ]


def lines(folder: Path, index: int) -> list[tuple[int, float]]:
    path = folder / f"job-{index}"
    if not path.exists():
        return []
    return [(int(a), float(b)) for a, b in (line.split() for line in path.read_text().splitlines() if line)]


def running(up: UpResult, folder: Path, job_ids: list[int], count: int = JOBS) -> bool:
    jobs = list_jobs(up.config.control_plane_addresses, up.config.client_tls)
    return all(jobs[j].state == "running" for j in job_ids) and all(
        len(lines(folder, i)) >= 3 for i in range(count)
    )


def finished(up: UpResult, job_ids: list[int]) -> bool:
    jobs = list_jobs(up.config.control_plane_addresses, up.config.client_tls)
    return all(jobs[j].state in ("succeeded", "failed", "cancelled") for j in job_ids)


def wait_for_the_end(up: UpResult, job_ids: list[int], database_url: str) -> None:
    """Wait until every job has ended; on a timeout, say where each one is and what the cluster
    declared (a worker's death, a requeue), so that a failure on a loaded machine tells why."""
    try:
        wait_for(lambda: finished(up, job_ids), timeout_s=90, what="every job to end")
    except AssertionError as exc:
        jobs = list_jobs(up.config.control_plane_addresses, up.config.client_tls)
        assignments = fetch(
            database_url, "SELECT job_id, worker_id, state, end_reason FROM assignments ORDER BY id"
        )
        deaths = fetch(database_url, "SELECT count(*) AS n FROM worker_deaths")[0]["n"]
        raise AssertionError(
            f"{exc}: jobs {[(j, jobs[j].state) for j in job_ids]}, "
            f"assignments {[tuple(r) for r in assignments]}, worker deaths {deaths}"
        ) from exc


def check_report(cluster: LocalCluster) -> checker.CheckReport:
    config = cluster.config()

    async def history() -> checker.History:
        async with asyncio_bridge():
            return await checker.load_history(config.database_url)

    return checker.check_logs(
        trio.run(history),
        [cluster.state.work_dir(w.id) for w in config.workers],
        checker.load_events(cluster.state.events_path),
    )


def assert_ran_once(folder: Path, count: int = JOBS) -> None:
    """Each job wrote one series 0, 1, 2, ...: it started once and was never started again."""
    for index in range(count):
        written = [i for i, _ in lines(folder, index)]
        assert written == list(range(len(written))) and len(written) >= 3, f"job {index} wrote {written}"


def pause_deadline_s(cluster: LocalCluster, worker_id: str) -> float:
    """The pause deadline the worker's reapers hold its jobs to, as its agent last wrote it
    (``time.monotonic()`` seconds, shared by every process of the machine)."""
    deadlines = read_fence_deadline(cluster.state.work_dir(worker_id) / "fence_deadline")
    assert deadlines is not None, "the agent wrote no fence deadline"
    return deadlines[0]


def assert_kept(database_url: str, job_ids: list[int], incarnation: int) -> None:
    rows = fetch(
        database_url,
        "SELECT a.job_id, a.worker_incarnation, a.state, a.end_reason, j.state AS job_state, j.losses"
        " FROM assignments a JOIN jobs j ON j.id = a.job_id ORDER BY a.id",
    )
    assert [r["job_id"] for r in rows] == job_ids, "a job was placed more than once"
    assert {
        (r["worker_incarnation"], r["state"], r["end_reason"], r["job_state"], r["losses"]) for r in rows
    } == {(incarnation, "finished", "succeeded", "succeeded", 0)}
    assert fetch(database_url, "SELECT count(*) AS n FROM worker_deaths")[0]["n"] == 0


def test_ten_command_jobs_run_once_uninterrupted_across_a_killed_and_restarted_agent(
    tmp_path: Path, database_url: str
) -> None:
    """Ten running command jobs; their agent is SIGKILLed and started again (same id, same work
    folder, as `stockade up` does): it takes them over in the same incarnation, each job writes
    its lines once, with no pause, and ends succeeded on its only assignment; nothing was
    declared dead, lost or placed again, and the checker's report is ok."""
    folder = shared_folder(tmp_path)
    cluster, up = start(tmp_path, database_url, cp_args=CRASH_TIMINGS[0], agent_args=CRASH_TIMINGS[1])
    try:
        job_ids = submit(up, folder)
        wait_for(lambda: running(up, folder, job_ids), timeout_s=60, what="ten jobs running")
        incarnation = next(w.incarnation for w in up.status.workers if w.id == "w-1")
        killed_at = time.monotonic()
        cluster.kill("w-1")
        pause_at = pause_deadline_s(cluster, "w-1")  # as the dead agent last wrote it
        again = cluster.up(control_planes=1, workers=1)
        back_at = time.monotonic()
        # Registered again (the continuation) before up returned, and so before the reapers'
        # pause deadline (the last acknowledged heartbeat's send time + 30 s): no job could pause.
        assert back_at < pause_at, (
            f"the agent was back {back_at - killed_at:.2f} s after its kill, "
            f"{back_at - pause_at:.2f} s after its jobs' pause deadline"
        )
        assert next(w.incarnation for w in again.status.workers if w.id == "w-1") == incarnation
        (folder / GATE).touch()
        wait_for_the_end(up, job_ids, database_url)
        assert_ran_once(folder)
        assert_kept(database_url, job_ids, incarnation)
        report = check_report(cluster)
        assert report.ok and report.double_runs == 0 and report.pauses == 0, report.details
        print(f"the agent was back {back_at - killed_at:.2f} s after its kill")
    finally:
        cluster.down()


def test_ten_command_jobs_run_once_across_a_planned_restart(tmp_path: Path, database_url: str) -> None:
    """The same with the default timings and a planned restart: SIGHUP makes the agent ask for
    its restart hold and exit leaving its jobs running; started 3 s later (twice the fence time)
    but before the hold's pause deadline, the new agent keeps them all: no pause, no death, no
    requeue."""
    folder = shared_folder(tmp_path)
    cluster, up = start(tmp_path, database_url)
    try:
        job_ids = submit(up, folder)
        wait_for(lambda: running(up, folder, job_ids), timeout_s=60, what="ten jobs running")
        incarnation = next(w.incarnation for w in up.status.workers if w.id == "w-1")
        pid = cluster.kill("w-1", signal.SIGHUP)
        wait_for(lambda: "w-1" not in cluster.pids(), timeout_s=15, what=f"the agent (pid {pid}) to exit")
        exited_at = time.monotonic()
        pause_at = pause_deadline_s(cluster, "w-1")
        time.sleep(3.0)  # away longer than the fence (1.5 s): only the hold keeps the jobs running
        again = cluster.up(control_planes=1, workers=1)
        back_at = time.monotonic()
        # The hold (30 s by default) moved the reapers' deadline past the restart.
        assert back_at < pause_at, (
            f"the agent was back {back_at - exited_at:.2f} s after its exit, "
            f"{back_at - pause_at:.2f} s after its jobs' pause deadline"
        )
        assert next(w.incarnation for w in again.status.workers if w.id == "w-1") == incarnation
        (folder / GATE).touch()
        wait_for_the_end(up, job_ids, database_url)
        assert_ran_once(folder)
        assert_kept(database_url, job_ids, incarnation)
        report = check_report(cluster)
        assert report.ok and report.pauses == 0 and report.worker_deaths == 0, report.details
    finally:
        cluster.down()


def test_an_agent_back_after_dead_after_follows_the_self_fence_rule(
    tmp_path: Path, database_url: str
) -> None:
    """The agent of w-1, running three jobs, is SIGKILLed and started again only once the
    cluster declared it dead and its jobs run on w-2: the jobs paused at w-1's fence deadline,
    and the restarted agent, whose incarnation is not continued, kills them before it registers
    a new one; each job ran on w-1 until the pause, then once more from the start on w-2, never
    in two places at once, and the checker's report is ok."""
    folder = shared_folder(tmp_path)
    cluster, up = start(tmp_path, database_url, workers=2)
    config = up.config
    try:
        addresses, tls = config.control_plane_addresses, config.client_tls
        rpc.call(
            addresses,
            "cordon_worker",
            pb.CordonWorkerRequest(worker_id="w-2", idempotency_key="c-1"),
            tls=tls,
        )
        job_ids = submit(up, folder, count=3, gated=False)
        wait_for(lambda: running(up, folder, job_ids, 3), timeout_s=60, what="three jobs running on w-1")
        rpc.call(
            addresses,
            "uncordon_worker",
            pb.UncordonWorkerRequest(worker_id="w-2", idempotency_key="u-1"),
            tls=tls,
        )
        cluster.kill("w-1")
        killed_at = time.time()

        def moved() -> bool:
            jobs = list_jobs(addresses, tls)
            return all(jobs[j].worker_id == "w-2" and jobs[j].state == "running" for j in job_ids)

        wait_for(moved, timeout_s=60, what="the jobs to run on w-2")
        cluster.up(control_planes=1, workers=2)
        wait_for_the_end(up, job_ids, database_url)
        stops = [r for r in read_jsonl(cluster.state.work_dir("w-1") / "agent.jsonl") if r["event"] == "stop"]
        assert len(stops) == 3 and {s["reason"] for s in stops} == {"self_fence"}
        for index in range(3):
            written = lines(folder, index)
            restart = next(n for n in range(1, len(written)) if written[n][0] == 0)
            first, second = written[:restart], written[restart:]
            assert [i for i, _ in second] == list(range(LINES))
            assert first[-1][1] < killed_at + 1.5 + 0.3, "the job ran past its fence deadline"
            assert first[-1][1] < second[0][1], "the job ran in two places at once"
        report = check_report(cluster)
        assert report.ok and report.double_runs == 0 and report.false_deaths == 0, report.details
        rows = fetch(database_url, "SELECT worker_id, state, end_reason FROM assignments ORDER BY id")
        assert [tuple(r) for r in rows] == [("w-1", "lost", "worker_dead")] * 3 + [
            ("w-2", "finished", "succeeded")
        ] * 3
    finally:
        cluster.down()

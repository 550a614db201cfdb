"""Restarts that keep jobs, with real processes: an agent process is killed (or exits for a
planned restart), its command jobs run on under their reapers, and an agent process started
again on the same work folder takes them over, or stops them before it registers anew.

Each test runs ``agent.main.main`` in child processes against a scripted control plane that
answers a registration asking to continue an incarnation as it is told (continued, or not).
Command jobs append a wall-clock timestamp to a file every 50 ms from a grandchild process, so
the file shows whether the job ran on, paused, or ran twice. Every process of a test works in a
folder under the test's work folder, so psutil can tell whether any is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio
from jobfiles import job_writable

from agent import adoption, job_record
from agent.cgroups import select_resources, worker_key
from agent.deadman import FENCED_AT_FILE, REPORT_FILE, read_fence_deadline, write_fence_deadline
from agent.job_record import RECORD_FILE
from agent.reaper import reaper_argv
from agent.resources import ConfinedJob
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import GrpcChannel, asyncio_bridge, serve_grpc, trio_service
from runtime.jobs import CommandRuntime
from runtime.settings.agent import AgentSettings
from runtime.text import read_jsonl

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(os, "pidfd_open"), reason="restarts keep jobs on Linux 5.3+"
)

WORKER = "w-r"
HEARTBEAT_S = 0.1
FENCE_S = 15.0
"""The agents' fence span here (the control plane says dead_after is 20 s): a loaded test
machine may take many seconds to start an agent process (11 s at a load of 15-18), and a restart
back within the fence time is what keeps jobs unpaused; the tests assert that it was, against
the deadline the reapers read (:meth:`Host.pause_deadline_s`). No test waits for this span to
pass. The rules are the same with the defaults (1.5 s, 2.5 s)."""
DEAD_AFTER_MS = 20_000


@attrs.define
class ScriptedControlPlane:
    """Answers registrations and heartbeats at once and records them. A registration asking to
    continue an incarnation is continued when ``continue_incarnations`` is true (the held
    assignments it lists stay, none is released) and refused otherwise; a new registration gets
    a fresh incarnation. A heartbeat's restart hold is granted."""

    continue_incarnations: bool = True
    registrations: list[pb.RegisterWorkerRequest] = attrs.field(factory=list)
    heartbeats: list[pb.HeartbeatRequest] = attrs.field(factory=list)
    incarnations: dict[str, int] = attrs.field(factory=dict)
    """Each worker's current incarnation (every worker counts its own from 1)."""
    on_register: Callable[[pb.RegisterWorkerRequest], None] | None = None
    """Called with each registration before it is answered (a test checks what runs then)."""

    @property
    def incarnation(self) -> int:
        """The test worker's current incarnation."""
        return self.incarnations.get(WORKER, 0)

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self.registrations.append(request)
        if self.on_register is not None:
            self.on_register(request)
        current = self.incarnations.get(request.worker_id, 0)
        if request.resume_incarnation:
            if self.continue_incarnations and request.resume_incarnation == current:
                return pb.RegisterWorkerReply(
                    incarnation=current, epoch=1, dead_after_ms=DEAD_AFTER_MS, resumed=True
                )
            return pb.RegisterWorkerReply(incarnation=0, epoch=1, dead_after_ms=DEAD_AFTER_MS, resumed=False)
        self.incarnations[request.worker_id] = current + 1
        return pb.RegisterWorkerReply(incarnation=current + 1, epoch=1, dead_after_ms=DEAD_AFTER_MS)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.heartbeats.append(request)
        if request.incarnation != self.incarnations.get(request.worker_id, 0):
            return pb.HeartbeatReply(epoch=1, reregister=True)
        return pb.HeartbeatReply(epoch=1, restart_hold_granted=request.restart_hold_ms > 0)

    async def submit_job(self, request: object) -> object:
        raise NotImplementedError

    get_job = list_jobs = cancel_job = status = leave_worker = submit_job

    def heartbeats_of(self, incarnation: int) -> list[pb.HeartbeatRequest]:
        return [h for h in self.heartbeats if h.incarnation == incarnation]


@attrs.define
class Host:
    """The agent processes of one worker (one work folder), one after the other."""

    cp: ScriptedControlPlane
    cp_port: int
    work_dir: Path
    tmp_path: Path
    processes: list[trio.Process] = attrs.field(factory=list)

    @property
    def process(self) -> trio.Process:
        return self.processes[-1]

    async def start(self, fence_s: float = FENCE_S, **settings: Any) -> trio.Process:
        """Start an agent process on the work folder (fence span ``fence_s``) and wait until it
        heartbeats."""
        before = len(self.cp.heartbeats)
        options = ", ".join(f"{k}={v!r}" for k, v in settings.items())
        script = textwrap.dedent(f"""
            from agent.main import main
            from runtime.settings.agent import AgentSettings
            main(AgentSettings(worker_id={WORKER!r}, control_planes=["127.0.0.1:{self.cp_port}"],
                               work_dir={str(self.work_dir)!r},
                               heartbeat_interval_s={HEARTBEAT_S}, heartbeat_timeout_s=0.3,
                               self_fence_after_s={fence_s}, stop_grace_s=0.5,
                               {options or "cpu_millis=1000, memory_mb=1000"}))
        """)
        stderr = (self.tmp_path / f"agent-{len(self.processes) + 1}.stderr").open("wb")
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=stderr
        )
        stderr.close()
        self.processes.append(process)
        await wait_for(lambda: len(self.cp.heartbeats) > before or process.poll() is not None)
        assert process.poll() is None, (self.tmp_path / f"agent-{len(self.processes)}.stderr").read_text()
        return process

    async def kill(self) -> float:
        """SIGKILL the running agent process; returns when (wall clock)."""
        self.process.kill()
        killed_at = time.time()
        await self.process.wait()
        return killed_at

    def records(self) -> list[dict[str, Any]]:
        log = self.work_dir / "agent.jsonl"
        return read_jsonl(log) if log.exists() else []

    def stops(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["event"] == "stop"]

    def deadline_unix_s(self) -> float:
        return self.pause_deadline_s() - time.monotonic() + time.time()

    def pause_deadline_s(self) -> float:
        """The pause deadline the reapers hold the jobs to, as the agent last wrote it
        (``time.monotonic()`` seconds, shared by every process of the machine)."""
        deadlines = read_fence_deadline(self.work_dir / "fence_deadline")
        assert deadlines is not None
        return deadlines[0]

    def kill_deadline_unix_s(self) -> float:
        deadlines = read_fence_deadline(self.work_dir / "fence_deadline")
        assert deadlines is not None
        return deadlines[1] - time.monotonic() + time.time()

    def job_file(self, assignment_id: int, name: str) -> Path:
        """File ``name`` of the job folder of assignment ``assignment_id`` (job 10 x its id)."""
        return self.work_dir / "jobs" / f"{10 * assignment_id}-{assignment_id}" / name

    def assert_back_in_time(self, pause_at_s: float) -> None:
        """The agent just started was back (it heartbeats) before the pause deadline its
        predecessor left to the reapers: no job could pause."""
        now = time.monotonic()
        assert now < pause_at_s, f"the agent was back {now - pause_at_s:.2f} s after the jobs' pause deadline"

    def leftovers(self) -> list[psutil.Process]:
        """Live processes (not zombies) working under the work folder: reapers and jobs."""
        found = []
        inside = f"{self.work_dir}{os.sep}"
        for proc in psutil.process_iter():
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and proc.cwd().startswith(inside):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found


@asynccontextmanager
async def host(tmp_path: Path, cp: ScriptedControlPlane | None = None) -> AsyncIterator[Host]:
    """A scripted control plane and a worker's work folder; every agent process, reaper and job
    of the test is killed on the way out."""
    cp = cp or ScriptedControlPlane()
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        worker = Host(cp=cp, cp_port=port, work_dir=tmp_path / "work", tmp_path=tmp_path)
        try:
            yield worker
        finally:
            for process in worker.processes:
                if process.poll() is None:
                    process.kill()
                    await process.wait()
            for leftover in worker.leftovers():
                with contextlib.suppress(psutil.NoSuchProcess):
                    leftover.kill()
            nursery.cancel_scope.cancel()


async def assign(worker: Host, *jobs: tuple[int, pb.JobSpec]) -> None:
    """Send assignments (id, spec) to the running agent (job id = 10 x assignment id)."""
    channel = GrpcChannel(worker.cp.registrations[-1].address)
    try:
        reply = await channel.call(
            channel.stub(pb.WorkerStub).assign,
            pb.AssignRequest(
                epoch=1,
                worker_id=WORKER,
                incarnation=worker.cp.incarnation,
                assignments=[pb.Assignment(assignment_id=a, job_id=10 * a, spec=s) for a, s in jobs],
            ),
            timeout_s=5,
        )
    finally:
        channel.close()
    assert sorted(reply.accepted_ids) == sorted(a for a, _ in jobs), reply.refused


def writer_job(path: Path, *, seconds: float = 60.0, cpu_millis: int = 100) -> pb.JobSpec:
    """A command whose grandchild appends the wall-clock time to ``path`` every 50 ms for
    ``seconds``, then the job exits 0."""
    count = int(seconds / 0.05)
    loop = f"i=0; while [ $i -lt {count} ]; do date +%s.%N >> {path}; sleep 0.05; i=$((i+1)); done"
    return pb.JobSpec(
        cpu_millis=cpu_millis, memory_mb=10, command=pb.CommandRuntime(argv=["sh", "-c", f"({loop})"])
    )


def stamps(path: Path) -> list[float]:
    if not path.exists():
        return []
    return [float(line) for line in path.read_text().split()]


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll ``predicate`` (files and /proc: nothing to wait on) until it holds."""
    with trio.fail_after(timeout_s):
        while True:
            if predicate():
                return
            await trio.sleep(0.02)


def _job_cgroup(work_dir: Path, name: str) -> ConfinedJob | None:
    """The cgroup of job folder ``name`` of the test's worker as its agent would find it; None
    when there is none, or where the machine has no cgroups (rlimit mode)."""
    settings = AgentSettings(
        worker_id=WORKER, control_planes=["127.0.0.1:1"], cpu_millis=1, memory_mb=1, work_dir=str(work_dir)
    )
    found, _ = select_resources("auto", worker_key=worker_key(settings), job_nice=10, pids_max=16)
    return found.find(name)


async def test_a_restarted_agent_keeps_the_command_job_its_killed_predecessor_left_running(
    tmp_path: Path,
) -> None:
    """SIGKILL of the agent leaves its command job running; an agent started again on the same
    work folder within the fence time asks to continue the incarnation, holding the job, and
    keeps it: the job writes on without a pause, runs once, and its stop line (written by the
    new process, in the old incarnation) says it succeeded, which a heartbeat reports."""
    out = job_writable(tmp_path) / "stamps"
    async with host(tmp_path) as worker:
        await worker.start()
        await assign(worker, (1, writer_job(out, seconds=4.0)))
        await wait_for(lambda: len(stamps(out)) >= 5)
        await worker.kill()
        pause_at = worker.pause_deadline_s()
        written = len(stamps(out))
        await wait_for(lambda: len(stamps(out)) > written)  # the job did not stop with its agent
        await worker.start()
        worker.assert_back_in_time(pause_at)
        resume = worker.cp.registrations[-1]
        assert (resume.resume_incarnation, list(resume.held_assignment_ids)) == (1, [1])
        confined = _job_cgroup(worker.work_dir, "10-1")
        if confined is not None:  # kept at the new agent's start, with the job in it
            assert (confined.usage().cpu_s or 0.0) > 0.0
        await wait_for(lambda: len(worker.stops()) == 1)
        if confined is not None:  # and removed once the job ended
            await wait_for(lambda: _job_cgroup(worker.work_dir, "10-1") is None)
        (stop,) = worker.stops()
        assert (stop["reason"], stop["incarnation"], stop["exit_code"]) == ("succeeded", 1, 0)
        await wait_for(lambda: any(h.finished for h in worker.cp.heartbeats_of(1)))
        (outcome,) = [o for h in worker.cp.heartbeats for o in h.finished]
        assert (outcome.assignment_id, outcome.state) == (1, "succeeded")
        assert [r["event"] for r in worker.records()].count("start") == 1
        assert not any(r["event"] == "pause" for r in worker.records())
        assert not (worker.work_dir / "jobs" / "10-1" / RECORD_FILE).exists()


async def test_a_killed_agents_command_job_pauses_at_its_fence_deadline_and_dies_at_the_grace(
    tmp_path: Path,
) -> None:
    """With no agent started again, a killed agent's command job runs on until the fence
    deadline the agent last wrote, stops there (paused), and is gone once the outage grace has
    passed: the reaper keeps invariant 7 for a dead agent as for a frozen one."""
    out = job_writable(tmp_path) / "stamps"
    async with host(tmp_path) as worker:
        await worker.start(1.0, cpu_millis=1000, memory_mb=1000, db_outage_grace_s=2.5)
        await assign(worker, (1, writer_job(out)))
        await wait_for(lambda: len(stamps(out)) >= 5)
        killed_at = await worker.kill()
        deadline, kill_deadline = worker.deadline_unix_s(), worker.kill_deadline_unix_s()
        assert killed_at < deadline <= killed_at + 1.0 + 0.1
        fenced_at = worker.job_file(1, FENCED_AT_FILE)
        await wait_for(fenced_at.exists)  # the reaper paused the job
        # The pause time the reaper wrote, on the wall clock (it paused when it could, at or
        # after the deadline: on a busy machine later).
        paused_at = float(fenced_at.read_text()) - time.monotonic() + time.time()
        assert paused_at >= deadline - 0.01
        last = stamps(out)[-1]
        assert last > killed_at, "the job died with its agent"
        assert last <= paused_at + 0.01, "the job ran past its pause"
        await trio.sleep(0.3)
        assert stamps(out)[-1] == last, "the job ran past its fence deadline"
        looked_at = time.time()
        held = worker.leftovers()
        assert held or looked_at >= kill_deadline - 0.1, "the paused job should be held, not killed yet"
        await wait_for(lambda: not worker.leftovers())
        assert time.time() >= kill_deadline - 0.1


async def test_a_restart_whose_incarnation_is_not_continued_stops_the_jobs_before_registering(
    tmp_path: Path,
) -> None:
    """When the control plane does not continue the incarnation (the worker was declared dead
    meanwhile), the restarted agent stops the job it found and waits until it is gone before
    it registers a new incarnation; the stop line ends the run when it stopped doing work."""
    out = job_writable(tmp_path) / "stamps"
    cp = ScriptedControlPlane(continue_incarnations=False)
    running_at_registration: list[int] = []
    async with host(tmp_path, cp) as worker:
        cp.on_register = lambda request: running_at_registration.append(
            -1 if request.resume_incarnation else len(worker.leftovers())
        )
        await worker.start()
        await assign(worker, (1, writer_job(out)))
        await wait_for(lambda: len(stamps(out)) >= 5)
        await worker.kill()
        await worker.start()
        assert [r.resume_incarnation for r in cp.registrations] == [0, 1, 0]
        assert running_at_registration == [0, -1, 0], "a job of the old life ran on into the new one"
        (stop,) = worker.stops()
        assert stop["incarnation"] == 1 and stop["reason"] in ("restart", "self_fence")
        last = stamps(out)[-1]
        assert stop["time"] >= last - 0.1
        await trio.sleep(0.3)
        assert stamps(out)[-1] == last


async def test_a_restart_with_less_capacity_keeps_the_oldest_jobs_that_fit(tmp_path: Path) -> None:
    """An agent started again with less CPU keeps the jobs that fit, oldest start first, and
    stops the others before it asks to continue: those are not held, so the control plane
    releases them."""
    folder = job_writable(tmp_path)
    outs = {a: folder / f"stamps-{a}" for a in (1, 2, 3)}
    async with host(tmp_path) as worker:
        await worker.start(cpu_millis=1000, memory_mb=1000)
        for aid in (1, 2, 3):  # one at a time: their start order is their assignment order
            await assign(worker, (aid, writer_job(outs[aid], cpu_millis=300)))
            await wait_for(lambda aid=aid: len(stamps(outs[aid])) >= 2)
        await worker.kill()
        await worker.start(cpu_millis=700, memory_mb=1000)
        resume = worker.cp.registrations[-1]
        assert list(resume.held_assignment_ids) == [1, 2]
        (stop,) = worker.stops()
        assert (stop["assignment_id"], stop["reason"]) == (3, "restart")
        kept = {a: len(stamps(outs[a])) for a in (1, 2)}
        stopped = stamps(outs[3])
        for aid in (1, 2):  # the kept ones write on
            await wait_for(lambda aid=aid: len(stamps(outs[aid])) > kept[aid])
        await trio.sleep(0.3)
        assert stamps(outs[3]) == stopped, "the stopped job wrote on"


async def test_a_job_that_ended_while_no_agent_ran_is_reported_by_the_next_one(tmp_path: Path) -> None:
    """A command job that ends between the agent's death and its restart: the new agent writes
    its stop line from the reaper's report and carries its outcome in the registration, and
    holds nothing of it."""
    out = job_writable(tmp_path) / "stamps"
    async with host(tmp_path) as worker:
        await worker.start()
        await assign(worker, (1, writer_job(out, seconds=0.5)), (2, writer_job(out, seconds=30)))
        await wait_for(lambda: len(stamps(out)) >= 2)
        await worker.kill()
        await wait_for(worker.job_file(1, REPORT_FILE).exists)  # its reaper saw it end
        await worker.start()
        resume = worker.cp.registrations[-1]
        assert list(resume.held_assignment_ids) == [2]
        assert [(o.assignment_id, o.state) for o in resume.finished] == [(1, "succeeded")]
        assert [(s["assignment_id"], s["reason"]) for s in worker.stops()] == [(1, "succeeded")]


async def test_a_planned_restart_holds_the_worker_and_the_next_agent_keeps_its_jobs(tmp_path: Path) -> None:
    """SIGHUP: the agent's last heartbeat asks for its restart hold; once granted the fence
    deadline moves on by the hold and the process exits 0 leaving its job running; an agent
    started 2 s later (twice the fence time) keeps the job, which never paused."""
    out = job_writable(tmp_path) / "stamps"
    async with host(tmp_path) as worker:
        await worker.start(1.0, cpu_millis=1000, memory_mb=1000, restart_hold_s=5.0)
        await assign(worker, (1, writer_job(out, seconds=6.0)))
        await wait_for(lambda: len(stamps(out)) >= 5)
        signalled_at = time.time()
        worker.process.send_signal(signal.SIGHUP)
        with trio.fail_after(5):
            code = await worker.process.wait()
        assert code == 0
        assert worker.cp.heartbeats[-1].restart_hold_ms == 5000
        assert worker.deadline_unix_s() >= signalled_at + 5.0
        pause_at = worker.pause_deadline_s()
        await trio.sleep(2.0)  # away longer than the fence (1 s): only the hold keeps the job running
        await worker.start(1.0, cpu_millis=1000, memory_mb=1000)
        worker.assert_back_in_time(pause_at)
        assert list(worker.cp.registrations[-1].held_assignment_ids) == [1]
        await wait_for(lambda: len(worker.stops()) == 1)
        assert worker.stops()[0]["reason"] == "succeeded"
        assert not any(r["event"] == "pause" for r in worker.records())


async def test_a_restarted_agent_runs_the_rest_of_a_sleep_jobs_duration(tmp_path: Path) -> None:
    """A sleep job has no process: its record keeps it. The restarted agent holds it, and it
    succeeds once it has run its whole duration, the agent's absence counted as running (it was
    back before the fence deadline): it ends less than the absence after its 4 s, which a
    duration counted anew, or counted without the absence, could not."""
    async with host(tmp_path) as worker:
        await worker.start()
        sleep = pb.JobSpec(cpu_millis=100, memory_mb=10, sleep=pb.SleepRuntime(duration_ms=4000))
        await assign(worker, (1, sleep))
        await wait_for(lambda: any(r["event"] == "start" for r in worker.records()))
        (start,) = [r for r in worker.records() if r["event"] == "start"]
        await trio.sleep(1.0)
        killed_at = await worker.kill()
        pause_at = worker.pause_deadline_s()
        await trio.sleep(1.0)  # an absence of a second at least, more while the new agent starts
        await worker.start()
        absent_s = time.time() - killed_at
        worker.assert_back_in_time(pause_at)
        assert list(worker.cp.registrations[-1].held_assignment_ids) == [1]
        await wait_for(lambda: len(worker.stops()) == 1)
        (stop,) = worker.stops()
        assert (stop["reason"], stop["incarnation"]) == ("succeeded", 1)
        ran_s = stop["time"] - start["time"]
        assert 3.9 <= ran_s < 4.0 + absent_s, (ran_s, absent_s)


def _reaper(job_dir: Path, deadline: Path) -> subprocess.Popen[bytes]:
    """A real reaper running ``sleep 30`` in ``job_dir``, under the deadline file ``deadline``."""
    job_dir.mkdir(parents=True)
    argv = reaper_argv(
        sys.executable,
        parent_pid=os.getpid(),
        stop_grace_s=0.2,
        fence_deadline_path=str(deadline),
        argv=("sleep", "30"),
    )
    return subprocess.Popen(argv, cwd=job_dir, start_new_session=True)


async def test_the_survey_keeps_only_reapers_its_records_prove_and_stops_the_rest(tmp_path: Path) -> None:
    """Three real reapers of one work folder: one whose record names its pid and start time
    (kept), one whose record names its pid with another start time, as a reused pid would
    (a stray), and one in a folder with no record (a stray); a reaper of another work folder is
    not seen. Stopping the strays kills them and waits until they are gone."""
    work = tmp_path / "work"
    jobs = work / "jobs"
    deadline = work / "fence_deadline"
    work.mkdir()
    write_fence_deadline(deadline, time.monotonic() + 60, time.monotonic() + 120)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    write_fence_deadline(elsewhere / "fence_deadline", time.monotonic() + 60, time.monotonic() + 120)
    procs = {
        "10-1": _reaper(jobs / "10-1", deadline),
        "20-2": _reaper(jobs / "20-2", deadline),
        "30-3": _reaper(jobs / "30-3", deadline),
        "other": _reaper(elsewhere / "jobs" / "40-4", elsewhere / "fence_deadline"),
    }
    try:
        await wait_for(lambda: all(adoption.start_ticks(p.pid) is not None for p in procs.values()))
        for name, aid, skew in (("10-1", 1, 0), ("20-2", 2, 7)):
            pid = procs[name].pid
            ticks = adoption.start_ticks(pid)
            assert ticks is not None
            job_record.write_record(
                jobs / name,
                job_record.JobRecord(
                    worker_id=WORKER,
                    assignment_id=aid,
                    job_id=10 * aid,
                    incarnation=1,
                    epoch=1,
                    cpu_millis=100,
                    memory_mb=10,
                    runtime=CommandRuntime(argv=("sleep", "30")),
                    started_monotonic_s=time.monotonic(),
                    began_monotonic_s=time.monotonic(),
                    supervisor_pid=pid,
                    supervisor_start_ticks=ticks + skew,
                ),
            )
        found = adoption.survey(jobs, worker_id=WORKER, deadline_path=deadline)
        assert {f.record.assignment_id: f.verdict for f in found.found} == {
            1: adoption.Verdict.KEEPABLE,
            2: adoption.Verdict.STRAY,
        }
        assert [s.pid for s in found.strays] == [procs["30-3"].pid]
        with trio.fail_after(10):
            await adoption.stop_strays(found.strays, stop_grace_s=0.2)
        assert procs["30-3"].poll() is not None
        assert procs["10-1"].poll() is None and procs["other"].poll() is None
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)
            proc.wait(timeout=10)


async def test_a_fleet_restarted_with_sighup_keeps_every_workers_jobs(tmp_path: Path) -> None:
    """A fleet of two workers, each running a command job: SIGHUP makes every worker ask for
    its restart hold and the fleet exit 0; the fleet started again takes each worker's job over
    in that worker's own incarnation, and both jobs succeed, having never paused."""
    folder = job_writable(tmp_path)
    cp = ScriptedControlPlane()
    spec = tmp_path / "fleet.json"
    spec.write_text(
        json.dumps(
            [
                {"id": f"w-{i}", "port": 0, "cpu_millis": 1000, "memory_mb": 1000, "work_dir": f"w-{i}"}
                for i in (1, 2)
            ]
        )
    )

    async def start_fleet(port: int) -> trio.Process:
        """Start the fleet and wait until both of its workers heartbeat."""
        process = await trio.lowlevel.open_process(
            [
                *(sys.executable, "-m", "ops.cli", "fleet", "--id", "fleet-t", "--spec", str(spec)),
                *("--control-planes", f"127.0.0.1:{port}", "--heartbeat-interval-s", "0.1", "--insecure"),
                *("--self-fence-after-s", "1.0", "--restart-hold-s", "30"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        count = len(cp.heartbeats)
        await wait_for(lambda: len({h.worker_id for h in cp.heartbeats[count:]}) == 2)
        return process

    stderr = (tmp_path / "fleet.stderr").open("ab")
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        fleet = await start_fleet(port)
        try:
            for worker_id in ("w-1", "w-2"):
                address = next(r.address for r in cp.registrations if r.worker_id == worker_id)
                channel = GrpcChannel(address)
                try:
                    job = writer_job(folder / f"stamps-{worker_id}", seconds=5.0)
                    reply = await channel.call(
                        channel.stub(pb.WorkerStub).assign,
                        pb.AssignRequest(
                            epoch=1,
                            worker_id=worker_id,
                            incarnation=cp.incarnations[worker_id],
                            assignments=[pb.Assignment(assignment_id=1, job_id=10, spec=job)],
                        ),
                        timeout_s=5,
                    )
                finally:
                    channel.close()
                assert list(reply.accepted_ids) == [1]
            await wait_for(lambda: all(len(stamps(folder / f"stamps-w-{i}")) >= 3 for i in (1, 2)))
            before = dict(cp.incarnations)
            fleet.send_signal(signal.SIGHUP)
            with trio.fail_after(10):
                assert await fleet.wait() == 0
            pause_at = {}
            for i in (1, 2):
                deadlines = read_fence_deadline(tmp_path / f"w-{i}" / "fence_deadline")
                assert deadlines is not None
                pause_at[i] = deadlines[0]
            fleet = await start_fleet(port)
            back_at = time.monotonic()
            assert all(back_at < pause_at[i] for i in (1, 2)), (
                "the fleet was back after its jobs' pause deadline"
            )
            resumes = {r.worker_id: r for r in cp.registrations if r.resume_incarnation}
            assert {w: (r.resume_incarnation, list(r.held_assignment_ids)) for w, r in resumes.items()} == {
                w: (before[w], [1]) for w in ("w-1", "w-2")
            }
            assert cp.incarnations == before
            for i in (1, 2):
                log = tmp_path / f"w-{i}" / "agent.jsonl"
                await wait_for(lambda log=log: any(r["event"] == "stop" for r in read_jsonl(log)))
                assert [r["reason"] for r in read_jsonl(log) if r["event"] == "stop"] == ["succeeded"]
                assert not any(r["event"] == "pause" for r in read_jsonl(log))
        finally:
            if fleet.poll() is None:
                fleet.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    await fleet.wait()
            nursery.cancel_scope.cancel()
            stderr.close()

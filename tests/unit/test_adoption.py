"""The rules of restarts that keep jobs (agent/adoption.py), pure: which records a restarted
agent may keep, the guard against reused pids, which jobs fit a smaller capacity, and what it
asks the control plane to continue."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from agent import adoption, job_record
from agent.acceptance import Admission
from agent.adoption import Found, ProcessInfo, Supervisor, Survey, Verdict
from agent.container import supervisor_argv
from agent.job_record import JobRecord
from agent.messages import AssignOrder, JobOrder, JobState, RefusalReason
from agent.reaper import reaper_argv
from agent.runtimes import ContainerJob
from runtime.errors import LocalFileError
from runtime.jobs import CommandRuntime, ContainerRuntime, JobSpec, SleepRuntime

WORKER = "w-1"
DEADLINE = "/srv/stockade/workers/w-1/fence_deadline"


def record(
    aid: int = 1,
    *,
    incarnation: int = 7,
    started: float = 100.0,
    cpu: int = 500,
    memory: int = 256,
    runtime: object = None,
    pid: int | None = 4242,
    ticks: int | None = 90_000,
    worker_id: str = WORKER,
) -> JobRecord:
    return JobRecord(
        worker_id=worker_id,
        assignment_id=aid,
        job_id=10 * aid,
        incarnation=incarnation,
        epoch=3,
        cpu_millis=cpu,
        memory_mb=memory,
        runtime=runtime or CommandRuntime(argv=("sh", "-c", "sleep 60")),  # type: ignore[arg-type]
        started_monotonic_s=started,
        began_monotonic_s=started,
        supervisor_pid=pid,
        supervisor_start_ticks=ticks,
    )


def reaper_process(*, pid: int = 4242, ticks: int = 90_000, deadline: str = DEADLINE) -> ProcessInfo:
    argv = reaper_argv(
        sys.executable, parent_pid=1, stop_grace_s=0.5, fence_deadline_path=deadline, argv=("sh", "-c", "x")
    )
    return ProcessInfo(
        pid=pid, start_ticks=ticks, argv=tuple(argv), cwd="/srv/stockade/workers/w-1/jobs/10-1"
    )


def test_a_reaper_whose_pid_and_start_time_are_the_records_is_kept() -> None:
    """A live reaper of this worker whose pid and start time are those recorded may be kept."""
    verdict, _ = adoption.judge(record(), reaper_process(), Supervisor.REAPER, worker_id=WORKER)
    assert verdict is Verdict.KEEPABLE


def test_a_reused_pid_is_not_kept() -> None:
    """The record's pid now names a process that started at another time (the reaper exited
    and its pid was reused): stopped, never kept."""
    verdict, why = adoption.judge(record(), reaper_process(ticks=95_000), Supervisor.REAPER, worker_id=WORKER)
    assert verdict is Verdict.STRAY and "started at tick 90000" in why


def test_a_reaper_the_record_does_not_name_is_stopped() -> None:
    """A record written before its reaper's pid (the agent died between the fork and the
    record) proves nothing about the reaper in its folder: stopped."""
    verdict, _ = adoption.judge(
        record(pid=None, ticks=None), reaper_process(), Supervisor.REAPER, worker_id=WORKER
    )
    assert verdict is Verdict.STRAY


def test_another_workers_record_is_not_kept() -> None:
    """A record of another worker id (the work folder was used with another --id) is stopped."""
    verdict, _ = adoption.judge(
        record(worker_id="w-2"), reaper_process(), Supervisor.REAPER, worker_id=WORKER
    )
    assert verdict is Verdict.STRAY


def test_a_container_job_is_not_kept() -> None:
    """A container job's supervisor is stopped: container jobs are not kept across restarts."""
    container = record(runtime=ContainerRuntime(image="app:1", argv=()))
    verdict, why = adoption.judge(container, reaper_process(), Supervisor.CONTAINER, worker_id=WORKER)
    assert verdict is Verdict.STRAY and "container" in why


def test_a_record_whose_supervisor_is_gone_is_settled() -> None:
    """No supervisor runs in the folder: the job ended while no agent watched it."""
    verdict, _ = adoption.judge(record(), None, None, worker_id=WORKER)
    assert verdict is Verdict.ENDED


def test_a_sleep_job_is_kept_without_a_process() -> None:
    """A sleep job has no process: its record alone keeps it."""
    sleep = record(runtime=SleepRuntime(duration_ms=5000), pid=None, ticks=None)
    assert adoption.judge(sleep, None, None, worker_id=WORKER)[0] is Verdict.SLEEP


def test_a_reaper_of_this_work_folder_is_recognised_by_its_command_line() -> None:
    """A reaper's command line names its worker's fence-deadline file; another worker's reaper,
    and any other process, is not this worker's."""
    assert adoption.supervisor_of(reaper_process().argv, DEADLINE) is Supervisor.REAPER
    other = reaper_process(deadline="/srv/stockade/workers/w-2/fence_deadline")
    assert adoption.supervisor_of(other.argv, DEADLINE) is None
    assert adoption.supervisor_of(("sh", "-c", DEADLINE), DEADLINE) is None
    # The job's own argv naming the file does not make it a reaper of this folder.
    job = reaper_argv(
        sys.executable,
        parent_pid=1,
        stop_grace_s=0.5,
        fence_deadline_path="/elsewhere",
        argv=("cat", DEADLINE),
    )
    assert adoption.supervisor_of(job, DEADLINE) is None


def test_a_container_supervisor_of_this_work_folder_is_recognised() -> None:
    """A container supervisor names the deadline file in its spec."""
    job = ContainerJob(worker_id=WORKER, job_id=10, assignment_id=1, cpu_millis=100, memory_mb=64)
    argv = supervisor_argv(
        ContainerRuntime(image="app:1", argv=()),
        job,
        started_fd=-1,
        stop_grace_s=0.5,
        fence_deadline_path=Path(DEADLINE),
        job_env={},
    )
    assert adoption.supervisor_of(argv, DEADLINE) is Supervisor.CONTAINER
    assert adoption.supervisor_of(argv, "/other/fence_deadline") is None


def test_the_oldest_jobs_that_fit_a_smaller_capacity_are_kept() -> None:
    """Oldest start first, each kept if it fits what the kept ones left; a small later job is
    still kept where a large one did not fit."""
    jobs = [
        record(1, started=10.0, cpu=600),
        record(2, started=20.0, cpu=500),  # does not fit beside job 1
        record(3, started=30.0, cpu=300),
        record(4, started=5.0, cpu=100, memory=2000),  # oldest, but too much memory
    ]
    kept, dropped = adoption.fit(jobs, cpu_millis=1000, memory_mb=1024)
    assert [j.assignment_id for j in kept] == [1, 3]
    assert [j.assignment_id for j in dropped] == [4, 2]


@given(
    st.lists(st.tuples(st.integers(1, 2000), st.integers(1, 2000), st.floats(0, 100)), max_size=20),
    st.integers(1, 4000),
    st.integers(1, 4000),
)
def test_the_kept_jobs_never_exceed_the_capacity(
    sizes: list[tuple[int, int, float]], cpu_millis: int, memory_mb: int
) -> None:
    """Whatever the jobs, those kept fit the capacity, and every job is kept or dropped once."""
    jobs = [record(i + 1, cpu=c, memory=m, started=s) for i, (c, m, s) in enumerate(sizes)]
    kept, dropped = adoption.fit(jobs, cpu_millis=cpu_millis, memory_mb=memory_mb)
    assert sum(j.cpu_millis for j in kept) <= cpu_millis
    assert sum(j.memory_mb for j in kept) <= memory_mb
    assert sorted(j.assignment_id for j in kept + dropped) == list(range(1, len(jobs) + 1))


def found(item: JobRecord, verdict: Verdict = Verdict.KEEPABLE) -> Found:
    return Found(
        job_dir=Path(f"/jobs/{item.job_id}-{item.assignment_id}"), record=item, verdict=verdict, why=""
    )


def plan(
    *items: Found, now_s: float = 200.0, deadline: tuple[float, float] | None = (201.0, 245.0), **kw: object
):
    survey = Survey(found=items, strays=(), deadline=deadline)
    options = {"cpu_millis": 1000, "memory_mb": 1024, "now_s": now_s, "min_left_s": 1.5, **kw}
    return adoption.plan_takeover(survey, **options)  # type: ignore[arg-type]


def test_a_takeover_asks_to_continue_the_incarnation_of_the_kept_jobs() -> None:
    """The kept jobs' incarnation is asked for; the jobs of an older one are stopped."""
    result = plan(found(record(1, incarnation=7)), found(record(2, incarnation=6)))
    assert (result.incarnation, result.keep) == (7, (1,))
    assert list(result.stop) == [2] and "incarnation 6" in result.stop[2]


def test_nothing_is_kept_when_the_kill_deadline_is_near() -> None:
    """Once the reapers' kill deadline is less than a fence span ahead, nothing is kept: a new
    incarnation is registered after everything was stopped."""
    result = plan(found(record(1)), now_s=244.0)
    assert (result.incarnation, result.keep, list(result.stop)) == (None, (), [1])


def test_nothing_is_kept_without_pidfds() -> None:
    """Without pidfds a reaper that is not this process's child cannot be watched: stopped."""
    result = plan(found(record(1)), pidfds=False)
    assert (result.incarnation, list(result.stop)) == (None, [1])


def test_a_job_that_does_not_fit_is_stopped_and_the_rest_kept() -> None:
    """A smaller capacity keeps the older job and stops the younger, saying why."""
    result = plan(found(record(1, started=1.0, cpu=700)), found(record(2, started=2.0, cpu=700)))
    assert result.keep == (1,) and "does not fit" in result.stop[2]


def test_strays_and_ended_jobs_are_not_kept() -> None:
    """A stray is stopped and an ended job settled; neither is held."""
    result = plan(found(record(1), Verdict.STRAY), found(record(2), Verdict.ENDED), found(record(3)))
    assert result.keep == (3,) and list(result.stop) == [1]
    assert [f.record.assignment_id for f in result.settle] == [2]


def test_a_sleep_job_runs_until_its_jobs_paused_while_no_agent_watched() -> None:
    """A sleep job's time runs from its start, less its recorded pauses, up to the pause
    deadline its agent last wrote; one that ran its duration by then is settled."""
    sleep = attrs.evolve(
        record(1, runtime=SleepRuntime(duration_ms=30_000)), began_monotonic_s=100.0, paused_s=5.0
    )
    assert adoption.sleep_ran_s(sleep, now_s=140.0, pause_at_s=120.0) == pytest.approx(15.0)
    assert adoption.sleep_ran_s(sleep, now_s=110.0, pause_at_s=120.0) == pytest.approx(5.0)
    done = plan(found(sleep, Verdict.SLEEP), now_s=200.0, deadline=(150.0, 500.0))
    assert [f.record.assignment_id for f in done.settle] == [1] and done.keep == ()
    going = plan(found(sleep, Verdict.SLEEP), now_s=120.0, deadline=(130.0, 500.0))
    assert going.keep == (1,) and going.incarnation == 7


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    """Each runtime's record reads back whole; a torn or foreign one reads as none."""
    for runtime in (
        SleepRuntime(duration_ms=1500),
        CommandRuntime(argv=("python3", "-c", "print('é')")),
        ContainerRuntime(image="app:1", argv=("run",)),
    ):
        item = attrs.evolve(record(runtime=runtime), timeout_s=30.0, name="job")
        job_record.write_record(tmp_path, item)
        assert job_record.read_record(tmp_path) == item
    (tmp_path / job_record.RECORD_FILE).write_text('{"version": 1, "worker_id"')
    assert job_record.read_record(tmp_path) is None
    (tmp_path / job_record.RECORD_FILE).write_text(record().to_json().replace('"version": 1', '"version": 9'))
    assert job_record.read_record(tmp_path) is None
    job_record.remove_record(tmp_path)
    assert job_record.read_record(tmp_path) is None


def test_a_process_start_time_is_read_from_proc() -> None:
    """The start time of a live process is /proc/<pid>/stat field 22; a gone one has none."""
    ticks = adoption.start_ticks(os.getpid())
    with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as file:
        assert ticks == int(file.read().rsplit(")", 1)[1].split()[19])
    assert adoption.start_ticks(2**22 + 1) is None


def test_a_supervisors_child_before_its_exec_is_not_taken_for_the_supervisor(tmp_path: Path) -> None:
    """A process that passes for a reaper of this work folder forks a child that never execs
    (as a reaper's child between fork and exec): both show the same command line and folder, and
    the scan finds the parent alone, so a survey never takes the child for the job's reaper."""
    import subprocess

    deadline = str(tmp_path / "fence_deadline")
    script = (
        "# agent.reaper import run\n"
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(30); os._exit(0)\n"
        "sys.stdout.write('forked\\n'); sys.stdout.flush(); time.sleep(30)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, deadline, "--", "sleep", "30"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"forked\n"
        found = adoption.supervisors(deadline)
        assert [(info.pid, kind) for info, kind in found] == [(parent.pid, Supervisor.REAPER)]
        assert found[0][0].parent_pid == os.getpid()
    finally:
        os.killpg(parent.pid, 9)
        parent.wait(timeout=10)


def test_a_continued_incarnation_refuses_what_was_released_and_accepts_new_work() -> None:
    """Invariant 5 after a continuation: the continued incarnation's Assign is accepted, an
    assignment the control plane released is refused as cancelled, and a previous life's is
    refused."""
    adm = Admission(worker_id=WORKER, cpu_capacity_millis=2000, memory_capacity_mb=2048)
    adm.reserve(1, cpu_millis=500, memory_mb=256)  # taken over
    adm.continued(7, 3, released=(2,))

    def order(aid: int, incarnation: int = 7) -> AssignOrder:
        spec = JobSpec(name="j", cpu_millis=100, memory_mb=10, runtime=SleepRuntime(duration_ms=1))
        return AssignOrder(
            epoch=3,
            worker_id=WORKER,
            incarnation=incarnation,
            assignments=(JobOrder(assignment_id=aid, job_id=10 * aid, spec=spec),),
        )

    assert adm.assign(order(3)).accepted_ids == (3,)
    assert [r.reason for r in adm.assign(order(2)).refused] == [RefusalReason.CANCELLED]
    duplicate = adm.assign(order(1))
    assert duplicate.accepted_ids == (1,) and duplicate.to_start == ()
    assert [r.reason for r in adm.assign(order(4, incarnation=6)).refused] == [
        RefusalReason.WRONG_INCARNATION
    ]
    assert (adm.cpu_used_millis, adm.memory_used_mb) == (600, 266)


async def test_a_job_whose_supervisor_was_never_recorded_nor_reported_did_not_start(tmp_path: Path) -> None:
    """A record with no reaper, none running and no report: the agent died before it forked
    one, so the job never ran (not_started: placed again at once); with a recorded reaper and no
    report, the reaper was killed: the job failed."""
    unstarted = adoption.result_from_report(record(pid=None, ticks=None), tmp_path, stopped=False)
    assert (unstarted.state, unstarted.started) == (JobState.NOT_STARTED, False)
    killed = adoption.result_from_report(record(), tmp_path, stopped=False)
    assert (killed.state, killed.started) == (JobState.FAILED, True)
    ended_monotonic_s = time.monotonic() - 2.0
    (tmp_path / "reaper.report").write_text(
        f"exit_code=0\nended_monotonic_s={ended_monotonic_s!r}\nstopped=0\n"
    )
    done = adoption.result_from_report(record(started=ended_monotonic_s - 3.0), tmp_path, stopped=False)
    assert (done.state, done.exit_code) == (JobState.SUCCEEDED, 0)
    # Its times are the reaper's CLOCK_MONOTONIC ones, in this agent's trio clock.
    assert done.ended_at == pytest.approx(trio.current_time() - 2.0, abs=0.5)
    assert done.ended_at - done.began_at == pytest.approx(3.0)


def test_one_agent_process_per_work_folder(tmp_path: Path) -> None:
    """A second agent on a work folder in use is refused, naming the holder's pid (two would take
    over the same jobs); once the first lets go (it exits, or is killed), the next may start."""
    first = adoption.lock_work_dir(tmp_path)
    with pytest.raises(LocalFileError, match=f"in use by another agent process \\(pid {os.getpid()}"):
        adoption.lock_work_dir(tmp_path)
    os.close(first)
    os.close(adoption.lock_work_dir(tmp_path))


def test_a_record_an_older_agent_wrote_is_still_read() -> None:
    """A record that kept its job's start on the wall clock (an agent before times of record were
    the database's) is read all the same: its start is when its duration began counting, and its
    start line's time is unknown."""
    data = json.loads(record(started=1234.5).to_json())
    del data["started_monotonic_s"], data["start_line_s"]
    data["started_unix_s"] = 1_700_000_000.0
    old = JobRecord.from_json(json.dumps(data))
    assert (old.started_monotonic_s, old.start_line_s) == (1234.5, None)
    assert old == record(started=1234.5)

"""The agent's side of countable devices (docs/devices.md): a job's environment names its units;
the acceptance rules refuse an assignment whose units a running job holds, also one taken over
from a previous agent process; the job log's start line and the job's record carry the units;
a fleet spec offers fake units; nvidia-smi's absence offers none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.acceptance import Admission
from agent.devices import device_settings, listed_gpus
from agent.fleet import FleetSpecError, parse_fleet_spec
from agent.job_env import job_environment
from agent.job_record import JobRecord
from agent.joblog import JobLog, LogEvent
from agent.messages import AssignOrder, JobOrder
from runtime import log
from runtime.jobs import JobSpec, SleepRuntime
from runtime.settings.agent import AgentSettings


def order(aid: int, units: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> JobOrder:
    spec = JobSpec(name="j", cpu_millis=100, memory_mb=10, runtime=SleepRuntime(duration_ms=1000))
    return JobOrder(assignment_id=aid, job_id=aid * 10, spec=spec, units=units)


def test_a_jobs_environment_names_its_units() -> None:
    """A job holding gpu 0 and 3 and fpga b gets STOCKADE_RESOURCE_GPU=0,3,
    CUDA_VISIBLE_DEVICES=0,3 and STOCKADE_RESOURCE_FPGA=b; a job holding none gets none of them."""
    env = job_environment(order(1, (("fpga", ("b",)), ("gpu", ("0", "3")))))
    assert env["STOCKADE_RESOURCE_GPU"] == "0,3"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,3"
    assert env["STOCKADE_RESOURCE_FPGA"] == "b"
    plain = job_environment(order(2))
    assert not any(k.startswith("STOCKADE_RESOURCE_") or k == "CUDA_VISIBLE_DEVICES" for k in plain)


def test_a_job_holding_no_gpu_on_a_gpu_worker_sees_none() -> None:
    """On a worker offering gpu units a job holding none gets CUDA_VISIBLE_DEVICES empty (CUDA
    then shows it no device); one holding some gets exactly those; on a worker offering only
    other devices the variable stays unset."""
    assert job_environment(order(1), offered=("gpu", "fpga"))["CUDA_VISIBLE_DEVICES"] == ""
    held = job_environment(order(2, (("gpu", ("1",)),)), offered=("gpu",))
    assert held["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in job_environment(order(3), offered=("fpga",))


def admitted() -> Admission:
    admission = Admission(worker_id="w-1", cpu_capacity_millis=4000, memory_capacity_mb=8192)
    admission.registered(7, 3)
    return admission


def assign(*jobs: JobOrder) -> AssignOrder:
    return AssignOrder(epoch=3, worker_id="w-1", incarnation=7, assignments=jobs)


def test_an_assignment_whose_unit_a_running_job_holds_is_refused() -> None:
    """gpu 1 held by a running job: an assignment asking gpu 1 is refused as units_held, one
    asking gpu 2 is started; once the first job ended, gpu 1 may be given again."""
    admission = admitted()
    assert admission.assign(assign(order(1, (("gpu", ("0", "1")),)))).accepted_ids == (1,)
    decision = admission.assign(assign(order(2, (("gpu", ("1",)),)), order(3, (("gpu", ("2",)),))))
    assert {r.assignment_id: r.reason.value for r in decision.refused} == {2: "units_held"}
    assert [j.assignment_id for j in decision.to_start] == [3]
    admission.job_ended(1, finished=True)
    assert admission.assign(assign(order(4, (("gpu", ("1",)),)))).accepted_ids == (4,)


def test_units_of_a_job_taken_over_from_a_previous_process_are_held() -> None:
    """A restarted agent holds the units of the jobs it took over (from their records)."""
    admission = admitted()
    admission.reserve(9, cpu_millis=100, memory_mb=10, units=(("gpu", ("5",)),))
    decision = admission.assign(assign(order(1, (("gpu", ("5",)),))))
    assert [r.reason.value for r in decision.refused] == ["units_held"]


async def test_the_start_line_and_the_record_carry_the_units(tmp_path: Path) -> None:
    """The job log's start line names the units the job holds, and its record keeps them
    across a restart of the agent."""
    joblog = JobLog(tmp_path / "agent.jsonl", worker_id="w-1")
    joblog.open()
    joblog.clock.observe(1000.0, sent_at=0.0, received_at=0.0)
    joblog.write(
        LogEvent.START, incarnation=7, epoch=3, job_id=10, assignment_id=1, units=(("gpu", ("0", "3")),)
    )
    joblog.write(LogEvent.START, incarnation=7, epoch=3, job_id=20, assignment_id=2)
    joblog.close()
    lines = [json.loads(line) for line in (tmp_path / "agent.jsonl").read_text().splitlines()]
    assert lines[0]["units"] == {"gpu": ["0", "3"]} and "units" not in lines[1]
    record = JobRecord(
        worker_id="w-1",
        assignment_id=1,
        job_id=10,
        incarnation=7,
        epoch=3,
        cpu_millis=100,
        memory_mb=10,
        runtime=SleepRuntime(duration_ms=1000),
        started_monotonic_s=1.0,
        began_monotonic_s=1.0,
        units=(("gpu", ("0", "3")),),
    )
    again = JobRecord.from_json(record.to_json())
    assert again == record and again.order().units == (("gpu", ("0", "3")),)


def test_a_fleet_spec_offers_fake_units_and_refuses_a_unit_twice(tmp_path: Path) -> None:
    """A fleet worker's ``resources`` are its offered units; a unit listed twice is refused,
    naming the worker, the field and the unit."""
    entry = {"id": "w-1", "port": 0, "cpu_millis": 8000, "memory_mb": 8192, "work_dir": "w-1"}
    (worker,) = parse_fleet_spec([{**entry, "resources": {"gpu": ["0", "1"]}}], base_dir=tmp_path)
    assert worker.resources == {"gpu": ("0", "1")}
    with pytest.raises(FleetSpecError, match="must list each unit id once"):
        parse_fleet_spec([{**entry, "resources": {"gpu": ["0", "0"]}}], base_dir=tmp_path)


async def test_without_nvidia_smi_a_worker_offers_only_what_it_declares(tmp_path: Path) -> None:
    """Where nvidia-smi does not exist the worker finds no gpu, and offers what its settings
    declare; a declared gpu is never replaced by a listing."""
    assert listed_gpus("stockade-no-such-program")[0] == ()
    settings = AgentSettings(
        worker_id="w-1",
        control_planes=("127.0.0.1:1",),
        cpu_millis=1000,
        memory_mb=1024,
        work_dir=str(tmp_path),
        resources={"fpga": ("a",)},
    )
    found = await device_settings(settings, log.get("test"), program="stockade-no-such-program")
    assert found.resources == {"fpga": ("a",)}

"""A job's usage from its cgroup's counters: the readings (fake cgroup files), the CPU averaged
between two readings, the samples a heartbeat carries and how the control plane takes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from test_agent_heartbeat import (  # noqa: F401 (autojump_clock: a fixture)
    ScriptedControlPlane,
    assign,
    autojump_clock,
    running_agent,
    sleep_job,
)

from actors.console.usage import usage_view
from actors.ingest_heartbeats import USAGE_VALUE_TOP, usage_rows
from agent.cgroups import Cgroup1Job, Cgroup2Resources
from agent.control_plane import to_pb
from agent.messages import WORKER_TOTAL, HeartbeatReport, UsageSample
from agent.resources import JobUsage, RlimitResources
from agent.usage import UsageMeter, read_usage
from ops.cli.render import job_status_json, status_json
from ops.client.results import Usage, job_from_pb, status_from_pb
from protocol import pb
from runtime.errors import InvalidArgument

MIB = 2**20


def _cgroup(folder: Path, usage_usec: int, memory_bytes: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.stat").write_text(f"usage_usec {usage_usec}\nuser_usec 1\nnr_periods 3\nnr_throttled 1\n")
    (folder / "memory.current").write_text(f"{memory_bytes}\n")


def test_a_cgroup2_reading_has_the_jobs_cpu_time_and_memory_and_the_workers_total(tmp_path: Path) -> None:
    """read_usage reads usage_usec and memory.current of each job's cgroup and of the worker's
    folder (under WORKER_TOTAL); a job whose cgroup is gone is left out."""
    worker_dir = tmp_path / "stockade-jobs" / "w-1-me"
    _cgroup(worker_dir, 9_000_000, 700 * MIB)
    _cgroup(worker_dir / "7-3", 4_500_000, 300 * MIB)
    resources = Cgroup2Resources(worker_dir=worker_dir, pids_max=64, jobs_weight=100)
    readings, _ = read_usage(resources, {3: "7-3", 4: "8-4"})
    assert readings == {
        WORKER_TOTAL: JobUsage(cpu_s=9.0, throttled_periods=1, memory_bytes=700 * MIB),
        3: JobUsage(cpu_s=4.5, throttled_periods=1, memory_bytes=300 * MIB),
    }


def test_a_cgroup1_reading_has_cpuacct_usage_and_memory_usage_in_bytes(tmp_path: Path) -> None:
    """cgroup v1: cpuacct.usage (ns) and memory.usage_in_bytes."""
    folders = {c: tmp_path / c / "7-3" for c in ("cpu", "cpuacct", "memory", "pids")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    (folders["cpuacct"] / "cpuacct.usage").write_text("2500000000\n")
    (folders["memory"] / "memory.usage_in_bytes").write_text(f"{64 * MIB}\n")
    usage = Cgroup1Job(name="7-3", folders=folders).usage()
    assert (usage.cpu_s, usage.memory_bytes) == (2.5, 64 * MIB)


def test_without_cgroups_nothing_is_read() -> None:
    """rlimit mode counts nothing: the worker's total has no CPU count, so no sample follows."""
    readings, _ = read_usage(RlimitResources(), {})
    assert readings == {WORKER_TOTAL: JobUsage()}
    meter = UsageMeter()
    meter.samples(readings, 0.0)
    assert meter.samples(readings, 5.0) == ()


def test_the_first_reading_sets_the_baseline_and_the_next_gives_cores() -> None:
    """Two cores busy for 5 s (10 CPU seconds more) read as 2000 millicores over 5000 ms; the
    memory is the second reading's, in MiB."""
    meter = UsageMeter()
    assert meter.samples({3: JobUsage(cpu_s=1.0, memory_bytes=10 * MIB)}, 100.0) == ()
    samples = meter.samples({3: JobUsage(cpu_s=11.0, memory_bytes=300 * MIB)}, 105.0)
    assert samples == (UsageSample(assignment_id=3, cpu_millis=2000, memory_mb=300, span_ms=5000),)


def test_each_span_counts_from_the_reading_before() -> None:
    """A third reading averages over the span since the second, not since the first."""
    meter = UsageMeter()
    meter.samples({3: JobUsage(cpu_s=0.0)}, 0.0)
    meter.samples({3: JobUsage(cpu_s=10.0)}, 5.0)
    (sample,) = meter.samples({3: JobUsage(cpu_s=12.5)}, 10.0)
    assert (sample.cpu_millis, sample.memory_mb, sample.span_ms) == (500, 0, 5000)


def test_each_counter_counts_over_the_span_between_its_own_reads() -> None:
    """Readings timed each by its own read (read_usage's): a counter read 0.5 s later than the
    other (its thread waited for a core) is averaged over its own span, not the other's."""
    meter = UsageMeter()
    meter.samples({3: JobUsage(cpu_s=0.0), WORKER_TOTAL: JobUsage(cpu_s=0.0)}, {3: 0.5, WORKER_TOTAL: 0.0})
    samples = meter.samples(
        {3: JobUsage(cpu_s=10.0), WORKER_TOTAL: JobUsage(cpu_s=10.0)}, {3: 5.5, WORKER_TOTAL: 5.0}
    )
    assert [(s.assignment_id, s.cpu_millis, s.span_ms) for s in samples] == [
        (3, 2000, 5000),
        (WORKER_TOTAL, 2000, 5000),
    ]


def test_a_counter_that_went_back_starts_a_new_baseline() -> None:
    """A cgroup made anew counts from 0: no sample (it would be negative), the next one counts."""
    meter = UsageMeter()
    meter.samples({3: JobUsage(cpu_s=50.0)}, 0.0)
    assert meter.samples({3: JobUsage(cpu_s=1.0)}, 5.0) == ()
    (sample,) = meter.samples({3: JobUsage(cpu_s=6.0)}, 10.0)
    assert sample.cpu_millis == 1000


def test_a_job_not_read_is_forgotten() -> None:
    """A job missing from a reading (it ended) starts over should its id be read again."""
    meter = UsageMeter()
    meter.samples({3: JobUsage(cpu_s=1.0), WORKER_TOTAL: JobUsage(cpu_s=1.0)}, 0.0)
    assert [s.assignment_id for s in meter.samples({WORKER_TOTAL: JobUsage(cpu_s=2.0)}, 5.0)] == [
        WORKER_TOTAL
    ]
    assert [s.assignment_id for s in meter.samples({3: JobUsage(cpu_s=9.0)}, 10.0)] == []


def test_a_heartbeats_samples_become_rows_capped_at_the_databases_integer() -> None:
    """The control plane keeps a huge measure as the integer's top rather than refusing it."""
    request = pb.HeartbeatRequest(
        running_assignment_ids=[3],
        usage=[
            pb.UsageSample(assignment_id=3, cpu_millis=1900, memory_mb=12, span_ms=5000),
            pb.UsageSample(assignment_id=0, cpu_millis=2**32 - 1, memory_mb=0, span_ms=5000),
        ],
    )
    assert usage_rows(request) == ((3, 1900, 12, 5000), (0, USAGE_VALUE_TOP, 0, 5000))


def test_a_heartbeat_with_more_samples_than_jobs_plus_one_is_refused() -> None:
    """At most one sample per running assignment plus the worker's total."""
    request = pb.HeartbeatRequest(running_assignment_ids=[3], usage=[pb.UsageSample(assignment_id=3)] * 3)
    with pytest.raises(
        InvalidArgument, match=r"usage must hold at most one per running assignment plus one \(2\)"
    ):
        usage_rows(request)


def test_a_heartbeat_without_samples_has_none() -> None:
    """An older agent's heartbeat (no usage field) records no sample."""
    assert usage_rows(pb.HeartbeatRequest(running_assignment_ids=[3])) == ()


def test_a_jobs_and_a_workers_newest_figures_reach_the_cli_and_its_json() -> None:
    """GetJob's and Status's ``usage`` become ``Usage`` values, shown in cores and MiB and given
    whole in ``--json``; a reply without it has none (null)."""
    used = pb.UsageNow(cpu_millis=1930, memory_mb=41, age_s=2.5)
    job = job_from_pb(pb.JobInfo(job_id=7, state="running", usage=used))
    assert job.usage == Usage(cpu_millis=1930, memory_mb=41, age_s=2.5)
    assert job.usage.describe() == "1.93 cores, 41 MiB, 2 s ago"
    assert job_status_json(job)["usage"] == {"cpu_millis": 1930, "memory_mb": 41, "age_s": 2.5}
    assert job_status_json(job_from_pb(pb.JobInfo(job_id=8, state="pending")))["usage"] is None
    status = status_from_pb(
        pb.StatusReply(workers=[pb.WorkerInfo(id="w-1", state="alive", usage=used), pb.WorkerInfo(id="w-2")])
    )
    assert [w["usage"] for w in status_json(status)["workers"]] == [
        {"cpu_millis": 1930, "memory_mb": 41, "age_s": 2.5},
        None,
    ]


def test_the_usage_section_shows_the_newest_sample_and_scales_its_charts_above_the_ask() -> None:
    """The figures are the newest sample's; each chart draws the samples of its span (an older
    one is left out), its scale reaching above both the values and the ask (dashed)."""
    row = {
        "now_unix_s": 1000.0,
        "unix_s": [0.0, 990.0, 995.0],
        "cpu_millis": [100, 1200, 1930],
        "memory_mb": [1, 30, 41],
    }
    usage = usage_view(row, span_s=900.0, cpu_asked_millis=2000, memory_asked_mb=64)
    assert usage is not None
    assert (usage.cores, usage.cpu_millis, usage.memory_mb, usage.age_s, usage.samples) == (
        1.93,
        1930,
        41,
        5.0,
        3,
    )
    cpu = usage.cpu_chart
    assert len(cpu.points.split()) == 2  # the sample 1000 s old is outside the 900 s span
    assert [label for _, label in cpu.y_ticks] == ["0", "1.25", "2.5"]
    assert cpu.asked_y is not None and cpu.y0 < cpu.asked_y < cpu.y1
    assert [label for _, label in usage.memory_chart.y_ticks] == ["0", "50", "100"]
    assert usage_view({**row, "unix_s": [], "cpu_millis": [], "memory_mb": []}) is None


def test_a_workers_usage_has_no_ask_drawn() -> None:
    """A worker's total asked for nothing: no dashed line."""
    usage = usage_view({"now_unix_s": 10.0, "unix_s": [5.0], "cpu_millis": [0], "memory_mb": [0]})
    assert usage is not None and usage.cpu_chart.asked_y is None and usage.cores == 0.0
    assert [label for _, label in usage.cpu_chart.y_ticks] == ["0", "1", "2"]


async def test_a_heartbeat_carries_its_samples_as_protocol_messages() -> None:
    """The agent's report becomes ``HeartbeatRequest.usage``, field for field; none: empty."""
    sample = UsageSample(assignment_id=3, cpu_millis=1930, memory_mb=41, span_ms=5000)
    report = HeartbeatReport(
        worker_id="w-1",
        incarnation=2,
        running_assignment_ids=(3,),
        finished=(),
        epoch_seen=1,
        usage=(sample,),
    )
    request = to_pb(report, pb.HeartbeatRequest)
    assert request.usage == [pb.UsageSample(assignment_id=3, cpu_millis=1930, memory_mb=41, span_ms=5000)]
    assert to_pb(attrs.evolve(report, usage=()), pb.HeartbeatRequest).usage == []


async def test_a_heartbeat_leaves_out_the_samples_of_jobs_that_ended_since_they_were_measured(
    tmp_path: Path,
    autojump_clock: Any,  # noqa: F811 (the fixture imported above)
) -> None:
    """Samples are measured up to usage_interval_s before the heartbeat that carries them: those
    of assignments no longer running are left out, so a heartbeat never carries more than one
    per running assignment plus the worker's total (the control plane refuses more)."""
    cp = ScriptedControlPlane()
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assign(agent, sleep_job(1), sleep_job(2))
        await trio.sleep(1.0)
        measured = tuple(
            UsageSample(assignment_id=aid, cpu_millis=1000, memory_mb=1, span_ms=5000)
            for aid in (0, 1, 2, 3, 4)
        )
        report = agent._heartbeat_report(1, trio.current_time(), (), measured)
    assert report.running_assignment_ids == (1, 2)
    assert [s.assignment_id for s in report.usage] == [0, 1, 2]

"""Enforced resources of command jobs, the pure parts: the limits' arithmetic, the cgroup files'
parsing, where the hierarchies are, which mode a machine gets (from fake cgroup trees built in
``tmp_path``), what the v2 and v1 layouts write, the reaper's confinement field, the settings.

The fake trees stand in for the kernel: a folder made under them gets the interface files the
kernel would put there (:class:`FakeKernel`), and writes land in plain files. So these tests say
what is written where, not that a kernel takes it (the integration tests do that on the
machine's real hierarchies)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from agent import cgroups, reaper
from agent.cgroup_mounts import (
    Host,
    Mount,
    locate,
    parse_keyed,
    parse_mountinfo,
    parse_proc_cgroup,
    visible_dir,
)
from agent.cgroups import AGENT_LEAF, JOBS_GROUP, Cgroup1Resources, Cgroup2Resources, select_resources
from agent.job_results import JobResult, oom_killed
from agent.messages import JobState
from agent.resources import (
    JobLimits,
    JobUsage,
    Mode,
    RlimitResources,
    cpu_quota_us,
    job_cpu_shares,
    job_cpu_weight,
    jobs_cpu_shares,
    jobs_cpu_weight,
    memory_limit_bytes,
)
from runtime.errors import InvalidArgument, ResourcesUnavailable
from runtime.settings.agent import (
    AUTO,
    JOB_RESOURCES_CHOICES,
    AgentSettings,
)

PID = 4242
"""The agent's process id in the fake trees."""

# What this development machine shows (cgroup v1 for the controllers, an empty cgroup2).
HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/dca81d33
2:cpuacct:/
1:cpu:/
0::/
"""

V2_FILES = {
    "cgroup.procs": "",
    "cgroup.controllers": "cpu memory pids",
    "cgroup.subtree_control": "",
    "cgroup.type": "domain",
    "cpu.max": "max 100000",
    "cpu.weight": "100",
    "cpu.stat": "usage_usec 0\nnr_periods 0\nnr_throttled 0\n",
    "memory.max": "max",
    "memory.swap.max": "max",
    "memory.oom.group": "0",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
    "pids.max": "max",
}
V1_FILES = {
    "cgroup.procs": "",
    "cpu.cfs_period_us": "100000",
    "cpu.cfs_quota_us": "-1",
    "cpu.shares": "1024",
    "cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
    "cpuacct.usage": "0",
    "memory.limit_in_bytes": "9223372036854771712",
    "memory.memsw.limit_in_bytes": "9223372036854771712",
    "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    "pids.max": "max",
}


@attrs.define
class FakeKernel:
    """Stands in for cgroupfs: a folder made gets ``files`` (the interface files) at once."""

    files: dict[str, str]

    def mkdir(self, folder: Path, *, exist_ok: bool = False) -> None:
        folder.mkdir(exist_ok=exist_ok)
        for name, text in self.files.items():
            if not (folder / name).exists():
                (folder / name).write_text(text)


@pytest.fixture
def v2_kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    kernel = FakeKernel(dict(V2_FILES))
    monkeypatch.setattr(cgroups, "_mkdir", kernel.mkdir)
    return kernel


@pytest.fixture
def v1_kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    kernel = FakeKernel(dict(V1_FILES))
    monkeypatch.setattr(cgroups, "_mkdir", kernel.mkdir)
    return kernel


def v2_host(tmp_path: Path, *, own: str = "/system.slice/stockade.service", procs: str = f"{PID}\n") -> Host:
    """A machine with only the unified hierarchy (at ``tmp_path/cg``), the agent in ``own``,
    which holds ``procs``."""
    (tmp_path / "mountinfo").write_text(f"41 31 0:38 / {tmp_path}/cg rw,relatime - cgroup2 cgroup2 rw\n")
    (tmp_path / "cgroup").write_text(f"0::{own}\n")
    folder = tmp_path / "cg" / own.strip("/")
    folder.mkdir(parents=True)
    FakeKernel(dict(V2_FILES)).mkdir(folder, exist_ok=True)
    (folder / "cgroup.procs").write_text(procs)
    return Host(mountinfo=tmp_path / "mountinfo", self_cgroup=tmp_path / "cgroup", pid=PID, cpus=1)


def v1_host(tmp_path: Path, *, with_v2: bool = False) -> Host:
    """A machine with cgroup v1 hierarchies ``cpu,cpuacct``, ``memory``, ``pids`` at
    ``tmp_path/v1/...`` (and an empty cgroup2 when ``with_v2``), the agent at ``/agent`` in each."""
    lines = [
        f"32 31 0:29 / {tmp_path}/v1/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct",
        f"35 31 0:32 / {tmp_path}/v1/memory rw - cgroup cgroup rw,memory",
        f"39 31 0:36 / {tmp_path}/v1/pids rw - cgroup cgroup rw,pids",
    ]
    if with_v2:
        lines.append(f"41 31 0:38 / {tmp_path}/unified rw - cgroup2 cgroup2 rw")
        FakeKernel({**V2_FILES, "cgroup.controllers": ""}).mkdir(tmp_path / "unified")
    (tmp_path / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp_path / "cgroup").write_text("3:pids:/agent\n2:memory:/agent\n1:cpu,cpuacct:/agent\n0::/\n")
    for hierarchy in ("cpu,cpuacct", "memory", "pids"):
        (tmp_path / "v1" / hierarchy / "agent").mkdir(parents=True)
    return Host(mountinfo=tmp_path / "mountinfo", self_cgroup=tmp_path / "cgroup", pid=PID, cpus=1)


def select(choice: str, host: Host, *, pids_max: int = 4096) -> tuple[object, list[str]]:
    return select_resources(choice, worker_key="w-1-abc", job_nice=10, pids_max=pids_max, host=host)


# ---------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("cpu_millis", "quota_us"), [(500, 50_000), (1000, 100_000), (4000, 400_000), (10, 1000), (1, 1000)]
)
def test_the_cpu_quota_is_a_hundred_microseconds_per_millicore_at_least_one_millisecond(
    cpu_millis: int, quota_us: int
) -> None:
    """A job's CFS quota per 100 ms period is cpu_millis x 100 µs, never below the kernel's 1 ms."""
    assert cpu_quota_us(cpu_millis) == quota_us


def test_the_memory_limit_is_memory_mb_mebibytes() -> None:
    """memory_mb 64 is a limit of 64 x 2^20 bytes."""
    assert memory_limit_bytes(64) == 67_108_864


@pytest.mark.parametrize(
    ("job_nice", "cpus", "shares", "weight"),
    [(0, 1, 1024, 100), (10, 1, 110, 11), (19, 1, 15, 1), (10, 4, 440, 43), (0, 512, 262_144, 10_000)],
)
def test_the_jobs_weigh_what_one_task_at_the_job_nice_value_weighs_per_cpu(
    job_nice: int, cpus: int, shares: int, weight: int
) -> None:
    """The worker's jobs together weigh one task at job_nice per CPU (the kernel's table: nice
    10 = 110 of 1024), on the v1 scale (cpu.shares) and the v2 scale (cpu.weight, 100 = nice
    0), within the kernel's ranges."""
    assert (jobs_cpu_shares(job_nice, cpus), jobs_cpu_weight(job_nice, cpus)) == (shares, weight)


def test_a_jobs_weight_among_its_workers_jobs_follows_its_cpu_millis_within_the_kernels_range() -> None:
    """One job weighs 1024 shares (v1) or 100 (v2) per core asked for, clamped to the kernel's range."""
    assert [job_cpu_shares(m) for m in (1, 500, 1000, 1_000_000)] == [2, 512, 1024, 262_144]
    assert [job_cpu_weight(m) for m in (1, 500, 1000, 1_000_000)] == [1, 50, 100, 10_000]


# ---------------------------------------------------------------------------- parsing


def test_memory_events_and_oom_control_give_their_oom_kill_counts() -> None:
    """The oom_kill line of memory.events (v2) and of memory.oom_control (v1) are read as numbers."""
    assert parse_keyed("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 1\n")["oom_kill"] == 2
    assert parse_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")["oom_kill"] == 5
    assert parse_keyed("garbage\nusage_usec x\n") == {}


def test_mountinfo_gives_the_cgroup_mounts_with_their_controllers_and_decoded_paths() -> None:
    """Only cgroup file systems are kept; a v1 mount lists its controllers (comounted ones
    together), a v2 mount none, and escaped characters in paths are decoded."""
    mounts = parse_mountinfo(
        "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:1 - cgroup cgroup rw,cpu,cpuacct\n"
        "41 31 0:38 /docker/ab /mnt/my\\040cg rw - cgroup2 cgroup2 rw,nsdelegate\n"
        "broken line\n"
    )
    assert mounts == [
        Mount(
            mount_point=Path("/sys/fs/cgroup/cpu,cpuacct"),
            root="/",
            version=1,
            controllers=frozenset({"cpu", "cpuacct"}),
        ),
        Mount(mount_point=Path("/mnt/my cg"), root="/docker/ab", version=2, controllers=frozenset()),
    ]


def test_proc_cgroup_gives_each_controllers_path_and_the_unified_one_under_the_empty_key() -> None:
    """/proc/self/cgroup lines map every controller of a hierarchy to its path, v2's to ''."""
    assert parse_proc_cgroup(HYBRID_CGROUP + "2:cpu,cpuacct:/a:b\n") == {
        "name=systemd": "/",
        "pids": "/",
        "memory": "/process_api/dca81d33",
        "cpuacct": "/",
        "cpu": "/",
        "": "/",
    }


def test_a_cgroup_is_found_under_a_mount_that_shows_part_of_its_hierarchy_or_not_at_all() -> None:
    """A mount of /docker/ab shows /docker/ab/x at <mount>/x, and does not show /other."""
    mount = Mount(mount_point=Path("/sys/fs/cgroup"), root="/docker/ab", version=2, controllers=frozenset())
    assert visible_dir(mount, "/docker/ab") == Path("/sys/fs/cgroup")
    assert visible_dir(mount, "/docker/ab/x") == Path("/sys/fs/cgroup/x")
    assert visible_dir(mount, "/docker/abc") is None
    assert visible_dir(mount, "/other") is None


def test_on_this_hybrid_machine_the_v1_hierarchies_hold_the_controllers() -> None:
    """With v1 hierarchies for cpu, cpuacct, memory and pids and an empty cgroup2, both are
    located: v2 at the unified mount, v1 in each hierarchy at the process's own cgroup."""
    located = locate(HYBRID_MOUNTINFO, HYBRID_CGROUP)
    assert located.v2 == Path("/sys/fs/cgroup/unified")
    assert dict(located.v1) == {
        "cpu": Path("/sys/fs/cgroup/cpu"),
        "memory": Path("/sys/fs/cgroup/memory/process_api/dca81d33"),
        "pids": Path("/sys/fs/cgroup/pids"),
        "cpuacct": Path("/sys/fs/cgroup/cpuacct"),
    }
    assert located.v1_why == ""


def test_a_machine_without_a_pids_hierarchy_has_no_v1_mode_and_says_which_is_missing() -> None:
    """cgroup v1 needs cpu, memory and pids; the reason names the missing one."""
    mountinfo = "\n".join(line for line in HYBRID_MOUNTINFO.splitlines() if "pids" not in line)
    assert locate(mountinfo, HYBRID_CGROUP).v1_why == "no cgroup v1 hierarchy of pids is mounted"


# ---------------------------------------------------------------------------- mode detection


def test_auto_takes_cgroup2_where_the_unified_hierarchy_offers_the_controllers(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """cgroup v2 with cpu, memory and pids in the agent's cgroup: the mode is cgroup2, nothing skipped."""
    resources, skipped = select(AUTO, v2_host(tmp_path))
    assert isinstance(resources, Cgroup2Resources) and resources.mode is Mode.CGROUP2
    assert skipped == []


def test_auto_takes_cgroup1_where_the_unified_hierarchy_has_no_controllers_and_says_why(
    tmp_path: Path, v1_kernel: FakeKernel
) -> None:
    """A hybrid machine (an empty cgroup2, v1 hierarchies for the controllers) gets cgroup1,
    and the reason cgroup2 was not taken names the cgroup and what it lacks."""
    resources, skipped = select(AUTO, v1_host(tmp_path, with_v2=True))
    assert isinstance(resources, Cgroup1Resources)
    assert len(skipped) == 1 and skipped[0].startswith("cgroup2: the cgroup ")
    assert "offers the controllers (none), not cpu memory pids" in skipped[0]


def test_auto_falls_back_to_rlimits_without_cgroups_and_says_why_for_each(tmp_path: Path) -> None:
    """No cgroup file system at all: rlimit, with a reason for cgroup2 and one for cgroup1."""
    (tmp_path / "mountinfo").write_text("23 1 0:21 / /proc rw - proc proc rw\n")
    (tmp_path / "cgroup").write_text("")
    resources, skipped = select(
        AUTO, Host(mountinfo=tmp_path / "mountinfo", self_cgroup=tmp_path / "cgroup", pid=PID, cpus=1)
    )
    assert isinstance(resources, RlimitResources)
    assert skipped == [
        "cgroup2: no cgroup2 file system is mounted",
        "cgroup1: no cgroup v1 hierarchy of cpu, memory, pids is mounted",
    ]


def test_a_mode_asked_for_by_name_that_the_machine_lacks_is_an_error_saying_why(
    tmp_path: Path, v1_kernel: FakeKernel
) -> None:
    """job_resources cgroup2 on a machine whose unified hierarchy has no controllers is refused."""
    with pytest.raises(
        ResourcesUnavailable, match=r"^job_resources cgroup2 cannot be used here: the cgroup "
    ):
        select("cgroup2", v1_host(tmp_path, with_v2=True))


def test_rlimit_asked_for_by_name_is_taken_even_where_cgroups_work(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """job_resources rlimit is the fallback forced: no cgroup is touched."""
    host = v2_host(tmp_path)
    resources, _ = select("rlimit", host)
    assert isinstance(resources, RlimitResources)
    assert not (tmp_path / "cg" / "system.slice" / "stockade.service" / AGENT_LEAF).exists()


def test_rlimit_mode_limits_each_processs_address_space_to_the_jobs_memory() -> None:
    """Without cgroups a job's confinement is RLIMIT_AS = memory_mb MiB, and no cgroup."""
    confined = RlimitResources().confine("7-3", JobLimits(cpu_millis=500, memory_mb=64))
    assert confined.confinement.cgroup_procs == ()
    assert confined.confinement.address_space_bytes == 64 * 2**20
    assert confined.usage() == JobUsage() and confined.remove()


# ---------------------------------------------------------------------------- cgroup v2 layout


def test_cgroup2_moves_the_agent_into_a_leaf_and_hands_the_controllers_down(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """The agent's process goes into D/stockade-agent; D, D/stockade-jobs and the worker's
    folder enable cpu, memory and pids for their children; the jobs' group weighs 11 (nice 10)."""
    select(AUTO, v2_host(tmp_path))
    d = tmp_path / "cg" / "system.slice" / "stockade.service"
    assert (d / AGENT_LEAF / "cgroup.procs").read_text() == str(PID)
    for folder in (d, d / JOBS_GROUP, d / JOBS_GROUP / "w-1-abc"):
        assert (folder / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (d / JOBS_GROUP / "cpu.weight").read_text() == "11"


def test_cgroup2_writes_a_jobs_quota_limits_and_pids_into_its_own_cgroup(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """A job of 500 millicores and 64 MiB gets cpu.max '50000 100000', memory.max 64 MiB with
    no swap, the whole job killed on OOM, pids.max as set, and its process joins cgroup.procs."""
    resources, _ = select(AUTO, v2_host(tmp_path), pids_max=64)
    assert isinstance(resources, Cgroup2Resources)
    confined = resources.confine("7-3", JobLimits(cpu_millis=500, memory_mb=64))
    job = tmp_path / "cg" / "system.slice" / "stockade.service" / JOBS_GROUP / "w-1-abc" / "7-3"
    written = {name: (job / name).read_text() for name in V2_FILES if name not in ("cgroup.procs",)}
    assert {k: written[k] for k in ("cpu.max", "cpu.weight", "memory.max", "memory.swap.max")} == {
        "cpu.max": "50000 100000",
        "cpu.weight": "50",
        "memory.max": str(64 * 2**20),
        "memory.swap.max": "0",
    }
    assert (written["memory.oom.group"], written["pids.max"]) == ("1", "64")
    assert confined.confinement.cgroup_procs == (str(job / "cgroup.procs"),)
    assert confined.confinement.clone_into == str(job)  # born there, where the kernel can
    assert confined.confinement.address_space_bytes is None


def test_cgroup2_without_swap_accounting_or_oom_groups_still_limits_the_rest(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """A kernel without memory.swap.max and memory.oom.group: those are left out, not made up."""
    del v2_kernel.files["memory.swap.max"], v2_kernel.files["memory.oom.group"]
    resources, _ = select(AUTO, v2_host(tmp_path))
    assert isinstance(resources, Cgroup2Resources)
    resources.confine("7-3", JobLimits(cpu_millis=500, memory_mb=64))
    job = resources.worker_dir / "7-3"
    assert not (job / "memory.swap.max").exists() and not (job / "memory.oom.group").exists()
    assert (job / "memory.max").read_text() == str(64 * 2**20)


def test_cgroup2_reads_a_jobs_cpu_time_throttling_and_oom_kills(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """usage_usec and nr_throttled of cpu.stat, oom_kill of memory.events."""
    resources, _ = select(AUTO, v2_host(tmp_path))
    assert isinstance(resources, Cgroup2Resources)
    confined = resources.confine("7-3", JobLimits(cpu_millis=500, memory_mb=64))
    job = resources.worker_dir / "7-3"
    (job / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1400000\nnr_periods 30\nnr_throttled 7\n")
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 2\n")
    assert confined.usage() == JobUsage(cpu_s=1.5, throttled_periods=7, oom_kills=2)


def test_cgroup2_is_not_used_where_the_agents_cgroup_holds_other_processes(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """The no-internal-processes rule: a shared cgroup (a shell's) cannot hand controllers
    down while others stay in it, so cgroup2 is refused, saying so, and nothing is moved."""
    host = v2_host(tmp_path, procs=f"{PID}\n17\n18\n")
    with pytest.raises(ResourcesUnavailable, match="holds 2 other processes besides the agent"):
        select("cgroup2", host)
    assert not (tmp_path / "cg" / "system.slice" / "stockade.service" / AGENT_LEAF).exists()


def test_cgroup2_in_its_leaf_already_takes_the_parent_and_moves_nothing(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """A fleet's next worker (the process is in stockade-agent already, as systemd's
    DelegateSubgroup would start it) sets up its own folder beside the first's under the same
    stockade-jobs, and moves nothing."""
    first, _ = select(AUTO, v2_host(tmp_path))
    d = tmp_path / "cg" / "system.slice" / "stockade.service"
    (tmp_path / "cgroup").write_text(f"0::/system.slice/stockade.service/{AGENT_LEAF}\n")
    (d / AGENT_LEAF / "cgroup.procs").write_text(f"{PID}\n")
    second, _ = select_resources(
        AUTO,
        worker_key="w-2-abc",
        job_nice=10,
        pids_max=4096,
        host=Host(mountinfo=tmp_path / "mountinfo", self_cgroup=tmp_path / "cgroup", pid=PID, cpus=1),
    )
    assert isinstance(first, Cgroup2Resources) and isinstance(second, Cgroup2Resources)
    assert (first.worker_dir, second.worker_dir) == (d / JOBS_GROUP / "w-1-abc", d / JOBS_GROUP / "w-2-abc")
    assert not (d / AGENT_LEAF / AGENT_LEAF).exists()


def test_cgroup2_started_in_its_leaf_by_the_process_manager_takes_the_parent(
    tmp_path: Path, v2_kernel: FakeKernel
) -> None:
    """systemd's DelegateSubgroup=stockade-agent starts the agent in the leaf: the unit's cgroup
    is D, and the jobs go beside the leaf, not inside it."""
    host = v2_host(tmp_path, own=f"/system.slice/stockade.service/{AGENT_LEAF}")
    d = tmp_path / "cg" / "system.slice" / "stockade.service"
    FakeKernel(dict(V2_FILES)).mkdir(d, exist_ok=True)
    resources, _ = select("cgroup2", host)
    assert isinstance(resources, Cgroup2Resources)
    assert resources.worker_dir == d / JOBS_GROUP / "w-1-abc"
    assert (d / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert not (d / AGENT_LEAF / AGENT_LEAF).exists()


def test_cgroup2_in_the_root_cgroup_stays_there(tmp_path: Path, v2_kernel: FakeKernel) -> None:
    """The root cgroup (no cgroup.type) is exempt from the rule: no leaf, jobs under /stockade-jobs."""
    host = v2_host(tmp_path, own="/", procs=f"1\n{PID}\n")
    (tmp_path / "cg" / "cgroup.type").unlink()
    resources, _ = select("cgroup2", host)
    assert isinstance(resources, Cgroup2Resources)
    assert resources.worker_dir == tmp_path / "cg" / JOBS_GROUP / "w-1-abc"
    assert not (tmp_path / "cg" / AGENT_LEAF).exists()


# ---------------------------------------------------------------------------- cgroup v1 layout


def test_cgroup1_writes_a_jobs_quota_limits_and_pids_in_each_hierarchy(
    tmp_path: Path, v1_kernel: FakeKernel
) -> None:
    """The worker's folder weighs 110 shares (nice 10); a job gets its quota and shares in cpu,
    its limit with the same memory+swap limit (no swap) in memory, pids.max in pids, and its
    process joins one cgroup.procs per hierarchy (cpu and cpuacct are one here)."""
    resources, _ = select("cgroup1", v1_host(tmp_path), pids_max=64)
    assert isinstance(resources, Cgroup1Resources)
    confined = resources.confine("7-3", JobLimits(cpu_millis=500, memory_mb=64))
    cpu = tmp_path / "v1" / "cpu,cpuacct" / "agent" / "stockade-w-1-abc"
    memory = tmp_path / "v1" / "memory" / "agent" / "stockade-w-1-abc" / "7-3"
    pids = tmp_path / "v1" / "pids" / "agent" / "stockade-w-1-abc" / "7-3"
    assert (cpu / "cpu.shares").read_text() == "110"
    assert [
        (cpu / "7-3" / f).read_text() for f in ("cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.shares")
    ] == [
        "100000",
        "50000",
        "512",
    ]
    limit = str(64 * 2**20)
    assert [(memory / f).read_text() for f in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")] == [
        limit,
        limit,
    ]
    assert (pids / "pids.max").read_text() == "64"
    assert confined.confinement.cgroup_procs == tuple(
        str(p / "cgroup.procs") for p in (cpu / "7-3", memory, pids)
    )


def test_cgroup1_reads_cpuacct_usage_throttling_and_oom_kills(tmp_path: Path, v1_kernel: FakeKernel) -> None:
    """cpuacct.usage (ns), cpu.stat's nr_throttled and memory.oom_control's oom_kill."""
    resources, _ = select("cgroup1", v1_host(tmp_path))
    assert isinstance(resources, Cgroup1Resources)
    confined = resources.confine("7-3", JobLimits(cpu_millis=500, memory_mb=64))
    cpu = tmp_path / "v1" / "cpu,cpuacct" / "agent" / "stockade-w-1-abc" / "7-3"
    (cpu / "cpuacct.usage").write_text("2500000000\n")
    (cpu / "cpu.stat").write_text("nr_periods 20\nnr_throttled 19\nthrottled_time 5\n")
    (tmp_path / "v1" / "memory" / "agent" / "stockade-w-1-abc" / "7-3" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
    )
    assert confined.usage() == JobUsage(cpu_s=2.5, throttled_periods=19, oom_kills=1)


# ---------------------------------------------------------------------------- the outcome


def _result(state: JobState, **changes: object) -> JobResult:
    fields: dict[str, object] = {
        "state": state,
        "stopped": False,
        "exit_code": -9,
        "began_at": 1.0,
        "ended_at": 2.0,
        "detail": "killed by signal SIGKILL",
    }
    fields.update(changes)
    return JobResult(**fields)  # type: ignore[arg-type]


LIMITS = JobLimits(cpu_millis=500, memory_mb=64)


def test_a_job_the_oom_killer_hit_ends_failed_with_the_oom_killed_reason() -> None:
    """OOM kills in its cgroup: failed, the detail starting with oom_killed and naming its memory."""
    result = oom_killed(_result(JobState.FAILED), 1, LIMITS)
    assert result.state is JobState.FAILED
    assert result.detail == (
        "oom_killed: the kernel killed it: it used more than its memory_mb of 64 (no swap) "
        "(killed by signal SIGKILL)"
    )


def test_a_job_that_exited_zero_after_an_oom_kill_of_one_of_its_processes_fails_too() -> None:
    """As for a container, an OOM kill fails the job whatever its exit code."""
    assert oom_killed(_result(JobState.SUCCEEDED, exit_code=0), 1, LIMITS).state is JobState.FAILED


@pytest.mark.parametrize(
    "changes",
    [
        {"state": JobState.CANCELLED, "stopped": True},
        {"state": JobState.CANCELLED, "stopped": True, "fenced": True},
        {"state": JobState.FAILED, "detail": "timeout: ran past its timeout_s of 1 s and was stopped"},
        {"state": JobState.FAILED, "started": False},
    ],
)
def test_a_stopped_fenced_timed_out_or_unstarted_job_keeps_its_end_despite_oom_kills(changes: dict) -> None:
    """Only a job that ended on its own is told as OOM-killed."""
    result = _result(**changes)
    assert oom_killed(result, 1, LIMITS) == result


def test_no_oom_kill_changes_nothing() -> None:
    """A job with no OOM kill keeps its result."""
    result = _result(JobState.FAILED, exit_code=3, detail="exit code 3")
    assert oom_killed(result, 0, LIMITS) == result


# ---------------------------------------------------------------------------- the reaper's field


def test_the_reaper_gets_the_cgroups_and_the_rlimit_in_one_field_it_reads_back() -> None:
    """reaper_argv puts the cgroup.procs files, RLIMIT_AS and the OOM score before the '--' and
    the reaper's parser gives them back."""
    argv = reaper.reaper_argv(
        "python",
        parent_pid=1,
        stop_grace_s=0.5,
        fence_deadline_path=None,
        argv=("true",),
        cgroup_procs=("/a b/cgroup.procs", "/c:d/cgroup.procs"),
        address_space_bytes=123,
        clone_into="/a b",
        oom_score_adj=1000,
    )
    field = argv[argv.index("--") - 1]
    assert reaper._parse_confine(field) == (("/a b/cgroup.procs", "/c:d/cgroup.procs"), 123, "/a b", 1000)
    assert reaper._parse_confine("") == ((), None, None, None)


def test_a_cgroup_path_with_a_newline_is_refused() -> None:
    """The field is one line per item: a path with a newline could not be told apart."""
    with pytest.raises(ValueError, match="newline"):
        reaper.reaper_argv(
            "python",
            parent_pid=1,
            stop_grace_s=0.5,
            fence_deadline_path=None,
            argv=("x",),
            cgroup_procs=("/a\n/b",),
        )


# ---------------------------------------------------------------------------- settings


def _settings(**changes: Any) -> AgentSettings:
    return AgentSettings(
        worker_id="w-1",
        control_planes=["127.0.0.1:1"],
        cpu_millis=1000,
        memory_mb=1000,
        work_dir="/w",
        **changes,
    )


def test_the_defaults_are_auto_and_4096_processes_per_job() -> None:
    """job_resources auto, job_pids_max 4096."""
    settings = _settings()
    assert (settings.job_resources, settings.job_pids_max) == ("auto", 4096)


@pytest.mark.parametrize("value", [0, -1, 4_194_305, True, 2.5])
def test_a_pids_limit_out_of_range_is_refused_naming_the_field_the_range_and_the_value(value: object) -> None:
    """job_pids_max must be an integer in 1..4194304."""
    with pytest.raises(InvalidArgument) as raised:
        _settings(job_pids_max=value)
    assert str(raised.value) == f"job_pids_max must be an integer between 1 and 4194304, got {value!r}"


def test_an_unknown_resources_mode_is_refused_listing_the_choices() -> None:
    """job_resources must be auto, cgroup2, cgroup1 or rlimit."""
    with pytest.raises(InvalidArgument) as raised:
        _settings(job_resources="cgroup3")
    assert str(raised.value) == "job_resources must be one of auto, cgroup2, cgroup1, rlimit, got 'cgroup3'"


def test_the_settings_choices_are_the_modes_and_auto() -> None:
    """Every mode can be asked for by name, and nothing else but auto."""
    assert set(JOB_RESOURCES_CHOICES) == {AUTO, *(m.value for m in Mode)}

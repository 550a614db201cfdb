"""What a job can see of its worker's work folder, with a real agent process (root, a uid per
job): it cannot list the work folder or ``jobs/``, nor read the agent's files or another job's
record, on a new work folder and on one an earlier agent left with looser modes; its own folder
stays reachable (docs/tenancy.md, "What a job can see")."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from test_agent_restart import assign, host, wait_for

from protocol import pb

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="command jobs need Linux"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per job needs a root agent"),
]

PROBE = textwrap.dedent("""
    import json, os, sys
    work_dir = sys.argv[1]
    tries = {
        "list_work_dir": lambda: os.listdir(work_dir),
        "list_jobs": lambda: os.listdir(work_dir + "/jobs"),
        "read_agent_jsonl": lambda: open(work_dir + "/agent.jsonl").read(),
        "read_agent_lock": lambda: open(work_dir + "/agent.lock").read(),
        "read_uid_block": lambda: open(work_dir + "/uid-block").read(),
        "read_fence_deadline": lambda: open(work_dir + "/fence_deadline").read(),
        "list_sleep_job": lambda: os.listdir(work_dir + "/jobs/20-2"),
        "read_sleep_job_record": lambda: open(work_dir + "/jobs/20-2/job.record").read(),
        "list_old_job": lambda: os.listdir(work_dir + "/jobs/990-99"),
        "read_old_job_record": lambda: open(work_dir + "/jobs/990-99/job.record").read(),
    }
    got = {}
    for name, attempt in tries.items():
        try:
            attempt()
            got[name] = "succeeded"
        except OSError as exc:
            got[name] = exc.errno
    with open("tries.json", "w") as out:  # its own work/: reachable
        json.dump(got, out)
""")


def _left_open_by_an_earlier_agent(work_dir: Path) -> None:
    """A work folder as an agent before these modes left it: folders 0755, files 0644, an
    ended job's folder with its record."""
    old_job = work_dir / "jobs" / "990-99"
    old_job.mkdir(parents=True)
    for folder in (work_dir, work_dir / "jobs", old_job):
        folder.chmod(0o755)
    (work_dir / "agent.jsonl").write_text('{"event": "start", "job_id": 990, "assignment_id": 99}\n')
    (old_job / "job.record").write_text('{"job_id": 990}\n')
    for path in (work_dir / "agent.jsonl", old_job / "job.record"):
        path.chmod(0o644)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("work_folder", ["new", "left-open"])
async def test_a_job_sees_nothing_of_its_worker_but_its_own_folder(tmp_path: Path, work_folder: str) -> None:
    """Beside a running sleep job, a command job (a uid of its own) cannot list the work folder,
    its jobs/ or the other jobs' folders, nor read agent.jsonl, agent.lock, uid-block,
    fence_deadline or any job.record (EACCES each); it still writes in its own work/. The work
    folder and jobs/ are 0711, the agent's files 0600, also where an earlier agent left them
    0755 and 0644."""
    async with host(tmp_path) as worker:
        if work_folder == "left-open":
            _left_open_by_an_earlier_agent(worker.work_dir)
        await worker.start()
        await assign(
            worker, (2, pb.JobSpec(cpu_millis=100, memory_mb=10, sleep=pb.SleepRuntime(duration_ms=600_000)))
        )
        await wait_for(lambda: (worker.work_dir / "jobs" / "20-2" / "job.record").exists())
        probe = pb.CommandRuntime(argv=[sys.executable, "-I", "-c", PROBE, str(worker.work_dir)])
        await assign(worker, (1, pb.JobSpec(cpu_millis=100, memory_mb=10, command=probe)))
        await wait_for(lambda: any(r["event"] == "stop" and r["assignment_id"] == 1 for r in worker.stops()))
        out = worker.job_file(1, "work") / "tries.json"
        assert out.exists(), worker.job_file(1, "stderr.log").read_text()
        tried = json.loads(out.read_text())
        expected = {name: 13 for name in tried}
        if work_folder == "new":
            expected["list_old_job"] = expected["read_old_job_record"] = 2  # ENOENT: there is none
        assert tried == expected
        assert _mode(worker.work_dir) == _mode(worker.work_dir / "jobs") == 0o711
        for name in ("agent.jsonl", "agent.lock", "uid-block", "fence_deadline"):
            assert _mode(worker.work_dir / name) == 0o600, name
        assert _mode(worker.job_file(2, "job.record")) == 0o600
        assert _mode(worker.job_file(2, "")) & 0o077 == 0

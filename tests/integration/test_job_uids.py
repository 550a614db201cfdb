"""Each job in a uid of its own, with real processes on one worker: "the two-job attack" (job B
tries to read job A's files and output, signal it, and read its memory and environment) fails
every time, and a uid comes back to the pool with nothing of its job left."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from agent import uid_cleanup
from agent.identities import CLEANUP_THREADS, JobIdentities
from agent.job_results import JobResult
from agent.messages import JobState
from agent.runtimes import job_dir_for, run_job
from runtime.jobs import CommandRuntime
from runtime.os_users import RunAs
from runtime.settings.agent import AgentSettings

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="command jobs need Linux"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per job needs a root agent"),
]

ROUNDS = 20

ATTACK = textwrap.dedent("""
    import ctypes, json, os, signal, sys
    a_dir, a_pid = sys.argv[1], int(sys.argv[2])
    libc = ctypes.CDLL(None, use_errno=True)

    def ptrace_attach():
        if libc.ptrace(16, a_pid, None, None) != 0:  # PTRACE_ATTACH
            raise OSError(ctypes.get_errno(), "ptrace")

    tries = {
        "read_secret": lambda: open(a_dir + "/work/secret.txt").read(),
        "list_work": lambda: os.listdir(a_dir + "/work"),
        "list_job_dir": lambda: os.listdir(a_dir),
        "read_stdout": lambda: open(a_dir + "/stdout.log").read(),
        "read_record": lambda: open(a_dir + "/job.record").read(),
        "read_root": lambda: open(f"/proc/{a_pid}/root/tmp/secret.txt").read(),
        "sigstop": lambda: os.kill(a_pid, signal.SIGSTOP),
        "sigkill": lambda: os.kill(a_pid, signal.SIGKILL),
        "environ": lambda: open(f"/proc/{a_pid}/environ", "rb").read(),
        "mem": lambda: open(f"/proc/{a_pid}/mem", "rb").read(1),
        "ptrace": ptrace_attach,
    }
    got = {}
    for name, attempt in tries.items():
        try:
            attempt()
            got[name] = "succeeded"
        except OSError as exc:
            got[name] = exc.errno
    print(json.dumps(got))
""")


def _settings(tmp_path: Path) -> AgentSettings:
    return AgentSettings(
        worker_id="w-ids",
        control_planes=["127.0.0.1:1"],
        cpu_millis=100,
        memory_mb=100,
        work_dir=str(tmp_path / "work"),
    )


@asynccontextmanager
async def _identities(tmp_path: Path) -> AsyncIterator[JobIdentities]:
    """A worker's pool of job uids, from a block claimed as the agent claims it; given up after."""
    ids = JobIdentities.claim(_settings(tmp_path), logger=None)
    try:
        yield ids
    finally:
        ids.close()


def _words(path: Path) -> list[str]:
    """The words of file ``path`` (none while it is missing)."""
    return path.read_text().split() if path.exists() else []


def _left(path: str) -> bool:
    """Whether anything (a symlink included) is at ``path``."""
    return os.path.lexists(path)


def _state(pid: int) -> str:
    """The state letter of process ``pid`` (``T``: stopped), ``-`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "-"


async def _attack(a_dir: Path, a_pid: int, b_dir: Path, b_as: RunAs) -> None:
    """Run job B (:data:`ATTACK`, as ``b_as``, in ``b_dir``) against job A (its folder
    ``a_dir``, its process ``a_pid``): every try must fail by the kernel's refusal (EACCES for
    files, EPERM for signals and ptrace), and A must still run, not stopped."""
    b = await run_job(
        CommandRuntime(argv=(sys.executable, "-I", "-c", ATTACK, str(a_dir), str(a_pid))),
        job_dir=b_dir,
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_as=b_as,
    )
    assert b.state is JobState.SUCCEEDED, (b, (b_dir / "stderr.log").read_text())
    tried = json.loads((b_dir / "stdout.log").read_text())
    assert all(v != "succeeded" for v in tried.values()), tried
    assert set(tried.values()) <= {13, 1}, tried
    assert _state(a_pid) in {"S", "R"}


async def _attack_once(ids: JobIdentities, jobs_dir: Path, round_no: int) -> None:
    a_as, b_as = ids.run_as(), ids.run_as()
    assert a_as is not None and b_as is not None and a_as.uid != b_as.uid
    a_dir = job_dir_for(jobs_dir, 1, round_no * 2)
    b_dir = job_dir_for(jobs_dir, 2, round_no * 2 + 1)
    secret = f"secret-{round_no}"
    a_stop = trio.Event()
    a_result: list[JobResult] = []

    async def run_a() -> None:
        a_result.append(
            await run_job(
                CommandRuntime(
                    argv=("sh", "-c", f"echo {secret} > secret.txt; echo $$; echo {secret}; exec sleep 600")
                ),
                job_dir=a_dir,
                stop=a_stop,
                stop_grace_s=1.0,
                run_as=a_as,
                job_env={"A_SECRET": secret},
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_a)
        with trio.fail_after(30):
            while len(_words(a_dir / "stdout.log")) < 2:  # noqa: ASYNC110 (a file)
                await trio.sleep(0.02)
        a_pid = int(_words(a_dir / "stdout.log")[0])
        await _attack(a_dir, a_pid, b_dir, b_as)
        # A is unharmed: its file intact, and it ends only when told to.
        assert (a_dir / "work" / "secret.txt").read_text() == f"{secret}\n"
        a_stop.set()
    assert a_result[0].stopped and a_result[0].state is not JobState.FAILED
    for uid, folder in ((a_as.uid, a_dir), (b_as.uid, b_dir)):
        assert await ids.release(uid, folder)


async def test_the_two_job_attack_fails_every_time(tmp_path: Path) -> None:
    """Twenty times on one worker: job B (its own uid) cannot read job A's work/secret.txt
    (nor through /proc/<pid>/root), list A's folders, read A's stdout.log or record, SIGSTOP or
    SIGKILL A's process, read its /proc environ or mem, or ptrace it; A runs on unharmed until it
    is stopped."""
    jobs_dir = tmp_path / "jobs"
    async with _identities(tmp_path) as ids:
        for round_no in range(ROUNDS):
            await _attack_once(ids, jobs_dir, round_no)


async def test_a_jobs_folder_and_output_are_its_uids_alone(tmp_path: Path) -> None:
    """A running job's work/ is its uid's, mode 0700; its folder is the agent's with the job's
    gid, mode 0710; its stdout.log and stderr.log are the agent's, mode 0600. Once its uid is
    given back, everything in the folder is the agent's again."""
    async with _identities(tmp_path) as ids:
        run_as = ids.run_as()
        assert run_as is not None
        job_dir = tmp_path / "jobs" / "3-30"
        result = await run_job(
            CommandRuntime(argv=("sh", "-c", "id -u; id -G; echo x > mine.txt; ln -s /etc/shadow link")),
            job_dir=job_dir,
            stop=trio.Event(),
            stop_grace_s=1.0,
            run_as=run_as,
        )
        assert result.state is JobState.SUCCEEDED, (job_dir / "stderr.log").read_text()
        assert (job_dir / "stdout.log").read_text().split() == [str(run_as.uid), str(run_as.uid)]
        work = os.stat(job_dir / "work")
        assert (work.st_uid, work.st_mode & 0o7777) == (run_as.uid, 0o700)
        folder = os.stat(job_dir)
        assert (folder.st_uid, folder.st_gid, folder.st_mode & 0o7777) == (0, run_as.gid, 0o710)
        for name in ("stdout.log", "stderr.log"):
            out = os.stat(job_dir / name)
            assert (out.st_uid, out.st_mode & 0o7777) == (0, 0o600)
        assert await ids.release(run_as.uid, job_dir)
        for path in (job_dir, job_dir / "work", job_dir / "work" / "mine.txt"):
            assert (os.lstat(path).st_uid, os.lstat(path).st_gid) == (0, 0), path
        assert os.lstat(job_dir / "work" / "link").st_uid == 0
        assert os.stat("/etc/shadow").st_uid == 0  # the link was changed, not what it names


async def test_a_uid_comes_back_only_without_what_its_job_left(tmp_path: Path) -> None:
    """A job that leaves a file and a folder in /tmp, a file in /dev/shm and a SysV
    shared-memory segment, and a process of its uid that no reaper watches (as one a root
    helper started for it would be): when its uid is given back, none of them is left."""
    async with _identities(tmp_path) as ids:
        run_as = ids.run_as()
        assert run_as is not None
        uid = run_as.uid
        tag = f"stockade-test-{os.getpid()}-{uid}"
        script = textwrap.dedent(f"""
            import ctypes, os
            open("/tmp/{tag}", "w").write("left")
            os.mkdir("/tmp/{tag}.d"); open("/tmp/{tag}.d/inner", "w").write("left")
            open("/dev/shm/{tag}", "w").write("left")
            libc = ctypes.CDLL(None)
            assert libc.shmget(0, 4096, 0o1600) >= 0  # IPC_PRIVATE, IPC_CREAT | 0600
        """)
        result = await run_job(
            CommandRuntime(argv=(sys.executable, "-I", "-c", script)),
            job_dir=tmp_path / "jobs" / "4-40",
            stop=trio.Event(),
            stop_grace_s=1.0,
            run_as=run_as,
        )
        assert result.state is JobState.SUCCEEDED, (tmp_path / "jobs" / "4-40" / "stderr.log").read_text()
        stray = await trio.lowlevel.open_process(
            ["sleep", "600"], user=uid, group=uid, extra_groups=[], start_new_session=True
        )
        assert uid_cleanup.processes_of({uid}) == {stray.pid: uid}
        assert uid_cleanup.ipc_objects({uid})
        assert await ids.release(uid, tmp_path / "jobs" / "4-40")
        assert not uid_cleanup.processes_of({uid})
        assert await stray.wait() == -signal.SIGKILL
        assert not uid_cleanup.ipc_objects({uid})
        for path in (Path(f"/tmp/{tag}"), Path(f"/tmp/{tag}.d"), Path(f"/dev/shm/{tag}")):
            assert not path.exists() and not path.is_symlink(), path
        assert uid not in ids.pool.held and uid not in ids.pool.quarantined


async def test_uids_released_together_are_cleaned_up_in_one_walk_of_the_temp_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight jobs, each leaving a file in /tmp, whose uids are released at once: each file is
    gone and each uid given back, after fewer walks of /tmp than uids (one per batch of uids
    that waited for a clean-up thread together, not one per uid)."""
    walks: list[str] = []
    owned_under = uid_cleanup._owned_under

    def counted(root: str, uids: set[int]) -> list[tuple[str, int]]:
        walks.append(root)
        return owned_under(root, uids)

    monkeypatch.setattr(uid_cleanup, "_owned_under", counted)
    async with _identities(tmp_path) as ids:
        runs = [(run_as, tmp_path / "jobs" / f"{n}-{n}") for n in range(8) if (run_as := ids.run_as())]
        tag = f"stockade-test-{os.getpid()}-batch"

        async def run(run_as: RunAs, job_dir: Path) -> None:
            result = await run_job(
                CommandRuntime(argv=("sh", "-c", f"echo left > /tmp/{tag}-{run_as.uid}")),
                job_dir=job_dir,
                stop=trio.Event(),
                stop_grace_s=1.0,
                run_as=run_as,
            )
            assert result.state is JobState.SUCCEEDED, (job_dir / "stderr.log").read_text()

        async with trio.open_nursery() as nursery:
            for run_as, job_dir in runs:
                nursery.start_soon(run, run_as, job_dir)
        given: list[bool] = []

        async def release(uid: int, job_dir: Path) -> None:
            given.append(await ids.release(uid, job_dir))

        async with trio.open_nursery() as nursery:
            for run_as, job_dir in runs:
                nursery.start_soon(release, run_as.uid, job_dir)
        assert given == [True] * 8
        for run_as, _ in runs:
            assert not _left(f"/tmp/{tag}-{run_as.uid}")
            assert run_as.uid not in ids.pool.held and run_as.uid not in ids.pool.quarantined
    assert 1 <= walks.count("/tmp") <= CLEANUP_THREADS + 1 < 8, walks


async def test_a_setuid_file_a_job_left_gives_a_later_job_nothing(tmp_path: Path) -> None:
    """Job A leaves a setuid and setgid copy of ``id`` where every job may reach it (a folder
    the clean-up does not search, as /run/lock is); job B of another uid runs it: with
    no_new_privs set on every job, the copy runs with B's ids, not A's."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    for folder in (tmp_path, *tmp_path.parents):
        folder.chmod(folder.stat().st_mode | 0o011)
    async with _identities(tmp_path) as ids:
        a_as, b_as = ids.run_as(), ids.run_as()
        assert a_as is not None and b_as is not None
        planted = shared / "id"
        a = await run_job(
            CommandRuntime(argv=("sh", "-c", f"cp /usr/bin/id {planted} && chmod 6755 {planted}")),
            job_dir=tmp_path / "jobs" / "5-50",
            stop=trio.Event(),
            stop_grace_s=1.0,
            run_as=a_as,
        )
        assert a.state is JobState.SUCCEEDED, (tmp_path / "jobs" / "5-50" / "stderr.log").read_text()
        assert os.stat(planted).st_mode & 0o6000 == 0o6000
        b = await run_job(
            CommandRuntime(
                argv=("sh", "-c", f"{planted} -u; {planted} -g; grep NoNewPrivs /proc/self/status")
            ),
            job_dir=tmp_path / "jobs" / "6-60",
            stop=trio.Event(),
            stop_grace_s=1.0,
            run_as=b_as,
        )
        assert b.state is JobState.SUCCEEDED, (tmp_path / "jobs" / "6-60" / "stderr.log").read_text()
        out = (tmp_path / "jobs" / "6-60" / "stdout.log").read_text().split()
        assert out == [str(b_as.uid), str(b_as.gid), "NoNewPrivs:", "1"]


async def test_a_tree_deeper_than_pythons_recursion_is_cleaned_up(tmp_path: Path) -> None:
    """A job leaves a folder 1,500 levels deep in /tmp and another in its work folder: its
    uid's clean-up removes the first and gives the second back to the agent, whole, and the
    uid is given out again (no recursion: the walks are iterative)."""
    async with _identities(tmp_path) as ids:
        run_as = ids.run_as()
        assert run_as is not None
        top = f"/tmp/stockade-test-deep-{os.getpid()}-{run_as.uid}"
        script = textwrap.dedent(f"""
            import os
            for start in ({top!r}, "deep"):
                os.mkdir(start); os.chdir(start)
                for _ in range(1500):
                    os.mkdir("a"); os.chdir("a")
                open("leaf", "w").write("x")
                os.chdir(os.environ["HOME"])
        """)
        job_dir = tmp_path / "jobs" / "7-70"
        result = await run_job(
            CommandRuntime(argv=(sys.executable, "-I", "-c", script)),
            job_dir=job_dir,
            stop=trio.Event(),
            stop_grace_s=1.0,
            run_as=run_as,
        )
        assert result.state is JobState.SUCCEEDED, (job_dir / "stderr.log").read_text()
        assert await ids.release(run_as.uid, job_dir)
        assert top not in {path for path, _ in uid_cleanup._entries("/tmp")}
        owners = {info.st_uid for _, info in uid_cleanup._tree(str(job_dir / "work" / "deep"))}
        assert owners == {0}
        assert run_as.uid not in ids.pool.quarantined
        uid_cleanup._remove_tree(str(job_dir / "work" / "deep"))  # too deep for the test's own walks


async def test_a_restarted_agent_keeps_each_running_jobs_uid(tmp_path: Path) -> None:
    """A root agent runs two jobs as two uids of the block it recorded in its work folder, each
    uid in the job's record; killed and started again, the agent claims the same block, keeps
    both jobs with their uids, and gives a new job a uid neither holds. Once the jobs end,
    their folders are the agent's again."""
    from jobfiles import job_writable
    from test_agent_restart import assign, host, wait_for

    from agent import job_record
    from agent.identities import BLOCK_RECORD
    from protocol import pb

    gate = job_writable(tmp_path) / "gate"
    argv = ["sh", "-c", f"id -u; while [ ! -e {gate} ]; do sleep 0.05; done"]
    spec = pb.JobSpec(cpu_millis=10, memory_mb=10, command=pb.CommandRuntime(argv=argv))
    async with host(tmp_path) as worker:

        def uid_of(assignment_id: int) -> int | None:
            words = _words(worker.job_file(assignment_id, "stdout.log"))
            return int(words[0]) if words else None

        await worker.start()
        block = (worker.work_dir / BLOCK_RECORD).read_text()
        first, last = (int(v) for v in block.split("-"))
        await assign(worker, (1, spec), (2, spec))
        await wait_for(lambda: uid_of(1) is not None and uid_of(2) is not None)
        uids = {uid_of(1), uid_of(2)}
        assert len(uids) == 2 and all(u is not None and first <= u <= last for u in uids)
        for a in (1, 2):
            record = job_record.read_record(worker.job_file(a, "x").parent)
            assert record is not None and record.job_uid == uid_of(a)
        await worker.kill()
        await worker.start()
        assert (worker.work_dir / BLOCK_RECORD).read_text() == block
        await assign(worker, (3, spec))
        await wait_for(lambda: uid_of(3) is not None)
        assert uid_of(3) not in uids and first <= (uid_of(3) or 0) <= last
        gate.touch()
        await wait_for(lambda: len(worker.stops()) == 3)
        for a in (1, 2, 3):
            work = worker.job_file(a, "work")
            await wait_for(lambda work=work: work.stat().st_uid == 0)
        assert {s["reason"] for s in worker.stops()} == {"succeeded"}


CONTAINER_ROUNDS = 20


def _container_pid(name: str) -> int:
    """The host pid of container ``name``'s first process (0: not running)."""
    import docker

    client = docker.from_env(timeout=10)
    try:
        return int(client.containers.get(name).attrs["State"]["Pid"])
    finally:
        client.close()


async def _container_attack_once(
    ids: JobIdentities, image: str, worker_id: str, jobs_dir: Path, round_no: int
) -> None:
    from agent.container import container_name
    from agent.runtimes import ContainerJob
    from runtime.jobs import ContainerRuntime

    a_as, b_as = ids.run_as(), ids.run_as()
    assert a_as is not None and b_as is not None
    job = ContainerJob(
        worker_id=worker_id,
        job_id=round_no + 1,
        assignment_id=1000 + round_no,
        cpu_millis=200,
        memory_mb=128,
        user=f"{a_as.uid}:{a_as.gid}",
    )
    a_dir = job_dir_for(jobs_dir, job.job_id, job.assignment_id)
    b_dir = job_dir_for(jobs_dir, 0, round_no)
    program = (
        "import os, time; open('/tmp/secret.txt', 'w').write('secret');"
        "print(os.getuid(), os.getgid(), flush=True); time.sleep(600)"
    )
    a_stop = trio.Event()
    a_result: list[JobResult] = []

    async def run_a() -> None:
        a_result.append(
            await run_job(
                ContainerRuntime(image=image, argv=("python3", "-c", program)),
                job_dir=a_dir,
                stop=a_stop,
                stop_grace_s=1.0,
                container=job,
                job_env={"A_SECRET": "secret"},
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_a)
        with trio.fail_after(60):
            while len(_words(a_dir / "stdout.log")) < 2:  # noqa: ASYNC110 (a file)
                await trio.sleep(0.05)
        assert _words(a_dir / "stdout.log") == [str(a_as.uid), str(a_as.gid)]
        a_pid = _container_pid(container_name(job))
        assert os.stat(f"/proc/{a_pid}").st_uid == a_as.uid
        await _attack(a_dir, a_pid, b_dir, b_as)
        a_stop.set()
    assert a_result[0].stopped, a_result[0]
    for uid, folder in ((a_as.uid, a_dir), (b_as.uid, b_dir)):
        assert await ids.release(uid, folder)


async def test_the_two_job_attack_on_a_container_job_fails_every_time(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """Twenty times: container job A runs as a uid of its own (uid:gid, not root) and holds a
    secret; job B, a command with another uid, cannot list A's folder, read A's stdout.log or its
    files through /proc/<pid>/root, SIGSTOP or SIGKILL it, read its environ or mem, or ptrace
    it; A runs on unharmed."""
    async with _identities(tmp_path) as ids:
        for round_no in range(CONTAINER_ROUNDS):
            await _container_attack_once(ids, job_image, container_worker, tmp_path / "jobs", round_no)

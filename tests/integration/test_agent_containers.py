"""Container jobs run by the agent's runtime on a real Docker engine: output, exit codes, the
reasons a container ends (OOM, missing image, missing command), stops, the fence's pause, and
the leftovers of an earlier life. Every test skips, saying why, where no engine answers."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agent.container import container_labels, container_name, engine_label, remove_leftovers
from agent.deadman import FENCED_AT_FILE, write_fence_deadline
from agent.job_results import JobResult
from agent.messages import JobState
from agent.runtimes import ContainerJob, RunOptions, run_job
from agent.supervised import StopNotice
from runtime.jobs import ContainerRuntime

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="container jobs need Linux")

_ids = iter(range(1, 10**6))


def _job(worker_id: str, *, memory_mb: int = 256, cpu_millis: int = 500, user: str = "") -> ContainerJob:
    n = next(_ids)
    return ContainerJob(
        worker_id=worker_id,
        job_id=n,
        assignment_id=1000 + n,
        cpu_millis=cpu_millis,
        memory_mb=memory_mb,
        user=user,
    )


def _docker() -> Any:
    import docker

    return docker.from_env(timeout=10)


def _state(name: str) -> dict[str, Any] | None:
    """The container's ``State``, or None when there is no such container."""
    import docker.errors

    client = _docker()
    try:
        return dict(client.containers.get(name).attrs["State"])
    except docker.errors.NotFound:
        return None
    finally:
        client.close()


async def _wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` (an engine or file check: nothing to wait on) until it holds."""
    with trio.fail_after(timeout_s):
        while True:
            if predicate():
                return
            await trio.sleep(0.05)


def _read(path: str | Path) -> str:
    return Path(path).read_text()


async def _run(
    image: str,
    argv: tuple[str, ...],
    job: ContainerJob,
    tmp_path: Path,
    *,
    stop: trio.Event | None = None,
    fence_deadline_path: Path | None = None,
    run_options: RunOptions | None = None,
    notice: StopNotice | None = None,
) -> JobResult:
    return await run_job(
        ContainerRuntime(image=image, argv=argv),
        job_dir=tmp_path / f"{job.job_id}-{job.assignment_id}",
        stop=trio.Event() if stop is None else stop,
        stop_grace_s=1.0,
        fence_deadline_path=fence_deadline_path,
        job_env={"STOCKADE_JOB_ID": str(job.job_id), "STOCKADE_ASSIGNMENT_ID": str(job.assignment_id)},
        container=job,
        run_options=run_options,
        notice=notice,
    )


async def test_a_container_runs_in_its_workdir_and_ends_failed_at_its_timeout(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """A container job's workdir is its working directory inside the container; one running
    past its timeout_s is stopped by the agent and ends failed, reason timeout, removed."""
    job = attrs.evolve(_job(container_worker), workdir="/tmp/here")
    result = await _run(job_image, ("python3", "-c", "import os; print(os.getcwd())"), job, tmp_path)
    assert result.state is JobState.SUCCEEDED, result
    assert _read(result.stdout_path) == "/tmp/here\n"
    job = _job(container_worker)
    argv = ("python3", "-c", "import time; time.sleep(60)")
    result = await _run(job_image, argv, job, tmp_path, run_options=RunOptions(timeout_s=1.0))
    assert result.state is JobState.FAILED and not result.stopped, result
    assert result.detail.startswith("timeout:")
    assert _state(container_name(job)) is None


async def test_a_container_job_succeeds_and_its_output_lands_in_the_job_folder(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """Exit 0 succeeds; stdout and stderr land in stdout.log and stderr.log; the container is removed."""
    job = _job(container_worker)
    program = "import os, sys; print('hi', os.environ['STOCKADE_JOB_ID']); print('oops', file=sys.stderr)"
    result = await _run(job_image, ("python3", "-c", program), job, tmp_path)
    assert result.state is JobState.SUCCEEDED and result.exit_code == 0, result
    assert _read(result.stdout_path) == f"hi {job.job_id}\n"
    assert _read(result.stderr_path) == "oops\n"
    assert _state(container_name(job)) is None


async def test_a_container_runs_as_the_job_user_without_capabilities(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """The container's processes run as the agent's job user (uid:gid) with no capabilities."""
    program = (
        "import os\n"
        "print(os.getuid(), os.getgid())\n"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])"
    )
    job = _job(container_worker, user="4242:4343")
    result = await _run(job_image, ("python3", "-c", program), job, tmp_path)
    assert result.state is JobState.SUCCEEDED, result
    assert _read(result.stdout_path).split() == ["4242", "4343", "0000000000000000"]


async def test_a_container_without_argv_runs_its_image_command(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """No argv: the image's own command runs."""
    result = await _run(job_image, (), _job(container_worker), tmp_path)
    assert result.state is JobState.SUCCEEDED
    assert _read(result.stdout_path) == "the image command\n"


async def test_a_non_zero_exit_code_fails_the_job(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """The container's exit code is the job's; not 0 is failed."""
    argv = ("python3", "-c", "raise SystemExit(3)")
    result = await _run(job_image, argv, _job(container_worker), tmp_path)
    assert result.state is JobState.FAILED and result.exit_code == 3
    assert result.detail == "exit code 3"


async def test_a_container_past_its_memory_is_oom_killed(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """A job that allocates more than its memory_mb (no swap) fails with reason oom_killed."""
    job = _job(container_worker, memory_mb=64)
    program = "b = bytearray(200 * 2**20); print(len(b))"
    result = await _run(job_image, ("python3", "-c", program), job, tmp_path)
    assert result.state is JobState.FAILED
    assert result.detail.startswith("oom_killed: "), result.detail
    assert "64" in result.detail


async def test_a_missing_image_fails_at_once(container_worker: str, tmp_path: Path) -> None:
    """An image the worker does not hold fails at once with image_not_found (nothing is pulled)."""
    from container_images import engine_error

    reason = engine_error()
    if reason is not None:
        pytest.skip(reason)
    began = time.monotonic()
    result = await _run("stockade-no-such-image:0", ("true",), _job(container_worker), tmp_path)
    assert result.state is JobState.FAILED and not result.started
    assert result.detail.startswith("image_not_found: "), result.detail
    assert time.monotonic() - began < 10


async def test_a_command_missing_from_the_image_says_so(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """A command the image does not have fails with reason command_not_found naming it."""
    result = await _run(job_image, ("no-such-command-xyz", "a"), _job(container_worker), tmp_path)
    assert result.state is JobState.FAILED
    assert result.detail.startswith("command_not_found: "), result.detail
    assert "no-such-command-xyz" in result.detail


async def test_a_stop_stops_the_container(job_image: str, container_worker: str, tmp_path: Path) -> None:
    """The stop event (a cancel) stops the running container: the job is cancelled, the
    container gone."""
    job = _job(container_worker)
    stop = trio.Event()
    results: list[JobResult] = []

    async def run() -> None:
        results.append(await _run(job_image, ("sleep", "60"), job, tmp_path, stop=stop))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await _wait_for(lambda: (_state(container_name(job)) or {}).get("Running") is True)
        began = time.monotonic()
        stop.set()
    assert time.monotonic() - began < 10
    (result,) = results
    assert result.state is JobState.CANCELLED and result.stopped
    assert _state(container_name(job)) is None


_TRAPS_SIGTERM = (
    "import signal, sys, time\n"
    "def term(*_):\n"
    "    print('term', flush=True)\n"
    "    {on_term}\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


@pytest.mark.parametrize(("on_term", "exit_code"), [("sys.exit(0)", 0), ("pass", 137)])
async def test_a_stop_with_its_own_grace_terms_the_container_then_kills_it(
    job_image: str, container_worker: str, tmp_path: Path, on_term: str, exit_code: int
) -> None:
    """A stop with a grace of its own (a preemption's) sends the container SIGTERM at once: one
    that exits on it ends stopped with its exit code 0; one that runs on is killed after the
    grace (137). Either way the job is cancelled, not failed, and the container gone."""
    job = _job(container_worker)
    notice = StopNotice()
    results: list[JobResult] = []
    stdout = tmp_path / f"{job.job_id}-{job.assignment_id}" / "stdout.log"
    program = _TRAPS_SIGTERM.format(on_term=on_term)

    async def run() -> None:
        results.append(await _run(job_image, ("python3", "-c", program), job, tmp_path, notice=notice))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await _wait_for(lambda: stdout.exists() and "up" in _read(stdout))
            notice.give(2.0)
    (result,) = results
    assert result.state is JobState.CANCELLED and result.stopped
    assert result.exit_code == exit_code
    assert _read(stdout).split() == ["up", "term"]
    assert _state(container_name(job)) is None


async def test_the_fence_deadline_pauses_the_container_and_a_new_deadline_resumes_it(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """Past the pause deadline the supervisor pauses the container (State.Paused) and records
    the time; a deadline moved on unpauses it, and the job then ends on its own."""
    deadline = tmp_path / "fence_deadline"
    write_fence_deadline(deadline, time.monotonic() + 600, time.monotonic() + 1200)
    job = _job(container_worker)
    job_dir = tmp_path / f"{job.job_id}-{job.assignment_id}"
    program = "import time\nfor i in range(40):\n    print(i, flush=True)\n    time.sleep(0.1)"
    results: list[JobResult] = []

    async def run() -> None:
        argv = ("python3", "-c", program)
        results.append(await _run(job_image, argv, job, tmp_path, fence_deadline_path=deadline))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await _wait_for(lambda: (_state(container_name(job)) or {}).get("Running") is True)
        write_fence_deadline(deadline, time.monotonic() - 1, time.monotonic() + 600)
        await _wait_for(lambda: (_state(container_name(job)) or {}).get("Paused") is True)
        await _wait_for((job_dir / FENCED_AT_FILE).exists)  # written once the pause is made
        await trio.sleep(0.5)  # output written before the pause may still be on its way
        held = (job_dir / "stdout.log").read_text()
        await trio.sleep(1.0)
        assert (job_dir / "stdout.log").read_text() == held  # no work while paused
        write_fence_deadline(deadline, time.monotonic() + 600, time.monotonic() + 1200)
        await _wait_for(lambda: (_state(container_name(job)) or {}).get("Paused") is False)
        assert not (job_dir / FENCED_AT_FILE).exists()
    (result,) = results
    assert result.state is JobState.SUCCEEDED, result
    assert _read(result.stdout_path).split() == [str(i) for i in range(40)]


async def test_the_kill_deadline_kills_a_paused_container(
    job_image: str, container_worker: str, tmp_path: Path
) -> None:
    """Past the kill deadline the paused container is killed: the job counts as fenced, ended
    when it was paused."""
    deadline = tmp_path / "fence_deadline"
    write_fence_deadline(deadline, time.monotonic() + 600, time.monotonic() + 1200)
    job = _job(container_worker)
    results: list[JobResult] = []

    async def run() -> None:
        results.append(await _run(job_image, ("sleep", "60"), job, tmp_path, fence_deadline_path=deadline))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await _wait_for(lambda: (_state(container_name(job)) or {}).get("Running") is True)
        write_fence_deadline(deadline, time.monotonic() - 1, time.monotonic() + 1)
    (result,) = results
    assert result.fenced and result.stopped and result.state is JobState.CANCELLED
    assert _state(container_name(job)) is None


def test_leftover_containers_of_this_worker_are_removed(job_image: str, container_worker: str) -> None:
    """At start the containers labelled with this worker's id and owner are removed (force);
    another worker's, and the same worker id's of another cluster (another owner), are kept."""
    client = _docker()
    try:
        job = attrs.evolve(_job(container_worker), owner="mine")
        left = client.containers.run(
            job_image, ["sleep", "60"], name=container_name(job), labels=container_labels(job), detach=True
        )
        others = [
            attrs.evolve(_job(container_worker + "-other"), owner="mine"),
            attrs.evolve(_job(container_worker), owner="theirs"),
        ]
        kept = [
            client.containers.create(
                job_image, ["true"], name=container_name(other), labels=container_labels(other)
            )
            for other in others
        ]
        try:
            assert remove_leftovers(container_worker, "mine") == [container_name(job)]
            assert _state(left.name) is None
            assert all(_state(container.name) is not None for container in kept)
        finally:
            for container in kept:
                container.remove(force=True)
    finally:
        client.close()


def test_a_worker_with_an_engine_is_labelled_container_docker() -> None:
    """The engine answers: docker; the operator's container=none is kept; no engine: none, saying why."""
    from container_images import engine_error

    reason = engine_error()
    if reason is not None:
        pytest.skip(reason)
    assert engine_label({}) == ("docker", "")
    assert engine_label({"container": "none"})[0] == "none"


def test_a_worker_without_an_engine_is_labelled_container_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine answers at DOCKER_HOST: the label is none and the reason names the failure."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    value, why = engine_label({}, timeout_s=0.5)
    assert value == "none" and "no Docker engine answered" in why


async def test_an_engine_that_disappears_ends_the_job_with_no_container_engine(
    job_image: str, container_worker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine stops answering while the container runs: the supervisor kills the
    container's processes itself and the job fails with no_container_engine, not left running."""
    from container_images import EngineProxy

    proxy = EngineProxy(str(tmp_path / "engine.sock"))
    monkeypatch.setenv("DOCKER_HOST", proxy.url)
    job = _job(container_worker)
    results: list[JobResult] = []

    async def run() -> None:
        results.append(await _run(job_image, ("sleep", "60"), job, tmp_path))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await _wait_for(lambda: (_state(container_name(job)) or {}).get("Running") is True)
        began = time.monotonic()
        proxy.cut()
    monkeypatch.undo()  # the engine itself, for the checks and the cleanup
    (result,) = results
    assert time.monotonic() - began < 15
    assert result.state is JobState.FAILED and result.exit_code is None
    assert result.detail.startswith("no_container_engine: "), result.detail
    # Killed by the supervisor without the engine: the engine (still there, only cut off from the supervisor)
    # sees it exit, and it is not running.
    await _wait_for(lambda: (_state(container_name(job)) or {}).get("Running") is not True)
    assert "killed the container's processes" in _read(result.stderr_path)


async def test_an_engine_that_disappears_while_the_container_is_paused_still_ends_it(
    job_image: str, container_worker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused at the fence deadline, then the engine goes: the supervisor kills the frozen
    processes and thaws them so the kill takes effect; the job stays a fence stop (paused
    first), its detail naming no_container_engine."""
    from container_images import EngineProxy

    proxy = EngineProxy(str(tmp_path / "engine.sock"))
    monkeypatch.setenv("DOCKER_HOST", proxy.url)
    deadline = tmp_path / "fence_deadline"
    write_fence_deadline(deadline, time.monotonic() + 600, time.monotonic() + 1200)
    job = _job(container_worker)
    results: list[JobResult] = []

    async def run() -> None:
        results.append(await _run(job_image, ("sleep", "60"), job, tmp_path, fence_deadline_path=deadline))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await _wait_for(lambda: (_state(container_name(job)) or {}).get("Running") is True)
        write_fence_deadline(deadline, time.monotonic() - 1, time.monotonic() + 600)
        await _wait_for(lambda: (_state(container_name(job)) or {}).get("Paused") is True)
        proxy.cut()
    monkeypatch.undo()
    (result,) = results
    assert result.fenced and result.state is JobState.CANCELLED
    assert "no_container_engine: " in result.detail, result.detail
    await _wait_for(lambda: (_state(container_name(job)) or {}).get("Running") is not True)
    assert "killed the container's processes" in _read(result.stderr_path)

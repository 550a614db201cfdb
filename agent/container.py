"""Container jobs on the agent's side: whether this worker runs them (:func:`engine_label`), its
leftovers (:func:`remove_leftovers`), and a run (:func:`run_container`, under its supervisor,
:mod:`agent.container_supervisor`). docs/design.md, "Job runtimes".
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from agent import container_supervisor, deadman
from agent.job_env import WORKER_ID
from agent.job_results import JobResult, container_result
from agent.runtimes import ContainerJob, owner_of
from agent.supervised import SupervisedRun
from runtime.jobs import ContainerRuntime
from runtime.resources import GPU, env_name
from runtime.settings.agent import AgentSettings

PING_TIMEOUT_S = 2.0
"""How long the agent waits for the engine's answer to its ping at start, in seconds."""
LABEL_PREFIX = "stockade."
"""The prefix of the labels each job's container carries (``stockade.job_id`` ...)."""
WORKER_LABEL = f"{LABEL_PREFIX}worker_id"
OWNER_LABEL = f"{LABEL_PREFIX}owner"
"""Label naming the agent a container job belongs to: :func:`owner_of` its work folder. Two
clusters on one engine may both have a ``w-1``; only the work folder tells their agents apart
(:func:`agent.runtimes.owner_of`)."""

_ENGINE_ENV = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "DOCKER_CONFIG")
"""The agent's variables its containers' supervisors get: which engine, and how to reach it."""


def _client(timeout_s: float) -> Any:
    """A Docker SDK client of the engine the environment names (``DOCKER_HOST``, ...); raises
    ``docker.errors.DockerException`` when none can be made."""
    import docker

    return docker.from_env(timeout=timeout_s)


def engine_label(labels: Mapping[str, str], *, timeout_s: float = PING_TIMEOUT_S) -> tuple[str, str]:
    """The value of the worker's ``container`` label, and why when it is not ``docker``:
    ``docker`` when the engine answers a ping within ``timeout_s`` seconds; ``none`` when it does
    not, or when ``labels`` already say ``container=none``. Blocking: run it in a thread."""
    if labels.get("container") == "none":
        return "none", "the worker's labels say container=none"
    try:
        client = _client(timeout_s)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # any failure means: no engine to run containers with
        return "none", f"no Docker engine answered a ping within {timeout_s:g} s: {exc}"
    return "docker", ""


def remove_leftovers(worker_id: str, owner: str, *, timeout_s: float = 10.0) -> list[str]:
    """Remove (force) every container labelled ``stockade.worker_id=<worker_id>`` and
    ``stockade.owner=<owner>``: those an earlier life of this worker's agent left, and no other
    cluster's; returns their names. Blocking: run it in a thread.

    Raises:
        docker.errors.DockerException, requests.RequestException: the engine did not answer.
    """
    client = _client(timeout_s)
    removed: list[str] = []
    try:
        labels = [f"{WORKER_LABEL}={worker_id}", f"{OWNER_LABEL}={owner}"]
        for container in client.containers.list(all=True, filters={"label": labels}):
            container.remove(force=True)
            removed.append(container.name)
    finally:
        client.close()
    return removed


def container_name(job: ContainerJob) -> str:
    """``stockade-<worker_id>-<owner>-<job_id>-<assignment_id>`` (Docker's name rules admit
    worker ids; the owner keeps two clusters' ``w-1`` apart)."""
    return f"stockade-{job.worker_id}-{job.owner}-{job.job_id}-{job.assignment_id}"


def container_labels(job: ContainerJob) -> dict[str, str]:
    """The labels a job's container carries: its job, assignment and worker."""
    return {
        f"{LABEL_PREFIX}job_id": str(job.job_id),
        f"{LABEL_PREFIX}assignment_id": str(job.assignment_id),
        WORKER_LABEL: job.worker_id,
        OWNER_LABEL: job.owner,
    }


def supervisor_argv(
    runtime: ContainerRuntime,
    job: ContainerJob,
    *,
    started_fd: int,
    stop_grace_s: float,
    fence_deadline_path: Path | None,
    job_env: Mapping[str, str],
) -> list[str]:
    """The command line of a container job's supervisor (:mod:`agent.container_supervisor`)."""
    spec = {
        "parent_pid": os.getpid(),
        "stop_grace_s": float(stop_grace_s),
        "deadline_path": "" if fence_deadline_path is None else str(fence_deadline_path),
        "started_fd": started_fd,
        "image": runtime.image,
        "argv": list(runtime.argv),
        "name": container_name(job),
        "labels": container_labels(job),
        "env": {**job_env, WORKER_ID: job.worker_id},
        "nano_cpus": job.cpu_millis * 1_000_000,
        "mem_bytes": job.memory_mb * 2**20,
        "user": job.user,
        "workdir": job.workdir,
        "oom_score_adj": job.oom_score_adj,
        # The gpu units the assignment holds (agent/job_env.py): the container gets those alone.
        "gpus": [u for u in job_env.get(env_name(GPU), "").split(",") if u],
    }
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [sys.executable, "-I", "-c", container_supervisor.bootstrap(root), json.dumps(spec)]


def _remove_by_name(name: str) -> None:
    """Remove container ``name`` (force) if it is there; an engine that does not answer is let
    be (the next start of the agent removes it)."""
    with contextlib.suppress(Exception):
        client = _client(container_supervisor.API_TIMEOUT_S)
        try:
            client.containers.get(name).remove(force=True)
        finally:
            client.close()


async def run_container(
    runtime: ContainerRuntime, run: SupervisedRun, *, job: ContainerJob | None
) -> JobResult:
    """:func:`agent.runtimes.run_job` for a container job: returns (or, cancelled, raises) once
    its container has ended and is removed. A ``notice`` stops it as ``docker stop`` would,
    with the notice's grace: ``docker kill --signal SIGTERM``, ``docker kill`` that long after."""
    began = trio.current_time()
    if job is None:
        return run.not_started(began, "a container job without its limits", stopped=False)
    if run.stop_asked():
        return run.not_started(began, "stopped before it was started", stopped=True)
    env = {k: os.environ[k] for k in _ENGINE_ENV if k in os.environ}
    env["PATH"] = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    argv = partial(
        supervisor_argv,
        runtime,
        job,
        stop_grace_s=run.stop_grace_s,
        fence_deadline_path=run.fence_deadline_path,
        job_env=run.job_env,
    )

    def spawn() -> tuple[subprocess.Popen[bytes], int]:
        run.job_dir.mkdir(parents=True, exist_ok=True)
        if job.user:  # nothing of the job enters it on this side: closed to every job
            run.job_dir.chmod(0o700)
        deadman.clear_files(run.job_dir)
        return run.popen(lambda started_fd: argv(started_fd=started_fd), env=env)

    try:
        proc, started_fd = await run.spawn(spawn)
    except OSError as exc:
        return run.not_started(
            began, f"cannot start the supervisor of container {container_name(job)}: {exc}"
        )
    stopped, exec_reported, code = await run.wait(proc, started_fd)
    report = deadman.read_report(run.job_dir)
    if report.get("removed") != "1" and "error" not in report:
        # Its supervisor was killed (maybe between create and start), or lost the engine: do
        # not leave the container behind. (A report's error: no container is left.)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_remove_by_name, container_name(job))
    return container_result(
        report, code, stopped=stopped, exec_reported=exec_reported, began_at=began, paths=run.paths
    )


async def container_settings(settings: AgentSettings, logger: Any) -> AgentSettings:
    """``settings`` with the worker's ``container`` label (:func:`engine_label`), once the
    containers an earlier life of this worker left are removed (:func:`remove_leftovers`);
    both logged. The engine calls run in a thread."""
    value, why = await trio.to_thread.run_sync(engine_label, settings.labels)
    if value == "docker":
        try:
            removed = await trio.to_thread.run_sync(
                remove_leftovers, settings.worker_id, owner_of(settings.work_dir)
            )
        except Exception as exc:
            logger.warning("cannot remove containers left by an earlier life of this worker", error=str(exc))
        else:
            if removed:
                logger.warning(
                    "removed containers left by an earlier life of this worker",
                    count=len(removed),
                    containers=removed,
                )
        logger.info("container jobs enabled: the Docker engine answered", label="container=docker")
    else:
        logger.warning("container jobs disabled", label="container=none", reason=why)
    return attrs.evolve(settings, labels={**settings.labels, "container": value})

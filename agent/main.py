"""The agent's entry points: :func:`run_agent` (async, composable) and :func:`main` (a process).

:func:`run_agent` keeps all of its state in its own objects, so one process can host many agents
(the fleet mode); what belongs to the process, its start slots and its spawner thread
(:mod:`agent.starts`), is passed in. :func:`main` also measures the process's event-loop lag and
garbage-collection pauses, and serves its Prometheus metrics.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypedDict, Unpack

import trio

from agent import adoption, job_record
from agent.cgroups import resource_settings
from agent.container import container_settings
from agent.control_plane import ControlPlane, GrpcControlPlane
from agent.core import Agent
from agent.devices import device_settings
from agent.fence import FENCE_DEADLINE_FILE
from agent.identities import JobIdentities
from agent.logs import LogReader
from agent.output import OutputFiles, OutputKeeper
from agent.runtimes import job_runner
from agent.service import WorkerService
from agent.starts import Spawner, StartLimiter
from protocol.bases import WorkerBase
from runtime import identifiers, log, metrics, oom, priority
from runtime.aio import asyncio_bridge, serve_grpc, trio_service
from runtime.client import ControlPlaneClient
from runtime.gcpause import GcPauses
from runtime.lag import LoopLag
from runtime.loops import run_until_signal
from runtime.os_users import RunAs, resolve_unprivileged_user
from runtime.settings.agent import AgentSettings
from runtime.tls import CONTROL_PLANE, server_context

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}

MAX_ASSIGN_BYTES = 256 * 1024 * 1024
"""The largest Assign or Cancel the Worker service takes, in bytes: above the control plane's
16 MiB, since one Assign carries a round's assignments for the worker with their specs (argv
up to 64 KiB each), and only control planes, which the role check admits first, may send it."""

WORKER_ACCESS = {"assign": (CONTROL_PLANE,), "cancel": (CONTROL_PLANE,), "read_logs": (CONTROL_PLANE,)}
"""Who may call each Worker RPC over mutual TLS: only control planes (the request's epoch and
incarnation are then checked as before, :mod:`agent.acceptance`). Users read a job's output
through a control plane (ControlPlane.ReadJobLogs), which checks their role and relays it."""


def advertised_address(settings: AgentSettings, port: int) -> str:
    """The host:port to register: ``advertise_address``, else the listen host (the machine's
    name for a wildcard one) and bound port."""
    if settings.advertise_address:
        return settings.advertise_address
    host = settings.listen_host
    if host in _WILDCARD_HOSTS:
        host = socket.gethostname()
    return identifiers.format_address(host, port)


async def run_agent(
    settings: AgentSettings,
    *,
    control_plane: ControlPlane | None = None,
    start_limiter: StartLimiter | None = None,
    leave_turns: trio.CapacityLimiter | None = None,
    spawner: Spawner | None = None,
    sweep_beside_registration: bool = False,
    task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one worker's agent until cancelled; the asyncio bridge must already be open.

    Binds the Worker service (listen port 0: a free one), then signals
    ``task_status.started(agent)`` and registers in the background. On cancellation it stops
    every running job (shielded), logs each stop with reason ``shutdown``, and closes its
    connections.

    When this process is root, each command and container job runs as a uid of its own from
    the worker's pool (:class:`agent.identities.JobIdentities`: ``settings.job_uids``, else a
    block it claims), or, with ``settings.job_user`` set, all of them as that one user; when it
    is not root, as this process's user. The start log says which. Before anything else it
    labels the worker ``container=docker|none`` (:func:`agent.container.container_settings`)
    and ``resources=cgroup2|cgroup1|rlimit`` (:func:`agent.cgroups.resource_settings`),
    removing what an earlier life of it left.

    ``control_plane``, ``start_limiter``, ``leave_turns`` and ``spawner`` (running): None, the
    agent's own (a :class:`GrpcControlPlane` over ``settings.control_planes``). A root agent
    sweeps its uid pool before it serves, or, with ``sweep_beside_registration`` (a fleet's
    workers), once it serves, gathered with the other workers of the process
    (:meth:`JobIdentities.sweep_at_start`).

    Raises:
        OSError: the listen address cannot be bound, or the work folder cannot be written.
        runtime.os_users.UserNotCreated: this process is root and the job user could not be
            created (or is root itself).
        agent.identities.NoUidBlock: no block of uids could be claimed.
        runtime.errors.ResourcesUnavailable: ``settings.job_resources`` names a mode this
            machine cannot do.
    """
    logger = log.get("agent").bind(worker_id=settings.worker_id)
    # The cgroups (and uids) of jobs whose supervisors still run stay: this agent takes them over.
    live = adoption.supervised_job_folders(str(Path(settings.work_dir) / FENCE_DEADLINE_FILE))
    run_as, identities = await job_identities(settings, logger, live=live)
    try:
        if identities is not None and not sweep_beside_registration:
            work_dir = await trio.to_thread.run_sync(Path(settings.work_dir).resolve)
            await identities.sweep_at_start(work_dir / "jobs", gather=False)
        settings = await container_settings(settings, logger)
        settings = await device_settings(settings, logger)
        settings, resources = await resource_settings(settings, logger, keep=live)
    except BaseException:
        if identities is not None:
            identities.close()
        raise
    client: ControlPlaneClient | None = None
    if control_plane is None:
        client = ControlPlaneClient(
            settings.control_planes,
            timeout_s=settings.heartbeat_timeout_s,
            tls=settings.tls,
            home_key=settings.worker_id,  # spreads the workers over the replicas
        )
        control_plane = GrpcControlPlane(client, hedge_after_s=settings.heartbeat_timeout_s)
    own_spawner = Spawner() if spawner is None else None
    try:
        # The spawner thread outlives every job this agent starts (agent.starts says why).
        with own_spawner or contextlib.nullcontext():
            agent = Agent(
                settings,
                control_plane,
                start_limiter=start_limiter,
                leave_turns=leave_turns,
                runner=job_runner(spawner or own_spawner),
                run_as=run_as,
                identities=identities,
                resources=resources,
            )
            beside = identities if sweep_beside_registration else None
            await _serve_agent(agent, settings, beside, task_status=task_status)
    finally:
        resources.close()  # every job has ended (and its cgroup is gone): the worker's folder
        if identities is not None:
            identities.close()  # every job's uid is given back: the block is free for others
        if client is not None:
            client.close()


async def job_identities(
    settings: AgentSettings, logger: Any, *, live: frozenset[str]
) -> tuple[RunAs | None, JobIdentities | None]:
    """Who the worker's jobs run as, logged: as root without ``job_user``, a uid each from its
    pool (claimed, the uids of the jobs in the ``live`` folders held; what the others left is
    removed by :meth:`JobIdentities.sweep_at_start`); else ``job_user`` as root, or this
    process's user.

    Raises:
        runtime.os_users.UserNotCreated, agent.identities.NoUidBlock: as :func:`run_agent` says.
    """
    if os.geteuid() != 0 or settings.job_user:
        run_as = resolve_unprivileged_user(settings.job_user)
        if os.geteuid() == 0:
            logger.warning(
                "jobs run as one shared user: each can reach the others' files and processes",
                job_user=run_as.name,
                uid=run_as.uid,
            )
        else:
            logger.warning(
                "jobs run as the agent's own user (it is not root): they are not kept apart",
                user=run_as.name,
                uid=run_as.uid,
            )
        return run_as, None

    def claim() -> JobIdentities:
        identities = JobIdentities.claim(settings, logger=logger)
        try:
            jobs_dir = Path(settings.work_dir).resolve() / "jobs"
            for name in live:
                record = job_record.read_record(jobs_dir / name)
                if record is not None and record.job_uid is not None:
                    identities.hold(record.job_uid)
            return identities
        except BaseException:
            identities.close()
            raise

    # What uids of the pool no job holds left is removed by JobIdentities.sweep_at_start.
    identities = await trio.to_thread.run_sync(claim)
    return None, identities


async def _serve_agent(
    agent: Agent,
    settings: AgentSettings,
    sweep_beside: JobIdentities | None,
    *,
    task_status: trio.TaskStatus[Agent],
) -> None:
    # The job folders' output, read (ReadLogs) and kept in bounds, through one set of files.
    place: dict[str, Any] = {
        "worker_id": settings.worker_id,
        "jobs_dir": agent.jobs_dir,
        "settings": settings.output,
        "files": OutputFiles(),
    }
    logs = LogReader(job_done=agent.job_done, **place)
    keeper = OutputKeeper(
        active=agent.active_jobs,
        writing=agent.output_jobs,
        added=agent.jobs_added,
        logger=log.get("agent").bind(worker_id=settings.worker_id),
        **place,
    )
    async with trio.open_nursery() as nursery:
        service = trio_service(
            WorkerBase,
            WorkerService(agent, logs),
            access=WORKER_ACCESS,
            max_request_bytes=MAX_ASSIGN_BYTES,
        )
        tls = None if settings.tls is None else server_context(settings.tls)
        port = await nursery.start(
            partial(serve_grpc, [service], settings.listen_host, settings.listen_port, tls=tls)
        )
        await nursery.start(agent.run, advertised_address(settings, port))
        nursery.start_soon(keeper.run)
        if sweep_beside is not None:  # a fleet's worker: its pool is swept beside registration
            nursery.start_soon(sweep_beside.sweep_at_start, agent.jobs_dir)
        log.get("agent").info(
            "worker service listening",
            worker_id=settings.worker_id,
            address=agent.address,
            work_dir=str(agent.work_dir),
        )
        task_status.started(agent)


RESTART_SIGNAL = signal.SIGHUP
"""The signal that asks an agent (or a fleet) process for a planned restart: it exits leaving its
jobs running (:func:`restart_on_signal`). SIGTERM and SIGINT keep their meaning: a clean stop."""


async def serve_until_signal(
    work: Callable[[list[Agent]], Awaitable[object]], *, logger: Any, message: str
) -> None:
    """Run ``work`` beside the process's loop-lag and GC-pause probes, under the asyncio bridge,
    until SIGTERM or SIGINT (logging ``message``). ``work`` gets a list it fills with its agents
    as they start: a :data:`RESTART_SIGNAL` restarts those (:func:`restart_on_signal`)."""
    agents: list[Agent] = []

    async def serve() -> None:
        async with asyncio_bridge(), trio.open_nursery() as nursery:
            nursery.start_soon(LoopLag(loop="agent").run)
            nursery.start_soon(GcPauses().run)
            nursery.start_soon(restart_on_signal, agents, logger)
            nursery.start_soon(work, agents)

    await run_until_signal(serve, logger=logger, message=message)


async def restart_on_signal(agents: Sequence[Agent], logger: Any) -> None:
    """On :data:`RESTART_SIGNAL`: a planned restart of this process's ``agents``. Each has a
    heartbeat record a restart hold (:meth:`agent.core.Agent.prepare_restart`, all at once);
    then the process exits at once (status 0), leaving every job running under its reaper for the
    next process on the same work folder. One whose hold was not recorded in time leaves its jobs
    as a killed agent does."""
    with trio.open_signal_receiver(RESTART_SIGNAL) as received:
        async for _ in received:
            logger.warning(
                "restarting: signal received, leaving every job to the next agent process",
                signal=RESTART_SIGNAL.name,
                workers=len(agents),
            )
            held: dict[str, bool] = {}
            async with trio.open_nursery() as nursery:
                for agent in list(agents):
                    nursery.start_soon(_prepare_restart, agent, held)
            logger.warning(
                "exiting for the restart",
                held=sorted(w for w, ok in held.items() if ok),
                not_held=sorted(w for w, ok in held.items() if not ok),
            )
            sys.stdout.flush()
            sys.stderr.flush()
            # No clean-up: that would stop the jobs. Every job line is flushed as written.
            os._exit(0)


async def _prepare_restart(agent: Agent, held: dict[str, bool]) -> None:
    held[agent.worker_id] = await agent.prepare_restart(agent.settings.restart_hold_s)


async def _run_until_signal(settings: AgentSettings) -> None:
    async def serve(agents: list[Agent]) -> None:
        async with trio.open_nursery() as nursery:
            agents.append(await nursery.start(run_agent, settings))

    logger = log.get("agent")
    await serve_until_signal(serve, logger=logger, message="stopping: signal received, stopping every job")
    logger.info("agent stopped")


class ProcessOptions(TypedDict, total=False):
    """How an agent or a fleet process runs (:func:`main`, :func:`agent.fleet.main`)."""

    json_logs: bool
    """JSON-lines logs on stderr instead of console lines (default: console lines)."""
    log_level: str
    """The lowest level logged (``"DEBUG"``, ``"INFO"``, ...; default ``"INFO"``)."""
    metrics_port: int | None
    """Serve the process's Prometheus metrics on this port of its listen host; None: don't."""
    nice: int
    """The CPU priority to ask for before any thread starts (:mod:`runtime.priority`)."""
    oom_score_adj: int
    """The OOM score this process (and every reaper it forks) asks for (:mod:`runtime.oom`)."""


def start_process(options: ProcessOptions, *, logger: str, metrics_host: str, **bind: str) -> None:
    """Set this process up as ``options`` say before anything starts: its logs (``bind`` on
    every line), CPU priority and OOM score (logged to the ``logger`` logger), and its metrics
    server on ``metrics_host``."""
    log.configure(json=options.get("json_logs", False), level=options.get("log_level", "INFO"), **bind)
    priority.ask_for_priority(options.get("nice", priority.DEFAULT_NICE), log=log.get(logger))
    oom.protect_process(options.get("oom_score_adj", oom.DEFAULT_AGENT_OOM_SCORE_ADJ), log=log.get(logger))
    if metrics_port := options.get("metrics_port"):
        metrics.serve(metrics_port, metrics_host)


def main(settings: AgentSettings, **options: Unpack[ProcessOptions]) -> None:
    """Run the agent as this process's one job until SIGTERM or SIGINT, then return.

    On the signal every running job is stopped (and logged) before this returns; on SIGHUP the
    process exits for a planned restart (:func:`restart_on_signal`). Must run in the main thread.

    Raises:
        OSError: the listen address cannot be bound, or the work folder cannot be written
            (inside an ExceptionGroup, as trio's nurseries raise them).
    """
    start_process(options, logger="agent", metrics_host=settings.listen_host, worker_id=settings.worker_id)
    trio.run(_run_until_signal, settings)

"""One control-plane replica: a trio nursery of supervised actors, wired by memory channels.

Every actor runs under :func:`runtime.supervisor.supervise`; the channels belong to this
nursery, so a restarted actor finds its inbox intact. The lease keeper and the ingest (and the
web console) run on trio loops of their own. The wiring and why: docs/design.md, "One replica:
the actors and their loops".
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import trio

from actors.console import Console
from actors.database_watch import DatabaseWatch, PgWatchStore
from actors.dispatcher import Dispatcher, GrpcWorkerCalls
from actors.heartbeat_policy import default_policy
from actors.ingest import Ingest
from actors.lease import LeaseKeeper, open_pg_store
from actors.ledger import Ledger
from actors.messages import DispatcherInbox, LeaseInbox, LedgerInbox, RoleChange
from actors.placer import Placer
from actors.placer_store import PgPlacerStore
from actors.reconciler import Reconciler
from actors.reconciler_store import PgReconcilerStore
from actors.role import RoleView
from actors.scheduler import PgSchedulerStore, Scheduler
from actors.schema import apply_schema
from runtime import gcpause, log, metrics, priority
from runtime.aio import asyncio_bridge
from runtime.backoff import FullJitterBackoff
from runtime.errors import DatabaseUnavailable
from runtime.gcpause import GcPauses
from runtime.lag import LoopLag
from runtime.loops import retry, run_until_signal
from runtime.outage import OutageLog
from runtime.settings.control_plane import ControlPlaneSettings
from runtime.supervisor import RestartPolicy, supervise
from runtime.threads import CrossLoopSender, OwnLoop, run_on_own_loop
from runtime.tls import ClientTls, server_context


@attrs.define
class ControlPlaneHandle:
    """What a started control plane tells its starter."""

    cp_id: str
    address: str
    placer: Placer


async def _apply_schema_with_retry(settings: ControlPlaneSettings) -> None:
    """Apply the schema, again with capped backoff (``schema_retry_base_s`` up to
    ``schema_retry_max_s``) while the database cannot be reached, logging the outage
    (:class:`runtime.outage.OutageLog`)."""
    outage = OutageLog(log.get("control_plane"), settings.database_url)

    async def attempt() -> None:
        await apply_schema(settings.database_url)
        outage.succeeded()

    await retry(
        attempt,
        retry_on=DatabaseUnavailable,
        backoff=FullJitterBackoff(base_s=settings.schema_retry_base_s, cap_s=settings.schema_retry_max_s),
        on_retry=lambda exc, wait_s: outage.failed(exc),
    )


async def run_control_plane(
    settings: ControlPlaneSettings,
    *,
    policy: RestartPolicy = RestartPolicy(),
    gc_pauses: GcPauses | None = None,
    task_status: trio.TaskStatus[ControlPlaneHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one replica until cancelled, with the asyncio bridge open; ``task_status.started``
    gets a :class:`ControlPlaneHandle` once every actor is up. ``gc_pauses`` times the process's
    garbage collections (None: one that only times them).

    Raises:
        ActorGaveUp: an actor crashed more often than ``policy`` allows.
    """
    await _apply_schema_with_retry(settings)
    lease_send, lease_recv = trio.open_memory_channel[LeaseInbox](64)
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](16)
    dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](1024)
    placer_roles_send, placer_roles_recv = trio.open_memory_channel[RoleChange](16)
    reconciler_roles_send, reconciler_roles_recv = trio.open_memory_channel[RoleChange](16)
    scheduler_roles_send, scheduler_roles_recv = trio.open_memory_channel[RoleChange](16)

    client_tls = None if settings.tls is None else ClientTls(settings.tls)
    # Who this replica is and where it listens: the same for every actor that serves.
    replica: dict[str, Any] = {
        "cp_id": settings.cp_id,
        "database_url": settings.database_url,
        "listen_host": settings.listen_host,
        "advertise_address": settings.advertise_address,
    }
    console = None
    if settings.http_port is not None:
        console = Console(
            **replica,
            http_port=settings.http_port,
            settings=settings.console,
            tls=settings.tls,
            clock=time.time,
        )
    ingest = Ingest(
        **replica,
        listen_port=settings.listen_port,
        presence_interval_s=settings.presence_interval_s,
        settings=settings.ingest,
        told_default=default_policy(settings.reconciler),
        console_url=None if console is None else console.url,
        tls=None if settings.tls is None else server_context(settings.tls),
        worker_tls=client_tls,
    )
    ledger = Ledger(
        settings.cp_id, settings.database_url, settings.ledger, inbox=ledger_recv, lease_inbox=lease_send
    )
    dispatcher = Dispatcher(
        settings=settings.dispatch,
        inbox=dispatch_recv,
        lease_inbox=lease_send,
        calls=GrpcWorkerCalls(tls=client_tls),
    )
    main_lag = LoopLag(loop="main")
    main_token = trio.lowlevel.current_trio_token()
    lease_loop = OwnLoop("lease")
    ingest_loop = OwnLoop("ingest", monitor_lag=False)  # the ingest runs its own: it sheds by it
    # Consumed on the lease keeper's loop, fed from the main loop's lease channel by relay_lease.
    lease_inbox_send, lease_inbox_recv = trio.open_memory_channel[LeaseInbox](1024)

    async def lease_actor(*, task_status: trio.TaskStatus[None]) -> None:
        lease = LeaseKeeper(
            cp_id=settings.cp_id,
            settings=settings.lease,
            open_store=open_pg_store(settings.cp_id, settings.database_url, settings.lease),
            inbox=lease_inbox_recv,
            subscribers=[
                CrossLoopSender(placer_roles_send, main_token, "placer roles"),
                CrossLoopSender(reconciler_roles_send, main_token, "reconciler roles"),
                CrossLoopSender(scheduler_roles_send, main_token, "scheduler roles"),
            ],
            main_loop_silent_s=lambda: time.monotonic() - main_lag.last_wake_monotonic,
        )
        await lease.run(task_status=task_status)

    async def relay_lease(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        async for message in lease_recv:
            lease_loop.post(_send_or_drop, lease_inbox_send, message)

    def decider(roles: trio.MemoryReceiveChannel[RoleChange]) -> dict[str, Any]:
        """What the placer and the reconciler are both given."""
        return {
            "role": RoleView(changes=roles, lease_inbox=lease_send),
            "ledger": ledger_send,
            "dispatcher": dispatch_send,
            "max_rows_per_fenced_write": settings.ledger.max_rows_per_fenced_write,
        }

    def store_named(actor: str) -> dict[str, str]:
        return {
            "database_url": settings.database_url,
            "application_name": f"stockade {settings.cp_id} {actor}",
        }

    placer = Placer(
        settings=settings.placer,
        store=PgPlacerStore(
            **store_named("placer"),
            statement_timeout_s=settings.placer.read_statement_timeout_s,
            trial_run_s=settings.placer.trial_run_s,
        ),
        **decider(placer_roles_recv),
    )
    reconciler = Reconciler(
        settings=settings.reconciler,
        store=PgReconcilerStore(
            **store_named("reconciler"), statement_timeout_s=settings.reconciler.read_statement_timeout_s
        ),
        **decider(reconciler_roles_recv),
    )
    scheduler = Scheduler(
        store=PgSchedulerStore(
            **store_named("scheduler"), statement_timeout_s=settings.reconciler.read_statement_timeout_s
        ),
        role=RoleView(changes=scheduler_roles_recv, lease_inbox=lease_send),
        ledger=ledger_send,
        max_rows_per_fenced_write=settings.ledger.max_rows_per_fenced_write,
    )
    watch = DatabaseWatch(
        settings=settings.database_watch,
        store=PgWatchStore(
            **store_named("database watch"), statement_timeout_s=settings.database_watch.statement_timeout_s
        ),
    )
    actors: list[tuple[str, Callable[..., Any]]] = [
        ("ledger", ledger.run),
        ("dispatcher", dispatcher.run),
        ("ingest", partial(run_on_own_loop, ingest_loop, ingest.run)),
        ("lease relay", relay_lease),
        ("lease", partial(run_on_own_loop, lease_loop, lease_actor)),
        ("placer", placer.run),
        ("reconciler", reconciler.run),
        ("scheduler", scheduler.run),
        ("database watch", watch.run),
    ]
    if console is not None:
        # On a loop of its own: rendering a page never delays a placer round.
        actors.append(("console", partial(run_on_own_loop, OwnLoop("console"), console.run)))
    # The replica can do without its console: a page that keeps crashing it (a bug a request
    # can reach) never takes the lease or the ingest down with it.
    inessential = {"console"}
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(main_lag.run)
            nursery.start_soon((gc_pauses or GcPauses()).run)
            for name, run in actors:
                await nursery.start(
                    partial(supervise, name, run, policy=policy, essential=name not in inessential)
                )
            log.get("control_plane").info("control plane up", cp_id=settings.cp_id, address=ingest.address)
            task_status.started(
                ControlPlaneHandle(cp_id=settings.cp_id, address=ingest.address, placer=placer)
            )
    finally:
        # The stores outlive their actors' restarts; they close once, with the replica.
        with trio.CancelScope(shield=True):
            await placer.store.close()
            await reconciler.store.close()
            await scheduler.store.close()


def _send_or_drop(channel: trio.MemorySendChannel[LeaseInbox], message: LeaseInbox) -> None:
    """Deliver ``message`` on the lease keeper's loop (called there)."""
    try:
        channel.send_nowait(message)
    except trio.WouldBlock:
        log.get("control_plane").warning(
            "lease keeper inbox full: message dropped", message=type(message).__name__
        )


def main(
    settings: ControlPlaneSettings,
    *,
    json_logs: bool = False,
    metrics_port: int | None = None,
    nice: int = priority.DEFAULT_NICE,
) -> None:
    """Run a replica as a process: logs to stderr, Prometheus metrics on ``metrics_port`` when
    given, the CPU priority ``nice`` asked for before any thread starts; exits cleanly (releasing
    the lease) on SIGTERM or SIGINT."""
    log.configure(json=json_logs, cp_id=settings.cp_id)
    priority.ask_for_priority(nice, log=log.get("control_plane"))
    if metrics_port:
        metrics.serve(metrics_port, settings.listen_host)

    async def serve() -> None:
        async with asyncio_bridge(), trio.open_nursery() as nursery:
            await nursery.start(
                partial(run_control_plane, settings, gc_pauses=GcPauses(freeze_survivors=True))
            )
            # What start-up left alive (modules, classes, the actors) is never garbage: keep
            # it out of the collector's full passes, which then scan only what the replica
            # allocates while running (docs.python.org/3/library/gc.html#gc.freeze).
            gc.freeze()
            young, middle, oldest = gcpause.collect_less_often()
            log.get("control_plane").info(
                "garbage collection thresholds", young=young, middle=middle, oldest=oldest
            )

    # Signals are watched from the start: a replica still waiting for its database stops too.
    trio.run(partial(run_until_signal, serve, logger=log.get("control_plane")))

"""Ingest actors serving the ControlPlane service for real, and the leader's side a test holds
by hand (the lease at a given epoch, an admin connection), for the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from ssl import SSLContext

import trio

from actors.ingest import Ingest
from actors.ledger import Ledger
from actors.messages import DispatcherInbox, LeaseInbox, LedgerInbox, RoleChange
from actors.placer import Placer
from actors.placer_store import PgPlacerStore
from actors.role import RoleView
from runtime.aio import PgConnection, asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.settings.control_plane import IngestSettings
from runtime.settings.leader import LedgerSettings, PlacerSettings
from runtime.tls import ClientTls, TlsFiles, server_context

HOLD_LEASE = "UPDATE lease SET holder = 'cp-1', epoch = $1, expires_at = now() + interval '1 hour'"
"""cp-1 holds the lease at epoch $1 for an hour: the test plays the leader under that epoch."""


@asynccontextmanager
async def serve_ingests(
    database_url: str,
    *cp_ids: str,
    settings: IngestSettings | None = None,
    presence_interval_s: float = 60.0,
    tls: SSLContext | None = None,
    worker_tls: Callable[[str], ClientTls] | None = None,
) -> AsyncIterator[list[Ingest]]:
    """One ingest actor per id on ``database_url``, each serving on 127.0.0.1 (a free port),
    with no lease keeper and no leader, on the caller's loop; all stopped on leaving.
    ``settings`` defaults to ``IngestSettings()``; ``tls`` (a server context,
    :func:`runtime.tls.server_context`) serves mutual TLS, None plaintext; ``worker_tls`` gives
    each replica's client certificate for reading job output from workers (by its id; None:
    plaintext)."""
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        started = []
        for cp_id in cp_ids:
            ingest = Ingest(
                cp_id=cp_id,
                database_url=database_url,
                listen_host="127.0.0.1",
                listen_port=0,
                presence_interval_s=presence_interval_s,
                settings=IngestSettings() if settings is None else settings,
                tls=tls,
                worker_tls=None if worker_tls is None else worker_tls(cp_id),
            )
            await nursery.start(ingest.run)
            started.append(ingest)
        yield started
        nursery.cancel_scope.cancel()


NO_LAG_SHEDDING_S = 60.0
"""The loop lag past which the test servers of :func:`mtls_control_plane` and
:func:`ingest_and_leader` answer "busy": never, in practice. Their tests are about what the
service stores and answers, and one call with no retry would fail on a loaded machine (a test
process's loop lags past the default 0.25 s there); shedding has tests of its own."""


@asynccontextmanager
async def mtls_control_plane(database_url: str, certs: Path) -> AsyncIterator[str]:
    """One ingest (cp-1, a small pool) serving mutual TLS with cp-1's certificate in ``certs``;
    yields its address. It sheds no work for loop lag (:data:`NO_LAG_SHEDDING_S`)."""
    settings = IngestSettings(pool_size=2, liveness_reserved_connections=1, shed_lag_s=NO_LAG_SHEDDING_S)
    tls = server_context(TlsFiles.in_dir(certs, "cp-1"))
    async with serve_ingests(database_url, "cp-1", settings=settings, tls=tls) as (ingest,):
        yield ingest.address


@asynccontextmanager
async def ingest_and_leader(
    database_url: str, *, epoch: int = 1, presence_interval_s: float = 60.0
) -> AsyncIterator[tuple[ControlPlaneClient, PgConnection]]:
    """One ingest actor on a small pool (2 connections, 1 reserved for liveness), a client of
    it, and an admin connection holding the lease at ``epoch`` (:data:`HOLD_LEASE`), for tests
    that send what workers send through the real service and run the leader's statements by
    hand; all closed on leaving. It sheds no work for loop lag (:data:`NO_LAG_SHEDDING_S`)."""
    settings = IngestSettings(pool_size=2, liveness_reserved_connections=1, shed_lag_s=NO_LAG_SHEDDING_S)
    async with serve_ingests(
        database_url, "cp-1", settings=settings, presence_interval_s=presence_interval_s
    ) as (ingest,):
        cp = ControlPlaneClient([ingest.address], timeout_s=10.0)
        admin = await PgConnection.connect(database_url)
        try:
            await admin.execute(HOLD_LEASE, epoch)
            yield cp, admin
        finally:
            cp.close()
            await admin.close()


@asynccontextmanager
async def placer_with_ledger(
    database_url: str, settings: PlacerSettings | None = None
) -> AsyncIterator[Placer]:
    """A placer whose rounds (``await placer.round(1)``) a ledger of its own commits under epoch 1
    (the test holds the lease: :data:`HOLD_LEASE`), on the caller's loop with the asyncio bridge
    open; what it dispatches goes nowhere; both stopped on leaving."""
    async with trio.open_nursery() as nursery:
        ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
        lease_send, _ = trio.open_memory_channel[LeaseInbox](8)
        ledger = Ledger(
            cp_id="cp-1",
            database_url=database_url,
            settings=LedgerSettings(),
            inbox=ledger_recv,
            lease_inbox=lease_send,
        )
        await nursery.start(ledger.run)
        dispatch_send, _dispatched = trio.open_memory_channel[DispatcherInbox](100)
        _, roles_recv = trio.open_memory_channel[RoleChange](8)
        store = PgPlacerStore(database_url=database_url, application_name="test placer")
        placer = Placer(
            settings=settings or PlacerSettings(),
            store=store,
            role=RoleView(changes=roles_recv, lease_inbox=lease_send),
            ledger=ledger_send,
            dispatcher=dispatch_send,
        )
        try:
            yield placer
        finally:
            await store.close()
            nursery.cancel_scope.cancel()

"""Ingest actors serving the ControlPlane service for real, for the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from actors.ingest import Ingest
from runtime.aio import asyncio_bridge
from runtime.settings import IngestSettings


@asynccontextmanager
async def serve_ingests(
    database_url: str,
    *cp_ids: str,
    settings: IngestSettings | None = None,
    presence_interval_s: float = 60.0,
) -> AsyncIterator[list[Ingest]]:
    """One ingest actor per id on ``database_url``, each serving on 127.0.0.1 (a free port),
    with no lease keeper and no leader, on the caller's loop; all stopped on leaving.
    ``settings`` defaults to ``IngestSettings()``."""
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
            )
            await nursery.start(ingest.run)
            started.append(ingest)
        yield started
        nursery.cancel_scope.cancel()

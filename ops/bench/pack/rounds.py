"""The real placer round (read, decision, fenced commit) in this process, against a bench
database of simulated workers: :class:`BenchPlacer`, timed by the scale curve of ``stockade bench
pack`` (:func:`ops.bench.pack.scenarios.run_scale_point`) and by ``stockade bench unschedulable``.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import AsyncIterator, Sequence

import attrs
import trio

from actors.ledger import Ledger
from actors.messages import DispatcherInbox, LeaseInbox, LedgerInbox, RoleChange
from actors.placer import Placer
from actors.placer_store import PgPlacerStore
from actors.role import RoleView
from actors.schema import apply_schema
from runtime.aio import PgConnection
from runtime.errors import DatabaseBusy
from runtime.settings.leader import LedgerSettings, PlacerSettings


@attrs.define
class BenchPlacer:
    """The placer and the ledger of one control plane (``bench``) on a bench database
    (:meth:`open`), with ``workers`` simulated workers ``w-1``.. ``w-N``; what the placer
    dispatches is dropped."""

    db: PgConnection
    workers: int
    rng: random.Random
    ledger: Ledger
    placer: Placer
    _dispatched: trio.MemoryReceiveChannel[DispatcherInbox]
    failed_rounds: int = 0
    """Rounds whose statement the database cancelled (:class:`DatabaseBusy`: past the ledger's or
    the placer's statement timeout), counted as the leader's placer counts them."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, database_url: str, *, workers: int, rng: random.Random) -> AsyncIterator[BenchPlacer]:
        """A bench on ``database_url``: its schema applied, its tables emptied, ``bench`` its
        leader for an hour, the ledger running for the block; every connection closed after
        it. The caller seeds the workers and jobs on :attr:`db`, then runs rounds."""
        await apply_schema(database_url)
        db = await PgConnection.connect(database_url)
        try:
            await db.execute(
                "TRUNCATE assignments, jobs, gangs, workers, lease_history, stale_writes CASCADE"
            )
            await db.execute(
                "UPDATE lease SET holder = 'bench', epoch = 1, expires_at = now() + interval '1 hour'"
            )
            ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
            lease_send, _lease_recv = trio.open_memory_channel[LeaseInbox](64)
            dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](100_000)
            _roles_send, roles_recv = trio.open_memory_channel[RoleChange](8)
            ledger = Ledger(
                cp_id="bench",
                database_url=database_url,
                settings=LedgerSettings(),
                inbox=ledger_recv,
                lease_inbox=lease_send,
            )
            placer = Placer(
                settings=PlacerSettings(),
                store=PgPlacerStore(database_url=database_url, application_name="bench"),
                role=RoleView(changes=roles_recv, lease_inbox=lease_send),
                ledger=ledger_send,
                dispatcher=dispatch_send,
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(ledger.run)
                yield cls(
                    db=db, workers=workers, rng=rng, ledger=ledger, placer=placer, dispatched=dispatch_recv
                )
                nursery.cancel_scope.cancel()
            await placer.store.close()  # type: ignore[attr-defined]
        finally:
            await db.close()

    async def add_busy_workers(self) -> None:
        """Store the simulated workers: 16000 cpu_millis and 32768 MiB each, all but 100 cpu_millis
        and 768 MiB of it allocated."""
        await self.db.execute(
            "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)"
            " SELECT 'w-' || i, '127.0.0.1:1', 16000, 32768, i FROM generate_series(1, $1) i",
            self.workers,
        )
        await self.db.execute(
            "UPDATE worker_allocations SET cpu_allocated_millis = 15900, memory_allocated_mb = 32000"
        )

    async def round(self, *, free_room: bool = True) -> tuple[float, float]:
        """One round (a round whose statement the database cancelled counts in
        :attr:`failed_rounds`) after the simulated workers heartbeat (as live ones would, else they go
        stale and the placer rightly places nothing on them) and, with ``free_room``, one of
        them drawn at random frees 2000 cpu_millis and 2048 MiB, so a job or two fit.

        Returns:
            The round's wall time and this process's CPU time in it, milliseconds.
        """
        await self.db.execute("UPDATE workers SET last_heartbeat_at = now()")
        if free_room:
            await self.db.execute(
                "UPDATE worker_allocations SET cpu_allocated_millis = cpu_allocated_millis - 2000,"
                " memory_allocated_mb = memory_allocated_mb - 2048 WHERE worker_id = $1",
                f"w-{self.rng.randint(1, self.workers)}",
            )
        while True:
            try:
                self._dispatched.receive_nowait()
            except trio.WouldBlock:
                break
        started, cpu = time.perf_counter(), time.process_time()
        try:
            await self.placer.round(1)
        except DatabaseBusy:
            # As the leader's placer takes it (Placer._logged_round): nothing was sent, and the
            # queue is read in full next round.
            self.placer._synced_epoch = None
            self.failed_rounds += 1
        return (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000


def percentiles_ms(times: Sequence[float]) -> tuple[float, float, float]:
    """The median, 99th percentile and maximum of ``times`` (milliseconds, at least one)."""
    ordered = sorted(times)
    return (
        round(statistics.median(ordered), 2),
        round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
        round(ordered[-1], 2),
    )

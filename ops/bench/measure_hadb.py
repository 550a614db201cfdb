"""How long the HA PostgreSQL pair (:mod:`ops.launcher.hadb`) takes to start, and to fail over when the
primary's host dies, with a client writing through the multi-host URL all along::

    python -m ops.bench.measure_hadb [--state-dir DIR] [--failovers 3]

Without ``--state-dir`` it starts a pair in a temporary folder (and prints how long that took)
and stops it at the end; with it, it uses the pair under DIR (``.stockade/hadb`` of a cluster
started with ``stockade up --ha-db``), starting it if needed and leaving it running.

Each failover: a writer inserts one row per committed transaction through the multi-host URL
without pause; the primary's Patroni and PostgreSQL are SIGKILLed together; then it prints
seconds from the kill to (1) the other member being primary and accepting read-write
connections, (2) the killed member being the sync standby again after its restart (started as
soon as (1) holds), (3) the writer's first commit acknowledged by the new primary; and checks
that every row whose commit was acknowledged is on the new primary. With
``synchronous_mode_strict`` (the default) (3) waits for the restarted member to stream again:
the new primary acknowledges no commit before a standby has it (Patroni records that member
as the sync standby, (2), a few seconds later).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import threading
import time
from pathlib import Path

import asyncpg

from ops.launcher.hadb import HaPostgres

_WRITE_TIMEOUT_S = 2.0
"""Budget of one connection or insert; a failed one is retried after a short pause."""


class _Writer(threading.Thread):
    """Inserts rows 1, 2, 3... into ``ha_measure`` through ``url``, one committed transaction
    each, recording (id, :func:`time.monotonic` of the acknowledgement), until stopped."""

    def __init__(self, url: str, first_id: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.next_id = first_id
        self.acknowledged: list[tuple[int, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        asyncio.run(self._write())

    async def _write(self) -> None:
        connection: asyncpg.Connection | None = None
        while not self.stopping.is_set():
            try:
                if connection is None:
                    connection = await asyncpg.connect(self.url, timeout=_WRITE_TIMEOUT_S)
                await connection.execute(
                    "INSERT INTO ha_measure (id) VALUES ($1)", self.next_id, timeout=_WRITE_TIMEOUT_S
                )
                self.acknowledged.append((self.next_id, time.monotonic()))
                self.next_id += 1
            except (
                OSError,
                asyncpg.PostgresError,
                asyncpg.InterfaceError,
                asyncpg.InternalClientError,
                TimeoutError,
            ):
                if connection is not None:
                    connection.terminate()
                    connection = None
                # Not acknowledged: it may or may not have committed; use a fresh id.
                self.next_id += 1
                await asyncio.sleep(0.05)
        if connection is not None:
            await connection.close()


async def _execute(url: str, statement: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        return await connection.fetch(statement)
    finally:
        await connection.close()


def _failover(ha: HaPostgres, number: int) -> None:
    url = ha.url()
    first = asyncio.run(_execute(url, "SELECT coalesce(max(id), 0) + 1 AS n FROM ha_measure"))[0]["n"]
    writer = _Writer(url, first)
    writer.start()
    time.sleep(1.0)
    killed = ha.kill_primary()
    promoted = ha.wait_for_new_primary(killed, timeout_s=90)
    rejoined_s = ha.restart_member(killed.name, timeout_s=120)
    rejoined_after_s = time.monotonic() - killed.at_monotonic_s
    deadline = time.monotonic() + 60
    # Only the new primary can acknowledge a write after the promotion (an answer the old one
    # sent just before the kill may be read a few milliseconds after it).
    promoted_at = killed.at_monotonic_s + promoted.after_s
    while not any(at > promoted_at for _, at in writer.acknowledged) and time.monotonic() < deadline:
        time.sleep(0.05)
    writer.stopping.set()
    writer.join()
    first_write = min((at for _, at in writer.acknowledged if at > promoted_at), default=None)
    rows = {r["id"] for r in asyncio.run(_execute(url, "SELECT id FROM ha_measure"))}
    lost = [i for i, _ in writer.acknowledged if i not in rows]
    write_text = "none in 60 s" if first_write is None else f"{first_write - killed.at_monotonic_s:.2f} s"
    print(
        f"failover {number}: killed {killed.name}; {promoted.name} primary (read-write) "
        f"{promoted.after_s:.2f} s after the kill; {killed.name} sync standby {rejoined_after_s:.2f} s "
        f"after the kill ({rejoined_s:.2f} s after its restart); first acknowledged write {write_text}; "
        f"{len(writer.acknowledged)} acknowledged, {len(lost)} lost",
        flush=True,
    )
    if lost:
        raise SystemExit(f"acknowledged rows missing after the failover: {lost[:20]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-dir", type=Path, help="the pair's folder (default: a temporary one)")
    parser.add_argument("--failovers", type=int, default=3, help="how many failovers (default 3)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.state_dir is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stockade-hadb-")))
            ha = HaPostgres(folder / "hadb")
            stack.callback(ha.stop)
        else:
            ha = HaPostgres(args.state_dir)
        started = time.monotonic()
        ha.start()
        print(f"start: primary and sync standby ready in {time.monotonic() - started:.2f} s", flush=True)
        asyncio.run(_execute(ha.url(), "CREATE TABLE IF NOT EXISTS ha_measure (id bigint PRIMARY KEY)"))
        for number in range(1, args.failovers + 1):
            _failover(ha, number)


if __name__ == "__main__":
    main()

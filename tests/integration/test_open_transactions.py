"""The database watch on a real PostgreSQL: a session left idle in a transaction while the
workers' rows are updated is measured (its age, the dead rows it keeps vacuum from removing)
and warned about, once each, and its end is said too."""

from __future__ import annotations

from typing import Any

import attrs
import trio
from prometheus_client import REGISTRY

from actors.database_watch import DatabaseWatch, PgWatchStore
from runtime.aio import PgConnection, asyncio_bridge
from runtime.settings.control_plane import DatabaseWatchSettings

HANG_GUARD_S = 60.0
"""Bounds a wait for something the test makes happen, so a broken watch fails the test instead
of hanging it; never a measured time."""

WORKERS = 5
SETTINGS = DatabaseWatchSettings(
    sample_interval_s=0.1, oldest_transaction_warn_s=1.0, dead_rows_warn_ratio=10.0, dead_rows_warn_min=200
)
ADD_WORKERS = """
INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)
SELECT 'w-' || i, '127.0.0.1:' || (7000 + i), 1000, 1000, 1 FROM generate_series(1, $1) AS i
"""


@attrs.define
class Recorder:
    """Stands in for the watch's logger: keeps every line, and sets an event per kind of line."""

    lines: list[tuple[str, str, dict[str, Any]]] = attrs.field(factory=list)
    transaction_warned: trio.Event = attrs.field(factory=trio.Event)
    dead_rows_warned: trio.Event = attrs.field(factory=trio.Event)
    transaction_ended: trio.Event = attrs.field(factory=trio.Event)

    def warning(self, event: str, **keys: Any) -> None:
        self.lines.append(("warning", event, keys))
        if "pid" in keys:
            self.transaction_warned.set()
        if keys.get("table") == "workers":
            self.dead_rows_warned.set()

    def info(self, event: str, **keys: Any) -> None:
        self.lines.append(("info", event, keys))
        if "oldest_transaction_warn_s" in keys:
            self.transaction_ended.set()


def gauge(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    assert value is not None, name
    return value


async def test_an_idle_open_transaction_and_the_dead_rows_it_keeps_are_measured_and_warned_about(
    database_url: str,
) -> None:
    """While another session holds a transaction idle open and the workers' rows are updated,
    the oldest transaction's age and the workers' dead rows rise past their thresholds; each is
    warned about once (the transaction naming its session's pid, application and state), and
    once the transaction ends an info line says so."""
    recorder = Recorder()
    async with asyncio_bridge():
        idle = await PgConnection.connect(
            database_url, server_settings={"application_name": "forgotten psql"}
        )
        updater = await PgConnection.connect(database_url)
        store = PgWatchStore(database_url=database_url, application_name="stockade cp-1 database watch")
        watch = DatabaseWatch(settings=SETTINGS, store=store, log=recorder)
        try:
            await updater.execute(ADD_WORKERS, WORKERS)
            idle_pid = await idle.fetchval("SELECT pg_backend_pid()")
            await idle.execute("BEGIN")
            await idle.fetchval("SELECT txid_current()")  # holds back every row version from now on
            async with trio.open_nursery() as nursery:
                await nursery.start(watch.run)

                async def heartbeats() -> None:
                    while True:  # the workers' heartbeats, much faster
                        await updater.execute("UPDATE workers SET last_heartbeat_at = now()")
                        await trio.sleep(0.005)

                nursery.start_soon(heartbeats)
                with trio.fail_after(HANG_GUARD_S):
                    await recorder.transaction_warned.wait()
                    await recorder.dead_rows_warned.wait()
                oldest_s = gauge("stockade_database_oldest_transaction_seconds")
                dead = gauge("stockade_database_dead_rows", table="workers")
                live = gauge("stockade_database_live_rows", table="workers")
                await idle.execute("ROLLBACK")
                with trio.fail_after(HANG_GUARD_S):
                    await recorder.transaction_ended.wait()
                nursery.cancel_scope.cancel()
        finally:
            for conn in (idle, updater):
                await conn.close()
            await store.close()
    assert oldest_s > SETTINGS.oldest_transaction_warn_s
    assert dead > max(SETTINGS.dead_rows_warn_min, SETTINGS.dead_rows_warn_ratio * live)
    warnings = [keys for level, _, keys in recorder.lines if level == "warning"]
    [transaction] = [keys for keys in warnings if "pid" in keys]
    assert (transaction["pid"], transaction["application_name"], transaction["state"]) == (
        idle_pid,
        "forgotten psql",
        "idle in transaction",
    )
    assert [keys["table"] for keys in warnings if "table" in keys] == ["workers"]

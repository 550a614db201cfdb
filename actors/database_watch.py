"""The database watch: what Stockade cannot fix in its database, measured and said.

Every replica samples the oldest open transaction and the live and dead rows of
:data:`HOT_TABLES`, exports them, and warns once per crossing of a threshold
(:class:`runtime.settings.DatabaseWatchSettings`). Why, and what is said: docs/design.md,
"The database watch".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import attrs
import trio

from actors import queries
from runtime import log, metrics
from runtime.aio import ReadStore
from runtime.errors import DatabaseUnavailable
from runtime.loops import Periodic
from runtime.settings.control_plane import DatabaseWatchSettings

HOT_TABLES = ("assignments", "jobs", "lease", "workers")
"""The tables Stockade updates several times a second, whose dead rows are watched."""

OLDEST_TRANSACTION = "oldest_transaction"
"""The key of the open-transaction threshold among :func:`over_thresholds`' keys."""


def dead_rows_key(table: str) -> str:
    """The key of ``table``'s dead-rows threshold among :func:`over_thresholds`' keys."""
    return f"dead_rows:{table}"


@attrs.frozen(kw_only=True)
class OpenTransaction:
    """The oldest transaction open in the database (another session's)."""

    age_s: float
    """How long it has been open, in seconds (the server's clock)."""
    pid: int
    """Its session's server process id (``pg_terminate_backend(pid)`` ends it)."""
    application_name: str
    client: str
    """The client's address; empty for a Unix socket."""
    state: str
    """``idle in transaction``, ``active``, ...; empty where the role may not see it."""


@attrs.frozen(kw_only=True)
class TableRows:
    """One table's rows, as PostgreSQL's statistics last counted them."""

    table: str
    live_rows: int
    dead_rows: int


@attrs.frozen(kw_only=True)
class DatabaseSample:
    """One sample: the oldest open transaction (None: none) and the watched tables' rows."""

    oldest: OpenTransaction | None
    tables: tuple[TableRows, ...]


def dead_rows_over(rows: TableRows, settings: DatabaseWatchSettings) -> bool:
    """Whether ``rows`` holds more dead rows than ``dead_rows_warn_ratio`` times its live ones
    and more than ``dead_rows_warn_min``."""
    return rows.dead_rows > max(settings.dead_rows_warn_min, settings.dead_rows_warn_ratio * rows.live_rows)


def over_thresholds(sample: DatabaseSample, settings: DatabaseWatchSettings) -> frozenset[str]:
    """The thresholds ``sample`` is over: :data:`OLDEST_TRANSACTION` when its oldest open
    transaction is older than ``oldest_transaction_warn_s``, :func:`dead_rows_key` of each table
    :func:`dead_rows_over` holds for."""
    over = {dead_rows_key(rows.table) for rows in sample.tables if dead_rows_over(rows, settings)}
    if sample.oldest is not None and sample.oldest.age_s > settings.oldest_transaction_warn_s:
        over.add(OLDEST_TRANSACTION)
    return frozenset(over)


class WatchStore(Protocol):
    """What the watch reads."""

    async def sample(self, tables: Iterable[str]) -> DatabaseSample:
        """The oldest open transaction and the rows of ``tables``; raises DatabaseUnavailable."""

    async def close(self) -> None:
        """Close the store's connection (a later read opens another)."""


@attrs.define
class PgWatchStore(ReadStore):
    """:class:`WatchStore` on a read-only connection of its own (not the ledger's, not the
    ingest's pool), each read bounded by ``statement_timeout_s``."""

    def server_settings(self) -> dict[str, str]:
        return {**super().server_settings(), "default_transaction_read_only": "on"}

    async def sample(self, tables: Iterable[str]) -> DatabaseSample:
        conn = await self._connection()
        oldest = await conn.fetchrow(queries.OLDEST_TRANSACTION)
        rows = await conn.fetch(queries.TABLE_ROWS, list(tables))
        transaction = None
        if oldest is not None:
            age_s, pid = max(0.0, float(oldest["age_s"])), int(oldest["pid"])
            fields = {k: oldest[k] for k in ("application_name", "client", "state")}
            transaction = OpenTransaction(age_s=age_s, pid=pid, **fields)
        return DatabaseSample(
            oldest=transaction,
            tables=tuple(
                TableRows(table=r["table_name"], live_rows=int(r["live_rows"]), dead_rows=int(r["dead_rows"]))
                for r in rows
            ),
        )


@attrs.define
class DatabaseWatch:
    """The actor: samples every ``settings.sample_interval_s`` (the first at once), exports the
    sample, and logs each threshold crossed. It owns ``store`` and closes it on the way out."""

    settings: DatabaseWatchSettings
    store: WatchStore
    over: frozenset[str] = frozenset()
    """The thresholds the last sample was over (:func:`over_thresholds`)."""
    _log: Any = attrs.field(factory=lambda: log.get("database_watch"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample until cancelled."""
        ticks = Periodic(self.settings.sample_interval_s)
        task_status.started()
        try:
            while True:
                await ticks.tick()
                try:
                    sample = await self.store.sample(HOT_TABLES)
                except DatabaseUnavailable:
                    continue  # its connection logs the outage, once per change
                self.take(sample)
        finally:
            await self.store.close()

    def take(self, sample: DatabaseSample) -> None:
        """Export ``sample`` and log the thresholds it crossed since the last one."""
        metrics.DATABASE_OLDEST_TRANSACTION_SECONDS.set(0.0 if sample.oldest is None else sample.oldest.age_s)
        for rows in sample.tables:
            metrics.DATABASE_LIVE_ROWS.labels(rows.table).set(rows.live_rows)
            metrics.DATABASE_DEAD_ROWS.labels(rows.table).set(rows.dead_rows)
        over = over_thresholds(sample, self.settings)
        if OLDEST_TRANSACTION in over - self.over and sample.oldest is not None:
            oldest = sample.oldest
            self._log.warning(
                "a transaction has been open too long: vacuum cannot remove the dead rows of "
                "Stockade's tables meanwhile (end it, or its session: pg_terminate_backend(pid))",
                age_s=round(oldest.age_s, 1),
                pid=oldest.pid,
                application_name=oldest.application_name,
                client=oldest.client,
                state=oldest.state,
                oldest_transaction_warn_s=self.settings.oldest_transaction_warn_s,
            )
        elif OLDEST_TRANSACTION in self.over - over:
            self._log.info(
                "no transaction open too long any more",
                oldest_transaction_s=round(0.0 if sample.oldest is None else sample.oldest.age_s, 1),
                oldest_transaction_warn_s=self.settings.oldest_transaction_warn_s,
            )
        for rows in sample.tables:
            key = dead_rows_key(rows.table)
            facts = {
                "table": rows.table,
                "dead_rows": rows.dead_rows,
                "live_rows": rows.live_rows,
                "dead_rows_warn_ratio": self.settings.dead_rows_warn_ratio,
                "dead_rows_warn_min": self.settings.dead_rows_warn_min,
            }
            if key in over - self.over:
                self._log.warning(
                    "a table holds many dead rows: vacuum is held back (a transaction left open) or "
                    "cannot keep up, and every read of the table is slower",
                    **facts,
                )
            elif key in self.over - over:
                self._log.info("a table's dead rows are back under the threshold", **facts)
        self.over = over

"""The console's database reads: a small pool of its own, every page's reads bounded in time.

Its sessions run with ``default_transaction_read_only = on``; its pool is apart from the
ingest's, so a page never takes a connection a heartbeat needs. A page's reads run inside one
deadline (``read_timeout_s``); past it, or when the database cannot be reached,
:meth:`ConsoleStore.read` raises :class:`DatabaseDown` with the time the database was first found
unreachable (cleared by the next read that succeeds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from runtime import log
from runtime.aio import PgConnection, PgPool
from runtime.aio.pg import CALL_MARGIN_S
from runtime.errors import DatabaseRefused, DatabaseUnavailable, TemporaryError
from runtime.settings.control_plane import ConsoleSettings
from runtime.settings.fields import session_ms

__all__ = ["ConsoleStore", "DatabaseDown"]

T = TypeVar("T")

POOL_RETRY_S = 1.0
"""After a failed attempt to open the pool, the next one waits this long, in seconds (pages
meanwhile say the database is unreachable at once)."""


class DatabaseDown(TemporaryError):
    """The console's reads did not complete: the database is unreachable or did not answer in
    time; ``since_unix_s``: when it was first found unreachable (wall clock, Unix seconds)."""

    def __init__(self, message: str, *, since_unix_s: float) -> None:
        super().__init__(message)
        self.since_unix_s = since_unix_s


@attrs.define
class ConsoleStore:
    """The console's pool and the database's reachability as its reads found it; ``clock``:
    the wall clock, Unix seconds."""

    cp_id: str
    database_url: str
    settings: ConsoleSettings
    clock: Callable[[], float]
    down_since_unix_s: float | None = None
    """When the reads first failed, while they keep failing; None while they succeed."""
    last_error: str = ""
    """Why the last read failed."""
    _pool: PgPool | None = None
    _next_pool_attempt: float = attrs.field(default=-float("inf"))
    _log: Any = attrs.field(factory=lambda: log.get("console"))

    async def _get_pool(self) -> PgPool:
        if self._pool is not None:
            return self._pool
        if trio.current_time() < self._next_pool_attempt:
            raise DatabaseUnavailable(self.last_error or "the database is unreachable")
        try:
            self._pool = await PgPool.create(
                self.database_url,
                size=self.settings.pool_size,
                min_size=1,
                owner="console",
                server_settings={
                    "application_name": f"stockade {self.cp_id} console",
                    "statement_timeout": session_ms(self.settings.read_timeout_s),
                    "default_transaction_read_only": "on",
                },
                connect_timeout_s=self.settings.read_timeout_s,
                call_timeout_s=self.settings.read_timeout_s + CALL_MARGIN_S,
            )
        except BaseException:
            self._next_pool_attempt = trio.current_time() + POOL_RETRY_S
            raise
        return self._pool

    async def read(self, body: Callable[[PgConnection], Awaitable[T]]) -> T:
        """``body`` on one of the console's connections, within ``read_timeout_s``; raises
        DatabaseDown when the database cannot be reached, refused this client, or did not answer."""
        error = ""
        with trio.move_on_after(self.settings.read_timeout_s):
            try:
                pool = await self._get_pool()
                async with pool.acquire() as conn:
                    result = await body(conn)
            except (DatabaseUnavailable, DatabaseRefused) as exc:
                error = str(exc)
            else:
                self._succeeded()
                return result
        error = error or f"the database did not answer within {self.settings.read_timeout_s:g} s"
        raise self._failed(error)

    def _succeeded(self) -> None:
        if self.down_since_unix_s is not None:
            self._log.info("database reachable again", down_s=round(self.clock() - self.down_since_unix_s, 1))
        self.down_since_unix_s = None
        self.last_error = ""

    def _failed(self, error: str) -> DatabaseDown:
        if self.down_since_unix_s is None:
            self.down_since_unix_s = self.clock()
            self._log.warning("database unreachable", error=error)
        self.last_error = error
        return DatabaseDown(error, since_unix_s=self.down_since_unix_s)

    async def close(self) -> None:
        """Close the pool (shielded); a later read opens another."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

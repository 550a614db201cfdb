"""The lease keeper: takeover, renewal, local step-down, clean release.

A standby tries every ``takeover_poll_s`` to take the lease, which succeeds only once the
lease has expired by database time (:data:`actors.queries.TAKE_OVER_LEASE`), bumping the epoch.
The leader renews every ``renew_interval_s``; a renewal that finds no row means another
replica took over (deposed). The leader also steps down on its own once its last successful
renewal was *sent* more than ``lease_ttl_s - step_down_margin_s`` ago by the local monotonic
clock: the database set ``expires_at`` from a ``now()`` no earlier than that send, so the
replica stops deciding before its lease can have expired. That is liveness only: every
decision is fenced by the epoch in the ledger, whatever this actor believes.

Publishes :class:`Elected` / :class:`Deposed` (with an increasing ``seq``) to its subscribers;
answers :class:`QueryRole`; steps down on :class:`EpochSuperseded`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

from actors import queries
from actors.messages import Deposed, Elected, EpochSuperseded, LeaseInbox, QueryRole, RoleChange
from runtime import log
from runtime.aio import PgConnection
from runtime.errors import DatabaseUnavailable
from runtime.settings import LeaseSettings


class LeaseStore(Protocol):
    """The lease row, as the lease keeper needs it. Times are database time."""

    async def take_over(self, holder: str, ttl_s: float) -> int | None:
        """Take the lease if expired; the new epoch, or None when it is still held."""

    async def renew(self, holder: str, epoch: int, ttl_s: float) -> bool:
        """Extend our lease; False when ``(holder, epoch)`` no longer holds it."""

    async def release(self, holder: str, epoch: int) -> None:
        """Expire our lease now so a standby takes over at once."""

    async def close(self) -> None:
        """Drop the connection."""


@attrs.define
class PgLeaseStore:
    """:class:`LeaseStore` on its own PostgreSQL connection, reconnecting after a failure."""

    database_url: str
    application_name: str
    statement_timeout_s: float
    _conn: PgConnection | None = None

    async def _connection(self) -> PgConnection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await PgConnection.connect(
                self.database_url,
                server_settings={
                    "application_name": self.application_name,
                    "statement_timeout": str(int(self.statement_timeout_s * 1000)),
                },
                connect_timeout_s=self.statement_timeout_s,
            )
        return self._conn

    async def take_over(self, holder: str, ttl_s: float) -> int | None:
        conn = await self._connection()
        epoch = await conn.fetchval(queries.TAKE_OVER_LEASE, holder, ttl_s)
        return None if epoch is None else int(epoch)

    async def renew(self, holder: str, epoch: int, ttl_s: float) -> bool:
        conn = await self._connection()
        return await conn.fetchval(queries.RENEW_LEASE, holder, epoch, ttl_s) is not None

    async def release(self, holder: str, epoch: int) -> None:
        conn = await self._connection()
        await conn.execute(queries.RELEASE_LEASE, holder, epoch)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


@attrs.define
class LeaseKeeper:
    """The actor. Construct with its store factory, inbox and subscribers; run with ``run``."""

    cp_id: str
    settings: LeaseSettings
    open_store: Callable[[], Awaitable[LeaseStore]]
    inbox: trio.MemoryReceiveChannel[LeaseInbox]
    subscribers: Sequence[trio.MemorySendChannel[RoleChange]]
    epoch: int | None = None
    """The epoch we lead under, or None while standby."""
    last_renew_sent: float = 0.0
    """trio time at which the last successful takeover or renewal was sent."""
    _seq: int = 0
    _role: RoleChange | None = None
    _leader_wait: trio.CancelScope | None = None
    _log: object = attrs.field(factory=lambda: log.get("lease"))

    # ------------------------------------------------------------ role changes

    def _publish(self, change: RoleChange) -> None:
        self._role = change
        for channel in self.subscribers:
            try:
                channel.send_nowait(change)
            except trio.WouldBlock:
                # The subscriber is restarting or stuck; it asks QueryRole when it starts,
                # and fencing keeps a stale view harmless.
                self._log.warning("role change not delivered: subscriber inbox full")  # type: ignore[attr-defined]

    def _elect(self, epoch: int) -> None:
        self.epoch = epoch
        self._seq += 1
        self._log.info("elected", epoch=epoch)  # type: ignore[attr-defined]
        self._publish(Elected(seq=self._seq, epoch=epoch))

    def _depose(self, reason: str) -> None:
        epoch = self.epoch or 0
        self.epoch = None
        self._seq += 1
        self._log.warning("deposed", epoch=epoch, reason=reason)  # type: ignore[attr-defined]
        self._publish(Deposed(seq=self._seq, epoch=epoch, reason=reason))
        if self._leader_wait is not None:
            self._leader_wait.cancel()

    # ------------------------------------------------------------ the actor

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep (or wait for) the lease until cancelled; release it on the way out."""
        store = await self.open_store()
        self.epoch = None
        self._seq += 1
        self._publish(Deposed(seq=self._seq, epoch=0, reason="starting"))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._serve_inbox)
                task_status.started()
                await self._keep(store)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(self.settings.statement_timeout_s):
                if self.epoch is not None:
                    try:
                        await store.release(self.cp_id, self.epoch)
                        self._log.info("released lease", epoch=self.epoch)  # type: ignore[attr-defined]
                    except DatabaseUnavailable:
                        pass
                await store.close()

    async def _serve_inbox(self) -> None:
        async for message in self.inbox:
            match message:
                case QueryRole(reply=reply):
                    assert self._role is not None
                    reply.set(self._role)
                case EpochSuperseded(epoch=epoch, epoch_seen=seen):
                    if self.epoch is not None and self.epoch == epoch and seen > epoch:
                        self._depose(f"epoch {seen} seen, ours is {epoch}")

    async def _keep(self, store: LeaseStore) -> None:
        s = self.settings
        while True:
            if self.epoch is None:
                sent = trio.current_time()
                epoch: int | None = None
                with trio.move_on_after(s.statement_timeout_s):
                    try:
                        epoch = await store.take_over(self.cp_id, s.lease_ttl_s)
                    except DatabaseUnavailable as exc:
                        self._log.warning("takeover attempt failed", error=str(exc))  # type: ignore[attr-defined]
                if epoch is not None:
                    self.last_renew_sent = sent
                    self._elect(epoch)
                else:
                    await trio.sleep(s.takeover_poll_s)
                continue
            await self._renew_once(store)

    async def _renew_once(self, store: LeaseStore) -> None:
        s = self.settings
        assert self.epoch is not None
        epoch = self.epoch
        step_down_at = self.last_renew_sent + s.lease_ttl_s - s.step_down_margin_s
        with trio.CancelScope() as wait:
            self._leader_wait = wait
            await trio.sleep_until(self.last_renew_sent + s.renew_interval_s)
        self._leader_wait = None
        if self.epoch != epoch:
            return  # deposed while waiting
        while trio.current_time() < step_down_at:
            sent = trio.current_time()
            renewed: bool | None = None
            with trio.move_on_at(step_down_at):
                try:
                    renewed = await store.renew(self.cp_id, epoch, s.lease_ttl_s)
                except DatabaseUnavailable as exc:
                    self._log.warning("renewal failed", error=str(exc))  # type: ignore[attr-defined]
                    await trio.sleep(min(0.05, s.renew_interval_s))
                    continue
            if renewed is None:
                break
            if not renewed:
                self._depose("lease taken by another replica")
                return
            if self.epoch == epoch:
                self.last_renew_sent = sent
            return
        if self.epoch == epoch:
            self._depose("renewal did not succeed within lease_ttl_s - step_down_margin_s")


def open_pg_store(
    cp_id: str, database_url: str, settings: LeaseSettings
) -> Callable[[], Awaitable[LeaseStore]]:
    """A store factory for :class:`LeaseKeeper` on a real database."""

    async def open_store() -> LeaseStore:
        return PgLeaseStore(
            database_url=database_url,
            application_name=f"stockade {cp_id} lease",
            statement_timeout_s=settings.statement_timeout_s,
        )

    return open_store

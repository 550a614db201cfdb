"""The lease keeper: takeover, renewal, local step-down, clean release.

Publishes :class:`Elected` / :class:`Deposed` (with an increasing ``seq``) to its subscribers,
answers :class:`QueryRole`, steps down on :class:`EpochSuperseded`. Liveness only: every decision
is fenced by the epoch in the ledger. docs/design.md, "The lease keeper".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any, Protocol, TypeVar

import attrs
import trio

from actors import queries
from actors.messages import Deposed, Elected, EpochSuperseded, LeaseInbox, QueryRole, RoleChange
from runtime import log, metrics
from runtime.aio import PgConnection, ReconnectingConnection
from runtime.aio.pg import CALL_MARGIN_S
from runtime.errors import DatabaseBusy, DatabaseUnavailable
from runtime.settings.fields import session_ms
from runtime.settings.leader import LeaseSettings

T_contra = TypeVar("T_contra", contravariant=True)


class SendNowait(Protocol[T_contra]):
    """Where role changes go: a memory channel's send side, or one on another loop
    (:class:`runtime.threads.CrossLoopSender`). Raises ``trio.WouldBlock`` when full."""

    def send_nowait(self, value: T_contra, /) -> None: ...


class LeaseStore(Protocol):
    """The lease row, as the lease keeper needs it. Times are database time."""

    async def try_take_over(self, holder: str, ttl_s: float) -> int | None:
        """Take the lease if it expired or its holder's session is gone; the new epoch, or None."""

    async def renew(self, holder: str, epoch: int, ttl_s: float) -> bool:
        """Extend our lease; False when ``(holder, epoch)`` no longer holds it."""

    async def release(self, holder: str, epoch: int) -> None:
        """Expire our lease now and let go of its lock, so a standby takes over at once."""

    async def relinquish(self, epoch: int) -> None:
        """Let go of the epoch's lock after stepping down (the lease row stays as it is)."""

    async def close(self) -> None:
        """Drop the connection."""


@attrs.define
class PgLeaseStore:
    """:class:`LeaseStore` on its own reconnecting PostgreSQL connection, which is also the
    leader's proof of life: it holds the advisory lock of the epoch it leads (taken again after
    a reconnect before renewing)."""

    database_url: str
    application_name: str
    statement_timeout_s: float
    _db: ReconnectingConnection = attrs.field(init=False)
    _conn: PgConnection | None = None
    _locked_epochs: set[int] = attrs.field(factory=set)

    def __attrs_post_init__(self) -> None:
        self._db = ReconnectingConnection(
            self.database_url,
            {
                "application_name": self.application_name,
                "statement_timeout": session_ms(self.statement_timeout_s),
            },
            owner="lease",
            connect_timeout_s=self.statement_timeout_s,
            call_timeout_s=self.statement_timeout_s + CALL_MARGIN_S,
        )

    async def _connection(self) -> PgConnection:
        conn = await self._db.get()
        if conn is not self._conn:
            self._locked_epochs.clear()  # a new session holds no lock
            self._conn = conn
        return conn

    async def try_take_over(self, holder: str, ttl_s: float) -> int | None:
        conn = await self._connection()
        probe = await conn.fetchrow(queries.PROBE_LEASE, queries.LEASE_LOCK_SPACE)
        assert probe is not None
        seen, orphaned = int(probe["epoch"]), bool(probe["orphaned"])
        try:
            if not (probe["expired"] or orphaned):
                return None
            row = await conn.fetchrow(queries.TAKE_OVER_LEASE, holder, ttl_s, seen, orphaned)
        finally:
            if orphaned:
                await conn.fetchval(queries.UNLOCK_LEASE_LOCK, queries.LEASE_LOCK_SPACE, seen)
        if row is None:
            return None
        epoch = int(row["epoch"])
        self._locked_epochs.add(epoch)
        return epoch

    async def renew(self, holder: str, epoch: int, ttl_s: float) -> bool:
        conn = await self._connection()
        if epoch not in self._locked_epochs:
            if not await conn.fetchval(queries.TRY_LEASE_LOCK, queries.LEASE_LOCK_SPACE, epoch):
                # Held by our previous session, not yet gone, or by a standby taking over:
                # try again shortly; the keeper steps down if it does not clear in time.
                raise DatabaseUnavailable(f"the lock of epoch {epoch} is held by another session")
            self._locked_epochs.add(epoch)
        return await conn.fetchval(queries.RENEW_LEASE, holder, epoch, ttl_s) is not None

    async def release(self, holder: str, epoch: int) -> None:
        conn = await self._connection()
        await conn.execute(queries.RELEASE_LEASE, holder, epoch)
        await self.relinquish(epoch)

    async def relinquish(self, epoch: int) -> None:
        if epoch in self._locked_epochs and self._conn is not None and not self._conn.is_closed():
            self._locked_epochs.discard(epoch)
            await self._conn.fetchval(queries.UNLOCK_LEASE_LOCK, queries.LEASE_LOCK_SPACE, epoch)

    async def close(self) -> None:
        await self._db.close()
        self._conn = None
        self._locked_epochs.clear()


@attrs.define
class LeaseKeeper:
    """The actor. Construct with its store factory, inbox and subscribers; run with ``run``."""

    cp_id: str
    settings: LeaseSettings
    open_store: Callable[[], Awaitable[LeaseStore]]
    inbox: trio.MemoryReceiveChannel[LeaseInbox]
    subscribers: Sequence[SendNowait[RoleChange]]
    main_loop_silent_s: Callable[[], float] | None = None
    """Seconds since the process's main loop last ran (None: not watched)."""
    epoch: int | None = None
    """The epoch we lead under, or None while standby."""
    last_renew_sent: float = 0.0
    """trio time at which the last successful takeover or renewal was sent."""
    _seq: int = 0
    _role: RoleChange | None = None
    _leader_wait: trio.CancelScope | None = None
    _relinquish: list[int] = attrs.field(factory=list)
    """Epochs we stopped leading whose advisory lock we still have to let go of."""
    _takeover_failing: bool = False
    """Whether the last takeover probe failed."""
    _log: Any = attrs.field(factory=lambda: log.get("lease"))

    def _publish(self, change: RoleChange) -> None:
        self._role = change
        for channel in self.subscribers:
            try:
                channel.send_nowait(change)
            except trio.WouldBlock:
                # The subscriber is restarting or stuck; it asks QueryRole when it starts,
                # and fencing keeps a stale view harmless.
                self._log.warning("role change not delivered: subscriber inbox full")

    def _elect(self, epoch: int) -> None:
        self.epoch = epoch
        metrics.LEASE_ELECTIONS.inc()
        metrics.LEASE_EPOCH.set(epoch)
        self._log.info("elected", epoch=epoch)
        self._publish(Elected(seq=self._next_seq(), epoch=epoch))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _depose(self, cause: str, reason: str) -> None:
        """Stop leading: publish :class:`Deposed` with ``reason`` (words for the logs and the
        subscribers), counted by ``cause`` (one of :data:`runtime.metrics.STEP_DOWN_CAUSES`)."""
        epoch = self.epoch or 0
        self.epoch = None
        metrics.LEASE_STEP_DOWNS.labels(cause).inc()
        metrics.LEASE_EPOCH.set(0)
        self._log.warning("deposed", epoch=epoch, reason=reason)
        self._publish(Deposed(seq=self._next_seq(), epoch=epoch, reason=reason))
        if epoch:
            self._relinquish.append(epoch)
        if self._leader_wait is not None:
            self._leader_wait.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep (or wait for) the lease until cancelled; release it on the way out."""
        store = await self.open_store()
        self.epoch = None
        self._publish(Deposed(seq=self._next_seq(), epoch=0, reason="starting"))
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
                        metrics.LEASE_STEP_DOWNS.labels("released").inc()
                        metrics.LEASE_EPOCH.set(0)
                        self._log.info("released lease", epoch=self.epoch)
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
                        self._depose("epoch_superseded", f"epoch {seen} seen, ours is {epoch}")

    def _main_loop_stalled(self) -> float | None:
        """Seconds the main loop has been silent, when longer than allowed; else None."""
        if self.main_loop_silent_s is None:
            return None
        silent_s = self.main_loop_silent_s()
        return silent_s if silent_s > self.settings.max_main_loop_stall_s else None

    async def _keep(self, store: LeaseStore) -> None:
        s = self.settings
        while True:
            if self.epoch is None and self._main_loop_stalled() is not None:
                await trio.sleep(s.takeover_poll_s)  # cannot decide: do not take the lease
                continue
            if self.epoch is None:
                while self._relinquish:
                    with trio.move_on_after(s.statement_timeout_s):
                        with suppress(DatabaseUnavailable):  # a broken connection has let go of it already
                            await store.relinquish(self._relinquish[0])
                    self._relinquish.pop(0)
                sent = trio.current_time()
                epoch: int | None = None
                with trio.move_on_after(s.statement_timeout_s):
                    try:
                        epoch = await store.try_take_over(self.cp_id, s.lease_ttl_s)
                        self._takeover_failing = False
                    except DatabaseUnavailable as exc:
                        # A lost database is logged by the store's connection, once per change
                        # (runtime.outage); a busy one here, once per run of failed probes.
                        if isinstance(exc, DatabaseBusy) and not self._takeover_failing:
                            self._log.warning("takeover attempt failed", error=str(exc))
                        self._takeover_failing = True
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
        stalled_s = self._main_loop_stalled()
        if stalled_s is not None:
            limit = f"max_main_loop_stall_s {self.settings.max_main_loop_stall_s:g}"
            self._depose("main_loop_stalled", f"the main loop has not run for {stalled_s:.1f} s ({limit})")
            return
        failures = 0
        while trio.current_time() < step_down_at:
            sent = trio.current_time()
            renewed: bool | None = None
            with trio.move_on_at(step_down_at):
                try:
                    renewed = await store.renew(self.cp_id, epoch, s.lease_ttl_s)
                except DatabaseUnavailable as exc:
                    failures += 1
                    if failures == 1:  # the retries until step-down say nothing new
                        self._log.warning("renewal failed", error=str(exc))
                    await trio.sleep(min(s.renew_retry_s, s.renew_interval_s))
                    continue
            if renewed is None:
                break
            metrics.LEASE_RENEWAL_SECONDS.observe(trio.current_time() - sent)
            if not renewed:
                self._depose("deposed", "lease taken by another replica")
                return
            if self.epoch == epoch:
                self.last_renew_sent = sent
            return
        if self.epoch == epoch:
            self._depose("renewal_late", "renewal did not succeed within lease_ttl_s - step_down_margin_s")


def open_pg_store(
    cp_id: str, database_url: str, settings: LeaseSettings
) -> Callable[[], Awaitable[LeaseStore]]:
    """A store factory for :class:`LeaseKeeper` on a real database."""

    async def open_store() -> LeaseStore:
        name = f"stockade {cp_id} lease"
        return PgLeaseStore(
            database_url, application_name=name, statement_timeout_s=settings.statement_timeout_s
        )

    return open_store

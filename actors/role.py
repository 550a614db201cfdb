"""Following the lease keeper's role changes from another actor.

A deciding actor asks :class:`QueryRole` when it (re)starts, then applies the changes from its
role channel whose ``seq`` is newer. The view is advisory: the ledger's fence decides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import trio

from actors.messages import Deposed, Elected, LeaseInbox, QueryRole, RoleChange
from runtime.loops import Periodic
from runtime.reply import Reply


@attrs.define
class RoleView:
    """The latest role this actor knows: ``epoch`` while leader, else None."""

    changes: trio.MemoryReceiveChannel[RoleChange]
    lease_inbox: trio.MemorySendChannel[LeaseInbox]
    epoch: int | None = None
    seq: int = -1
    elected: trio.Event = attrs.field(factory=trio.Event)
    """Set whenever we become leader (replaced with a fresh event when deposed)."""

    def apply(self, change: RoleChange) -> bool:
        """Apply ``change`` if newer; True when it changed the view."""
        if change.seq <= self.seq:
            return False
        self.seq = change.seq
        match change:
            case Elected(epoch=epoch):
                self.epoch = epoch
                self.elected.set()
            case Deposed():
                self.epoch = None
                if self.elected.is_set():
                    self.elected = trio.Event()
        return True

    async def query(self) -> None:
        """Ask the lease keeper for the current role and apply it."""
        reply: Reply[RoleChange] = Reply()
        await self.lease_inbox.send(QueryRole(reply=reply))
        self.apply(await reply.wait())

    async def follow(self) -> None:
        """Apply role changes as they arrive, forever."""
        async for change in self.changes:
            self.apply(change)

    async def every_interval_while_leader(
        self,
        interval_s: float,
        step: Callable[[int], Awaitable[object]],
        *,
        on_standby: Callable[[], None] | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """A deciding actor's loop: ask for the role, follow its changes, then call
        ``step(epoch)`` every ``interval_s`` seconds (at a fixed rate) while leader, the first at
        once after each election, until cancelled; an error ``step`` raises ends the loop.
        ``on_standby`` (no checkpoint) is called whenever the loop starts waiting for an election.
        """
        await self.query()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.follow)
            task_status.started()
            ticks = Periodic(interval_s)
            while True:
                if self.epoch is None:
                    if on_standby is not None:
                        on_standby()
                    await self.elected.wait()
                    ticks.restart()
                await ticks.tick()
                epoch = self.epoch
                if epoch is not None:
                    await step(epoch)

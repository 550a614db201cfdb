"""How many rows a decider puts in its next fenced write.

A fenced write holds the lease's share lock, so the ledger's session cancels a statement at
``statement_timeout_s``; on a saturated database a full write (``max_rows_per_fenced_write``)
would be cancelled on every try. So a decider sizes its writes as TCP sizes its congestion
window (RFC 5681, section 3.1: additive increase, multiplicative decrease): half the rows after a
write the server cancelled (:class:`runtime.errors.DatabaseBusy`), an eighth of the ceiling more
after each that went through. docs/design.md, "How decisions are fenced"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import trio

from actors.messages import LedgerInbox
from runtime.errors import DatabaseBusy, InvalidArgument
from runtime.reply import Reply
from runtime.settings.leader import DEFAULT_MAX_ROWS_PER_FENCED_WRITE


@attrs.frozen
class WriteSize:
    """The rows of the next fenced write: ``rows``, between 1 and ``most``."""

    rows: int
    most: int

    def __attrs_post_init__(self) -> None:
        if self.most < 1:
            raise InvalidArgument("most", self.most, "must be >= 1")
        if not 1 <= self.rows <= self.most:
            raise InvalidArgument("rows", self.rows, f"must be between 1 and most = {self.most}")

    @classmethod
    def full(cls, most: int) -> WriteSize:
        """Start at the ceiling, ``most`` rows."""
        return cls(most, most)

    def after_success(self) -> WriteSize:
        """After a write that went through: an eighth of ``most`` more (at least one), up to it."""
        return WriteSize(min(self.most, self.rows + max(1, self.most // 8)), self.most)

    def after_cancel(self) -> WriteSize:
        """After a write the server cancelled: half as many rows, at least one."""
        return WriteSize(max(1, self.rows // 2), self.most)


@attrs.define(kw_only=True)
class FencedWrites:
    """A decider's fenced writes (the base of the placer and the reconciler): asked of the
    ledger one at a time, each of at most :meth:`write_size` rows, the next sized by how the
    last one went."""

    ledger: trio.MemorySendChannel[LedgerInbox]
    max_rows_per_fenced_write: int = DEFAULT_MAX_ROWS_PER_FENCED_WRITE
    """Most rows one fenced write may carry (the ledger's ``max_rows_per_fenced_write``)."""
    _write_size: WriteSize | None = None

    def write_size(self) -> WriteSize:
        """How many rows the next fenced write may carry."""
        if self._write_size is None or self._write_size.most != self.max_rows_per_fenced_write:
            self._write_size = WriteSize.full(self.max_rows_per_fenced_write)
        return self._write_size

    async def write(self, message_of: Callable[[Reply[Any]], LedgerInbox]) -> Any:
        """Ask the ledger for one fenced write (``message_of`` builds it around its reply) and
        size the next one by how this one went.

        Raises:
            StaleEpoch, DatabaseUnavailable: as the ledger answered (DatabaseBusy: the server
                cancelled the write; the next one is half as large).
        """
        reply: Reply[Any] = Reply()
        await self.ledger.send(message_of(reply))
        try:
            result = await reply.wait()
        except DatabaseBusy:
            self._write_size = self.write_size().after_cancel()
            raise
        self._write_size = self.write_size().after_success()
        return result

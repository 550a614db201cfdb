"""How many rows a decider puts in its next fenced write.

A fenced write holds the lease's share lock while it runs, and the ledger's session cancels a
statement at ``LedgerSettings.statement_timeout_s`` so that it never holds it long enough to
cost the leader its renewal (docs/design.md, "How decisions are fenced"). At most
``max_rows_per_fenced_write`` rows keeps a write far inside that on a machine with CPU to spare
(500 rows: 10 to 40 ms on the 2-core VM), but not on a saturated one: in a cluster of 3,000
running sleep jobs on that VM a row cost about 0.4 ms, 500 rows passed 0.2 s, and a write of
that size would be cancelled on every try, however often it was tried. So a decider sizes its
writes the way TCP sizes its congestion window (RFC 5681, section 3.1: additive increase,
multiplicative decrease): it halves the rows after a write the server cancelled
(:class:`runtime.errors.DatabaseBusy`) and adds an eighth of the ceiling after each write that
went through. A slow database then gets writes it can finish, each still fenced and still
bounded in time; a fast one soon gets full ones again."""

from __future__ import annotations

import attrs

from runtime.errors import InvalidArgument


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
        """After a write that went through: an eighth of ``most`` more (at least one), up to
        ``most``."""
        return WriteSize(min(self.most, self.rows + max(1, self.most // 8)), self.most)

    def after_cancel(self) -> WriteSize:
        """After a write the server cancelled (too slow, or a lock it waited for): half as many
        rows, at least one."""
        return WriteSize(max(1, self.rows // 2), self.most)

"""The placer's mark for its incremental read of pending jobs, against a model of PostgreSQL's
snapshots: whatever order transactions take sequence numbers, commit or abort in, every job a
committed transaction made pending is read exactly once, by the first read after its commit
(or, when reads stop at a limit, by the reads that follow)."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.placer_store import PendingMark

Key = tuple[int, int]
"""A pending row's (pending_xid, pending_seq)."""


@attrs.define
class Database:
    """Transactions that insert pending jobs, as PostgreSQL sees them: a transaction gets its
    id at its first write, in order; ``nextval`` hands out sequence numbers in the order asked;
    a snapshot shows every transaction that ended before it (committed: its rows) and lists
    the ones in progress (xip) and the next id to assign (xmax)."""

    next_xid: int = 100
    next_seq: int = 1
    open: list[list[Key]] = attrs.field(factory=list)
    """Open transactions, each the rows it wrote (empty: no id yet)."""
    committed: list[Key] = attrs.field(factory=list)
    committed_at_read: dict[Key, int] = attrs.field(factory=dict)
    """Each committed row, and how many reads had begun before its commit."""
    reads: int = 0

    def write(self, tx: int) -> None:
        rows = self.open[tx]
        xid = rows[0][0] if rows else self.next_xid
        if not rows:
            self.next_xid += 1
        rows.append((xid, self.next_seq))
        self.next_seq += 1

    def end(self, tx: int, *, commit: bool) -> None:
        rows = self.open.pop(tx)
        if commit:
            self.committed += rows
            self.committed_at_read.update(dict.fromkeys(rows, self.reads))

    def read(self, mark: PendingMark, limit: int) -> tuple[list[Key], PendingMark]:
        """ROUND_READ's pending part in one snapshot, and the mark after it."""
        self.reads += 1
        above = sorted(k for k in self.committed if k > (mark.xid, mark.seq))[:limit]
        late = [k for k in self.committed if k[0] in mark.in_flight and k <= (mark.xid, mark.seq)]
        xip = [rows[0][0] for rows in self.open if rows]
        after = mark.after_read(
            last_read=above[-1] if len(above) >= limit else None,
            snapshot_xmax=self.next_xid,
            snapshot_xip=xip,
        )
        return above + late, after


steps = st.lists(
    st.tuples(st.sampled_from(["begin", "write", "commit", "abort", "read"]), st.integers(0, 7)),
    max_size=80,
)


def run(ops: list[tuple[str, int]], limit: int) -> tuple[Database, dict[Key, list[int]]]:
    """Play ``ops`` (the number picks an open transaction), then read until a read returns
    nothing with none open; returns the database and, per row, the reads that returned it."""
    db = Database()
    mark = PendingMark()
    returned: dict[Key, list[int]] = {}

    def read() -> int:
        nonlocal mark
        rows, mark = db.read(mark, limit)
        for key in rows:
            returned.setdefault(key, []).append(db.reads)
        return len(rows)

    for op, n in ops:
        if op == "begin":
            db.open.append([])
        elif op == "read":
            read()
        elif db.open:
            tx = n % len(db.open)
            if op == "write":
                db.write(tx)
            else:
                db.end(tx, commit=op == "commit")
    while db.open:
        db.end(0, commit=True)
    while read():
        pass
    return db, returned


@settings(max_examples=examples(400), deadline=None)
@given(steps)
def test_every_committed_job_is_read_once_by_the_first_read_after_its_commit(
    ops: list[tuple[str, int]],
) -> None:
    """Reads without a limit: each committed row is returned exactly once, by the first read
    that began after its transaction committed; no aborted row is returned."""
    db, returned = run(ops, limit=10**9)
    assert set(returned) == set(db.committed)
    for key, reads in returned.items():
        assert reads == [db.committed_at_read[key] + 1], key


@settings(max_examples=examples(400), deadline=None)
@given(steps, st.integers(1, 3))
def test_reads_that_stop_at_a_limit_still_read_every_committed_job_once(
    ops: list[tuple[str, int]], limit: int
) -> None:
    """Reads that return at most ``limit`` rows above the mark: each committed row is still
    returned exactly once, and none before its commit."""
    db, returned = run(ops, limit=limit)
    assert set(returned) == set(db.committed)
    for key, reads in returned.items():
        assert len(reads) == 1 and reads[0] > db.committed_at_read[key], key


def test_a_lower_seq_committed_after_a_higher_one_is_read_next() -> None:
    """The issue's case: seq 1's transaction is still open when seq 2's commits and is read;
    it commits afterwards and the next read returns it."""
    db = Database()
    db.open += [[], []]
    db.write(0)  # seq 1, xid 100
    db.write(1)  # seq 2, xid 101
    db.end(1, commit=True)
    rows, mark = db.read(PendingMark(), 100)
    assert rows == [(101, 2)] and mark == PendingMark(xid=102, seq=0, in_flight=(100,))
    db.end(0, commit=True)
    rows, mark = db.read(mark, 100)
    assert rows == [(100, 1)] and mark == PendingMark(xid=102, seq=0, in_flight=())


def test_a_mark_moves_to_the_snapshots_xmax_or_the_last_row_of_a_full_read() -> None:
    """Without a limit reached the mark moves to (xmax, 0) and keeps the in-progress ids below
    it; a read that filled its limit moves it to its last row and keeps only those below."""
    mark = PendingMark(xid=10, seq=3, in_flight=(7,))
    assert mark.after_read(last_read=None, snapshot_xmax=20, snapshot_xip=[12, 7]) == PendingMark(
        xid=20, seq=0, in_flight=(7, 12)
    )
    assert mark.after_read(last_read=(15, 9), snapshot_xmax=20, snapshot_xip=[12, 17]) == PendingMark(
        xid=15, seq=9, in_flight=(12,)
    )

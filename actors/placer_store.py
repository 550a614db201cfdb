"""What a placer round reads (:class:`PlacerStore`), and the store that reads it on a connection
of its own (:class:`PgPlacerStore`). :class:`PendingMark` marks where the next incremental read
of pending jobs begins.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import attrs
import trio

from actors import queries
from actors.fair_share import AccountShare
from actors.gang_queue import GangTask
from actors.messages import WorkerRef
from actors.pending_queue import PendingJob
from actors.preemption import Running, Shares
from actors.quotas import AccountQuota
from actors.rooms import WorkerRoom
from actors.rows import flags, ints, parallel, records
from runtime.aio import ReadStore
from runtime.constraints import Constraint
from runtime.settings.leader import PlacerSettings

ROWS_PER_STEP = 2000
"""Pending-job rows the full read turns into objects between two checkpoints (about 4 ms)."""


@attrs.frozen(kw_only=True)
class LiveWorker:
    """A live worker as the placer reads it."""

    ref: WorkerRef
    room: WorkerRoom
    unconfirmed: int = 0
    """Its incarnation's active assignments no heartbeat has listed yet."""
    confirmed: int = 0
    """Its incarnation's assignments a heartbeat has listed (running or finished) so far."""
    cordoned: bool = False
    """Cordoned or draining: never placed on; read so that an unschedulable reason names it."""
    unhealthy: bool = False
    """Marked unhealthy (:mod:`actors.health`): placed on only while its probe is due."""
    probe_due: bool = False
    """Unhealthy and its probe is due (``workers.unhealthy_probe_at`` has passed)."""
    trial: bool = False
    """On trial (newly registered, or its unhealthy mark cleared, and no run there since has
    succeeded or run ``trial_run_s``): placed on one job at a time."""


@attrs.frozen(kw_only=True)
class WaitingJob:
    """A pending job, the reason currently stored for it, and how long it must still wait for
    its requeue backoff (seconds, by database time at the read)."""

    job: PendingJob
    reason: str
    wait_s: float = 0.0
    gang: GangTask | None = None
    """A gang's task: placed only with all of its gang's tasks (actors/gang_queue.py); None: a job."""


@attrs.frozen(kw_only=True)
class PendingMark:
    """Where the placer's next incremental read of pending jobs begins: every job whose
    ``(pending_xid, pending_seq)`` is above ``(xid, seq)``, and those at or below it that a
    transaction in ``in_flight`` (below ``xid``, in progress at the last read) made pending;
    ``xid`` 0 before any read (docs/design.md, "The placer's incremental read")."""

    xid: int = 0
    seq: int = 0
    in_flight: tuple[int, ...] = ()

    def after_read(
        self, *, last_read: tuple[int, int] | None, snapshot_xmax: int, snapshot_xip: Iterable[int]
    ) -> PendingMark:
        """The mark after a read from this one, given the read's ``pg_snapshot_xmax`` and
        ``pg_snapshot_xip``; ``last_read``: the last ``(pending_xid, pending_seq)`` read above
        this mark when the read stopped at its limit, None when it returned every job above."""
        xid, seq = last_read if last_read is not None else (snapshot_xmax, 0)
        return PendingMark(xid=xid, seq=seq, in_flight=tuple(sorted(x for x in set(snapshot_xip) if x < xid)))


class PlacerStore(Protocol):
    """What a round reads."""

    quotas: dict[str, AccountQuota]
    """The capped accounts' caps and use, by name, as of the last :meth:`live_workers` or
    :meth:`read_round` (read with the workers; docs/quotas.md)."""
    with_account_use: bool
    """Whether :meth:`read_round` also reads what each account's jobs hold (fair share); the
    placer sets it before the read."""
    account_use: dict[str, AccountShare] | None
    """What the last :meth:`read_round` read of each account's use and weight (as
    :meth:`account_shares` without the past use), by name; None when it read none (or the last
    read was :meth:`live_workers`)."""

    async def live_workers(self, fresh_s: float) -> list[LiveWorker]:
        """Alive workers heard from within ``fresh_s`` seconds (database time), cordoned and
        unhealthy ones included and marked."""

    async def pending_jobs(self, limit: int) -> tuple[list[WaitingJob], PendingMark]:
        """Up to ``limit`` pending jobs, highest priority and oldest first, and the mark after
        them (what the next :meth:`read_round` starts from)."""

    async def no_longer_pending(self, job_ids: list[int]) -> list[int]:
        """Those of ``job_ids`` that are not pending any more (cancelled, or placed by another)."""

    async def read_round(
        self, fresh_s: float, mark: PendingMark, limit: int
    ) -> tuple[list[LiveWorker], list[WaitingJob], PendingMark]:
        """In one round trip: :meth:`live_workers`, the pending jobs after ``mark`` (up to
        ``limit`` above it, and all of its transactions in flight), and the mark after them."""

    async def preemptible(
        self, priority: int, cooldown_s: float, workers: Sequence[WorkerRef]
    ) -> tuple[list[Running], Shares]:
        """The active assignments on ``workers`` (in their incarnations) that a job of
        ``priority`` may preempt (a lower priority, not marked already, no cancel asked, not
        preempted within ``cooldown_s``), and the accounts' shares (the cluster's capacity left
        0: the caller knows it). Read only when a round leaves candidates (docs/preemption.md)."""

    async def account_shares(self, half_life_s: float, *, with_past: bool) -> dict[str, AccountShare]:
        """Each account's fair-share weight and what its jobs hold now, by name (those that
        hold something or weigh other than 1), with its decayed past use when ``with_past`` and
        ``half_life_s`` > 0 (else none: 0)."""

    async def close(self) -> None:
        """Close the store's connection (a later read opens another)."""


_VICTIM_COLUMNS = (
    "assignment_id",
    "job_id",
    "worker_id",
    "cpu_millis",
    "memory_mb",
    "priority",
    "account",
    "started_at_s",
)
"""queries.PREEMPTIBLE's ``v_`` arrays, named as :class:`actors.preemption.Running`'s fields."""

_SHARE_COLUMNS = ("account", "cpu_millis", "memory_mb", "weight")
"""queries.PREEMPTIBLE's ``s_`` arrays."""

_WORKER_COLUMNS = (
    "id",
    "address",
    "incarnation",
    "cpu_millis",
    "memory_mb",
    "cpu_allocated_millis",
    "memory_allocated_mb",
    "unconfirmed_assignments",
    "confirmed_assignments",
    "runs_containers",
    "labels",
    "cordoned",
    "unhealthy",
    "probe_due",
    "trial",
    "resources",
    "units_in_use",
)
_JOB_COLUMNS = (
    "id",
    "cpu_millis",
    "memory_mb",
    "priority",
    "reason",
    "pending_xid",
    "pending_seq",
    "wait_s",
    "container",
    "constraints",
    "failed_on",
    "owner",
    "resources",
    "gang_id",
    "gang_rank",
    "gang_size",
    "gang_spread",
)
_QUOTA_COLUMNS = ("name", "cpu_millis", "memory_mb", "used_cpu_millis", "used_memory_mb")


def _job_rows(row: Any) -> list[tuple[Any, ...]]:
    """The pending jobs of a read's one row of parallel arrays, one tuple per job in
    :data:`_JOB_COLUMNS` order."""
    return list(parallel(row, _JOB_COLUMNS, prefix="p_"))


async def _waiting(rows: list[tuple[Any, ...]]) -> list[WaitingJob]:
    """:func:`_job_rows` as :class:`WaitingJob`, with a checkpoint every :data:`ROWS_PER_STEP`
    (a full read of a large queue, or a burst of new jobs: let others run)."""
    waiting: list[WaitingJob] = []
    for start in range(0, len(rows), ROWS_PER_STEP):
        if start:
            await trio.lowlevel.checkpoint()
        waiting += [
            WaitingJob(
                job=PendingJob(
                    job_id=job_id,
                    cpu_millis=cpu,
                    memory_mb=mem,
                    priority=prio,
                    needs_container=bool(box),
                    constraints=_constraints(constraints),
                    failed_on=tuple(failed_on.split()) if failed_on else (),
                    owner=owner,
                    resources=_asked(asked),
                ),
                reason=reason,
                wait_s=wait_s or 0.0,
                gang=None
                if gang_id is None
                else GangTask(gang_id=gang_id, rank=rank, size=size, spread=bool(spread)),
            )
            for (
                job_id,
                cpu,
                mem,
                prio,
                reason,
                _,
                _,
                wait_s,
                box,
                constraints,
                failed_on,
                owner,
                asked,
                gang_id,
                rank,
                size,
                spread,
            ) in rows[start : start + ROWS_PER_STEP]
        ]
    return waiting


def _quotas(row: Any) -> dict[str, AccountQuota]:
    """The capped accounts of a read's one row of parallel arrays (``queries.QUOTAS``), by name."""
    return {
        name: AccountQuota(cpu_millis=cpu, memory_mb=mem, used_cpu_millis=used_cpu, used_memory_mb=used_mem)
        for name, cpu, mem, used_cpu, used_mem in parallel(row, _QUOTA_COLUMNS, prefix="q_")
    }


def _account_use(row: Any) -> dict[str, AccountShare]:
    """Each account's use and weight from a round read's one row of parallel arrays
    (``queries.ACCOUNT_USE`` in ``queries.ROUND_READ``), by name."""
    return {
        name: AccountShare(weight=float(weight), used_cpu_millis=int(cpu), used_memory_mb=int(mem))
        for name, weight, cpu, mem in parallel(
            row, ("name", "weight", "used_cpu_millis", "used_memory_mb"), prefix="f_"
        )
    }


@functools.lru_cache(maxsize=1024)
def _asked(text: str | None) -> tuple[tuple[str, int], ...]:
    """A job's device ask from its JSON column (None: none); cached, as jobs of one kind share it."""
    if not text:
        return ()
    return tuple(sorted((name, int(count)) for name, count in json.loads(text).items() if count))


def _offered(text: str | None) -> dict[str, tuple[str, ...]]:
    """A worker's offered devices from their JSON column (None: none)."""
    return {name: tuple(units) for name, units in json.loads(text).items()} if text else {}


def _in_use(text: str | None) -> frozenset[tuple[str, str]]:
    """The (name, unit) pairs a worker's active assignments hold, from JSON (None: none)."""
    return frozenset((name, unit) for name, unit in json.loads(text)) if text else frozenset()


@functools.lru_cache(maxsize=1024)
def _constraints(text: str | None) -> tuple[Constraint, ...]:
    """A job's constraints from their JSON column (None: none); cached, as jobs of one kind
    share them."""
    if not text:
        return ()
    return tuple(
        Constraint(key=c["key"], op=c["op"], values=tuple(c.get("values", ()))) for c in json.loads(text)
    )


def _live_worker(w: Any) -> LiveWorker:
    """A :class:`LiveWorker` from its :data:`_WORKER_COLUMNS`."""
    return LiveWorker(
        ref=WorkerRef(worker_id=w["id"], address=w["address"], incarnation=int(w["incarnation"])),
        room=WorkerRoom(
            worker_id=w["id"],
            **ints(w, "cpu_millis", "memory_mb", "cpu_allocated_millis", "memory_allocated_mb"),
            runs_containers=bool(w["runs_containers"]),
            labels=json.loads(w["labels"]) if w["labels"] else {},
            resources=_offered(w["resources"]),
            units_in_use=_in_use(w["units_in_use"]),
        ),
        unconfirmed=int(w["unconfirmed_assignments"]),
        confirmed=int(w["confirmed_assignments"]),
        **flags(w, "cordoned", "unhealthy", "probe_due", "trial"),
    )


@attrs.define
class PgPlacerStore(ReadStore):
    """:class:`PlacerStore` on a read connection of its own (``statement_timeout_s``: the
    placer settings' ``read_statement_timeout_s``)."""

    trial_run_s: float = PlacerSettings().trial_run_s
    """The placer's ``trial_run_s``: which workers its reads say are on trial."""
    quotas: dict[str, AccountQuota] = attrs.field(factory=dict, init=False)
    with_account_use: bool = attrs.field(default=False, init=False)
    account_use: dict[str, AccountShare] | None = attrs.field(default=None, init=False)
    _seen: dict[str, tuple[tuple[Any, ...], LiveWorker]] = attrs.field(factory=dict, init=False)
    """Worker id -> its columns as last read and the :class:`LiveWorker` made of them: a row
    read again unchanged (most, round after round) is not parsed again."""

    def _live_workers(self, rows: Iterable[tuple[Any, ...]]) -> list[LiveWorker]:
        """:class:`LiveWorker` of each row of :data:`_WORKER_COLUMNS` values, kept from the last
        read where the row is the same."""
        seen, self._seen = self._seen, {}
        workers = []
        for values in rows:
            kept = seen.get(values[0])
            worker = (
                kept[1]
                if kept is not None and kept[0] == values
                else _live_worker(dict(zip(_WORKER_COLUMNS, values, strict=True)))
            )
            self._seen[values[0]] = (values, worker)
            workers.append(worker)
        return workers

    def server_settings(self) -> dict[str, str]:
        # As the ledger's: plan each read once.
        return {**super().server_settings(), "plan_cache_mode": "force_generic_plan"}

    async def live_workers(self, fresh_s: float) -> list[LiveWorker]:
        conn = await self._connection()
        rows = await conn.fetch(queries.LIVE_WORKERS, fresh_s, self.trial_run_s)
        self.quotas = _quotas(await conn.fetchrow(queries.QUOTAS))
        self.account_use = None
        return self._live_workers(tuple(r[c] for c in _WORKER_COLUMNS) for r in rows)

    async def pending_jobs(self, limit: int) -> tuple[list[WaitingJob], PendingMark]:
        row = await (await self._connection()).fetchrow(queries.PENDING_JOBS, limit)
        assert row is not None
        rows = _job_rows(row)
        return await _waiting(rows), PendingMark().after_read(
            last_read=None, snapshot_xmax=int(row["snapshot_xmax"]), snapshot_xip=row["snapshot_xip"]
        )

    async def read_round(
        self, fresh_s: float, mark: PendingMark, limit: int
    ) -> tuple[list[LiveWorker], list[WaitingJob], PendingMark]:
        row = await (await self._connection()).fetchrow(
            queries.ROUND_READ,
            fresh_s,
            mark.xid,
            mark.seq,
            limit,
            list(mark.in_flight),
            self.trial_run_s,
            self.with_account_use,
        )
        assert row is not None
        self.account_use = _account_use(row) if self.with_account_use else None
        workers = self._live_workers(parallel(row, _WORKER_COLUMNS, prefix="w_"))
        self.quotas = _quotas(row)
        rows = _job_rows(row)
        # Rows above the mark came from the limited part of the read, the others from the
        # mark's transactions in flight.
        at_xid, at_seq = _JOB_COLUMNS.index("pending_xid"), _JOB_COLUMNS.index("pending_seq")
        above = [
            (r[at_xid], r[at_seq] or 0)
            for r in rows
            if r[at_xid] is not None and (r[at_xid], r[at_seq] or 0) > (mark.xid, mark.seq)
        ]
        next_mark = mark.after_read(
            last_read=max(above) if len(above) >= limit else None,
            snapshot_xmax=int(row["snapshot_xmax"]),
            snapshot_xip=row["snapshot_xip"],
        )
        return workers, await _waiting(rows), next_mark

    async def no_longer_pending(self, job_ids: list[int]) -> list[int]:
        rows = await (await self._connection()).fetch(queries.NO_LONGER_PENDING, job_ids)
        return [int(r["id"]) for r in rows]

    async def preemptible(
        self, priority: int, cooldown_s: float, workers: Sequence[WorkerRef]
    ) -> tuple[list[Running], Shares]:
        row = await (await self._connection()).fetchrow(
            queries.PREEMPTIBLE,
            priority,
            cooldown_s,
            [w.worker_id for w in workers],
            [w.incarnation for w in workers],
        )
        assert row is not None
        victims = [
            Running(
                **ints(v, "assignment_id", "job_id", "cpu_millis", "memory_mb", "priority"),
                worker_id=v["worker_id"],
                account=v["account"],
                started_at_s=float(v["started_at_s"]),
            )
            for v in records(row, _VICTIM_COLUMNS, prefix="v_")
        ]
        accounts = list(parallel(row, _SHARE_COLUMNS, prefix="s_"))
        shares = Shares(
            cluster_cpu_millis=0,
            cluster_memory_mb=0,
            used={a: (int(cpu), int(memory)) for a, cpu, memory, _ in accounts if cpu or memory},
            weights={a: float(weight) for a, _, _, weight in accounts},
            active=frozenset(a for a, *_ in accounts),
        )
        return victims, shares

    async def account_shares(self, half_life_s: float, *, with_past: bool) -> dict[str, AccountShare]:
        conn = await self._connection()
        past = (
            {r["name"]: r for r in await conn.fetch(queries.ACCOUNT_PAST_USE, half_life_s)}
            if with_past and half_life_s > 0
            else {}
        )
        shares = {
            r["name"]: AccountShare(
                weight=float(r["weight"]),
                used_cpu_millis=int(r["used_cpu_millis"]),
                used_memory_mb=int(r["used_memory_mb"]),
            )
            for r in await conn.fetch(queries.ACCOUNT_USE)
        }
        for name, r in past.items():
            share = shares.get(name, AccountShare())
            shares[name] = attrs.evolve(
                share,
                decayed_cpu_millis=max(0.0, float(r["decayed_cpu_millis"] or 0.0)),
                decayed_memory_mb=max(0.0, float(r["decayed_memory_mb"] or 0.0)),
            )
        return shares

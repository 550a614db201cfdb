"""What the client's calls about the cluster's administration return: a worker's schedule
(cordon, uncordon, drain), audit entries, accounts and periodic schedules, as frozen attrs
classes built from the control planes' replies (the conventions of :mod:`ops.client.results`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs

from ops.client.from_wire import from_pb

if TYPE_CHECKING:
    from protocol import pb
    from runtime.jobs import JobSpec


@attrs.frozen(kw_only=True)
class WorkerSchedule:
    """A worker's schedule after a cordon, uncordon or drain (``Client.cordon``, ...)."""

    worker_id: str
    cordoned: bool
    """``cordoned`` to ``drain_deadline_unix_s``: as in :class:`Worker`."""
    draining: bool
    drained: bool
    drain_deadline_unix_s: float | None
    job_ids: tuple[int, ...]
    """The jobs active on it when the request was recorded."""
    unhealthy: bool = False
    """It is marked unhealthy (see :attr:`Worker.unhealthy`); an uncordon clears it."""
    unhealthy_reason: str = ""
    """Why; empty when healthy."""


@attrs.frozen(kw_only=True)
class AuditEntry:
    """One change in the audit trail (``Client.audit``; docs/accounts.md)."""

    id: int
    at_unix_s: float
    """When it was made (the database's time of its transaction)."""
    role: str
    """Who: the caller's certificate role (``plaintext`` on a server run with ``--insecure``)."""
    actor_id: str
    """Its certificate's id (``anonymous`` without TLS)."""
    account: str
    """The account it acted as (the owner of the jobs it submitted)."""
    address: str
    """The peer address (``host:port``) the control plane saw."""
    action: str
    """``submit``, ``cancel``, ``drain``, ``cordon``, ``uncordon``, ``account_set`` or
    ``schedule_add``, ``schedule_pause``, ``schedule_resume``, ``schedule_remove``."""
    target_ids: tuple[int | str, ...]
    """What it changed: job ids (an array's id for an array), or a worker id."""
    arguments: dict[str, Any]
    """Its key arguments (``{"only_this_task": false}``, ``{"deadline_s": 60.0}``...)."""


@attrs.frozen(kw_only=True)
class Account:
    """An account's quotas, priority cap, fair-share weight and what it uses now
    (``Client.account``; docs/quotas.md). A cap of None is no cap."""

    name: str
    cpu_millis: int | None
    """Cap on the cpu_millis its assigned and running jobs hold."""
    memory_mb: int | None
    """Cap on the memory_mb (MiB) its assigned and running jobs hold."""
    max_pending: int | None
    """Cap on its pending and waiting jobs (a submission past it is refused)."""
    max_priority: int | None
    """The highest priority its users' jobs may have (None: the default,
    ``runtime.accounts.DEFAULT_MAX_PRIORITY``, 0; operators are not capped)."""
    weight: float
    """Its fair-share weight (1 unless set)."""
    used_cpu_millis: int
    """The cpu_millis of its assigned and running jobs."""
    used_memory_mb: int
    """The memory_mb of its assigned and running jobs."""
    queued_jobs: int
    """How many of its jobs are pending or waiting."""


@attrs.frozen(kw_only=True)
class Schedule:
    """A periodic job (``Client.schedules``; docs/schedules.md). Times are aware UTC datetimes
    (None: none)."""

    id: int
    name: str
    cron: str
    tz: str
    job: JobSpec
    """The job each slot fires."""
    concurrency_policy: str
    """``allow``, ``forbid`` or ``replace``."""
    starting_deadline_s: int
    paused: bool
    owner: str
    """The account its jobs belong to."""
    created_at: datetime | None
    last_slot_at: datetime | None
    """The last slot recorded (fired or skipped)."""
    next_slot_at: datetime | None
    """The next slot (None while paused, or when none comes within 5 years)."""
    fired: int
    skipped: int
    last_job_id: int | None
    last_skip_reason: str


def audit_from_pb(message: pb.AuditEntry) -> AuditEntry:
    """An ``AuditEntry`` message as an :class:`AuditEntry`."""
    import json

    targets = json.loads(message.target_ids_json or "[]")
    arguments = json.loads(message.arguments_json or "{}")
    return from_pb(AuditEntry, message, target_ids=tuple(targets), arguments=arguments)


def account_from_pb(message: pb.AccountInfo) -> Account:
    """An ``AccountInfo`` message as an :class:`Account` (a cap not set is None, 0 is a cap)."""
    from runtime.accounts import CLEARABLE  # not before: it loads the job spec, which status needs not

    caps = {cap: int(getattr(message, cap)) if getattr(message, f"has_{cap}") else None for cap in CLEARABLE}
    return from_pb(Account, message, **caps)


def _utc_ms(ms: int) -> datetime | None:
    return None if not ms else datetime.fromtimestamp(ms / 1000, UTC)


def schedule_info_from_pb(message: pb.ScheduleInfo) -> Schedule:
    """A ``ScheduleInfo`` message as a :class:`Schedule`."""
    from runtime.wire_jobs import job_spec_from_pb

    spec = message.spec
    assert spec is not None
    return Schedule(
        id=int(message.id),
        name=spec.name,
        cron=spec.cron,
        tz=spec.tz,
        job=job_spec_from_pb(spec.job, strict=False),
        concurrency_policy=spec.concurrency_policy,
        starting_deadline_s=int(spec.starting_deadline_s),
        paused=bool(message.paused),
        owner=message.owner,
        created_at=_utc_ms(message.created_at_ms),
        last_slot_at=_utc_ms(message.last_slot_at_ms),
        next_slot_at=_utc_ms(message.next_slot_at_ms),
        fired=int(message.fired),
        skipped=int(message.skipped),
        last_job_id=int(message.last_job_id) or None,
        last_skip_reason=message.last_skip_reason,
    )


def schedule_from_pb(message: pb.WorkerScheduleReply) -> WorkerSchedule:
    """A ``WorkerScheduleReply`` as a :class:`WorkerSchedule`."""
    return from_pb(WorkerSchedule, message)

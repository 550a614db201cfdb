"""The cluster at a glance as the client returns it (``Client.status``, ``stockade status``):
its control planes and workers, frozen attrs classes built from a ``StatusReply`` (the
conventions of :mod:`ops.client.results`, which re-exports them). Apart from the job results,
so that ``stockade status`` loads the classes it shows only; a reply that lists unschedulable
jobs loads those too."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ops.client.from_wire import from_pb, units

if TYPE_CHECKING:
    from ops.client.results import Job
    from protocol import pb


@attrs.frozen(kw_only=True)
class ControlPlane:
    """One control-plane replica as the cluster sees it."""

    id: str
    """Its id (``cp-1``)."""
    address: str
    role: str
    """``leader``, ``standby`` or ``down``."""
    seen_unix_s: float | None
    """When it last said it was alive."""


@attrs.frozen(kw_only=True)
class Usage:
    """What a running job, or all of a worker's command jobs together, used lately: the newest
    sample its worker reported from their cgroups (docs/console.md, "Usage")."""

    cpu_millis: int
    """CPU used on average over the sample's span, in millicores (1000 = one core busy)."""
    memory_mb: int
    """Memory held at the sample's end, in MiB."""
    age_s: float
    """How long before the reply the sample was recorded (database time), in seconds."""

    def describe(self) -> str:
        """``1.93 cores, 41 MiB, 3 s ago``."""
        return f"{self.cpu_millis / 1000:.2f} cores, {self.memory_mb:,} MiB, {self.age_s:.0f} s ago"


@attrs.frozen(kw_only=True)
class Worker:
    """One worker as the cluster sees it."""

    id: str
    """Its id (``w-1``)."""
    address: str
    """The ``host:port`` of its Worker service."""
    state: str
    """``alive``, ``dead`` or ``left`` (stopped cleanly)."""
    cpu_millis: int
    """Its capacity (so ``memory_mb``)."""
    memory_mb: int
    cpu_allocated_millis: int
    """What its active assignments reserve (so ``memory_allocated_mb``)."""
    memory_allocated_mb: int
    job_ids: tuple[int, ...]
    """The jobs active on it."""
    incarnation: int
    """Its current registration's number."""
    last_heartbeat_age_s: float
    """Seconds since its last heartbeat."""
    cordoned: bool
    """Nothing new is placed on it (a drain cordons too)."""
    draining: bool
    """A drain was asked and jobs are still active on it."""
    drained: bool
    """A drain was asked and no job is active on it: its agent can be stopped."""
    drain_deadline_unix_s: float | None
    """When a draining worker's remaining jobs are stopped and placed elsewhere; None: none."""
    labels: tuple[tuple[str, str], ...]
    """Its labels (key, value), sorted by key."""
    unhealthy: bool = False
    """Its recent runs fail where the same jobs do not fail elsewhere: nothing new is placed on
    it but a probe now and then, until a run succeeds there or an operator uncordons it."""
    unhealthy_reason: str = ""
    """Why it is unhealthy (``unhealthy: 8 of the last 10 runs failed (other workers meanwhile: 1
    of 40; 3 of those jobs succeeded elsewhere), last: exit code 2``); empty when healthy."""
    unhealthy_since_unix_s: float | None = None
    """When it was marked (renewals after a failed probe keep it); None when healthy."""
    resources: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The countable devices it offers, (name, unit ids), sorted by name (docs/devices.md)."""
    resources_in_use: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Those of its units its active assignments hold, (name, unit ids), sorted by name."""
    usage: Usage | None = None
    """What its command jobs used together lately; None: no sample in the last minute."""


@attrs.frozen(kw_only=True)
class ClusterStatus:
    """The cluster at a glance (``Client.status``)."""

    leader: str | None
    """The leading control plane's id; None while none leads."""
    epoch: int
    """The current lease epoch (0 before any leader)."""
    answered_by: str
    """The id of the control plane that answered."""
    control_planes: tuple[ControlPlane, ...]
    workers: tuple[Worker, ...]
    """Every worker that ever registered."""
    job_counts: tuple[tuple[str, int], ...]
    """Jobs per state (state, count), every state, in the control plane's order."""
    unschedulable: tuple[Job, ...]
    """Pending jobs no live worker can hold, with the reason."""
    heartbeat_interval_s: float | None = None
    """The heartbeat interval the cluster tells its workers now (None: not said)."""
    dead_after_s: float | None = None
    """How long a silent worker goes before it is declared dead now, in seconds (None: not said)."""
    heartbeat_policy: str = ""
    """Why that interval: the leader's choice from the cluster's size and the measured cost of a
    heartbeat, or the control planes' settings."""

    def job_count(self, state: str) -> int:
        """How many jobs are in ``state``."""
        return sum(count for name, count in self.job_counts if name == state)


def usage_from_pb(message: pb.UsageNow | None) -> Usage | None:
    """A ``UsageNow`` message as a :class:`Usage`; None: none said."""
    return None if message is None else from_pb(Usage, message)


def worker_from_pb(message: pb.WorkerInfo) -> Worker:
    """A ``WorkerInfo`` message as a :class:`Worker`."""
    return from_pb(
        Worker,
        message,
        labels=tuple(sorted(message.labels.items())),
        resources=units(message.resources),
        resources_in_use=units(message.resources_in_use),
        usage=usage_from_pb(message.usage),
    )


def status_from_pb(message: pb.StatusReply) -> ClusterStatus:
    """A ``StatusReply`` as a :class:`ClusterStatus`."""
    unschedulable: tuple[Job, ...] = ()
    if message.unschedulable:
        from ops.client.results import job_from_pb  # here: most replies list none

        unschedulable = tuple(job_from_pb(j) for j in message.unschedulable)
    return from_pb(
        ClusterStatus,
        message,
        control_planes=tuple(from_pb(ControlPlane, cp) for cp in message.control_planes),
        workers=tuple(worker_from_pb(w) for w in message.workers),
        job_counts=tuple((c.state, int(c.count)) for c in message.jobs),
        unschedulable=unschedulable,
        heartbeat_interval_s=message.heartbeat_interval_ms / 1000 if message.heartbeat_interval_ms else None,
        dead_after_s=message.dead_after_ms / 1000 if message.dead_after_ms else None,
    )

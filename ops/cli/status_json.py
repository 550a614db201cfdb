"""The JSON of ``stockade status --json`` (:func:`status_json`), apart from the status view so
that it loads without rich (:mod:`ops.cli.render` re-exports it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ops.client.results import ClusterStatus

__all__ = ["devices_in_use", "status_json"]


def status_json(status: ClusterStatus, metrics: dict[str, str] | None = None) -> dict[str, Any]:
    """The stable JSON shape of ``stockade status --json``.

    Keys: ``leader`` (id or null), ``epoch``, ``control_planes`` ({id, address, role}),
    ``workers`` ({id, state, cpu_millis, memory_mb, cpu_allocated_millis,
    memory_allocated_mb, jobs, cordoned, draining, drained, drain_deadline_unix_s (or null),
    labels (key -> value), unhealthy, unhealthy_reason and unhealthy_since_unix_s (null when
    healthy), resources and resources_in_use (name -> unit ids), usage ({cpu_millis, memory_mb,
    age_s}: what its jobs used together lately; null: no sample)}), ``devices`` (resource name ->
    {in_use, offered}: the alive workers' units; docs/devices.md), ``jobs`` (counts keyed by
    state, every state), ``unschedulable`` ({job_id, reason}), ``heartbeat`` ({interval_s,
    dead_after_s, reason}; nulls when the control plane did not say) and ``metrics`` (id of a
    local cluster's process or worker -> ``host:port`` of its Prometheus /metrics; empty for a
    cluster that is not local).
    """
    return {
        "leader": status.leader,
        "epoch": status.epoch,
        "control_planes": [
            {"id": cp.id, "address": cp.address, "role": cp.role} for cp in status.control_planes
        ],
        "workers": [
            {
                "id": w.id,
                "state": w.state,
                "cpu_millis": w.cpu_millis,
                "memory_mb": w.memory_mb,
                "cpu_allocated_millis": w.cpu_allocated_millis,
                "memory_allocated_mb": w.memory_allocated_mb,
                "jobs": list(w.job_ids),
                "cordoned": w.cordoned,
                "draining": w.draining,
                "drained": w.drained,
                "drain_deadline_unix_s": w.drain_deadline_unix_s,
                "labels": dict(w.labels),
                "unhealthy": w.unhealthy,
                "unhealthy_reason": w.unhealthy_reason or None,
                "unhealthy_since_unix_s": w.unhealthy_since_unix_s,
                "resources": {name: list(units) for name, units in w.resources},
                "resources_in_use": {name: list(units) for name, units in w.resources_in_use},
                "usage": None
                if w.usage is None
                else {
                    "cpu_millis": w.usage.cpu_millis,
                    "memory_mb": w.usage.memory_mb,
                    "age_s": w.usage.age_s,
                },
            }
            for w in status.workers
        ],
        "devices": devices_in_use(status),
        "jobs": dict(status.job_counts),
        "unschedulable": [{"job_id": j.job_id, "reason": j.reason or ""} for j in status.unschedulable],
        "heartbeat": {
            "interval_s": status.heartbeat_interval_s,
            "dead_after_s": status.dead_after_s,
            "reason": status.heartbeat_policy or None,
        },
        "metrics": dict(metrics or {}),
    }


def devices_in_use(status: ClusterStatus) -> dict[str, dict[str, int]]:
    """Resource name -> ``{"in_use": n, "offered": m}``: the units of the alive workers, and
    those of them their active assignments hold (docs/devices.md)."""
    totals: dict[str, dict[str, int]] = {}
    for w in status.workers:
        if w.state != "alive":
            continue
        held = dict(w.resources_in_use)
        for name, units in w.resources:
            total = totals.setdefault(name, {"in_use": 0, "offered": 0})
            total["offered"] += len(units)
            total["in_use"] += len(held.get(name, ()))
    return dict(sorted(totals.items()))

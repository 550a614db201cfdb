"""Unconfirmed assignments: which a pass re-sends and which it withdraws (:func:`plan_deliveries`,
a pure function; :func:`resend_due`). docs/design.md, "The reconciler's pass".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import attrs

from actors.messages import Dispatch, WorkerRef
from actors.reconciler_store import Delivery
from runtime.settings.leader import ReconcilerSettings


def resend_due(age_s: float, *, first_after_s: float, interval_s: float) -> bool:
    """Whether a pass re-sends an unconfirmed assignment ``age_s`` seconds after its commit:
    when its age passed ``first_after_s * 2**k`` (some k >= 0) since the previous pass,
    ``interval_s`` earlier: exponential backoff with no state per assignment."""
    if age_s < first_after_s:
        return False
    threshold = first_after_s * 2.0 ** math.floor(math.log2(age_s / first_after_s))
    return age_s - interval_s < threshold


Groups = tuple[tuple[WorkerRef, tuple[Delivery, ...]], ...]
"""Deliveries grouped by the worker they go to: one entry per worker, in the order of each
worker's first delivery, the deliveries in their given order."""


def by_worker(deliveries: Iterable[Delivery]) -> Groups:
    """``deliveries`` grouped per worker (see :data:`Groups`)."""
    groups: dict[WorkerRef, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        groups[d.worker].append(d)
    return tuple((worker, tuple(group)) for worker, group in groups.items())


@attrs.frozen(kw_only=True)
class DeliveryPlan:
    """What one pass does with the unconfirmed assignments (:func:`plan_deliveries`)."""

    resend: Groups
    """Sent to their worker again (one batch per worker)."""
    withdraw: Groups
    """Cancelled on their worker, then ended and requeued once it acknowledges."""

    def dispatches(self, epoch: int) -> tuple[Dispatch, ...]:
        """The re-sends as one :class:`Dispatch` per worker."""
        return tuple(
            Dispatch(epoch=epoch, worker=worker, assignments=tuple(d.assignment for d in group))
            for worker, group in self.resend
        )


def plan_deliveries(
    unconfirmed: Iterable[Delivery],
    settings: ReconcilerSettings,
    *,
    first_pass: bool,
    since_last_read_s: float,
    heartbeat_interval_s: float = 0.0,
) -> DeliveryPlan:
    """Which unconfirmed assignments a pass re-sends and which it withdraws: a pure function.

    One unconfirmed for ``cancel_unconfirmed_after_s`` (at least :data:`WITHDRAW_AFTER_INTERVALS`
    heartbeat intervals) is withdrawn; a younger one is re-sent on the first pass under an epoch
    (the previous leader may have died between commit and send), else when :func:`resend_due`
    says so from ``redispatch_after_s`` (at least :data:`RESEND_AFTER_INTERVALS` heartbeat
    intervals). ``since_last_read_s``: since the previous pass read them (``inf`` before any);
    ``heartbeat_interval_s``: the interval in force (0: not counted).
    """
    first_after_s = max(settings.redispatch_after_s, RESEND_AFTER_INTERVALS * heartbeat_interval_s)
    withdraw_after_s = max(
        settings.cancel_unconfirmed_after_s, WITHDRAW_AFTER_INTERVALS * heartbeat_interval_s
    )
    withdraw: list[Delivery] = []
    resend: list[Delivery] = []
    for d in unconfirmed:
        if d.age_s >= withdraw_after_s:
            withdraw.append(d)
        elif first_pass or resend_due(d.age_s, first_after_s=first_after_s, interval_s=since_last_read_s):
            resend.append(d)
    return DeliveryPlan(resend=by_worker(resend), withdraw=by_worker(withdraw))


RESEND_AFTER_INTERVALS = 2.0
"""Heartbeat intervals an assignment goes unconfirmed, at least, before its first re-send."""

WITHDRAW_AFTER_INTERVALS = 4.0
"""Heartbeat intervals an assignment goes unconfirmed, at least, before it is withdrawn."""

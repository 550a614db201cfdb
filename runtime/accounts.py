"""An account's quotas, priority cap and fair-share weight (docs/quotas.md): the rules of what
SetAccount may store, applied by client and server alike, and the reason a job waits past a cap.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import attrs

from runtime.checks import check_int_between
from runtime.errors import InvalidArgument
from runtime.identifiers import check_id
from runtime.jobs import MAX_CPU_MILLIS, MAX_MEMORY_MB, MAX_PRIORITY

if TYPE_CHECKING:
    from protocol import pb

MAX_QUOTA_WORKERS = 10_000
"""How many of the largest workers a cap may cover: a cpu_millis cap is at most
``MAX_CPU_MILLIS * MAX_QUOTA_WORKERS`` (10,000 workers of 1000 cores), memory_mb likewise."""

MAX_CAPS = {
    "cpu_millis": MAX_CPU_MILLIS * MAX_QUOTA_WORKERS,
    "memory_mb": MAX_MEMORY_MB * MAX_QUOTA_WORKERS,
    "max_pending": 100_000_000,
}
"""Each cap's largest value (the smallest is 0: nothing of it may be used, or queued)."""

CAPS = tuple(MAX_CAPS)
"""The caps an account may have, in the order they are shown and stored."""

MAX_WEIGHT = 1_000_000.0
"""The largest fair-share weight (the default is 1)."""

MIN_WEIGHT = 0.001
"""The smallest fair-share weight: a weight of 1e-320 (a denormal) was stored, and its account
got nothing while another had jobs; below a thousandth a weight means nothing more."""

DEFAULT_MAX_PRIORITY = 0
"""The highest job priority a user may submit when its account has no ``max_priority``: any
priority up to 0, so a user may lower its own jobs' priority (as Unix ``nice``), not raise it.
Operators are not capped. schema.sql's check_submission holds the same default (a test checks
the two agree)."""

CLEARABLE = (*CAPS, "max_priority")
"""The settings a change may remove: the caps (then none), and ``max_priority`` (then
:data:`DEFAULT_MAX_PRIORITY`)."""

_GIVEN = (*CLEARABLE, "weight")
"""The fields a change may give (each None: keep the stored value)."""


@attrs.frozen(kw_only=True)
class AccountChange:
    """What SetAccount stores for ``name``: each cap or weight given (None: keep the stored one),
    and the caps to remove."""

    name: str
    cpu_millis: int | None = None
    """Cap on the cpu_millis its assigned and running jobs hold, 0 to ``MAX_CAPS``."""
    memory_mb: int | None = None
    """Cap on the memory_mb (MiB) its assigned and running jobs hold, 0 to ``MAX_CAPS``."""
    max_pending: int | None = None
    """Cap on its pending and waiting jobs, 0 to ``MAX_CAPS``."""
    max_priority: int | None = None
    """The highest priority its users' jobs may have, -``MAX_PRIORITY`` to ``MAX_PRIORITY`` (the
    range of a job's priority, :data:`runtime.jobs.MAX_PRIORITY`)."""
    weight: float | None = None
    """Fair-share weight: finite, from :data:`MIN_WEIGHT` to :data:`MAX_WEIGHT`."""
    clear: tuple[str, ...] = ()
    """Settings to remove (of :data:`CLEARABLE`), sorted, none of them given."""

    def check(self) -> AccountChange:
        """This change, once every field is found within its rule.

        Raises:
            InvalidArgument: naming the first field that breaks its rule, its value and the
                limit (``cpu_millis must be between 0 and 10000000000, got -1``).
        """
        check_id(self.name, field="name")
        for cap in CAPS:
            value = getattr(self, cap)
            if value is not None:
                check_int_between(cap, value, 0, MAX_CAPS[cap])
        if self.max_priority is not None:
            check_int_between("max_priority", self.max_priority, -MAX_PRIORITY, MAX_PRIORITY)
        if self.weight is not None and not (
            MIN_WEIGHT <= self.weight <= MAX_WEIGHT and math.isfinite(self.weight)
        ):
            raise InvalidArgument(
                "weight", self.weight, f"must be a finite number >= {MIN_WEIGHT:g} and <= {MAX_WEIGHT:g}"
            )
        for cap in self.clear:
            if cap not in CLEARABLE:
                raise InvalidArgument("clear", cap, f"must name settings of {', '.join(CLEARABLE)}")
            if getattr(self, cap) is not None:
                raise InvalidArgument(
                    "clear", cap, f"must not name a cap also given ({cap}={getattr(self, cap)})"
                )
        if not self.clear and all(getattr(self, field) is None for field in _GIVEN):
            raise InvalidArgument(
                "account", self.name, "must be given a cap, a weight or a cap to clear (nothing to set)"
            )
        return attrs.evolve(self, clear=tuple(sorted(set(self.clear))))

    @classmethod
    def from_pb(cls, request: pb.SetAccountRequest) -> AccountChange:
        """A SetAccount request as a change (each field with its ``has_`` flag; not checked)."""
        given = {f: getattr(request, f) if getattr(request, f"has_{f}") else None for f in _GIVEN}
        return cls(name=request.name, clear=tuple(request.clear), **given)

    def to_pb(self, idempotency_key: str) -> pb.SetAccountRequest:
        """This change as a SetAccount request carrying ``idempotency_key``."""
        from protocol import pb

        given: dict[str, Any] = {}
        for field in _GIVEN:
            value = getattr(self, field)
            given[f"has_{field}"] = value is not None
            given[field] = value if value is not None else 0.0 if field == "weight" else 0
        return pb.SetAccountRequest(
            name=self.name, clear=list(self.clear), idempotency_key=idempotency_key, **given
        )

    def arguments(self) -> dict[str, object]:
        """The change's key arguments, for its audit row: what it gives and what it clears."""
        given = {f: getattr(self, f) for f in _GIVEN if getattr(self, f) is not None}
        return {**given, "clear": list(self.clear)} if self.clear else given


def quota_reason(account: str, field: str, used: int, cap: int) -> str:
    """Why a pending job waits for its account's usage: ``quota: alice uses 32000 of 32000
    cpu_millis`` (``field``: ``cpu_millis`` or ``memory_mb``)."""
    return f"quota: {account} uses {used} of {cap} {field}"


_QUOTA_REASON = re.compile(r"quota: (\S+) uses \d+ of (\d+) (cpu_millis|memory_mb)")


def quota_reason_key(reason: str) -> str:
    """``reason`` without the use a :func:`quota_reason` names (``quota: alice of 32000
    cpu_millis``), any other reason as it is: two reasons with one key say the same cap holds
    the job, so a stored one is not written again only because the account's use moved."""
    found = _QUOTA_REASON.fullmatch(reason)
    return reason if found is None else f"quota: {found[1]} of {found[2]} {found[3]}"

"""A schedule's slots: the UTC instants its cron expression names in its time zone, and the
rules a schedule's fields must follow.

A cron expression is read by croniter (5 fields, ``minute hour day-of-month month
day-of-week``, or 6 with a leading ``second`` field, as Quartz and Spring write it) over the
wall-clock times of the schedule's zone (IANA names, stdlib :mod:`zoneinfo`). Each wall-clock
time is then made an instant by our daylight-saving rule (docs/schedules.md, "Time zones and
daylight saving"):

- a wall-clock time the spring change skips (02:30 on Europe/Berlin's 2026-03-29) is the
  instant the gap ends (03:00 CEST); several skipped times are one slot there;
- a wall-clock time the autumn change repeats (02:30 on 2026-10-25) is its first occurrence
  (02:30 CEST); the second pass of the repeated hour names no slot.

So a schedule's slots are a strictly increasing sequence of instants, and each wall-clock time
the expression names fires once.
"""

from __future__ import annotations

import datetime as dt
import functools
import zoneinfo
from collections.abc import Iterator

import attrs
from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from runtime import identifiers
from runtime.errors import InvalidArgument

UTC = dt.UTC

CRON_HORIZON_YEARS = 5
"""A cron expression must name a slot within this many years of now (``0 0 30 2 *``, the 30th of
February, never does and is refused)."""
MAX_CRON_BYTES = 256
"""Longest cron expression."""
MAX_TZ_BYTES = 64
"""Longest time zone name (IANA names are at most 30 characters today)."""
MIN_STARTING_DEADLINE_S = 1
MAX_STARTING_DEADLINE_S = 7 * 24 * 3600
"""Range of ``starting_deadline_s``: how late after its time a slot may still fire (one second
to one week)."""
DEFAULT_STARTING_DEADLINE_S = 60
"""A schedule's ``starting_deadline_s`` when it names none."""
MAX_CATCH_UP_SLOTS = 10
"""Most slots one schedule fires in one pass of the scheduler, catching up after an outage:
the newest ones within ``starting_deadline_s``; older ones are recorded missed."""

CONCURRENCY_POLICIES = ("allow", "forbid", "replace")
"""Kubernetes CronJob's ``concurrencyPolicy``, lower-cased: ``allow`` fires whatever runs;
``forbid`` skips a slot while the schedule's previous job has not ended; ``replace`` cancels the
previous job and fires."""

CRON_RULE = (
    "must be a cron expression of 5 fields (minute hour day-of-month month day-of-week) or 6 "
    "(second first), or @hourly, @daily, @weekly, @monthly, @yearly"
)
_ALIASES = ("@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually")


@attrs.frozen
class Cron:
    """A parsed cron expression (:func:`parse_cron`)."""

    expression: str
    seconds: bool
    """True for 6 fields: the first is the second."""

    def local_times_after(self, local: dt.datetime) -> Iterator[dt.datetime]:
        """The naive wall-clock times the expression names, strictly after naive ``local``,
        increasing, for :data:`CRON_HORIZON_YEARS` years between two (then it stops)."""
        it = croniter(
            self.expression,
            local,
            second_at_beginning=self.seconds,
            max_years_between_matches=CRON_HORIZON_YEARS,
        )
        while True:
            try:
                yield it.get_next(dt.datetime)
            except CroniterBadDateError:
                return


def parse_cron(expression: str, *, field: str = "cron") -> Cron:
    """``expression`` parsed (see :data:`CRON_RULE`).

    Raises:
        InvalidArgument: ``field``, the value and :data:`CRON_RULE` (with croniter's reason).
    """
    if not isinstance(expression, str) or len(expression.encode("utf-8", "replace")) > MAX_CRON_BYTES:
        raise InvalidArgument(field, expression, f"must be at most {MAX_CRON_BYTES} bytes")
    text = " ".join(expression.split())
    fields = text.split(" ") if text else []
    if not (len(fields) in (5, 6) or (len(fields) == 1 and fields[0].lower() in _ALIASES)):
        raise InvalidArgument(field, expression, CRON_RULE, detail=f"it has {len(fields)} fields")
    backwards = _backwards_range(fields)
    if backwards is not None:
        raise InvalidArgument(field, expression, CRON_RULE, detail=f"the range {backwards} runs backwards")
    try:
        croniter(text, dt.datetime(2000, 1, 1), second_at_beginning=len(fields) == 6)
    except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
        raise InvalidArgument(field, expression, CRON_RULE, detail=str(exc) or type(exc).__name__) from None
    return Cron(expression=text, seconds=len(fields) == 6)


def _backwards_range(fields: list[str]) -> str | None:
    """The first numeric range of ``fields`` whose start is past its end (``5-2``), or None.
    croniter reads one as wrapping around (``1-0`` in day-of-month fires every day); Vixie cron
    and Kubernetes refuse it, and so do we."""
    for part in (p for f in fields for p in f.split(",")):
        low, dash, high = part.split("/", 1)[0].partition("-")
        if dash and low.isdigit() and high.isdigit() and int(low) > int(high):
            return f"{low}-{high}"
    return None


def zone(name: str, *, field: str = "tz") -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Berlin``, ``UTC``).

    Raises:
        InvalidArgument: ``field``, the value: not a time zone of the IANA database.
    """
    rule = "must be an IANA time zone name such as UTC or Europe/Berlin"
    if not isinstance(name, str) or not name or len(name.encode("utf-8", "replace")) > MAX_TZ_BYTES:
        raise InvalidArgument(field, name, rule, detail=f"1 to {MAX_TZ_BYTES} bytes")
    if name in NOT_ZONES or name not in _iana_zones():
        # A name the machine resolves but the IANA database does not have (``localtime`` is
        # the host's own zone, so replicas on hosts set differently would fire different slots).
        raise InvalidArgument(field, name, rule, detail="no such zone")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument(field, name, rule, detail="no such zone") from None


NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})
"""Names the zone files hold that are not zones of their own: the host's own zone, and
placeholders; refused as a schedule's ``tz``."""


@functools.cache
def _iana_zones() -> frozenset[str]:
    """The zone names this machine's IANA database has (``zoneinfo.available_timezones``, read
    once: it walks the zone folder)."""
    return frozenset(zoneinfo.available_timezones())


def slot_instant(local: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """The instant (aware, UTC) the naive wall-clock time ``local`` of ``tz`` fires at, by the
    module's daylight-saving rule: a skipped time fires when its gap ends, a repeated time at
    its first occurrence."""
    first = local.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == local:
        return first  # it exists (its first occurrence, when repeated)
    # Skipped: the first instant whose wall-clock time is at or after ``local`` ends the gap.
    # fold=1 reads it with the offset after the change: an instant before the gap ends.
    low = local.replace(tzinfo=tz, fold=1).astimezone(UTC)
    high = first
    while high - low > dt.timedelta(seconds=1):
        mid = low + (high - low) / 2
        mid = mid.replace(microsecond=0)
        if mid.astimezone(tz).replace(tzinfo=None) >= local:
            high = mid
        else:
            low = mid
    while (high - dt.timedelta(seconds=1)).astimezone(tz).replace(tzinfo=None) >= local:
        high -= dt.timedelta(seconds=1)
    return high


def slots_after(cron: Cron, tz: zoneinfo.ZoneInfo, after: dt.datetime) -> Iterator[dt.datetime]:
    """The schedule's slots (aware, UTC) strictly after the aware instant ``after``, increasing
    and each once; ends when no slot comes within :data:`CRON_HORIZON_YEARS` years."""
    # Wall-clock times up to ``after``'s own map to instants up to ``after`` (the mapping never
    # goes back), so the walk starts there; in a repeated hour's second pass the first
    # occurrences it meets are at or before ``after``, and are passed over.
    last = after
    for wall in cron.local_times_after(after.astimezone(tz).replace(tzinfo=None)):
        instant = slot_instant(wall, tz)
        if instant > last:
            last = instant
            yield instant


def next_slot(cron: Cron, tz: zoneinfo.ZoneInfo, after: dt.datetime) -> dt.datetime | None:
    """The first slot strictly after ``after``; None when none comes within the horizon."""
    return next(slots_after(cron, tz, after), None)


def slots_between(
    cron: Cron, tz: zoneinfo.ZoneInfo, after: dt.datetime, until: dt.datetime, *, limit: int
) -> list[dt.datetime]:
    """The slots in ``(after, until]``, oldest first, at most ``limit`` of them (the oldest)."""
    slots: list[dt.datetime] = []
    for slot in slots_after(cron, tz, after):
        if slot > until or len(slots) >= limit:
            break
        slots.append(slot)
    return slots


@attrs.frozen(kw_only=True)
class ScheduleRules:
    """A schedule's checked fields (:func:`check_schedule`)."""

    name: str
    cron: Cron
    tz: str
    concurrency_policy: str
    starting_deadline_s: int


def check_schedule(
    *,
    name: str,
    cron: str,
    tz: str,
    concurrency_policy: str,
    starting_deadline_s: int | None,
    now: dt.datetime,
) -> ScheduleRules:
    """Check a schedule's own fields (its job's spec is checked as a job's).

    Args:
        name: 1-64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit.
        cron: see :data:`CRON_RULE`; it must name a slot within :data:`CRON_HORIZON_YEARS`
            years of ``now``.
        tz: an IANA time zone name.
        concurrency_policy: one of :data:`CONCURRENCY_POLICIES`; empty: ``allow``.
        starting_deadline_s: seconds, :data:`MIN_STARTING_DEADLINE_S` to
            :data:`MAX_STARTING_DEADLINE_S`; None: :data:`DEFAULT_STARTING_DEADLINE_S` (0, which the
            wire sends for none, is the caller's to read as None).
        now: aware; the instant the horizon starts from.

    Raises:
        InvalidArgument: the first field that breaks its rule, its value and the rule.
    """
    identifiers.check_id(name, field="name")
    parsed = parse_cron(cron)
    tzinfo = zone(tz)
    if next_slot(parsed, tzinfo, now) is None:
        raise InvalidArgument(
            "cron",
            cron,
            f"must name a time within {CRON_HORIZON_YEARS} years (CRON_HORIZON_YEARS)",
            detail=f"none after {now.astimezone(tzinfo).isoformat()} in {tz}",
        )
    policy = concurrency_policy or "allow"
    if policy not in CONCURRENCY_POLICIES:
        raise InvalidArgument(
            "concurrency_policy", concurrency_policy, f"must be one of {', '.join(CONCURRENCY_POLICIES)}"
        )
    deadline = DEFAULT_STARTING_DEADLINE_S if starting_deadline_s is None else starting_deadline_s
    if not MIN_STARTING_DEADLINE_S <= deadline <= MAX_STARTING_DEADLINE_S:
        raise InvalidArgument(
            "starting_deadline_s",
            starting_deadline_s,
            f"must be between {MIN_STARTING_DEADLINE_S} and {MAX_STARTING_DEADLINE_S} seconds "
            "(MAX_STARTING_DEADLINE_S, one week)",
        )
    return ScheduleRules(
        name=name, cron=parsed, tz=tz, concurrency_policy=policy, starting_deadline_s=deadline
    )

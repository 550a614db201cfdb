"""A schedule's slots (runtime/schedules.py): cron in a time zone, the daylight-saving rule, and
the checks of a schedule's fields."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from runtime.errors import InvalidArgument
from runtime.schedules import (
    UTC,
    check_schedule,
    next_slot,
    parse_cron,
    slot_instant,
    slots_between,
    zone,
)

BERLIN = zone("Europe/Berlin")
NOW = dt.datetime(2026, 6, 1, tzinfo=UTC)


def berlin(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def local(slots: list[dt.datetime]) -> list[str]:
    return [s.astimezone(BERLIN).isoformat() for s in slots]


def test_spring_skipped_time_fires_once_when_the_gap_ends() -> None:
    """02:30 daily does not exist on 2026-03-29 in Berlin: that day it fires once at 03:00 CEST."""
    cron = parse_cron("30 2 * * *")
    slots = slots_between(cron, BERLIN, berlin(2026, 3, 27), berlin(2026, 3, 31), limit=10)
    assert local(slots) == [
        "2026-03-27T02:30:00+01:00",
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]


def test_spring_several_skipped_times_are_one_slot() -> None:
    """Every 15 minutes across the spring gap: 02:00-02:45 are one slot at 03:00, which is also 03:00's."""
    cron = parse_cron("*/15 * * * *")
    slots = slots_between(cron, BERLIN, berlin(2026, 3, 29, 0, 30), berlin(2026, 3, 29, 1, 30), limit=10)
    assert local(slots) == [
        "2026-03-29T01:45:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T03:15:00+02:00",
        "2026-03-29T03:30:00+02:00",
    ]


def test_autumn_repeated_time_fires_once_at_its_first_occurrence() -> None:
    """02:30 daily happens twice on 2026-10-25 in Berlin: it fires at 02:30 CEST only."""
    cron = parse_cron("30 2 * * *")
    slots = slots_between(cron, BERLIN, berlin(2026, 10, 23), berlin(2026, 10, 27), limit=10)
    assert local(slots) == [
        "2026-10-23T02:30:00+02:00",
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]


def test_autumn_repeated_hour_fires_once() -> None:
    """Every 15 minutes across the autumn change: the second pass of 02:00-02:45 names no slot."""
    cron = parse_cron("*/15 * * * *")
    slots = slots_between(cron, BERLIN, berlin(2026, 10, 24, 23, 50), berlin(2026, 10, 25, 2, 20), limit=20)
    assert local(slots) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:15:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:45:00+02:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T03:15:00+01:00",
    ]


def test_next_slot_from_inside_the_repeated_hour_skips_its_first_occurrences() -> None:
    """From 02:10 CET (the second pass), the next slot is 03:00 CET, not a 02:xx already fired."""
    cron = parse_cron("*/15 * * * *")
    after = berlin(2026, 10, 25, 1, 10)  # 02:10 CET
    assert next_slot(cron, BERLIN, after) == berlin(2026, 10, 25, 2, 0)


def test_seconds_field_fires_every_two_seconds() -> None:
    """A 6-field expression's first field is the second."""
    cron = parse_cron("*/2 * * * * *")
    slots = slots_between(cron, zone("UTC"), berlin(2026, 1, 1), berlin(2026, 1, 1, 0, 0, 6), limit=10)
    assert slots == [berlin(2026, 1, 1, 0, 0, s) for s in (2, 4, 6)]


@settings(max_examples=examples(200), deadline=None)
@given(
    start=st.datetimes(min_value=dt.datetime(2026, 1, 1), max_value=dt.datetime(2027, 12, 31)),
    expression=st.sampled_from(["*/15 * * * *", "30 2 * * *", "0 * * * *", "5,35 1-3 * * *", "@daily"]),
    tz=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"]),
)
def test_slots_increase_and_resume_where_they_stopped(start: dt.datetime, expression: str, tz: str) -> None:
    """Slots strictly increase, and the slots after any slot are the rest of the same sequence
    (a new leader starting from the last recorded slot fires the same ones)."""
    cron, zone_info = parse_cron(expression), zone(tz)
    after = start.replace(tzinfo=UTC)
    slots = slots_between(cron, zone_info, after, after + dt.timedelta(days=3), limit=400)
    assert all(a < b for a, b in itertools.pairwise(slots))
    assert all(s > after for s in slots)
    for i, slot in enumerate(slots[:-1]):
        assert next_slot(cron, zone_info, slot) == slots[i + 1]


@settings(max_examples=examples(200), deadline=None)
@given(wall=st.datetimes(min_value=dt.datetime(2026, 1, 1), max_value=dt.datetime(2027, 12, 31)))
def test_slot_instant_is_the_wall_time_or_the_end_of_its_gap(wall: dt.datetime) -> None:
    """An existing wall-clock time fires at its first occurrence; a skipped one at the first
    instant whose wall-clock time is later."""
    wall = wall.replace(microsecond=0)
    instant = slot_instant(wall, BERLIN)
    shown = instant.astimezone(BERLIN).replace(tzinfo=None)
    if shown == wall:
        assert instant == wall.replace(tzinfo=BERLIN, fold=0).astimezone(UTC)
    else:
        assert shown > wall
        assert (instant - dt.timedelta(seconds=1)).astimezone(BERLIN).replace(tzinfo=None) < wall


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"cron": "every minute"}, "cron", "cron expression of 5 fields"),
        ({"cron": "61 * * * *"}, "cron", "out of range"),
        ({"cron": "0 0 30 2 *"}, "cron", "within 5 years (CRON_HORIZON_YEARS)"),
        ({"cron": "0 0 1-0 * *"}, "cron", "the range 1-0 runs backwards"),
        ({"cron": "0 0 * * 5-2"}, "cron", "the range 5-2 runs backwards"),
        ({"tz": "Mars/Olympus"}, "tz", "IANA time zone"),
        ({"tz": "localtime"}, "tz", "IANA time zone"),
        ({"tz": "Factory"}, "tz", "IANA time zone"),
        ({"tz": "posix/Europe/Berlin"}, "tz", "IANA time zone"),
        ({"tz": "../../etc/passwd"}, "tz", "IANA time zone"),
        ({"starting_deadline_s": 10**9}, "starting_deadline_s", "between 1 and 604800"),
        ({"concurrency_policy": "sometimes"}, "concurrency_policy", "allow, forbid, replace"),
        ({"name": "-bad name"}, "name", ""),
    ],
)
def test_bad_fields_are_refused_naming_field_value_and_limit(
    fields: dict[str, object], field: str, words: str
) -> None:
    """Each bad field raises InvalidArgument naming the field, the value and the rule."""
    args: dict[str, object] = {
        "name": "nightly",
        "cron": "0 3 * * *",
        "tz": "Europe/Berlin",
        "concurrency_policy": "",
        "starting_deadline_s": None,
        **fields,
    }
    with pytest.raises(InvalidArgument) as caught:
        check_schedule(now=NOW, **args)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert repr(fields[field]) in str(caught.value)
    assert words in str(caught.value)


def test_defaults_are_allow_and_sixty_seconds() -> None:
    """An empty policy is allow; no deadline is the default 60 s."""
    rules = check_schedule(
        name="n", cron="@hourly", tz="UTC", concurrency_policy="", starting_deadline_s=None, now=NOW
    )
    assert (rules.concurrency_policy, rules.starting_deadline_s) == ("allow", 60)


def test_a_zero_starting_deadline_is_refused() -> None:
    """A deadline of 0 s is below the range, refused as -1 is (not read as the default)."""
    with pytest.raises(InvalidArgument, match=r"starting_deadline_s must be between 1 and 604800"):
        check_schedule(
            name="n", cron="@hourly", tz="UTC", concurrency_policy="", starting_deadline_s=0, now=NOW
        )

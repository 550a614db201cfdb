"""The job lifecycle's fields of a spec: their checks (each naming the field, the value and the
limit) and their wire form."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import pb
from runtime.constraints import parse_constraint
from runtime.errors import InvalidArgument
from runtime.jobs import ArrayRange, JobSpec, SleepRuntime, parse_array
from runtime.wire_jobs import job_spec_from_pb, job_spec_to_pb


def _spec(**fields: Any) -> JobSpec:
    return JobSpec(name="j", cpu_millis=100, memory_mb=16, runtime=SleepRuntime(duration_ms=1), **fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be between 1 and 100, got 0"),
        ({"max_attempts": 10**9}, "max_attempts must be between 1 and 100, got 1000000000"),
        ({"retry_backoff_s": -1.0}, "retry_backoff_s must be at least 0 and at most 600 seconds, got -1.0"),
        ({"retry_backoff_s": math.nan}, "retry_backoff_s must be a finite number of seconds, got nan"),
        ({"timeout_s": 0.0}, "timeout_s must be at least 0.001 and at most 604800 seconds, got 0.0"),
        (
            {"timeout_s": 604_801.0},
            "timeout_s must be at least 0.001 and at most 604800 seconds, got 604801.0",
        ),
        ({"env": {"A=B": "1"}}, "env name must not contain '=' (write NAME=VALUE), got 'A=B'"),
        ({"env": {"A\x00": "1"}}, "env name must not contain NUL bytes"),
        *(
            (
                {"env": {name: "x"}},
                f"env name must be a letter or _ then letters, digits or _ ([A-Za-z_][A-Za-z0-9_]*), "
                f"got {name!r}",
            )
            for name in ("A B", "1X", "A-B", "A.B", "É", "A\tB", " A", "A\n")
        ),
        ({"env": {"STOCKADE_ARRAY_INDEX": "1"}}, "must not start with STOCKADE_"),
        ({"workdir": "relative/dir"}, "workdir must be an absolute path"),
        ({"after": (3, 3)}, "after must name each job once"),
        ({"after": (0,)}, "after[0] must be between 1 and"),
        ({"array": ArrayRange(first_index=5, last_index=1)}, "array must end at or after its first index"),
        ({"array": ArrayRange(first_index=1, last_index=10**7)}, "array must have at most 10000 tasks"),
    ],
)
def test_bad_lifecycle_fields_are_refused_naming_field_value_and_limit(
    fields: dict[str, Any], message: str
) -> None:
    """Each bad value is refused by the spec's check with a message naming it."""
    with pytest.raises(InvalidArgument) as caught:
        _spec(**fields).check()
    assert message in str(caught.value)


@pytest.mark.parametrize("text", ["5-1", "1-10000000", "x", "1-2%", "-3", "\u0661-\u0663", "\uff11-\uff13"])
def test_bad_array_texts_are_refused(text: str) -> None:
    """``--array`` texts that are no range, backwards or too large, or not in ASCII digits
    (Arabic-Indic, full-width), are refused."""
    with pytest.raises(InvalidArgument, match="array"):
        parse_array(text)


@given(
    max_attempts=st.integers(1, 100),
    backoff_ms=st.integers(0, 600_000),
    count_lost=st.booleans(),
    timeout_ms=st.one_of(st.none(), st.integers(1, 604_800_000)),
    env=st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True),
        st.text(max_size=8).filter(lambda v: "\x00" not in v),
        max_size=3,
    ),
    after=st.lists(st.integers(1, 10**6), unique=True, max_size=4),
)
def test_every_lifecycle_field_survives_the_wire(
    max_attempts: int,
    backoff_ms: int,
    count_lost: bool,
    timeout_ms: int | None,
    env: dict[str, str],
    after: list[int],
) -> None:
    """A checked spec comes back from its wire form equal, whatever its lifecycle fields."""
    spec = _spec(
        max_attempts=max_attempts,
        retry_backoff_s=backoff_ms / 1000,
        count_lost=count_lost,
        timeout_s=None if timeout_ms is None else timeout_ms / 1000,
        constraints=(parse_constraint("gpu=a100"), parse_constraint("zone in (a,b)")),
        env=env,
        workdir="/srv/data",
        after=tuple(after),
        array=ArrayRange(first_index=1, last_index=10, max_running=2),
    ).check()
    assert job_spec_from_pb(pb.JobSpec.parse(bytes(job_spec_to_pb(spec)))) == spec

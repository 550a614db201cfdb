"""Encoding and decoding large messages in steps (protocol.wire): the same message as
betterproto2's in one piece, a yield every step_messages elements, malformed input refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import pb
from protocol.wire import Encoded, decode_steps, encode_steps, run_steps
from runtime import validation
from runtime.aio import WireCodec
from runtime.errors import InvalidArgument
from runtime.jobs import JobSpec, SleepRuntime

texts = st.text(max_size=12)
job_infos = st.builds(
    pb.JobInfo,
    job_id=st.integers(0, 2**63 - 1),
    spec=st.builds(
        pb.JobSpec,
        name=texts,
        cpu_millis=st.integers(0, 2**32 - 1),
        memory_mb=st.integers(0, 2**32 - 1),
        sleep=st.builds(pb.SleepRuntime, duration_ms=st.integers(0, 2**32 - 1)),
    ),
    state=texts,
    reason=texts,
    exit_code=st.integers(-(2**31), 2**31 - 1),
    finished_unix_s=st.floats(allow_nan=False),
)
listings = st.builds(pb.ListJobsReply, jobs=st.lists(job_infos, max_size=40))
statuses = st.builds(
    pb.StatusReply,
    leader=texts,
    epoch=st.integers(0, 2**63 - 1),
    workers=st.lists(
        st.builds(pb.WorkerInfo, id=texts, job_ids=st.lists(st.integers(0, 2**63 - 1))), max_size=8
    ),
    unschedulable=st.lists(job_infos, max_size=8),
    answered_by=texts,
)


def yields(steps: object) -> int:
    count = 0
    while True:
        try:
            next(steps)  # type: ignore[call-overload]
        except StopIteration:
            return count
        count += 1


@given(message=st.one_of(listings, statuses), step=st.integers(1, 16))
def test_encoding_in_steps_decodes_to_the_same_message(message: pb.ListJobsReply, step: int) -> None:
    """What encode_steps returns decodes to the message, as bytes(message) does."""
    data = run_steps(encode_steps(message, step_messages=step))
    assert type(message).FromString(data) == message


@given(message=st.one_of(listings, statuses), step=st.integers(1, 16))
def test_decoding_in_steps_gives_the_message_betterproto2_gives(message: pb.ListJobsReply, step: int) -> None:
    """decode_steps of bytes(message) equals FromString of it."""
    assert run_steps(decode_steps(type(message), bytes(message), step_messages=step)) == message


@given(message=listings, step=st.integers(1, 16))
def test_a_step_ends_after_every_step_messages_elements(message: pb.ListJobsReply, step: int) -> None:
    """n elements give n // step yields, encoding and decoding alike."""
    assert yields(encode_steps(message, step_messages=step)) == len(message.jobs) // step
    assert (
        yields(decode_steps(pb.ListJobsReply, bytes(message), step_messages=step))
        == len(message.jobs) // step
    )


def test_elements_built_lazily_are_encoded_in_the_steps() -> None:
    """A listing's jobs may come from an iterable of the caller's, built as they are encoded."""
    built: list[int] = []

    def jobs() -> object:
        for n in range(1, 6):
            built.append(n)
            yield pb.JobInfo(job_id=n)

    steps = encode_steps(pb.ListJobsReply(), step_messages=2, elements={"jobs": jobs()})  # type: ignore[dict-item]
    next(steps)
    assert built == [1, 2]
    data = run_steps(steps)
    assert [j.job_id for j in pb.ListJobsReply.FromString(data).jobs] == [1, 2, 3, 4, 5]


def test_elements_must_name_a_repeated_message_field() -> None:
    """A field that is not a list of messages is refused, naming it."""
    with pytest.raises(
        ValueError, match=r"elements must name repeated message fields of StatusReply, got \['leader'\]"
    ):
        run_steps(encode_steps(pb.StatusReply(), step_messages=1, elements={"leader": []}))


@pytest.mark.parametrize(
    "data", [b"\x0a\x05ab", b"\x0a", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x0b"]
)
def test_malformed_data_is_refused_with_a_value_error(data: bytes) -> None:
    """A truncated element, a truncated or endless varint, an unknown wire type: ValueError."""
    with pytest.raises(ValueError):
        run_steps(decode_steps(pb.SubmitJobsRequest, data, step_messages=4))


def test_the_server_codec_sends_an_encoded_reply_as_it_is_and_checks_its_type() -> None:
    """WireCodec passes Encoded bytes through, encodes messages as usual, and refuses an
    Encoded of another type."""
    codec = WireCodec()
    reply = pb.ListJobsReply(jobs=[pb.JobInfo(job_id=7)])
    assert codec.encode(Encoded(pb.ListJobsReply, b"raw"), pb.ListJobsReply) == b"raw"
    assert codec.encode(reply, pb.ListJobsReply) == bytes(reply)
    with pytest.raises(TypeError, match="reply must be encoded from"):
        codec.encode(Encoded(pb.StatusReply, b""), pb.ListJobsReply)


@given(
    specs=st.lists(
        st.builds(
            JobSpec,
            name=st.sampled_from(["j", "", "x\x00"]),
            cpu_millis=st.integers(-1, 2000),
            memory_mb=st.integers(1, 10),
            priority=st.just(0),
            runtime=st.just(SleepRuntime(duration_ms=10)),
        ),
        max_size=20,
    ),
    step=st.integers(1, 8),
)
def test_checking_a_batch_in_steps_gives_what_checking_it_at_once_gives(
    specs: list[JobSpec], step: int
) -> None:
    """check_jobs_steps returns the same jobs, or raises the same error, as check_jobs."""
    try:
        expected: object = validation.check_jobs(specs)
    except InvalidArgument as exc:
        expected = str(exc)
    try:
        got: object = run_steps(validation.check_jobs_steps(specs, spec_of=lambda s: s, step_jobs=step))
    except InvalidArgument as exc:
        got = str(exc)
    assert got == expected

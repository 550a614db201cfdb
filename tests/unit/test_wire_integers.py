"""Integers on the wire are taken as sent or refused, never truncated: every integer field of
every request of both services (found from the .proto's own descriptors, so a new field is
covered without a change here), sent just outside its type's range and far outside it, is
refused naming its path and the value as sent, by every way a request is decoded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpclib.const
import grpclib.exceptions
import pytest
from wire_fields import RANGES, IntegerField, as_sent, encode, integer_fields, on_the_wire, outside

from protocol import pb, wire
from runtime.aio import WireCodec


def decode_whole(request: type[Any], data: bytes) -> Any:
    return wire.parse(request, data)


def decode_in_steps(request: type[Any], data: bytes) -> Any:
    return wire.run_steps(wire.decode_steps(request, data, step_messages=1))


def decode_as_served(request: type[Any], data: bytes) -> Any:
    return WireCodec().decode(data, request)


DECODERS: dict[str, Callable[[type[Any], bytes], Any]] = {
    "parse": decode_whole,
    "decode_steps": decode_in_steps,
    "server codec": decode_as_served,
}

CASES = [
    pytest.param(field, raw, id=f"{field.request}.{field.path}={raw}")
    for field in integer_fields()
    for raw in outside(field.type)
]


def refusal(decode: Callable[[type[Any], bytes], Any], request: type[Any], data: bytes) -> str:
    """The message of the error ``decode`` refused ``data`` with (an OutOfRange, or INVALID_ARGUMENT
    from the server's codec)."""
    try:
        decoded = decode(request, data)
    except wire.OutOfRange as exc:
        return str(exc)
    except grpclib.exceptions.GRPCError as exc:
        assert exc.status == grpclib.const.Status.INVALID_ARGUMENT
        return exc.message or ""
    raise AssertionError(f"decoded as {decoded!r}")


def test_the_descriptors_name_the_integer_fields_of_both_services() -> None:
    """The walk finds the fields the issue names, in both services' requests (a check on the test)."""
    paths = {f"{f.request}.{f.path}" for f in integer_fields()}
    assert {
        "SubmitJobRequest.spec.priority",
        "SubmitJobRequest.spec.cpu_millis",
        "SubmitJobsRequest.specs[0].memory_mb",
        "RegisterWorkerRequest.cpu_millis",
        "HeartbeatRequest.running_assignment_ids[0]",
        "AssignRequest.assignments[0].spec.cpu_millis",
        "CancelRequest.assignment_ids[0]",
    } <= paths


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(("field", "raw"), CASES)
def test_an_integer_outside_its_type_is_refused_naming_the_field_and_the_value_as_sent(
    field: IntegerField, raw: int, decoder: str
) -> None:
    """Just outside the range on either side, or far outside it: refused, naming the field's
    path, the range and the value as the sender wrote it, not a truncated one."""
    request = getattr(pb, field.request)
    message = refusal(DECODERS[decoder], request, encode(field, raw))
    low, high = RANGES[field.type]
    assert message.startswith(f"{field.path} must be between {low} and {high} (")
    assert f", got {as_sent(field.type, raw)}" in message


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(
    "field", [f for f in integer_fields() if f.steps[-1].repeated], ids=lambda f: f"{f.request}.{f.path}"
)
def test_a_packed_list_is_checked_element_by_element(field: IntegerField, decoder: str) -> None:
    """In a packed list, the element outside the range is named by its index."""
    request = getattr(pb, field.request)
    _, high = RANGES[field.type]
    raw = on_the_wire(field.type, high + 1)
    message = refusal(DECODERS[decoder], request, encode(field, raw, packed_after=1))
    assert message.startswith(f"{field.path.removesuffix('[0]')}[1] must be between")


def read(message: Any, field: IntegerField) -> Any:
    for step in field.steps:
        message = getattr(message, step.name)
        if step.repeated:
            message = message[0]
    return message


@pytest.mark.parametrize("decoder", ["parse", "decode_steps"])
@pytest.mark.parametrize("field", integer_fields(), ids=lambda f: f"{f.request}.{f.path}")
def test_the_ends_of_the_range_are_taken_as_sent(field: IntegerField, decoder: str) -> None:
    """The lowest and the highest value of the range decode to themselves."""
    request = getattr(pb, field.request)
    for value in RANGES[field.type]:
        decoded = DECODERS[decoder](request, encode(field, on_the_wire(field.type, value)))
        assert read(decoded, field) == value


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            pb.JobSpec(priority=2**40),
            "spec.priority must be between -2147483648 and 2147483647 (int32), got 1099511627776",
        ),
        (
            pb.JobSpec(cpu_millis=2**32 + 500),
            "spec.cpu_millis must be between 0 and 4294967295 (uint32), got 4294967796",
        ),
        (
            pb.JobSpec(memory_mb=2**32 + 256),
            "spec.memory_mb must be between 0 and 4294967295 (uint32), got 4294967552",
        ),
        (
            pb.JobSpec(cpu_millis=-1),
            "spec.cpu_millis must be between 0 and 4294967295 (uint32), got 18446744073709551615 "
            "(-1 as a signed 64-bit integer)",
        ),
    ],
)
def test_the_issues_submissions_are_refused_with_the_value_sent(spec: pb.JobSpec, message: str) -> None:
    """What a betterproto2 client sends for these values is refused with the number it was given."""
    data = bytes(pb.SubmitJobRequest(spec=spec))
    assert refusal(decode_as_served, pb.SubmitJobRequest, data) == message


def malformed(decode: Callable[[type[Any], bytes], Any], request: type[Any], data: bytes) -> str:
    """The message of the error ``decode`` refused a malformed ``data`` with (a ValueError, or
    INVALID_ARGUMENT from the server's codec); never a decoded message of the wrong shape."""
    try:
        decoded = decode(request, data)
    except ValueError as exc:
        return str(exc)
    except grpclib.exceptions.GRPCError as exc:
        assert exc.status == grpclib.const.Status.INVALID_ARGUMENT
        return exc.message or ""
    raise AssertionError(f"decoded as {decoded!r}")


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(
    "field", [f for f in integer_fields() if not f.steps[-1].repeated], ids=lambda f: f"{f.request}.{f.path}"
)
def test_a_single_integer_sent_as_a_packed_list_is_refused(field: IntegerField, decoder: str) -> None:
    """A non-repeated integer field sent length-delimited (a packed list, ``cpu_millis=[500]``)
    is malformed: refused naming the field, where betterproto2 would have made the field a list
    and the handler would have failed with an internal error."""
    request = getattr(pb, field.request)
    message = malformed(DECODERS[decoder], request, encode(field, 500, packed_after=1))
    assert f"field {field.path} came as wire type 2" in message


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_string_sent_as_a_varint_is_refused(decoder: str) -> None:
    """SubmitJob's ``spec.name`` (field 1 of JobSpec, field 1 of the request) sent as a varint."""
    data = bytes([0x0A, 0x02, 0x08, 0x05])  # spec: {name (1) as varint 5}
    message = malformed(DECODERS[decoder], pb.SubmitJobRequest, data)
    assert "field spec.name came as wire type 0" in message

"""Integer fields of the requests of every service, found from the .proto's own descriptors
(protoc's, not betterproto2's), and the varints to send for them: the oracle of the tests of
integers on the wire (tests/unit/test_wire_integers.py, tests/integration/test_integers_over_grpc.py)."""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from protocol import wire

PROTO_DIR = Path(wire.__file__).parent
FieldType = descriptor_pb2.FieldDescriptorProto

SIGNED = {FieldType.TYPE_INT32, FieldType.TYPE_INT64, FieldType.TYPE_SFIXED32, FieldType.TYPE_SFIXED64}
ZIGZAG = {FieldType.TYPE_SINT32, FieldType.TYPE_SINT64}
RANGES = {
    FieldType.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldType.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldType.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldType.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldType.TYPE_UINT32: (0, 2**32 - 1),
    FieldType.TYPE_FIXED32: (0, 2**32 - 1),
    FieldType.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldType.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldType.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    # Stockade's uint64 fields hold PostgreSQL bigints (stockade.proto says so).
    FieldType.TYPE_UINT64: (0, 2**63 - 1),
    FieldType.TYPE_FIXED64: (0, 2**63 - 1),
}
"""Declared integer type -> the range Stockade takes (the test's own copy, not the code's)."""


@functools.cache
def descriptors() -> descriptor_pb2.FileDescriptorSet:
    """The descriptors protoc makes of ``protocol/*.proto``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stockade.desc"
        protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
        assert protoc.main(["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", *protos]) == 0
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


@attrs.frozen
class Step:
    """One field on the way from a request to an integer field."""

    number: int
    name: str
    repeated: bool


@attrs.frozen
class IntegerField:
    """An integer field of a request message, by its path from the request."""

    service: str
    rpc: str
    request: str
    steps: tuple[Step, ...]
    type: int

    @property
    def route(self) -> str:
        """The RPC's gRPC path, e.g. ``/stockade.v1.ControlPlane/SubmitJob``."""
        return f"/{self.service}/{self.rpc}"

    @property
    def path(self) -> str:
        """The path in error messages, e.g. ``assignments[0].spec.cpu_millis``."""
        return ".".join(f"{s.name}[0]" if s.repeated else s.name for s in self.steps)


def integer_fields() -> list[IntegerField]:
    """Every integer field reachable from the input message of every RPC of every service
    (a request used by two RPCs appears for each)."""
    files = descriptors().file
    messages = dict(kv for f in files for kv in _by_name(f".{f.package}", f.message_type))
    found = []
    for file in files:
        for service in file.service:
            for method in service.method:
                rpc = (f"{file.package}.{service.name}", method.name, method.input_type.rpartition(".")[2])
                found += _walk(rpc, messages[method.input_type], (), messages)
    return found


def _by_name(prefix: str, types: Any) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    """Full name -> descriptor of every message type, nested ones (map entries) included."""
    for message in types:
        yield f"{prefix}.{message.name}", message
        yield from _by_name(f"{prefix}.{message.name}", message.nested_type)


def _walk(
    rpc: tuple[str, str, str],
    message: descriptor_pb2.DescriptorProto,
    steps: tuple[Step, ...],
    messages: dict[str, Any],
) -> Iterator[IntegerField]:
    for field in message.field:
        step = Step(field.number, field.name, field.label == FieldType.LABEL_REPEATED)
        if field.type in RANGES:
            yield IntegerField(*rpc, (*steps, step), field.type)
        elif field.type == FieldType.TYPE_MESSAGE and len(steps) < 8:
            yield from _walk(rpc, messages[field.type_name], (*steps, step), messages)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode(field: IntegerField, raw: int, *, packed_after: int | None = None) -> bytes:
    """A request holding only ``raw`` as the integer field's varint, inside its messages.
    ``packed_after``: send the field packed, after this good element."""
    last = field.steps[-1]
    if packed_after is None:
        data = varint(last.number << 3) + varint(raw)
    else:
        payload = varint(packed_after) + varint(raw)
        data = varint(last.number << 3 | 2) + varint(len(payload)) + payload
    for step in reversed(field.steps[:-1]):
        data = varint(step.number << 3 | 2) + varint(len(data)) + data
    return data


def on_the_wire(field_type: int, value: int) -> int:
    """The varint a sender writes for ``value`` in a field of ``field_type``."""
    if field_type in ZIGZAG:
        return ((value << 1) ^ (value >> 63)) % 2**64
    return value % 2**64


def as_sent(field_type: int, raw: int) -> int:
    """The value a receiver should report: ``raw`` read at 64 bits with the declared signedness."""
    if raw >= 2**64:
        return raw
    if field_type in ZIGZAG:
        return (raw >> 1) ^ -(raw & 1)
    if field_type in SIGNED or field_type == FieldType.TYPE_ENUM:
        return raw - 2**64 if raw >= 2**63 else raw
    return raw


def outside(field_type: int) -> list[int]:
    """Varints just outside the type's range on both sides and far outside it: one past each
    end where 64 bits can say it (a 64-bit signed type's are past that: the 65-bit varint
    2**64 is its "just outside"), 2**40 past the top, the most negative 64-bit number, and the
    longest varint (70 bits)."""
    low, high = RANGES[field_type]
    raws = {2**64, 2**70 - 1}
    if high < 2**63 - 1 or field_type not in SIGNED | ZIGZAG:
        raws.add(on_the_wire(field_type, high + 1))
    if high < 2**63 - 1:
        raws.add(on_the_wire(field_type, 2**40 + high))
    if low - 1 >= -(2**63):
        raws.add(on_the_wire(field_type, low - 1))
        raws.add(on_the_wire(field_type, -(2**63)))
    return sorted(raws)

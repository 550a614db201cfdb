"""Encoding and decoding large messages in steps, so a server can yield to its event loop, and
decoding that refuses an integer outside its field's type.

:func:`encode_steps` and :func:`decode_steps` yield after every ``step_messages`` elements;
:func:`parse` decodes a request, raising :class:`OutOfRange` for an integer sent outside its
field's type (:func:`check_integers`); :class:`Encoded` carries a message in wire form across
the gRPC boundary. Why and how: docs/design.md, "Large messages in steps, and integers as sent".
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, Generic, TypeVar

import attrs
import betterproto2

M = TypeVar("M", bound=betterproto2.Message)

_WIRE_LEN_DELIM = 2


@attrs.frozen
class Encoded(Generic[M]):
    """A message of type ``message_type`` in wire form (``data``, its encoding)."""

    message_type: type[M]
    data: bytes

    def decode(self) -> M:
        """The message, decoded in one piece (:func:`parse`).

        Raises:
            OutOfRange: an integer field's value as sent lies outside its type.
            ValueError: ``data`` is not a well-formed encoding.
        """
        return parse(self.message_type, self.data)


def _message_lists(message_type: type[betterproto2.Message]) -> dict[str, Any]:
    """The repeated fields of ``message_type`` whose elements are messages: name -> metadata."""
    metadata = message_type._betterproto.meta_by_field_name  # type: ignore[arg-type]
    return {
        name: meta
        for name, meta in metadata.items()
        if meta.repeated and meta.proto_type == betterproto2.TYPE_MESSAGE and not meta.map_meta
    }


def _check_step(step_messages: int) -> None:
    if step_messages < 1:
        raise ValueError(f"step_messages must be >= 1, got {step_messages}")


def encode_steps(
    message: betterproto2.Message,
    *,
    step_messages: int,
    elements: Mapping[str, Iterable[betterproto2.Message]] | None = None,
) -> Generator[None, None, bytes]:
    """``bytes(message)`` in steps: yields after every ``step_messages`` elements of the
    message's repeated message fields it encoded, and returns the encoding.

    The bytes may differ from ``bytes(message)`` in field order, never in what they decode
    to. The caller must not change ``message`` until the generator has returned.

    Args:
        message: the message to encode.
        step_messages: elements encoded between two yields (at least 1).
        elements: for some repeated message fields (by name), their elements, to be taken from
            these iterables instead of ``message`` (which should leave those fields empty):
            elements built lazily are built in the same steps as they are encoded.

    Raises:
        ValueError: ``step_messages`` < 1, or ``elements`` names a field that is not a
            repeated message field of ``message``.
    """
    _check_step(step_messages)
    fields = _message_lists(type(message))
    unknown = sorted(set(elements or ()) - set(fields))
    if unknown:
        raise ValueError(
            f"elements must name repeated message fields of {type(message).__name__}, got {unknown}"
        )
    lists: dict[str, Iterable[betterproto2.Message]] = {
        name: getattr(message, name) for name in fields if getattr(message, name)
    }
    lists.update(elements or {})
    if not lists:
        return bytes(message)
    rest = copy.copy(message)
    for name in lists:
        setattr(rest, name, [])
    parts = [bytes(rest)]
    encoded = 0
    for name, items in lists.items():
        tag = betterproto2.encode_varint((fields[name].number << 3) | _WIRE_LEN_DELIM)
        for element in items:
            data = bytes(element)
            parts += (tag, betterproto2.encode_varint(len(data)), data)
            encoded += 1
            if encoded % step_messages == 0:
                yield
    return b"".join(parts)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos:]`` and the position after it.

    Raises:
        ValueError: the data ends inside the varint, or it is longer than 10 bytes.
    """
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise ValueError("varint longer than 10 bytes")


def _field_end(data: bytes, wire_type: int, pos: int) -> int:
    """Where a field of ``wire_type`` whose value starts at ``pos`` ends.

    Raises:
        ValueError: an unknown wire type, or a field running past the end of ``data``.
    """
    if wire_type == 0:
        return _varint(data, pos)[1]
    if wire_type == 1:
        end = pos + 8
    elif wire_type == _WIRE_LEN_DELIM:
        length, pos = _varint(data, pos)
        end = pos + length
    elif wire_type == 5:
        end = pos + 4
    else:
        raise ValueError(f"unsupported wire type {wire_type}")
    if end > len(data):
        raise ValueError("field runs past the end of the message")
    return end


def decode_steps(message_type: type[M], data: bytes, *, step_messages: int) -> Generator[None, None, M]:
    """``message_type.FromString(data)`` in steps: yields after every ``step_messages``
    elements of the message's repeated message fields it decoded, and returns the message.

    Args:
        message_type: the generated message class.
        data: its wire encoding.
        step_messages: elements decoded between two yields (at least 1).

    Raises:
        OutOfRange: an integer field's value as sent lies outside its type (see :func:`parse`);
            an element's field is named with its index, e.g. ``specs[3].cpu_millis``.
        ValueError: ``step_messages`` < 1, or ``data`` is not a well-formed encoding.
    """
    _check_step(step_messages)
    lists = {meta.number: name for name, meta in _message_lists(message_type).items()}
    if not lists:
        return parse(message_type, data)
    element_types: dict[str, Any] = message_type._betterproto.cls_by_field  # type: ignore[arg-type]
    elements: dict[str, list[Any]] = {name: [] for name in lists.values()}
    rest = bytearray()
    decoded = 0
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 0x7
        name = lists.get(number)
        if name is not None and wire_type == _WIRE_LEN_DELIM:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("field runs past the end of the message")
            index = len(elements[name])
            elements[name].append(
                parse(element_types[name], data[pos : pos + length], field=f"{name}[{index}]")
            )
            pos += length
            decoded += 1
            if decoded % step_messages == 0:
                yield
        else:
            pos = _field_end(data, wire_type, pos)
            rest += data[start:pos]
    message = parse(message_type, bytes(rest))
    for name, values in elements.items():
        if values:
            setattr(message, name, values)
    return message


def parse(message_type: type[M], data: bytes, *, field: str = "") -> M:
    """``message_type.FromString(data)``, once :func:`check_integers` has found every integer
    as sent inside its field's type.

    Args:
        message_type: the generated message class.
        data: its wire encoding.
        field: where the message sits in an enclosing one, for error messages (``specs[3]``);
            empty for a whole request.

    Raises:
        OutOfRange: an integer field's value as sent lies outside its type.
        ValueError: ``data`` is not a well-formed encoding of ``message_type``.
    """
    check_integers(message_type, data, field=field)
    try:
        return message_type.FromString(data)
    except Exception as exc:  # betterproto2 raises what its parsing meets: EOFError, struct.error ...
        raise ValueError(f"not a well-formed {message_type.__name__}: {exc!r}") from exc


@attrs.define(auto_exc=True)
class OutOfRange(ValueError):
    """An integer field's value, as sent, lies outside what the field's declared type holds.

    The message reads like ``runtime.errors.InvalidArgument``'s: ``spec.priority must be
    between -2147483648 and 2147483647 (int32), got 1099511627776``.

    Attributes:
        field: the field's path in the request, e.g. ``"specs[3].cpu_millis"``.
        value: the value as sent: the varint read at 64 bits with the field's declared
            signedness (zigzag for ``sint``), or as it is when it needs more than 64 bits.
        rule: the range it broke, e.g. ``"must be between 0 and 4294967295 (uint32)"``.
        detail: another reading of the same bits, e.g. ``"-1 as a signed 64-bit integer"``,
            for an unsigned field sent a negative number; empty when there is none.
    """

    field: str
    value: int
    rule: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"{self.field} {self.rule}, got {self.value}"
        return f"{text} ({self.detail})" if self.detail else text


_UINT64_END = 1 << 64


def _as_unsigned(raw: int) -> int:
    return raw


def _as_signed(raw: int) -> int:
    """Two's complement at 64 bits (how int32 and int64 send a negative number)."""
    return raw - _UINT64_END if 1 << 63 <= raw < _UINT64_END else raw


def _as_zigzag(raw: int) -> int:
    """Zigzag at 64 bits (how sint32 and sint64 send a number)."""
    return (raw >> 1) ^ -(raw & 1) if raw < _UINT64_END else raw


@attrs.frozen
class _IntegerType:
    """The values a declared integer type holds, and how its varint reads."""

    name: str
    low: int
    high: int
    reading: Callable[[int], int]

    def check(self, field: str, raw: int) -> None:
        value = self.reading(raw)
        if self.low <= value <= self.high:
            return
        detail = ""
        if raw >= _UINT64_END:
            detail = "more than 64 bits"
        elif self.low == 0 and value >= 1 << 63:
            detail = f"{value - _UINT64_END} as a signed 64-bit integer"
        raise OutOfRange(field, value, f"must be between {self.low} and {self.high} ({self.name})", detail)


MAX_UINT64 = 2**63 - 1
"""The largest value Stockade takes in a uint64 field: ids, epochs, counts and durations are
stored as PostgreSQL bigints (``stockade.proto`` says so too)."""

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)
_INTEGER_TYPES = {
    proto_type: _IntegerType(proto_type, low, high, reading)
    for proto_type, (low, high), reading in (
        (betterproto2.TYPE_INT32, _INT32, _as_signed),
        (betterproto2.TYPE_ENUM, _INT32, _as_signed),
        (betterproto2.TYPE_SFIXED32, _INT32, _as_signed),
        (betterproto2.TYPE_SINT32, _INT32, _as_zigzag),
        (betterproto2.TYPE_UINT32, _UINT32, _as_unsigned),
        (betterproto2.TYPE_FIXED32, _UINT32, _as_unsigned),
        (betterproto2.TYPE_INT64, _INT64, _as_signed),
        (betterproto2.TYPE_SFIXED64, _INT64, _as_signed),
        (betterproto2.TYPE_SINT64, _INT64, _as_zigzag),
        (betterproto2.TYPE_UINT64, (0, MAX_UINT64), _as_unsigned),
        (betterproto2.TYPE_FIXED64, (0, MAX_UINT64), _as_unsigned),
    )
}
"""Declared integer type -> the values it holds. A fixed-width encoding (wire types 1 and 5)
cannot hold more than its type, except a fixed64 above :data:`MAX_UINT64`, which is refused
too; a varint can hold anything up to 70 bits, so every varint is checked."""


@attrs.frozen
class _Field:
    name: str
    repeated: bool
    integer: _IntegerType | None
    """Set for an integer field."""
    message_type: Any
    """Set for a message field or a map (its entry message, with fields ``key`` and ``value``)."""
    wire_types: frozenset[int] = frozenset()
    """The wire types its values may come in (a repeated scalar also packed, as length-delimited)."""


_VARINT_KINDS = frozenset(
    {
        betterproto2.TYPE_INT32,
        betterproto2.TYPE_INT64,
        betterproto2.TYPE_UINT32,
        betterproto2.TYPE_UINT64,
        betterproto2.TYPE_SINT32,
        betterproto2.TYPE_SINT64,
        betterproto2.TYPE_BOOL,
        betterproto2.TYPE_ENUM,
    }
)
_FIXED64_KINDS = frozenset({betterproto2.TYPE_FIXED64, betterproto2.TYPE_SFIXED64, betterproto2.TYPE_DOUBLE})
_FIXED32_KINDS = frozenset({betterproto2.TYPE_FIXED32, betterproto2.TYPE_SFIXED32, betterproto2.TYPE_FLOAT})


def _wire_types(proto_type: str, repeated: bool) -> frozenset[int]:
    """The wire types a field of ``proto_type`` may be encoded in (the protobuf encoding guide:
    varint 0, 64-bit 1, length-delimited 2, 32-bit 5; repeated scalars may be packed)."""
    packed = {_WIRE_LEN_DELIM} if repeated else set()
    if proto_type in _VARINT_KINDS:
        return frozenset({0, *packed})
    if proto_type in _FIXED64_KINDS:
        return frozenset({1, *packed})
    if proto_type in _FIXED32_KINDS:
        return frozenset({5, *packed})
    return frozenset({_WIRE_LEN_DELIM})  # string, bytes, message, map


@functools.cache
def _fields(message_type: type[betterproto2.Message]) -> dict[int, _Field]:
    """Every field of ``message_type`` by field number, with the wire types it may come in and,
    for integer and message fields, what to check inside, from the metadata betterproto2
    generated from the ``.proto`` descriptors."""
    proto = message_type._betterproto  # type: ignore[arg-type]
    fields = {}
    for name, meta in proto.meta_by_field_name.items():
        repeated = bool(meta.repeated) or meta.proto_type == betterproto2.TYPE_MAP
        wire_types = _wire_types(meta.proto_type, repeated and meta.proto_type != betterproto2.TYPE_MAP)
        integer, nested = _INTEGER_TYPES.get(meta.proto_type), None
        if meta.proto_type in (betterproto2.TYPE_MESSAGE, betterproto2.TYPE_MAP):
            nested = meta.unwrap() if meta.unwrap else proto.cls_by_field[name]
        fields[meta.number] = _Field(name, repeated, integer, nested, wire_types)
    return fields


def check_integers(message_type: type[betterproto2.Message], data: bytes, *, field: str = "") -> None:
    """Check every integer in ``data``, a ``message_type`` on the wire (nested messages, map
    entries and packed lists included), against its field's declared type, before betterproto2
    keeps only the bits that type holds.

    Ranges: int32, sint32, sfixed32 and enums -2**31..2**31-1; uint32 and fixed32 0..2**32-1;
    int64, sint64 and sfixed64 -2**63..2**63-1; uint64 and fixed64 0..:data:`MAX_UINT64`.

    Args:
        message_type: the generated message class.
        data: its wire encoding.
        field: where the message sits in an enclosing one (``specs[3]``), prefixed to the
            field names in errors; empty for a whole request.

    Raises:
        OutOfRange: the first integer outside its field's type; the field is named by its
            path (``spec.cpu_millis``, ``assignments[0].spec.memory_mb``,
            ``running_assignment_ids[2]``).
        ValueError: ``data`` is not a well-formed encoding, or a known field came in a wire
            type its declared type never takes (a packed list for a single integer, a varint
            for a string), which betterproto2 would turn into a value of the wrong Python type.
    """
    _check_integers(message_type, data, 0, len(data), f"{field}." if field else "")


def _check_integers(message_type: Any, data: bytes, pos: int, end: int, prefix: str) -> None:
    fields = _fields(message_type)
    seen: dict[int, int] = {}
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 0x7
        spec = fields.get(number)
        if spec is not None and wire_type not in spec.wire_types:
            raise ValueError(
                f"field {prefix}{spec.name} came as wire type {wire_type}, which its declared type "
                f"never takes (expected {' or '.join(map(str, sorted(spec.wire_types)))})"
            )
        if spec is None:
            pos = _field_end(data, wire_type, pos)
        elif spec.integer is not None and wire_type == 0:
            raw, pos = _varint(data, pos)
            spec.integer.check(_element(prefix, spec, seen, number), raw)
        elif spec.integer is not None and wire_type == _WIRE_LEN_DELIM:
            length, pos = _varint(data, pos)
            packed_end = pos + length
            if packed_end > end:
                raise ValueError("field runs past the end of the message")
            while pos < packed_end:
                raw, pos = _varint(data, pos)
                spec.integer.check(_element(prefix, spec, seen, number), raw)
            if pos != packed_end:
                raise ValueError("packed list runs past its length")
        elif spec.integer is not None and wire_type == 1:
            start, pos = pos, _field_end(data, wire_type, pos)
            spec.integer.check(
                _element(prefix, spec, seen, number), int.from_bytes(data[start:pos], "little")
            )
        elif spec.message_type is not None and wire_type == _WIRE_LEN_DELIM:
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise ValueError("field runs past the end of the message")
            path = _element(prefix, spec, seen, number)
            _check_integers(spec.message_type, data, pos, pos + length, f"{path}.")
            pos += length
        else:
            pos = _field_end(data, wire_type, pos)
        if pos > end:
            raise ValueError("field runs past the end of the message")


def _element(prefix: str, spec: _Field, seen: dict[int, int], number: int) -> str:
    """The path of this occurrence of ``spec``: ``prefix`` + its name, with its index when
    the field is repeated."""
    if not spec.repeated:
        return f"{prefix}{spec.name}"
    index = seen.get(number, 0)
    seen[number] = index + 1
    return f"{prefix}{spec.name}[{index}]"


def run_steps(steps: Generator[None, None, Any]) -> Any:
    """Run ``steps`` (of :func:`encode_steps` or :func:`decode_steps`) to its end, in one piece."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value

"""Encoding and decoding large messages in steps, so a server can yield to its event loop.

betterproto2 encodes and decodes in pure Python: about 70 us per ``JobInfo`` on the 2-core
development VM, so ``bytes()`` of a 1,000-job ``ListJobsReply`` holds the calling thread for
70 to 110 ms in one piece, and decoding a 10,000-job ``SubmitJobsRequest`` for about 200 ms.
On a server's event loop that is as long a wait for every other request, heartbeats included.

:func:`encode_steps` and :func:`decode_steps` do the same work as generators that yield after
every ``step_messages`` elements of the message's repeated message fields, and return the
bytes (or the message) at the end; the caller lets other tasks run at each yield (the shape of
``actors.placement.place_queue_steps``). They rely on two rules of the protobuf wire format
(https://protobuf.dev/programming-guides/encoding/, "Last One Wins" and "Repeated Elements"):
a parser accepts fields in any order, and each occurrence of a repeated message field appends
one element, so ``encode(message without the list) + the list's elements, each framed as
tag, length, bytes`` decodes to the same message as ``bytes(message)``.

:class:`Encoded` carries a message in wire form across the gRPC boundary: a server handler
returns one to have its already-encoded reply sent as is, and receives one for a request it
decodes itself (see ``runtime.aio.trio_service``).
"""

from __future__ import annotations

import copy
from collections.abc import Generator, Iterable, Mapping
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
        """The message, decoded in one piece."""
        return self.message_type.FromString(self.data)


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
        ValueError: ``step_messages`` < 1, or ``data`` is not a well-formed encoding.
    """
    _check_step(step_messages)
    lists = {meta.number: name for name, meta in _message_lists(message_type).items()}
    if not lists:
        return _parse(message_type, data)
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
            elements[name].append(_parse(element_types[name], data[pos : pos + length]))
            pos += length
            decoded += 1
            if decoded % step_messages == 0:
                yield
        else:
            pos = _field_end(data, wire_type, pos)
            rest += data[start:pos]
    message = _parse(message_type, bytes(rest))
    for name, values in elements.items():
        if values:
            setattr(message, name, values)
    return message


def _parse(message_type: type[M], data: bytes) -> M:
    """``message_type.FromString(data)``.

    Raises:
        ValueError: ``data`` is not a well-formed encoding of ``message_type``.
    """
    try:
        return message_type.FromString(data)
    except Exception as exc:  # betterproto2 raises what its parsing meets: EOFError, struct.error ...
        raise ValueError(f"not a well-formed {message_type.__name__}: {exc!r}") from exc


def run_steps(steps: Generator[None, None, Any]) -> Any:
    """Run ``steps`` (of :func:`encode_steps` or :func:`decode_steps`) to its end, in one piece."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value

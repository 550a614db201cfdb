"""Text of unbounded size, shown or passed on in bounded size.

A job's output, a process's log, a message built from a user's input may be one line of
hundreds of megabytes; whatever shows it or passes it on goes through here and holds at most a
fixed number of bytes: :func:`tail_lines` (the end of a file, one seek and one read),
:func:`cut_line` (one line cut to its start and end), :func:`read_lines` and :func:`read_jsonl`
(records, skipping a line longer than any record). Sizes are UTF-8 bytes, never characters; a
cut never splits a UTF-8 sequence; invalid UTF-8 in a file shows as U+FFFD.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import attrs

TAIL_MAX_BYTES = 64 * 1024
"""Default for :func:`tail_lines`: bytes read from the end of a file."""
LINE_MAX_BYTES = 4096
"""Default for :func:`tail_lines` and :func:`cut_line`: bytes of one line shown."""
EARLIER_MARKER = "[… line begins earlier in the file …] "
"""Put before a line whose start lies before the part of the file that was read."""


def cut_marker(cut_bytes: int) -> str:
    """The text put where :func:`cut_line` left out ``cut_bytes`` bytes of a line."""
    return f" [… {cut_bytes} bytes cut …] "


def _head(data: bytes, size: int) -> bytes:
    """At most ``size`` bytes from the start of ``data``, not splitting a UTF-8 sequence."""
    if len(data) <= size:
        return data
    end = size
    while end > 0 and data[end] & 0xC0 == 0x80:  # data[end] continues a sequence: back off
        end -= 1
    return data[:end]


def _tail(data: bytes, size: int) -> bytes:
    """At most ``size`` bytes from the end of ``data``, not splitting a UTF-8 sequence."""
    if size <= 0:
        return b""
    if len(data) <= size:
        return data
    start = len(data) - size
    while start < len(data) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


def _cut(data: bytes, max_bytes: int) -> str:
    if len(data) <= max_bytes:
        return data.decode("utf-8", errors="replace")
    head = _head(data, max_bytes // 2)
    tail = _tail(data, max_bytes - len(head))
    marker = cut_marker(len(data) - len(head) - len(tail))
    return head.decode("utf-8", errors="replace") + marker + tail.decode("utf-8", errors="replace")


def cut_line(text: str, max_bytes: int = LINE_MAX_BYTES) -> str:
    """``text`` if its UTF-8 encoding has at most ``max_bytes`` bytes; else its first and last
    bytes (``max_bytes`` in all, half each) joined by :func:`cut_marker`, which says how many
    bytes were left out. The marker's own bytes come on top of ``max_bytes`` (>= 0).
    """
    data = text.encode("utf-8", errors="surrogatepass")
    return text if len(data) <= max_bytes else _cut(data, max_bytes)


RECORD_MAX_BYTES = 64 * 1024
"""Default for :func:`read_lines`: longest line returned."""


def read_lines(file: IO[bytes], max_bytes: int = RECORD_MAX_BYTES) -> Iterator[bytes]:
    """Each line of ``file`` from its position on, without its ``\\n``, holding at most
    ``max_bytes + 1`` bytes in memory at a time: a longer line (a corrupt file, say a run of
    NUL bytes a crash left behind) is read past in pieces and skipped (OSError if the file
    cannot be read).
    """
    while line := file.readline(max_bytes + 1):
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = file.readline(max_bytes + 1)
            continue
        yield line.removesuffix(b"\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON object line of ``path`` (an ``agent.jsonl``, an ``events.jsonl``), in order; a
    torn last line (a killed writer) is skipped, and so is a line longer than any record
    (:func:`read_lines`), without being held (OSError if the file cannot be read).
    """
    records: list[dict[str, Any]] = []
    with path.open("rb") as file:
        for line in read_lines(file):
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
    return records


def head_bytes(text: str, max_bytes: int) -> str:
    """The longest start of ``text`` whose UTF-8 has at most ``max_bytes`` bytes (whole
    characters only)."""
    return _head(text.encode("utf-8", errors="surrogatepass"), max_bytes).decode("utf-8", errors="replace")


def fit_line(text: str, max_bytes: int) -> str:
    """``text`` cut as :func:`cut_line` does, but to at most ``max_bytes`` bytes of UTF-8 in
    all, the marker included: for a peer's limit on what it accepts. A lone surrogate (which
    has no UTF-8 form) becomes ``?``. ``max_bytes``: at least the marker's longest form.
    """
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    return _cut(data, max_bytes - _MARKER_MAX_BYTES)


_MARKER_MAX_BYTES = len(cut_marker(2**64).encode())


@attrs.frozen(kw_only=True)
class Tail:
    """The end of a file, as :func:`tail_lines` read it."""

    lines: tuple[str, ...]
    """The last lines, oldest first, each cut to the line limit (see :func:`cut_line`)."""
    size_bytes: int
    """The file's size when it was read."""
    read_bytes: int
    """How many bytes from its end were read (all of it when equal to ``size_bytes``)."""

    @property
    def whole(self) -> bool:
        """Whether the whole file was read."""
        return self.read_bytes >= self.size_bytes


def tail_of(
    file: IO[bytes],
    *,
    max_lines: int,
    max_bytes: int = TAIL_MAX_BYTES,
    max_line_bytes: int = LINE_MAX_BYTES,
) -> Tail:
    """:func:`tail_lines` of a file already open for binary reading (seekable); reads it from
    its end, whatever its position."""
    size = file.seek(0, os.SEEK_END)
    start = max(0, size - max_bytes)
    # One byte more than the window when there is one: whether it is a newline tells if the
    # window's first line is whole.
    file.seek(max(0, start - 1))
    data = file.read(size - max(0, start - 1))
    begins_earlier = False
    if start > 0:
        begins_earlier = data[:1] != b"\n"
        data = data[1:]
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data and not begins_earlier:
        return Tail(lines=(), size_bytes=size, read_bytes=size - start)
    pieces = data.split(b"\n")
    kept = pieces[-max_lines:] if max_lines > 0 else []
    lines = [_cut(p[:-1] if p.endswith(b"\r") else p, max_line_bytes) for p in kept]
    if begins_earlier and len(kept) == len(pieces) and lines:
        lines[0] = EARLIER_MARKER + _tail(kept[0], max_line_bytes).decode("utf-8", errors="replace")
    return Tail(lines=tuple(lines), size_bytes=size, read_bytes=size - start)


def tail_lines(
    path: str | os.PathLike[str],
    *,
    max_lines: int,
    max_bytes: int = TAIL_MAX_BYTES,
    max_line_bytes: int = LINE_MAX_BYTES,
) -> Tail:
    """The last ``max_lines`` lines of the last ``max_bytes`` bytes of a file, in memory and
    time bounded by ``max_bytes`` whatever the file's size.

    A line longer than ``max_line_bytes`` keeps its start and its end with the number of bytes
    cut between them (:func:`cut_line`); the first line read, when it begins before the part
    read, is marked so (:data:`EARLIER_MARKER`) and keeps its end. Lines end at ``\\n``
    (a ``\\r`` before it is dropped); a last line without one counts.

    Raises:
        OSError: the file cannot be opened or read.
    """
    with Path(path).open("rb") as file:
        return tail_of(file, max_lines=max_lines, max_bytes=max_bytes, max_line_bytes=max_line_bytes)

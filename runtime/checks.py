"""The small checks every input rule is built from: text and integer ranges.

Each raises :class:`runtime.errors.InvalidArgument` naming the field, the value and the rule
(``cpu_millis must be between 1 and 1000000, got 0``). Sizes are bytes of UTF-8, the form text
takes on the wire and in the database, so a limit means the same for any script.
"""

from __future__ import annotations

from runtime.errors import InvalidArgument

BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""The characters that reorder how text around them is shown (Unicode's Bidi_Control
property, UAX #9): in a name shown on one line they can make ``job-a\u202egnp.exe`` read as
another name (the "Trojan Source" attack, CVE-2021-42574). Other format characters (the
zero-width joiners of emoji and of Persian) are allowed."""


def utf8_bytes(field: str, value: str) -> int:
    """The size of ``value`` in UTF-8; InvalidArgument for a lone surrogate (no UTF-8 form)."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(field, value, "must be valid Unicode text (it has no UTF-8 form)") from None


def check_text(
    field: str, value: str, *, max_bytes: int, allow_empty: bool = False, printable: bool = False
) -> str:
    """``value``, once it is found to hold no NUL byte (nor, when ``printable``, a control
    character or one of :data:`BIDI_CONTROLS`: text shown on one line), something (unless
    ``allow_empty``) and at most ``max_bytes`` bytes of UTF-8; else InvalidArgument naming
    ``field`` and the first rule broken.
    """
    if "\x00" in value:
        raise InvalidArgument(field, value, "must not contain NUL bytes")
    # Unicode's category Cc is exactly U+0000-U+001F and U+007F-U+009F (no unicodedata import).
    if printable and any(c < "\x20" or "\x7f" <= c <= "\x9f" for c in value):
        raise InvalidArgument(field, value, "must not contain control characters (newlines, escapes)")
    if printable and any(c in BIDI_CONTROLS for c in value):
        raise InvalidArgument(
            field, value, "must not contain bidirectional controls (U+202A-U+202E, U+2066-U+2069, ...)"
        )
    if not value and not allow_empty:
        raise InvalidArgument(field, value, "must not be empty")
    size = utf8_bytes(field, value)
    if size > max_bytes:
        raise InvalidArgument(field, value, f"must be at most {max_bytes} bytes in UTF-8 (has {size})")
    return value


def check_int_between(field: str, value: int, low: int, high: int) -> int:
    """``value``, once it is found between ``low`` and ``high`` (both included), else InvalidArgument."""
    if not low <= value <= high:
        raise InvalidArgument(field, value, f"must be between {low} and {high}")
    return value

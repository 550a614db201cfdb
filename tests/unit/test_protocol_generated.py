"""The committed betterproto2 code matches protocol/*.proto (run `just proto` when it does not)."""

from __future__ import annotations

from protocol.generate import is_stale


def test_generated_protocol_code_is_current() -> None:
    """Regenerating from the .proto files reproduces the committed files byte for byte."""
    assert is_stale() == []

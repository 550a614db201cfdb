"""Ports planned before their servers start come from below the kernel's ephemeral range, where
no outgoing connection can take them meanwhile (ops.launcher.ports.free_listen_port)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ops.launcher import ports


def test_a_planned_port_is_below_the_ephemeral_range_and_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", ranges)
    planned = {ports.free_listen_port() for _ in range(20)}
    assert all(ports.LISTEN_PORTS_FROM <= port < 32768 for port in planned)
    port = planned.pop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_without_room_below_the_range_any_free_port_will_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("1024 65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", ranges)
    assert 0 < ports.free_listen_port() < 65536
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert 0 < ports.free_listen_port() < 65536

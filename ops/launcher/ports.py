"""Free TCP ports on 127.0.0.1 for servers the launcher starts: :func:`free_port`, and
:func:`free_listen_port` for a port planned before its server starts."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

from ops.launcher.state import LISTEN_HOST

__all__ = ["LISTEN_PORTS_FROM", "free_listen_port", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LISTEN_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 10000
"""The lowest port :func:`free_listen_port` hands out."""


def free_listen_port() -> int:
    """As :func:`free_port`, but below the kernel's ephemeral range (from
    :data:`LISTEN_PORTS_FROM`), for a server whose port is planned before it starts: a large
    cluster's outgoing connections could take an ephemeral one meanwhile. Falls back to
    :func:`free_port` when the range cannot be read or no port below it is free."""
    try:
        low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port()
    if low <= LISTEN_PORTS_FROM + 1:
        return free_port()
    for _ in range(64):
        port = LISTEN_PORTS_FROM + secrets.randbelow(low - LISTEN_PORTS_FROM)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LISTEN_HOST, port))
            except OSError:
                continue
            return port
    return free_port()

"""Free TCP ports on 127.0.0.1 for servers the launcher starts: :func:`free_port`, and
:func:`free_listen_port` for a port planned before its server starts."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

from ops.launcher.state import LISTEN_HOST

__all__ = ["LISTEN_PORTS_FROM", "free_listen_port", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    The port is released before returning, so another process may take it
    first; callers that bind it later should expect that, rarely.

    Returns:
        the port number.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LISTEN_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 10000
"""The lowest port :func:`free_listen_port` hands out."""


def free_listen_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that outgoing connections never
    take: below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768 and up by
    default), from :data:`LISTEN_PORTS_FROM`. For a server whose port is chosen before it starts
    (``stockade up`` plans every process's port first): a port from the ephemeral range can be
    taken meanwhile by any of the thousands of connections a large cluster opens (its
    workers' to the control planes), and the server then fails to bind. Another process may
    still bind it first, as with :func:`free_port`, which this falls back to when the range
    cannot be read or no port below it is free.

    Returns:
        the port number.
    """
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

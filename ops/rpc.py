"""Synchronous entry to the control-plane client, for the launcher and the tests (the CLI's
client commands use the Python client, :mod:`ops.client`, through
:func:`ops.cli.common.with_client`).

Each call to :func:`with_client` is one ``trio.run`` with the asyncio bridge open around
the body, so a plain function (a typer command, a pytest test) can talk to the cluster. An
error raised by the body comes out as itself, not wrapped in an exception group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
import trio

from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.tls import TlsFiles

__all__ = ["DEFAULT_BUSY_RETRY_S", "DEFAULT_CALL_TIMEOUT_S", "call", "status", "with_client"]

T = TypeVar("T")

DEFAULT_CALL_TIMEOUT_S = 2.0
"""Deadline of one call to one control plane, in seconds."""

DEFAULT_BUSY_RETRY_S = 30.0
"""How long a command keeps asking again, backing off, while every control plane answers busy."""


@attrs.frozen
class _Failed:
    error: Exception


def with_client(
    addresses: Sequence[str],
    body: Callable[[ControlPlaneClient], Awaitable[T]],
    *,
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    busy_retry_s: float = DEFAULT_BUSY_RETRY_S,
    tls: TlsFiles | None = None,
) -> T:
    """Run ``await body(client)`` in a fresh trio loop with the asyncio bridge open.

    Args:
        addresses: ``host:port`` of the control planes, tried in order.
        body: the async function to run; gets a :class:`ControlPlaneClient`.
        timeout_s: deadline of one call to one control plane, in seconds.
        busy_retry_s: how long one call keeps asking again while every replica is busy, in
            seconds.
        tls: the client certificate to present (mutual TLS); None: plaintext.

    Returns:
        what ``body`` returned.

    Raises:
        InvalidArgument: an address is malformed, or a replica refused the input.
        ClusterBusy: every control plane stayed busy for ``busy_retry_s``.
        NoControlPlaneReachable: no control plane answered.
        PermissionDenied: the certificate's role may not make a call ``body`` made.
        runtime.tls.TlsFilesInvalid, runtime.tls.KeyFileExposed: a file of ``tls`` is
            missing or its key is readable by others.
        Exception: whatever ``body`` raised, unwrapped.
    """

    async def main() -> T | _Failed:
        async with asyncio_bridge():
            try:
                client = ControlPlaneClient(
                    addresses, timeout_s=timeout_s, busy_retry_s=busy_retry_s, tls=tls
                )
            except Exception as exc:
                return _Failed(exc)
            try:
                return await body(client)
            except Exception as exc:
                # Leave the bridge's nursery first, so the error is not wrapped in a group.
                return _Failed(exc)
            finally:
                client.close()

    result = trio.run(main)
    if isinstance(result, _Failed):
        raise result.error
    return result


def call(
    addresses: Sequence[str],
    rpc: str,
    request: Any,
    *,
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    tls: TlsFiles | None = None,
) -> Any:
    """One ControlPlane call (``rpc`` in snake_case, e.g. ``"status"``) on the first replica that answers.

    Raises:
        the same errors as :func:`with_client`.
    """

    async def body(client: ControlPlaneClient) -> Any:
        return await client.call(rpc, request)

    return with_client(addresses, body, timeout_s=timeout_s, tls=tls)


def status(
    addresses: Sequence[str], *, timeout_s: float = DEFAULT_CALL_TIMEOUT_S, tls: TlsFiles | None = None
) -> pb.StatusReply:
    """The Status view from the first replica that answers."""
    reply: pb.StatusReply = call(addresses, "status", pb.StatusRequest(), timeout_s=timeout_s, tls=tls)
    return reply

"""Synchronous entry to the control-plane client, for the launcher and the tests
(:func:`with_client`: one ``trio.run`` with the asyncio bridge open, in a thread of its own
when given ``limit_s``); docs/design.md, "Synchronous calls to the cluster", says why.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
import trio

from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.errors import Unavailable
from runtime.tls import TlsFiles

__all__ = ["DEFAULT_BUSY_RETRY_S", "DEFAULT_CALL_TIMEOUT_S", "RunOverran", "call", "status", "with_client"]

T = TypeVar("T")

DEFAULT_CALL_TIMEOUT_S = 2.0
"""Deadline of one call to one control plane, in seconds."""

DEFAULT_BUSY_RETRY_S = 30.0
"""How long a command keeps asking again, backing off, while every control plane answers busy."""


WAIT_STEP_S = 0.1
"""How often the calling thread wakes while it waits for a run with a limit (signals are
handled between waits), in seconds."""


class RunOverran(Unavailable):
    """A run given ``limit_s`` (:func:`with_client`) had not ended by then; it is abandoned (its
    thread is told to stop, and ends with the process at the latest)."""


@attrs.frozen
class _Raised:
    error: BaseException


def with_client(
    addresses: Sequence[str],
    body: Callable[[ControlPlaneClient], Awaitable[T]],
    *,
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    busy_retry_s: float = DEFAULT_BUSY_RETRY_S,
    tls: TlsFiles | None = None,
    limit_s: float | None = None,
) -> T:
    """Run ``await body(client)`` in a fresh trio loop with the asyncio bridge open.

    Args:
        addresses: ``host:port`` of the control planes, tried in order.
        body: the async function to run; gets a :class:`ControlPlaneClient`.
        timeout_s: deadline of one call to one control plane, in seconds.
        busy_retry_s: how long one call keeps asking again while every replica is busy, in
            seconds.
        tls: the client certificate to present (mutual TLS); None: plaintext.
        limit_s: the longest the caller waits for the whole run, in seconds; None: the run
            happens in the calling thread, with no limit but its calls' own deadlines.

    Returns:
        what ``body`` returned.

    Raises:
        RunOverran: the run had not ended after ``limit_s``.
        KeyboardInterrupt: Ctrl-C (or SIGTERM turned into it) while the caller waited.
        InvalidArgument, runtime.tls.TlsFilesInvalid, runtime.tls.KeyFileExposed: a bad
            address or certificate file (:class:`ControlPlaneClient`).
        Exception: whatever ``body`` raised (ClusterBusy, NoControlPlaneReachable,
            PermissionDenied, ...), unwrapped.
    """

    async def main() -> T | _Raised:
        async with asyncio_bridge():
            try:
                client = ControlPlaneClient(
                    addresses, timeout_s=timeout_s, busy_retry_s=busy_retry_s, tls=tls
                )
            except Exception as exc:
                return _Raised(exc)
            try:
                return await body(client)
            except Exception as exc:
                # Leave the bridge's nursery first, so the error is not wrapped in a group.
                return _Raised(exc)
            finally:
                client.close()

    result = trio.run(main) if limit_s is None else _run_in_thread(main, limit_s)
    if isinstance(result, _Raised):
        raise result.error
    return result


def _run_in_thread(main: Callable[[], Awaitable[T]], limit_s: float) -> T:
    """``trio.run(main)`` in a daemon thread, waited for at most ``limit_s`` seconds by the
    calling thread, which alone receives signals. On leaving early (the limit, Ctrl-C) the run
    is cancelled and left to end on its own.

    Raises:
        RunOverran: the run had not ended after ``limit_s``.
        BaseException: whatever the run raised, or the caller's KeyboardInterrupt.
    """
    done = threading.Event()
    outcome: list[Any] = []
    tokens: list[trio.lowlevel.TrioToken] = []
    scopes: list[trio.CancelScope] = []

    async def cancellable() -> T:
        tokens.append(trio.lowlevel.current_trio_token())
        with trio.CancelScope() as scope:
            scopes.append(scope)
            return await main()
        raise RunOverran("abandoned by its caller")  # the scope was cancelled: nobody waits

    def run() -> None:
        try:
            outcome.append(trio.run(cancellable))
        except BaseException as exc:  # handed to the waiting thread, raised there
            outcome.append(_Raised(exc))
        finally:
            done.set()

    thread = threading.Thread(target=run, name="stockade-rpc", daemon=True)
    thread.start()
    deadline = time.monotonic() + limit_s
    try:
        while not done.wait(WAIT_STEP_S):
            if time.monotonic() >= deadline:
                raise RunOverran(f"the calls did not end within {limit_s:g} s")
    except BaseException:
        if tokens and scopes:
            with contextlib.suppress(trio.RunFinishedError):
                tokens[0].run_sync_soon(scopes[0].cancel)
        raise
    (result,) = outcome
    if isinstance(result, _Raised):
        raise result.error
    return result  # type: ignore[no-any-return]


def call(
    addresses: Sequence[str],
    rpc: str,
    request: Any,
    *,
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    tls: TlsFiles | None = None,
    limit_s: float | None = None,
) -> Any:
    """One ControlPlane call (``rpc`` in snake_case, e.g. ``"status"``) on the first replica that
    answers (``limit_s``: as :func:`with_client`'s).

    Raises:
        the same errors as :func:`with_client`.
    """

    async def body(client: ControlPlaneClient) -> Any:
        return await client.call(rpc, request)

    return with_client(addresses, body, timeout_s=timeout_s, tls=tls, limit_s=limit_s)


def status(
    addresses: Sequence[str],
    *,
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    tls: TlsFiles | None = None,
    limit_s: float | None = None,
) -> pb.StatusReply:
    """The Status view from the first replica that answers (``limit_s``: as :func:`with_client`'s)."""
    reply: pb.StatusReply = call(
        addresses, "status", pb.StatusRequest(), timeout_s=timeout_s, tls=tls, limit_s=limit_s
    )
    return reply

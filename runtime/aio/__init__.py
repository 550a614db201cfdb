"""The trio-asyncio bridge: asyncpg and grpclib used from trio code.

asyncpg and grpclib are asyncio libraries. Each Stockade process opens one asyncio loop on
top of trio (:func:`asyncio_bridge`) and every call into those libraries goes through this
package, whose :mod:`runtime.aio.bridge` is the only caller of ``aio_as_trio`` (and of
``trio_as_aio``). Errors are translated at the boundary: a broken connection or an unreachable
peer becomes a :class:`runtime.errors.TemporaryError`, a broken unique index
:class:`runtime.errors.DuplicateKey`, a gRPC status :class:`InvalidArgument`,
:class:`NotFound`, :class:`IdempotencyConflict` or :class:`RemoteError`.

Cancellation: a trio cancel that lands inside an asyncpg call terminates that connection
(its protocol state is unknown afterwards), so the owner reconnects; close and rollback are
shielded, with a short deadline of their own.

Served RPCs and their deadlines: grpclib runs each request in an asyncio task and, when the
client's deadline (``grpc-timeout``) passes or the client resets the stream, cancels that task
(``grpclib.server.request_handler``: a ``DeadlineWrapper`` timer, or ``Handler.cancel`` on a
reset). The task awaits the trio handler through ``trio_as_aio``, so the cancel reaches the trio
handler wherever it is, in the middle of an asyncpg call included, which would then terminate a
pooled connection. A handler that must not lose its connection that way runs its database work
under :func:`finish_despite_cancel`; it learns its client's deadline from :func:`rpc_deadline`.

Server streams (``rpc X(Req) returns (stream Reply)``): the handler is trio code (an async
generator, or a coroutine given a send function), and each message it sends crosses back to
the asyncio task of its stream (``run_aio`` of grpclib's ``send_message``), which returns once
HTTP/2 flow control lets the message go: a client that reads slowly or not at all holds the
handler back, never its memory. The same cancel as above reaches the handler when the client
resets the stream or its deadline passes. On the client side, :meth:`GrpcChannel.stream`
reads one message per crossing, with no task of its own between reads (so it works the same in
a guest run, :mod:`runtime.aio.guest`), and resets the stream when its block is left early,
which cancels the server's handler; :meth:`runtime.client.ControlPlaneClient.stream` opens it
on the first control plane that sends a first message.

Encoding on the handler's terms: grpclib decodes a request before the handler runs and encodes
its reply after it returns, each in one piece on the event loop (70 ms and more for a message
with a thousand elements). A handler that must do that work itself, in slices and only once it
has admitted the request, returns a :class:`protocol.wire.Encoded` reply (sent as is, see
:class:`WireCodec`) and, when marked with :func:`takes_encoded_request`, receives its request
undecoded.

The package, one module per side of the boundary (names are imported from here, ``from
runtime.aio import PgConnection``; each module is loaded on first use of one of its names, so a
client that only calls a gRPC server loads neither the database side nor the server side):

- :mod:`runtime.aio.bridge`: the loop (:func:`asyncio_bridge`) and the crossings, :func:`run_aio`
  (trio -> asyncio) and :func:`run_trio` (asyncio -> trio).
- :mod:`runtime.aio.guest`: the other way round, trio as a guest of an asyncio program's own
  loop (:func:`open_portal`, :class:`TrioPortal`), where :func:`run_aio` runs asyncio code on that
  loop; for the asyncio face of the client.
- :mod:`runtime.aio.pg`: :class:`PgConnection`, :class:`ReconnectingConnection`,
  :class:`ReadStore`, :class:`PgPool`; every call bounded in time, TCP keepalives, reconnects
  with backoff and one log line per outage change (see that module).
- :mod:`runtime.aio.grpc_server`: :func:`serve_grpc`, :func:`trio_service` (unary RPCs and
  server streams, :data:`Send`), :class:`WireCodec`,
  :func:`takes_encoded_request`, :func:`rpc_deadline`, :func:`finish_despite_cancel`, and who
  called (:class:`Caller`, :func:`rpc_caller`, :func:`require_worker`, :func:`refuse`).
- :mod:`runtime.aio.grpc_client`: :class:`GrpcChannel` (unary calls and server streams).

A test that replaces a name patches it in the module that holds it (``runtime.aio.pg``...):
that is where the code looks it up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.aio.bridge import asyncio_bridge, asyncio_bridge_open, run_aio, run_trio
    from runtime.aio.grpc_client import GrpcChannel
    from runtime.aio.grpc_server import (
        Caller,
        Send,
        WireCodec,
        finish_despite_cancel,
        refuse,
        require_worker,
        rpc_caller,
        rpc_deadline,
        serve_grpc,
        takes_encoded_request,
        trio_service,
    )
    from runtime.aio.guest import TrioPortal, open_portal
    from runtime.aio.pg import PgConnection, PgPool, ReadStore, ReconnectingConnection

_NAMES_OF: dict[str, tuple[str, ...]] = {
    "bridge": ("asyncio_bridge", "asyncio_bridge_open", "run_aio", "run_trio"),
    "pg": ("PgConnection", "PgPool", "ReadStore", "ReconnectingConnection"),
    "grpc_server": (
        "Caller",
        "Send",
        "WireCodec",
        "finish_despite_cancel",
        "refuse",
        "require_worker",
        "rpc_caller",
        "rpc_deadline",
        "serve_grpc",
        "takes_encoded_request",
        "trio_service",
    ),
    "grpc_client": ("GrpcChannel",),
    "guest": ("TrioPortal", "open_portal"),
}
"""Module of this package -> the public names it holds."""

_MODULE_OF = {name: module for module, names in _NAMES_OF.items() for name in names}

__all__ = [
    "Caller",
    "GrpcChannel",
    "PgConnection",
    "PgPool",
    "ReadStore",
    "ReconnectingConnection",
    "Send",
    "TrioPortal",
    "WireCodec",
    "asyncio_bridge",
    "asyncio_bridge_open",
    "finish_despite_cancel",
    "open_portal",
    "refuse",
    "require_worker",
    "rpc_caller",
    "rpc_deadline",
    "run_aio",
    "run_trio",
    "serve_grpc",
    "takes_encoded_request",
    "trio_service",
]


def __getattr__(name: str) -> Any:
    """``runtime.aio.NAME``: the name from the module that holds it, imported on first use
    (PEP 562) and kept here after that.

    Raises:
        AttributeError: no module of the package holds ``name``.
    """
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

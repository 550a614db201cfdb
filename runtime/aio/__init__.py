"""The trio-asyncio bridge: asyncpg and grpclib used from trio code.

Each process opens one asyncio loop on top of trio (:func:`asyncio_bridge`); every call into
those libraries goes through this package (:mod:`runtime.aio.bridge` is the only caller of
``aio_as_trio`` and ``trio_as_aio``). Names are imported from here, each module loaded on first
use of one of its names (``_NAMES_OF``), so a client that only calls a gRPC server loads
neither the database side nor the server side. A test patches a name in the module that holds
it. How errors, cancels, deadlines, streams and encoding cross: docs/design.md, "The
trio-asyncio boundary: errors, cancels, deadlines, streams".
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.aio.bridge import asyncio_bridge, asyncio_bridge_open, run_aio, run_trio
    from runtime.aio.grpc_access import (
        Caller,
        audit_params,
        refuse,
        require_worker,
        rpc_caller,
        visible_account,
    )
    from runtime.aio.grpc_client import GrpcChannel, StreamLimits
    from runtime.aio.grpc_server import (
        Send,
        WireCodec,
        finish_despite_cancel,
        rpc_deadline,
        serve_grpc,
        takes_encoded_request,
        trio_service,
    )
    from runtime.aio.guest import TrioPortal, open_portal
    from runtime.aio.pg import PgConnection
    from runtime.aio.pg_reconnect import PgPool, ReadStore, ReconnectingConnection

_NAMES_OF: dict[str, tuple[str, ...]] = {
    "bridge": ("asyncio_bridge", "asyncio_bridge_open", "run_aio", "run_trio"),
    "pg": ("PgConnection",),
    "pg_reconnect": ("PgPool", "ReadStore", "ReconnectingConnection"),
    "grpc_access": ("Caller", "audit_params", "refuse", "require_worker", "rpc_caller", "visible_account"),
    "grpc_server": (
        "Send",
        "WireCodec",
        "finish_despite_cancel",
        "rpc_deadline",
        "serve_grpc",
        "takes_encoded_request",
        "trio_service",
    ),
    "grpc_client": ("GrpcChannel", "StreamLimits"),
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
    "StreamLimits",
    "TrioPortal",
    "WireCodec",
    "asyncio_bridge",
    "asyncio_bridge_open",
    "audit_params",
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
    "visible_account",
]


def __getattr__(name: str) -> Any:
    """``runtime.aio.NAME``: the name from the module that holds it, imported on first use
    (PEP 562) and kept here after that; AttributeError if no module holds it."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

"""The Stockade wire protocol: the ``.proto`` files and the betterproto2 code generated from them.

``protocol.pb`` is the generated module (messages, ``ControlPlaneStub``, ``WorkerStub``);
:mod:`protocol.bases` holds the generated service bases a server subclasses
(``ControlPlaneBase``, ``WorkerBase``), apart, so that a client never imports grpclib's server
side. Neither is edited by hand: change ``stockade.proto`` and run ``just proto``. This package
imports nothing else of Stockade's.
"""

import sys
from typing import Any


def _import_betterproto2_without_pydantic() -> None:
    """Import betterproto2 without letting it load pydantic.

    betterproto2 imports pydantic when it is installed (Typer depends on it), only to tell
    messages generated as pydantic dataclasses from plain ones, and then loads more of it on
    the first message it handles: 50 to 150 ms of every client's start-up. The code generated
    here is plain dataclasses, so betterproto2 is imported with pydantic hidden
    (``sys.modules["pydantic"] = None`` makes ``import pydantic`` fail, as the import system
    documents) and pydantic shown again at once: whoever imports it later gets it. When
    pydantic is already loaded, nothing is hidden.
    """
    if "betterproto2" in sys.modules or "pydantic" in sys.modules:
        return
    sys.modules["pydantic"] = None  # type: ignore[assignment]
    try:
        import betterproto2  # noqa: F401
    finally:
        del sys.modules["pydantic"]


def _import_stub_base_without_server() -> None:
    """Import betterproto2's client module (``ServiceStub``, which the generated stubs extend)
    without its ``betterproto2.grpclib`` package, whose ``__init__`` imports the server module
    and with it grpclib's server side, which a client never needs.

    The package's module is made from its spec without running its ``__init__`` and stands in
    :data:`sys.modules` only while the client module loads; the generated code imports the
    client module by its full name, which the import system then finds loaded. Whoever imports
    ``betterproto2.grpclib`` later (:mod:`protocol.bases`) gets the whole package, with this same
    client module.
    """
    if "betterproto2.grpclib" in sys.modules:
        return
    import importlib.util

    spec = importlib.util.find_spec("betterproto2.grpclib")
    if spec is None:
        return
    sys.modules["betterproto2.grpclib"] = importlib.util.module_from_spec(spec)
    try:
        import betterproto2.grpclib.grpclib_client  # noqa: F401
    finally:
        del sys.modules["betterproto2.grpclib"]


def _type_hints_once_per_class() -> None:
    """Let betterproto2 evaluate a message class's type hints once, not once for each field.

    On a class's first use betterproto2 0.10 builds its field metadata and, for each field in
    turn, asks :func:`typing.get_type_hints` of the whole class (``Message._type_hints``), so
    a class of n fields evaluates its n annotations n times: about 4 of the 5 ms the first
    StatusReply a client decodes takes. A class's hints never change once it is defined, so
    they are kept per class (its metadata, which betterproto2 keeps too, holds them as well).
    """
    import functools

    import betterproto2

    type_hints: Any = functools.cache(betterproto2.Message.__dict__["_type_hints"].__func__)
    betterproto2.Message._type_hints = classmethod(type_hints)  # type: ignore[method-assign, assignment]


_import_betterproto2_without_pydantic()
_import_stub_base_without_server()
_type_hints_once_per_class()

from protocol._generated.stockade import v1 as pb  # noqa: E402

__all__ = ["pb"]

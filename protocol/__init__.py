"""The Stockade wire protocol: the ``.proto`` files and the betterproto2 code generated from them.

``protocol.pb`` is the generated module (messages, ``ControlPlaneStub``/``ControlPlaneBase``,
``WorkerStub``/``WorkerBase``). It is never edited by hand: change ``stockade.proto`` and run
``just proto``. This package imports nothing else of Stockade's.
"""

import sys


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


_import_betterproto2_without_pydantic()

from protocol._generated.stockade import v1 as pb  # noqa: E402

__all__ = ["pb"]

"""The Stockade wire protocol: the ``.proto`` files and the betterproto2 code generated from them.

``protocol.pb`` is the generated module (messages, ``ControlPlaneStub``/``ControlPlaneBase``,
``WorkerStub``/``WorkerBase``). It is never edited by hand: change ``stockade.proto`` and run
``just proto``. This package imports nothing else of Stockade's.
"""

from protocol._generated.stockade import v1 as pb

__all__ = ["pb"]

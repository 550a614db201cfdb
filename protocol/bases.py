"""The generated service bases a gRPC server subclasses: ``ControlPlaneBase`` (served by
actors/ingest.py) and ``WorkerBase`` (agent/service.py), with each method's route and message
types in their ``__mapping__``.

They are generated into a module of their own (``just proto``, protocol/generate.py), apart
from :data:`protocol.pb`, because they import grpclib's server side, which a client never needs.
"""

from protocol._generated.stockade.v1.bases import ControlPlaneBase, WorkerBase

__all__ = ["ControlPlaneBase", "WorkerBase"]

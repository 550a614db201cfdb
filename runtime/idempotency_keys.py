"""Idempotency keys: one per mutating call, sent with every retry and hedged copy of it, so a
replica that stored the call and failed to answer returns its first answer to the copy
(``actors.idempotency``)."""

from __future__ import annotations

import copy
import uuid
from typing import TypeVar

from protocol import pb

T = TypeVar("T")


def new_idempotency_key() -> str:
    """A fresh idempotency key: a random UUID (122 random bits), so two clients never draw the
    same one."""
    return str(uuid.uuid4())


def with_idempotency_key(request: T) -> T:
    """``request`` with an idempotency key, for every attempt of one call.

    A request that has an ``idempotency_key`` field left empty gets a copy with a fresh key; a
    ``RegisterWorkerRequest`` whose ``agent_run_id`` (with ``registration_seq``, its key) is
    empty gets a fresh run id and number 1, as a one-off registration. A key the caller set is
    kept, so a caller that must survive its own restart (``stockade submit
    --idempotency-key``) can send the same call again. The caller's object is never changed:
    reusing it for another call draws another key. Other requests (reads, heartbeats) are
    returned as they are.
    """
    if getattr(request, "idempotency_key", None) == "":
        keyed = copy.copy(request)
        keyed.idempotency_key = new_idempotency_key()  # type: ignore[attr-defined]
        return keyed
    if isinstance(request, pb.RegisterWorkerRequest) and not request.agent_run_id:
        keyed_registration = copy.copy(request)
        keyed_registration.agent_run_id = new_idempotency_key()
        keyed_registration.registration_seq = request.registration_seq or 1
        return keyed_registration  # type: ignore[return-value]
    return request

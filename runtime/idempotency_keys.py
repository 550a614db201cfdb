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
    """``request`` with an idempotency key, for every attempt of one call: a copy with a fresh
    key when its ``idempotency_key`` is empty (a ``RegisterWorkerRequest`` without
    ``agent_run_id``: a fresh run id and number 1). A key the caller set is kept (``stockade
    submit --idempotency-key``); the caller's object is never changed; other requests are
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

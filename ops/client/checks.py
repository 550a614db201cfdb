"""The checks the client makes before it sends a call (:class:`ops.client.Client`): each raises
:class:`runtime.errors.InvalidArgument` naming the field, the value and the rule.
"""

from __future__ import annotations

import math

from runtime import validation
from runtime.errors import InvalidArgument
from runtime.idempotency_keys import new_idempotency_key


def check_key(key: str | None) -> str:
    """The caller's key, checked (InvalidArgument: empty, over 128 bytes, a control character),
    or a fresh random UUID."""
    return new_idempotency_key() if key is None else validation.check_idempotency_key(key)


def check_job_id(job_id: int, field: str = "job_id") -> int:
    """Raises InvalidArgument unless ``job_id`` is an integer of 1..2**63-1."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise InvalidArgument(field, job_id, "must be an integer")
    return validation.check_job_id(job_id)


def check_account(account: str | None) -> None:
    """Raises InvalidArgument unless ``account`` is None or follows the id rules."""
    if account is not None:
        from runtime.identifiers import check_id

        check_id(account, field="account")


def is_int_in(value: object, low: int, high: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of ``low..high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_seconds(field: str, value: float | None) -> float:
    """``value`` seconds, None as ``inf``; InvalidArgument unless a number > 0 (not NaN)."""
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidArgument(field, value, "must be a number of seconds > 0, or None for no limit")
    return float(value)

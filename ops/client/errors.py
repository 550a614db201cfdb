"""The errors the client raises of its own; with :mod:`runtime.errors`' (re-exported by
:mod:`ops.client`) they are every error a call raises on purpose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from runtime.errors import NotFound, StockadeError

if TYPE_CHECKING:
    from ops.client.results import Job


class JobNotFound(NotFound):
    """No job has this id (gRPC NOT_FOUND); nothing was done.

    Args:
        job_id: the id asked for.
        message: the control plane's words (``job_id 7 not found``); empty: those.
    """

    def __init__(self, job_id: int, message: str = "") -> None:
        super().__init__(message or f"job_id {job_id} not found")
        self.job_id = job_id


class WorkerNotFound(NotFound):
    """No worker ever registered with this id (gRPC NOT_FOUND); nothing was stored.

    Args:
        worker_id: the id asked for.
        message: the control plane's words; empty: a message of the same form.
    """

    def __init__(self, worker_id: str, message: str = "") -> None:
        super().__init__(
            message or f"worker_id {worker_id!r} not found: no worker ever registered with that id"
        )
        self.worker_id = worker_id


class WaitTimedOut(StockadeError, TimeoutError):
    """A job did not end within the time the caller gave ``wait``; it goes on.

    Args:
        job_id: the job waited for.
        timeout_s: how long ``wait`` waited, in seconds.
        last: the job as last read (None when no read answered).
    """

    def __init__(self, job_id: int, timeout_s: float, last: Job | None) -> None:
        still = f"still {last.state}" if last is not None else "its state was never read"
        super().__init__(f"job {job_id} did not end within {timeout_s:g} s ({still})")
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.last = last


@contextlib.contextmanager
def raised_as(error: Callable[[str], NotFound]) -> Iterator[None]:
    """NotFound raised in the block as the typed ``error(message)``."""
    try:
        yield
    except NotFound as exc:
        if type(exc) is not NotFound:
            raise
        raise error(str(exc)) from exc

"""Supervision: restart a crashed actor with capped backoff, give up after too many crashes.

Follows the Erlang/OTP restart-intensity rule (at most ``max_restarts`` within ``window_s``
seconds, else the supervisor itself fails; OTP design principles, "Supervisor Behaviour") with
kopf's capped exponential backoff between attempts. Cancellation and other ``BaseException``
always propagate; :class:`runtime.errors.PermanentError` is never retried. An actor the process
can do without (``essential=False``: the web console) never takes it down once it has started:
past the restart intensity it rests a window and starts again (OTP's "temporary" children are
never restarted; a console should come back).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from runtime import log
from runtime.errors import ActorGaveUp, PermanentError, TemporaryError

ActorFn = Callable[..., Awaitable[Any]]


@attrs.frozen(kw_only=True)
class RestartPolicy:
    """How a supervisor treats a crashing actor."""

    max_restarts: int = 5
    """Restarts allowed within ``window_s``; one more crash and the supervisor gives up."""
    window_s: float = 30.0
    """Sliding window for ``max_restarts``, in seconds (trio clock)."""
    backoff_initial_s: float = 0.1
    """Delay before the first restart."""
    backoff_max_s: float = 5.0
    """Cap of the doubling delay."""


def _unwrap(exc: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (trio's nursery wrapping)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _permanent(exc: BaseException) -> bool:
    if isinstance(exc, PermanentError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_permanent(e) for e in exc.exceptions)
    return False


def _retry_after(exc: BaseException) -> float:
    if isinstance(exc, TemporaryError):
        return exc.retry_after_s
    if isinstance(exc, BaseExceptionGroup):
        return max((_retry_after(e) for e in exc.exceptions), default=0.0)
    return 0.0


async def supervise(
    name: str,
    actor: ActorFn,
    *,
    policy: RestartPolicy = RestartPolicy(),
    essential: bool = True,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``actor`` (``await nursery.start(actor)``) and restart it when it crashes;
    ``task_status.started()`` once its first start succeeded; returns when it returns.

    Args:
        essential: False for an actor the process can do without: once it has started, more
            crashes than ``policy`` allows make it rest ``policy.window_s`` seconds (logged as
            an error) and start again, with its crash count cleared, instead of giving up.

    Raises:
        ActorGaveUp: the actor crashed more than ``policy.max_restarts`` times within
            ``policy.window_s`` (an essential one, or one whose first start never succeeded),
            or with a PermanentError; the cause is in ``__cause__``.
    """
    logger = log.get(name)
    crashes: deque[float] = deque()
    delay_s = policy.backoff_initial_s
    signalled = False
    while True:
        started_at = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(actor)
                if not signalled:
                    signalled = True
                    task_status.started()
            return
        except Exception as group:  # BaseException (Cancelled, KeyboardInterrupt) propagates
            exc = _unwrap(group)
            now = trio.current_time()
            if _permanent(exc):
                logger.error("actor failed permanently", error=repr(exc))
                raise ActorGaveUp(f"{name} failed permanently: {exc!r}") from exc
            crashes.append(now)
            while crashes and crashes[0] < now - policy.window_s:
                crashes.popleft()
            if len(crashes) > policy.max_restarts and (essential or not signalled):
                logger.error("actor gave up", crashes=len(crashes), window_s=policy.window_s, error=repr(exc))
                raise ActorGaveUp(
                    f"{name} crashed {len(crashes)} times in {policy.window_s:g} s; last: {exc!r}"
                ) from exc
            if len(crashes) > policy.max_restarts:
                logger.error(
                    "actor keeps crashing; the process goes on without it for a while",
                    crashes=len(crashes),
                    window_s=policy.window_s,
                    restart_in_s=policy.window_s,
                    error=repr(exc),
                )
                crashes.clear()
                delay_s = policy.backoff_initial_s
                await trio.sleep(policy.window_s)
                continue
            if now - started_at > policy.window_s:
                delay_s = policy.backoff_initial_s
            wait_s = max(delay_s, _retry_after(exc))
            logger.warning(
                "actor crashed, restarting",
                error=repr(exc),
                restart_in_s=wait_s,
                crashes_in_window=len(crashes),
            )
            await trio.sleep(wait_s)
            delay_s = min(delay_s * 2, policy.backoff_max_s)

"""What the console changes: cancel a job or an array, cordon, uncordon and drain a worker.

:class:`ConsoleActions` carries out each through the ingest's own handlers
(:class:`actors.ingest.ControlPlaneService`: ``cancel_job``, ``cordon_worker``,
``uncordon_worker``, ``drain_worker``), as the console's reader: the same role table
(:data:`actors.ingest.CONTROL_PLANE_ACCESS`), the same account scope, the same idempotency and
the same audit row as the gRPC call of ``stockade cancel``, ``cordon``, ``uncordon`` and
``drain``. The handlers run on the console's loop over a small pool of their own, opened at the
first action (docs/console.md, "Actions").
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from starlette.requests import Request

from actors.console import views
from actors.ingest import CONTROL_PLANE_ACCESS, ControlPlaneService
from actors.ingest_gate import open_pool
from actors.logs import LogRelay
from protocol import pb
from runtime import log
from runtime.aio import Caller
from runtime.aio.grpc_access import RPC_CALLER, check_access
from runtime.errors import (
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StockadeError,
)
from runtime.lag import LoopLag
from runtime.settings.control_plane import IngestSettings
from runtime.validation import check_drain_deadline_ms, check_drain_deadline_s

__all__ = [
    "ACTIONS",
    "MAX_ACTION_BODY_BYTES",
    "ActionDone",
    "ConsoleActions",
    "action_request",
    "localhost_alias",
    "read_body",
]

ACTIONS_SETTINGS = IngestSettings(pool_size=2, liveness_reserved_connections=1, max_requests_in_progress=1)
"""The console's actions' handlers: two connections, one action's statement at a time."""

ACTIONS = {
    "cancel": "cancel_job",
    "cancel-task": "cancel_job",
    "cordon": "cordon_worker",
    "uncordon": "uncordon_worker",
    "drain": "drain_worker",
}
"""Action (the last part of ``/action/...``) -> the RPC whose handler carries it out."""

MAX_ACTION_BODY_BYTES = 4096
"""An action's JSON body at most, in bytes (an idempotency key and a deadline take under 200);
a longer one is refused unread, so no caller can make the console's process hold it."""

ENDED_BEFORE_CANCEL = ("succeeded", "failed")
"""A cancel's reply state that says the job had ended first: nothing was cancelled."""


@attrs.frozen(kw_only=True)
class ActionDone:
    """What an action did: ``rpc`` its RPC and ``reply`` the handler's reply (``CancelJobReply``
    or ``WorkerScheduleReply``)."""

    rpc: str
    reply: Any


def action_request(action: str, target: str, body: dict[str, Any]) -> Any:
    """The RPC's request for ``action`` on ``target`` (a job id's text or a worker id), from the
    page's JSON ``body``: ``idempotency_key`` (text, one per confirmation) and, for a drain,
    ``deadline_s`` (seconds, a number or null: none).

    Raises:
        InvalidArgument: an unknown action, a job id that is not a number, a missing key or a
            bad deadline (the field, the value and the rule named).
    """
    key = body.get("idempotency_key")
    if not isinstance(key, str):
        raise InvalidArgument("idempotency_key", key, "must be text")
    if action in ("cancel", "cancel-task"):
        job_id = views.whole_number(target)
        if job_id is None:
            raise InvalidArgument("job_id", target, "must be a whole number")
        return pb.CancelJobRequest(job_id=job_id, idempotency_key=key, only_this_task=action == "cancel-task")
    if action == "cordon":
        return pb.CordonWorkerRequest(worker_id=target, idempotency_key=key)
    if action == "uncordon":
        return pb.UncordonWorkerRequest(worker_id=target, idempotency_key=key)
    if action == "drain":
        deadline_s = body.get("deadline_s")
        if deadline_s is None:
            return pb.DrainWorkerRequest(worker_id=target, idempotency_key=key)
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float):
            raise InvalidArgument("deadline_s", deadline_s, "must be a number of seconds or null")
        deadline_ms = check_drain_deadline_ms(round(check_drain_deadline_s(deadline_s) * 1000))
        return pb.DrainWorkerRequest(
            worker_id=target, idempotency_key=key, has_deadline=True, deadline_ms=deadline_ms
        )
    raise InvalidArgument("action", action, f"must be one of {', '.join(ACTIONS)}")


@attrs.define
class ConsoleActions:
    """The ingest's handlers on the console's loop (module docstring); ``logs`` is the console's
    relay (the handlers need one; no action reads output)."""

    cp_id: str
    database_url: str
    logs: LogRelay
    open_timeout_s: float
    """Longest the first action waits for the pool to open, in seconds."""
    _service: ControlPlaneService | None = None
    """The handlers, over their own pool; None until the first action."""
    _lock: trio.Lock = attrs.field(factory=trio.Lock)
    _log: Any = attrs.field(factory=lambda: log.get("console"))

    async def _handlers(self) -> ControlPlaneService:
        async with self._lock:
            if self._service is None:
                pool = None
                with trio.move_on_after(self.open_timeout_s):
                    pool = await open_pool(self.cp_id, self.database_url, ACTIONS_SETTINGS)
                if pool is None:
                    raise DatabaseUnavailable(
                        f"the database did not answer within {self.open_timeout_s:g} s: nothing was changed"
                    )
                self._service = ControlPlaneService(
                    cp_id=self.cp_id,
                    pool=pool,
                    settings=ACTIONS_SETTINGS,
                    lag=LoopLag(loop="console"),
                    logs=self.logs,
                )
            return self._service

    async def _act(self, caller: Caller, action: str, request: Any) -> ActionDone:
        """Carry out ``action`` (a key of :data:`ACTIONS`) with ``request`` (from
        :func:`action_request`) as ``caller`` would over gRPC, once :meth:`answer` found that
        ``caller``'s role may call its RPC.

        Raises:
            NotFound: no such job (or another account's), or no such worker.
            InvalidArgument, IdempotencyConflict, Busy, DatabaseUnavailable: as the handler.
        """
        rpc = ACTIONS[action]
        service = await self._handlers()
        handler: Callable[[Any], Awaitable[Any]] = getattr(service, rpc)
        token = RPC_CALLER.set(caller)
        try:
            reply = await handler(request)
        finally:
            RPC_CALLER.reset(token)
        self._log.info("console action", rpc=rpc, caller=str(caller))
        return ActionDone(rpc=rpc, reply=reply)

    async def answer(
        self, caller: Caller, action: str, target: str, body: Callable[[], Awaitable[Any]]
    ) -> tuple[int, bool, str]:
        """(HTTP status, done, what it did or why not) of ``action`` on ``target`` as ``caller``
        (:meth:`_act`, its errors as statuses). ``caller``'s role is checked first, as a gRPC
        call's is (a refusal logged and counted); ``body`` reads the page's JSON body (raising
        InvalidArgument when it is too long), only then. A cancel of a job that had already
        succeeded or failed is not done (409), as ``stockade cancel`` says (exit 3)."""
        try:
            check_access(ACTIONS[action], CONTROL_PLANE_ACCESS, caller)
            payload = await body()
            if not isinstance(payload, dict):
                raise InvalidArgument("body", payload, "must be a JSON object")
            request = action_request(action, target, payload)
            done = await self._act(caller, action, request)
        except PermissionDenied as exc:
            return 403, False, str(exc)
        except NotFound as exc:
            return 404, False, str(exc)
        except (InvalidArgument, IdempotencyConflict) as exc:
            return 400, False, str(exc)
        except StockadeError as exc:
            # Busy, DatabaseUnavailable: a deadline passed; the change may have committed
            # (the page says to look again before retrying).
            return 503, False, str(exc)
        if done.rpc == "cancel_job":
            target = str(request.job_id)
            if done.reply.state in ENDED_BEFORE_CANCEL:
                return 409, False, f"job {target} {done.reply.state} before the cancel took effect"
        return 200, True, views.action_outcome(action, target, done.reply)

    async def close(self) -> None:
        """Close the handlers' pool, if the first action opened it."""
        if self._service is not None:
            await self._service.pool.close()
            self._service = None


def localhost_alias(url: str) -> str | None:
    """``https://localhost:PORT`` for a console URL on a loopback address, else None."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "::1") or parts.port is None:
        return None
    return f"{parts.scheme}://localhost:{parts.port}"


async def read_body(request: Request) -> Any:
    """The request's body as JSON, None when it is not JSON (a number, nested past Python's
    recursion limit, not UTF-8). Reads at most :data:`MAX_ACTION_BODY_BYTES`.

    Raises:
        InvalidArgument: the body (or its ``Content-Length``) is longer than that.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_ACTION_BODY_BYTES:
        raise InvalidArgument("body", int(declared), f"must be at most {MAX_ACTION_BODY_BYTES} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_ACTION_BODY_BYTES:
            raise InvalidArgument("body", len(data), f"must be at most {MAX_ACTION_BODY_BYTES} bytes")
    try:
        return json.loads(bytes(data))
    except (ValueError, RecursionError):
        return None

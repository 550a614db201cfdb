"""The client's calls on workers (cordon, uncordon, drain): :class:`WorkerCalls`, a part of
:class:`ops.client.Client`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ops.client.admin_results import WorkerSchedule, schedule_from_pb
from ops.client.checks import check_key
from ops.client.errors import WorkerNotFound, raised_as
from runtime import validation
from runtime.client import ControlPlaneClient


class WorkerCalls:
    """:class:`ops.client.Client`'s calls on workers, over its connections ``_cp``."""

    _cp: ControlPlaneClient

    async def cordon(self, worker_id: str, *, idempotency_key: str | None = None) -> WorkerSchedule:
        """Cordon a worker: nothing new is placed on it; its running jobs go on. The cordon
        holds for the worker id across agent restarts, until :meth:`uncordon`.

        Raises:
            InvalidArgument: a bad ``worker_id`` or key; nothing was sent.
            WorkerNotFound: no worker ever registered with this id; nothing was stored.
            IdempotencyConflict, NoControlPlaneReachable, ClusterBusy, PermissionDenied: as
                :meth:`ops.client.Client.submit`.
        """
        from protocol import pb

        return await self._schedule("cordon_worker", pb.CordonWorkerRequest, worker_id, idempotency_key)

    async def uncordon(self, worker_id: str, *, idempotency_key: str | None = None) -> WorkerSchedule:
        """Uncordon a worker: it takes placements again; a drain of it ends (what it moved stays
        moved), and so does a mark as unhealthy (:attr:`ops.client.results.Worker.unhealthy`).

        Raises:
            the errors of :meth:`cordon`.
        """
        from protocol import pb

        return await self._schedule("uncordon_worker", pb.UncordonWorkerRequest, worker_id, idempotency_key)

    async def drain(
        self, worker_id: str, *, deadline_s: float | None = None, idempotency_key: str | None = None
    ) -> WorkerSchedule:
        """Drain a worker: cordon it and let its jobs end; at ``deadline_s`` the leader stops those
        still running and places them elsewhere, spending no attempt (``drained``: it is empty).

        Args:
            worker_id: the worker.
            deadline_s: seconds after which its remaining jobs are stopped and placed
                elsewhere, 0 (at once) to 604,800 (a week); None: no deadline.
            idempotency_key: this call's key, as in :meth:`ops.client.Client.submit`.

        Raises:
            InvalidArgument: a bad ``worker_id``, ``deadline_s`` or key; nothing was sent.
            WorkerNotFound, IdempotencyConflict, NoControlPlaneReachable, ClusterBusy,
                PermissionDenied: as :meth:`cordon`.
        """
        from protocol import pb

        deadline_ms = (
            None if deadline_s is None else round(validation.check_drain_deadline_s(deadline_s) * 1000)
        )

        def request(*, worker_id: str, idempotency_key: str) -> pb.DrainWorkerRequest:
            return pb.DrainWorkerRequest(
                worker_id=worker_id,
                has_deadline=deadline_ms is not None,
                deadline_ms=deadline_ms or 0,
                idempotency_key=idempotency_key,
            )

        return await self._schedule("drain_worker", request, worker_id, idempotency_key)

    async def _schedule(
        self, rpc: str, make_request: Callable[..., Any], worker_id: str, key: str | None
    ) -> WorkerSchedule:
        """One of cordon, uncordon and drain: checked, sent, its reply typed."""
        validation.check_worker_id(worker_id)
        request = make_request(worker_id=worker_id, idempotency_key=check_key(key))
        with raised_as(functools.partial(WorkerNotFound, worker_id)):
            reply = await self._cp.call(rpc, request)
        return schedule_from_pb(reply)

"""The client for asyncio programs: :class:`AsyncioClient` runs the calls of
:class:`ops.client.Client` in a trio guest run on the program's own event loop
(:mod:`runtime.aio.guest`; on a trio-asyncio loop, through its ``trio_as_future``), so grpclib
runs on that loop, no second loop or thread is opened and the loop policy is left alone.
Arguments, results and errors are those of :class:`Client`; a cancel of the awaiting task
(``asyncio.timeout``, ``task.cancel()``) cancels the call.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from ops.client.core import Client
from ops.client.results import (
    Account,
    AuditEntry,
    CancelOutcome,
    ClusterStatus,
    Job,
    JobHistory,
    LogChunk,
    WorkerSchedule,
)
from ops.client.settings import ClientSettings
from ops.client.streams import ChunkStream, LogStream
from runtime.aio.guest import TrioPortal, open_portal
from runtime.jobs import JobSpec

T = TypeVar("T")


class AsyncioClient:
    """A client of one Stockade cluster, for asyncio programs; open it with :meth:`open`.

    Every method is a coroutine (but :meth:`logs`, which returns an async iterator) and may be
    awaited from several tasks at once. Use it on the loop that opened it.
    """

    def __init__(self, portal: TrioPortal, client: Client) -> None:
        self._portal = portal
        self._client = client

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: ClientSettings | None = None) -> AsyncIterator[AsyncioClient]:
        """``async with AsyncioClient.open() as client:`` a client, closed at the end of the
        block (its calls still running are cancelled).

        Args:
            settings: where the cluster is and what to present; None:
                :meth:`ClientSettings.find` (as ``stockade``'s commands find them).

        Raises:
            ops.config.ClusterError, InvalidArgument, runtime.tls.TlsFilesInvalid,
                runtime.tls.KeyFileExposed: as :meth:`Client.open`.
            RuntimeError: this thread runs trio already (a trio program: use :class:`Client`).
        """
        client = Client(ClientSettings.find() if settings is None else settings)
        try:
            async with open_portal() as portal:
                yield cls(portal, client)
        finally:
            client.close()  # the connections live on this loop: closed from it

    @property
    def settings(self) -> ClientSettings:
        """The settings it was opened with."""
        return self._client.settings

    @property
    def last_answered(self) -> str:
        """The ``host:port`` of the control plane that answered last (asked first next)."""
        return self._client.last_answered

    async def _run(self, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return await self._portal.run(functools.partial(call, *args, **kwargs))

    async def submit(self, spec: JobSpec, *, idempotency_key: str | None = None) -> int:
        """Submit one job (or an array); return its id. As :meth:`Client.submit`.

        Raises:
            the errors of :meth:`Client.submit`.
        """
        return await self._run(self._client.submit, spec, idempotency_key=idempotency_key)

    async def submit_many(
        self, specs: Sequence[JobSpec], *, idempotency_key: str | None = None
    ) -> tuple[int, ...]:
        """Submit up to 10,000 jobs, all or none; their ids in order. As :meth:`Client.submit_many`.

        Raises:
            the errors of :meth:`Client.submit_many`.
        """
        return await self._run(self._client.submit_many, specs, idempotency_key=idempotency_key)

    async def get(self, job_id: int) -> Job:
        """The job ``job_id`` now. As :meth:`Client.get`.

        Raises:
            the errors of :meth:`Client.get`.
        """
        return await self._run(self._client.get, job_id)

    async def events(self, job_id: int) -> JobHistory:
        """The job's history, oldest first. As :meth:`Client.events`.

        Raises:
            the errors of :meth:`Client.events`.
        """
        return await self._run(self._client.events, job_id)

    async def wait(self, job_id: int, *, timeout_s: float | None = None) -> Job:
        """Wait until the job has ended and return it. As :meth:`Client.wait`; ``asyncio.timeout``
        around it works too.

        Raises:
            the errors of :meth:`Client.wait`.
        """
        return await self._run(self._client.wait, job_id, timeout_s=timeout_s)

    async def cancel(
        self, job_id: int, *, only_this_task: bool = False, idempotency_key: str | None = None
    ) -> CancelOutcome:
        """Cancel a job (or every task of an array). As :meth:`Client.cancel`.

        Raises:
            the errors of :meth:`Client.cancel`.
        """
        return await self._run(
            self._client.cancel, job_id, only_this_task=only_this_task, idempotency_key=idempotency_key
        )

    async def list(
        self, *, state: str | None = None, limit: int = 100, account: str | None = None
    ) -> tuple[Job, ...]:
        """The newest jobs, newest first (at most ``limit``, 0: 100). As :meth:`Client.list`.

        Raises:
            the errors of :meth:`Client.list`.
        """
        return await self._run(self._client.list, state=state, limit=limit, account=account)

    async def audit(
        self,
        *,
        account: str | None = None,
        action: str | None = None,
        since_s: float | None = None,
        limit: int = 100,
    ) -> tuple[AuditEntry, ...]:
        """The audit trail, newest first. As :meth:`Client.audit`.

        Raises:
            the errors of :meth:`Client.audit`.
        """
        return await self._run(
            self._client.audit, account=account, action=action, since_s=since_s, limit=limit
        )

    async def set_account(
        self,
        name: str,
        *,
        cpu_millis: int | None = None,
        memory_mb: int | None = None,
        max_pending: int | None = None,
        max_priority: int | None = None,
        weight: float | None = None,
        clear: Sequence[str] = (),
        idempotency_key: str | None = None,
    ) -> Account:
        """Set an account's quotas, priority cap and weight. As :meth:`Client.set_account`.

        Raises:
            the errors of :meth:`Client.set_account`.
        """
        return await self._run(
            self._client.set_account,
            name,
            cpu_millis=cpu_millis,
            memory_mb=memory_mb,
            max_pending=max_pending,
            max_priority=max_priority,
            weight=weight,
            clear=clear,
            idempotency_key=idempotency_key,
        )

    async def account(self, name: str) -> Account:
        """An account's quotas, weight and use. As :meth:`Client.account`.

        Raises:
            the errors of :meth:`Client.account`.
        """
        return await self._run(self._client.account, name)

    async def accounts(self) -> tuple[Account, ...]:
        """Every account with quotas or queued or in-use jobs. As :meth:`Client.accounts`.

        Raises:
            the errors of :meth:`Client.accounts`.
        """
        return await self._run(self._client.accounts)

    async def status(self) -> ClusterStatus:
        """The cluster at a glance. As :meth:`Client.status`.

        Raises:
            the errors of :meth:`Client.status`.
        """
        return await self._run(self._client.status)

    def logs(
        self,
        job_id: int,
        *,
        stream: str = "stdout",
        follow: bool = False,
        tail_lines: int | None = None,
        tail_max_bytes: int | None = None,
    ) -> AsyncioLogStream:
        """A job's output as an async iterator of :class:`LogChunk`. As :meth:`Client.logs`,
        errors included (a bad argument raises InvalidArgument at once)."""
        return AsyncioLogStream(
            self._portal,
            self._client.logs(
                job_id, stream=stream, follow=follow, tail_lines=tail_lines, tail_max_bytes=tail_max_bytes
            ),
        )

    async def cordon(self, worker_id: str, *, idempotency_key: str | None = None) -> WorkerSchedule:
        """Cordon a worker. As :meth:`Client.cordon`.

        Raises:
            the errors of :meth:`Client.cordon`.
        """
        return await self._run(self._client.cordon, worker_id, idempotency_key=idempotency_key)

    async def uncordon(self, worker_id: str, *, idempotency_key: str | None = None) -> WorkerSchedule:
        """Uncordon a worker. As :meth:`Client.uncordon`.

        Raises:
            the errors of :meth:`Client.cordon`.
        """
        return await self._run(self._client.uncordon, worker_id, idempotency_key=idempotency_key)

    async def drain(
        self, worker_id: str, *, deadline_s: float | None = None, idempotency_key: str | None = None
    ) -> WorkerSchedule:
        """Drain a worker (its jobs stopped and placed elsewhere after ``deadline_s`` seconds,
        None: never). As :meth:`Client.drain`.

        Raises:
            the errors of :meth:`Client.drain`.
        """
        return await self._run(
            self._client.drain, worker_id, deadline_s=deadline_s, idempotency_key=idempotency_key
        )


class AsyncioLogStream(ChunkStream):
    """A job's output for asyncio (:meth:`AsyncioClient.logs`): an async iterator of
    :class:`LogChunk` over a :class:`ops.client.streams.LogStream` read through the portal."""

    def __init__(self, portal: TrioPortal, stream: LogStream) -> None:
        self._portal = portal
        self._stream = stream

    async def next(self) -> LogChunk | None:
        """The next chunk, or None at the end (see :meth:`ops.client.streams.LogStream.next`).

        Raises:
            the errors :meth:`Client.logs` lists.
        """
        return await self._portal.run(self._stream.next)

    async def aclose(self) -> None:
        """End the stream, if it is open (idempotent)."""
        await self._portal.run(self._stream.aclose)

"""The client for asyncio programs: :class:`AsyncioClient` runs the calls of
:class:`ops.client.Client` in a trio guest run on the program's own event loop
(:mod:`runtime.aio.guest`; on a trio-asyncio loop, through its ``trio_as_future``), so grpclib
runs on that loop, no second loop or thread is opened and the loop policy is left alone.
Arguments, results and errors are those of :class:`Client`; a cancel of the awaiting task
(``asyncio.timeout``, ``task.cancel()``) cancels the call.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

from ops.client.core import Client
from ops.client.results import LogChunk
from ops.client.settings import ClientSettings
from ops.client.streams import ChunkStream, LogStream
from runtime.aio.guest import TrioPortal, open_portal

T = TypeVar("T")
P = ParamSpec("P")


def _named_after(mirror: Callable[..., Any], method: Callable[..., Any], doc: str) -> None:
    """Give ``mirror`` the name of :class:`Client`'s ``method``, its signature (for
    :func:`inspect.signature`, through ``__wrapped__``) and the docstring ``doc``."""
    functools.update_wrapper(mirror, method)
    mirror.__module__ = __name__
    mirror.__qualname__ = f"AsyncioClient.{method.__name__}"
    mirror.__doc__ = doc


def _mirrored(
    method: Callable[Concatenate[Client, P], Awaitable[T]], summary: str
) -> Callable[Concatenate[AsyncioClient, P], Coroutine[Any, Any, T]]:
    """:class:`AsyncioClient`'s method for :class:`Client`'s coroutine ``method``: the same
    arguments, result and errors, the call run in the trio guest run; its docstring ``summary``
    and a pointer to ``method``'s."""

    async def mirror(self: AsyncioClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._portal.run(functools.partial(method, self._client, *args, **kwargs))

    name = method.__name__
    raises = f"Raises:\n    the errors of :meth:`Client.{name}`.\n"
    _named_after(mirror, method, f"{summary} As :meth:`Client.{name}`.\n\n{raises}")
    return mirror


def _mirrored_logs(
    method: Callable[Concatenate[Client, P], LogStream],
) -> Callable[Concatenate[AsyncioClient, P], AsyncioLogStream]:
    """:meth:`AsyncioClient.logs` for :meth:`Client.logs`: the same arguments and errors (a bad
    argument raises InvalidArgument at once), its stream read through the portal."""

    def logs(self: AsyncioClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncioLogStream:
        return AsyncioLogStream(self._portal, method(self._client, *args, **kwargs))

    doc = (
        "A job's output as an async iterator of :class:`LogChunk`. As :meth:`Client.logs`,\n"
        "errors included (a bad argument raises InvalidArgument at once)."
    )
    _named_after(logs, method, doc)
    return logs


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

    submit = _mirrored(Client.submit, "Submit one job (or an array); return its id.")
    submit_many = _mirrored(Client.submit_many, "Submit up to 10,000 jobs, all or none; their ids in order.")
    get = _mirrored(Client.get, "The job ``job_id`` now.")
    events = _mirrored(Client.events, "The job's history, oldest first.")
    wait = _mirrored(
        Client.wait,
        "Wait until the job has ended and return it (``asyncio.timeout`` around it works too).",
    )
    cancel = _mirrored(Client.cancel, "Cancel a job (or every task of an array).")
    list = _mirrored(Client.list, "The newest jobs, newest first (at most ``limit``, 0: 100).")
    audit = _mirrored(Client.audit, "The audit trail, newest first.")
    set_account = _mirrored(Client.set_account, "Set an account's quotas, priority cap and weight.")
    account = _mirrored(Client.account, "An account's quotas, weight and use.")
    accounts = _mirrored(Client.accounts, "Every account with quotas or queued or in-use jobs.")
    add_schedule = _mirrored(Client.add_schedule, "Add a periodic job.")
    schedules = _mirrored(Client.schedules, "Every schedule, by name.")
    pause_schedule = _mirrored(Client.pause_schedule, "Pause a schedule.")
    resume_schedule = _mirrored(Client.resume_schedule, "Resume a paused schedule.")
    remove_schedule = _mirrored(Client.remove_schedule, "Remove a schedule.")
    status = _mirrored(Client.status, "The cluster at a glance.")
    logs = _mirrored_logs(Client.logs)
    cordon = _mirrored(Client.cordon, "Cordon a worker.")
    uncordon = _mirrored(Client.uncordon, "Uncordon a worker.")
    drain = _mirrored(
        Client.drain,
        "Drain a worker (its jobs stopped and placed elsewhere after ``deadline_s`` seconds, None: never).",
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

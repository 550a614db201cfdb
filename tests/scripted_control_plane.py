"""A ControlPlane service whose answers a test scripts, served for real (grpclib, plaintext, on
127.0.0.1) from a thread of the test's process, so a client of either face (trio, asyncio)
can call it.

:class:`ScriptedControlPlane` records every request (``requests``: ``(rpc, request)`` in
arrival order) and answers each RPC from ``answers[rpc]``: a reply message, an exception to
raise (``grpclib.GRPCError(Status.NOT_FOUND, "...")``), or a function of the request giving
either (it may be a coroutine function); ``read_job_logs``'s answer is a list of ``LogChunk``
messages, an exception (raised before anything is sent), or a function of the request giving
an async iterator of chunks. An RPC with no answer is UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import grpclib.const
import grpclib.exceptions
import grpclib.server

from protocol import pb
from protocol.bases import ControlPlaneBase

__all__ = ["ScriptedControlPlane", "grpc_error", "serve"]


def grpc_error(status: str, message: str = "") -> grpclib.exceptions.GRPCError:
    """The error a replica answers with: ``grpc_error("NOT_FOUND", "job_id 7 not found")``."""
    return grpclib.exceptions.GRPCError(grpclib.const.Status[status], message)


class ScriptedControlPlane(ControlPlaneBase):
    """See the module docstring."""

    def __init__(self, **answers: Any) -> None:
        self.answers: dict[str, Any] = dict(answers)
        self.requests: list[tuple[str, Any]] = []

    def sent(self, rpc: str) -> list[Any]:
        """The requests of ``rpc`` received so far, in order."""
        return [request for name, request in self.requests if name == rpc]

    async def _answer(self, rpc: str, request: Any) -> Any:
        self.requests.append((rpc, request))
        answer = self.answers.get(rpc)
        if answer is None:
            raise grpc_error("UNIMPLEMENTED", f"{rpc} is not scripted")
        if callable(answer):
            answer = answer(request)
            if inspect.isawaitable(answer):
                answer = await answer
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def submit_job(self, message: pb.SubmitJobRequest) -> pb.SubmitJobReply:
        return await self._answer("submit_job", message)  # type: ignore[no-any-return]

    async def submit_jobs(self, message: pb.SubmitJobsRequest) -> pb.SubmitJobsReply:
        return await self._answer("submit_jobs", message)  # type: ignore[no-any-return]

    async def get_job(self, message: pb.GetJobRequest) -> pb.JobInfo:
        return await self._answer("get_job", message)  # type: ignore[no-any-return]

    async def list_jobs(self, message: pb.ListJobsRequest) -> pb.ListJobsReply:
        return await self._answer("list_jobs", message)  # type: ignore[no-any-return]

    async def cancel_job(self, message: pb.CancelJobRequest) -> pb.CancelJobReply:
        return await self._answer("cancel_job", message)  # type: ignore[no-any-return]

    async def status(self, message: pb.StatusRequest) -> pb.StatusReply:
        return await self._answer("status", message)  # type: ignore[no-any-return]

    async def cordon_worker(self, message: pb.CordonWorkerRequest) -> pb.WorkerScheduleReply:
        return await self._answer("cordon_worker", message)  # type: ignore[no-any-return]

    async def uncordon_worker(self, message: pb.UncordonWorkerRequest) -> pb.WorkerScheduleReply:
        return await self._answer("uncordon_worker", message)  # type: ignore[no-any-return]

    async def drain_worker(self, message: pb.DrainWorkerRequest) -> pb.WorkerScheduleReply:
        return await self._answer("drain_worker", message)  # type: ignore[no-any-return]

    async def read_job_logs(self, message: pb.ReadJobLogsRequest) -> AsyncIterator[pb.LogChunk]:
        chunks = await self._answer("read_job_logs", message)
        if isinstance(chunks, list):
            for chunk in chunks:
                yield chunk
            return
        async for chunk in chunks:
            yield chunk


@contextmanager
def serve(*services: ScriptedControlPlane) -> Iterator[list[str]]:
    """Serve each service on 127.0.0.1 (a free port), from one thread with an asyncio loop of
    its own; yields their ``host:port`` addresses, and stops them on leaving."""
    loop = asyncio.SelectorEventLoop()  # not the policy's: trio-asyncio's policy may be set
    servers: list[grpclib.server.Server] = []
    addresses: list[str] = []
    started = threading.Event()
    failed: list[BaseException] = []

    async def start() -> None:
        for service in services:
            server = grpclib.server.Server([service])
            await server.start("127.0.0.1", 0)
            servers.append(server)
            sockets = server._server.sockets if server._server is not None else ()
            addresses.append(f"127.0.0.1:{sockets[0].getsockname()[1]}")

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as exc:
            failed.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()

    async def stop() -> None:
        for server in servers:
            server.close()
            await server.wait_closed()

    thread = threading.Thread(target=run, name="scripted-control-plane", daemon=True)
    thread.start()
    started.wait(10)
    if failed:
        raise failed[0]
    try:
        yield addresses
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

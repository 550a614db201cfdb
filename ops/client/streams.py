"""A job's output as it comes: :class:`LogStream` (what :meth:`ops.client.Client.logs` returns),
over :meth:`runtime.client.ControlPlaneClient.stream`, and :class:`ChunkStream`, what both
faces' streams share."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Self

import attrs
import trio

from ops.client.errors import JobNotFound, raised_as
from ops.client.results import ENDED_STATES, LogChunk, chunk_from_pb
from runtime.aio import StreamLimits
from runtime.backoff import FullJitterBackoff
from runtime.client import ControlPlaneClient
from runtime.errors import DeadlineExceeded, Unavailable

if TYPE_CHECKING:
    from protocol import pb

WAIT_POLL = FullJitterBackoff(base_s=0.1, cap_s=2.0)
"""The waits between two reads of a job in :meth:`Client.wait`: its ceilings, 0.1 s doubling
to 2 s (no jitter: a read is no retry)."""
LOG_OPEN_S = 10.0
"""How long a control plane may take to send the first chunk of a job's output, in seconds,
before :meth:`Client.logs` asks the next one (it reaches the worker within its own
``log_open_timeout_s``, 5 s, and the worker sends a first chunk at once)."""
LOG_RESUMES = 3
"""How many times in a row a broken output stream is opened again, from where it broke, before
:meth:`Client.logs` gives up (each opening walks every replica)."""
LOG_IDLE_S = 30.0
"""The longest silence of an open output stream, in seconds (a following control plane sends a
keep-alive chunk every 5 s)."""


class ChunkStream:
    """An async iterator of :class:`LogChunk` and an async context manager that closes the stream
    when left, over a subclass's :meth:`next` and :meth:`aclose`."""

    async def next(self) -> LogChunk | None:
        """The next chunk, or None at the end."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """End the stream, if it is open (idempotent)."""
        raise NotImplementedError

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> LogChunk:
        chunk = await self.next()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class LogStream(ChunkStream):
    """A job's output as it comes (:meth:`Client.logs`), opened at the first chunk asked for,
    closed at its end, at a failure, by :meth:`aclose`, or by leaving ``async with``.

    A stream that breaks is opened again on any replica for the same run from the byte after
    the last one received (each chunk's ``offset``), up to :data:`LOG_RESUMES` times in a row:
    no byte comes twice and none is skipped. With ``follow``, a run that ended while its job did
    not goes on with the next run's output, from its start, until the job has ended; following
    with no tail begins with the job's first run that started, so every run's output comes; a
    run whose worker stops answering is waited for while it is active, and once it has ended
    (its worker declared dead) the stream goes on with the next run, with a chunk that says the
    rest of the cut run is on that worker only (``LogChunk.cut_run``)."""

    def __init__(self, cp: ControlPlaneClient, request: pb.ReadJobLogsRequest, *, job_id: int) -> None:
        self._cp = cp
        self._request = request
        self._job_id = job_id
        self._opened = contextlib.AsyncExitStack()
        self._chunks: AsyncIterator[pb.LogChunk] | None = None
        """The replica's chunks, once the stream is open."""
        self._done = False
        self._assignment_id = 0
        """The run being read (0: none yet)."""
        self._next_offset: int | None = None
        """Where the next byte of that run's output is (None: nothing has come yet)."""
        self._resumes = 0
        """Streams opened again in a row since output last came."""
        self._job_ended = False
        """The job had ended when last read (:meth:`_open_next_run`)."""
        self._cut: list[LogChunk] = []
        """Notices of runs whose output stopped early (``LogChunk.cut_run``), to be returned next."""

    async def next(self) -> LogChunk | None:
        """The next chunk, or None once the output has all come (without ``follow``) or the
        job has ended (with it).

        Raises:
            the errors :meth:`Client.logs` lists.
        """
        while True:
            if self._cut:
                return self._cut.pop(0)
            if self._done:
                return None
            try:
                with raised_as(functools.partial(JobNotFound, self._job_id)):
                    message = await self._receive()
            except (Unavailable, DeadlineExceeded) as exc:
                if self._request.follow and self._assignment_id:
                    await self._after_silence()
                    continue
                if self._next_offset is None or self._resumes >= LOG_RESUMES:
                    if self._resumes:
                        exc.add_note(
                            f"(the stream of job {self._job_id}'s output broke and was opened again "
                            f"{self._resumes} times from where it broke, with no output since)"
                        )
                    await self.aclose()
                    raise
                await self._close_stream()
                self._resumes += 1
                self._request = _resumed(self._request, self._assignment_id, self._next_offset)
                continue
            except BaseException:
                await self.aclose()
                raise
            if message is None:
                await self.aclose()
                return None
            if message.data:
                self._resumes = 0  # progress: the next break may be opened again as often
            self._assignment_id = int(message.assignment_id) or self._assignment_id
            self._next_offset = int(message.offset) + len(message.data)
            chunk = chunk_from_pb(message)
            if chunk.job_ended and self._request.follow:
                if await self._next_run():
                    await self.aclose()  # the job has ended: this was its last chunk
                else:
                    chunk = attrs.evolve(chunk, job_ended=False)  # more comes, from the next run
            return chunk

    async def _receive(self) -> pb.LogChunk | None:
        """The next message of the open stream, opening it first if need be; None at its end."""
        if self._chunks is None:
            if self._from_first_run():
                if not await self._open_next_run(after=0):
                    self._chunks = await self._open(self._request)  # raises: not started yet
            else:
                self._chunks = await self._open(self._request)
        assert self._chunks is not None
        return await anext(self._chunks, None)

    def _from_first_run(self) -> bool:
        """Following the whole output (no tail, no run named) begins with the job's first run."""
        request = self._request
        named = request.has_tail or bool(request.assignment_id) or bool(self._assignment_id)
        return request.follow and not named

    async def _open(self, request: pb.ReadJobLogsRequest) -> AsyncIterator[pb.LogChunk]:
        """The stream of ``request``, open on the first replica that sends its first chunk."""
        return await self._opened.enter_async_context(
            self._cp.stream(
                "read_job_logs", request, StreamLimits(first_message_s=LOG_OPEN_S, idle_s=LOG_IDLE_S)
            )
        )

    async def _open_next_run(self, *, after: int) -> bool | None:
        """Open the stream on the job's first run after assignment ``after`` that started,
        from its start (True); a run placed but not started yet stops the search (None: wait
        for it); runs that ended without starting are passed over (False: no such run now)."""
        from protocol import pb
        from runtime.errors import FailedPrecondition

        info: pb.JobInfo = await self._cp.call("get_job", pb.GetJobRequest(job_id=self._job_id))
        self._job_ended = info.state in ENDED_STATES
        for attempt in sorted(info.attempt_history, key=lambda a: a.assignment_id):
            if attempt.assignment_id <= after:
                continue
            request = _resumed(self._request, attempt.assignment_id, 0)
            try:
                self._chunks = await self._open(request)
            except FailedPrecondition:
                if attempt.state == "active":
                    return None  # placed, not started yet: its output comes later
                continue  # it ended without starting: it has no output
            except (Unavailable, DeadlineExceeded):
                if attempt.state == "active":  # its worker may answer again: wait for it
                    self._request, self._assignment_id = request, attempt.assignment_id
                    raise
                self._cut.append(_cut_notice(attempt))
                continue
            self._request, self._assignment_id, self._next_offset = request, attempt.assignment_id, None
            return True
        return False

    async def _next_run(self) -> bool:
        """After the run being read ended, with ``follow``: wait until the job has ended with
        no later run that started (True: nothing more to read) or a later run of it has started
        (False: the stream is open on that run, from its start)."""
        reads = 0
        while True:
            await self._close_stream()
            if await self._open_next_run(after=self._assignment_id):
                return False
            if self._job_ended:
                return True
            await trio.sleep(WAIT_POLL.ceiling_s(reads))
            reads += 1

    async def _after_silence(self) -> None:
        """Following, the run being read stopped answering (its worker, or every replica's way
        to it): while the run is active, wait a moment and open it again from where it broke;
        once it has ended (its worker declared dead, say), the rest of its output is on that
        worker only: a notice of it (``cut_run``), then the next run's output, or the end."""
        await self._close_stream()
        from protocol import pb

        info: pb.JobInfo = await self._cp.call("get_job", pb.GetJobRequest(job_id=self._job_id))
        attempt = next(
            (a for a in info.attempt_history if a.assignment_id == self._assignment_id),
            pb.Attempt(assignment_id=self._assignment_id),  # not listed: taken as ended
        )
        if attempt.state == "active":
            await trio.sleep(WAIT_POLL.ceiling_s(self._resumes))
            self._resumes += 1
            self._request = _resumed(self._request, self._assignment_id, self._next_offset or 0)
            return
        self._cut.append(_cut_notice(attempt))
        if await self._next_run():
            await self.aclose()

    async def _close_stream(self) -> None:
        await self._opened.aclose()
        self._opened = contextlib.AsyncExitStack()
        self._chunks = None

    async def aclose(self) -> None:
        """End the stream, if it is open (idempotent; the control plane's handler is cancelled)."""
        self._done = True
        await self._opened.aclose()


def _cut_notice(attempt: pb.Attempt) -> LogChunk:
    """An empty chunk saying the output of run ``attempt``, which has ended, stopped early."""
    return LogChunk(
        data=b"",
        dropped_bytes=0,
        job_ended=False,
        worker_id=attempt.worker_id or None,
        assignment_id=None,
        cut_run=int(attempt.assignment_id),
    )


def _resumed(request: pb.ReadJobLogsRequest, assignment_id: int, offset: int) -> pb.ReadJobLogsRequest:
    """``request`` for run ``assignment_id`` from byte ``offset`` of its output (no tail)."""
    from protocol import pb

    return pb.ReadJobLogsRequest(
        job_id=request.job_id,
        stream=request.stream,
        follow=request.follow,
        assignment_id=assignment_id,
        has_offset=True,
        offset=offset,
    )

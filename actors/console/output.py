"""A job's output as the console shows it, read from its worker through the log relay of
``stockade logs`` (:class:`actors.logs.LogRelay`): the tails on the job's page
(:func:`output_tails`), one page of a stream at a byte offset or at its end
(:func:`output_page`), and a whole stream for a download (:func:`whole_output`).
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from actors.console import views
from actors.logs import LogRelay, LogSource, log_source
from protocol import pb
from runtime.errors import Busy, FailedPrecondition, InvalidArgument, NotFound, Unavailable

__all__ = ["OutputPage", "Unreadable", "output_page", "output_tails", "source_of", "whole_output"]

STREAMS = ("stdout", "stderr")
TAIL_LINES_ALL = 100_000
"""As many tail lines as ReadJobLogs gives (its limit): a page's tail is bounded by bytes."""


class Unreadable(Exception):
    """The output cannot be read now; the message says why (no run yet, the worker gone or
    unreachable, nothing within the time allowed)."""


def source_of(job_id: int, runtime: str, row: Any) -> LogSource:
    """Where ``job_id``'s output is read, from its row of ``CONSOLE_LOG_SOURCE``.

    Raises:
        Unreadable: a sleep job (no output), no run started yet, or its worker dead or left.
    """
    if runtime == "sleep":
        raise Unreadable("a sleep job writes no output")
    try:
        return log_source(job_id, row)
    except (NotFound, InvalidArgument, FailedPrecondition, Unavailable) as exc:
        raise Unreadable(str(exc)) from exc


@attrs.frozen(kw_only=True)
class Read:
    """What one read of a stream gave: its chunks in order, and whether the job had ended with
    all of it sent."""

    chunks: list[Any]
    ended: bool
    cut: bool
    """The read stopped at its byte limit: more followed."""

    @property
    def data(self) -> bytes:
        return b"".join(bytes(c.data) for c in self.chunks)


async def _read(
    logs: LogRelay, source: LogSource, request: pb.ReadJobLogsRequest, *, limit_bytes: int, timeout_s: float
) -> Read:
    """The chunks ``request`` asks for, until the stream ends or ``limit_bytes`` came.

    Raises:
        Unreadable: the relay failed, or the worker sent nothing more within ``timeout_s``.
    """
    chunks: list[Any] = []
    size = 0
    with trio.move_on_after(timeout_s) as deadline, trio.CancelScope() as enough:

        async def send(chunk: Any) -> None:
            nonlocal size
            chunks.append(chunk)
            size += len(chunk.data)
            if size > limit_bytes:
                enough.cancel()

        try:
            await logs.relay(source, request, send)
        except (Unavailable, FailedPrecondition, Busy) as exc:
            raise Unreadable(str(exc)) from exc
    if deadline.cancelled_caught:
        raise Unreadable(
            f"worker {source.worker_id} at {source.address} sent no output within {timeout_s:g} s"
        )
    return Read(chunks=chunks, ended=bool(chunks) and chunks[-1].job_ended, cut=enough.cancelled_caught)


async def output_tails(
    logs: LogRelay, source: LogSource, *, lines: int, max_bytes: int, timeout_s: float
) -> tuple[list[tuple[str, str]], str]:
    """(stream, text) of the last ``lines`` lines (at most ``max_bytes``) of the job's stdout and
    stderr, and a note saying why some or all could not be had (empty when both came). Both
    streams are read at once, within ``timeout_s``: the page waits for the slower, not the sum."""
    texts: dict[str, str] = {}
    failures: dict[str, str] = {}

    async def read(stream: str) -> None:
        request = pb.ReadJobLogsRequest(
            job_id=source.job_id, stream=stream, has_tail=True, tail_lines=lines, tail_max_bytes=max_bytes
        )
        try:
            got = await _read(logs, source, request, limit_bytes=max_bytes, timeout_s=timeout_s)
        except Unreadable as exc:
            failures[stream] = str(exc)
        else:
            texts[stream] = views.printable(got.data)

    async with trio.open_nursery() as nursery:
        for stream in STREAMS:
            nursery.start_soon(read, stream)
    outputs = [(s, texts[s]) for s in STREAMS if s in texts]
    return outputs, next((failures[s] for s in STREAMS if s in failures), "")


@attrs.frozen(kw_only=True)
class OutputPage:
    """One page of a stream: ``text`` shows bytes ``start_offset`` to ``end_offset`` of the run's
    output (offsets count every byte the job wrote, dropped ones too)."""

    stream: str
    text: str
    start_offset: int
    end_offset: int
    dropped_bytes: int
    """Bytes the worker no longer keeps right before ``start_offset`` (over its output cap)."""
    more: bool
    """Bytes follow ``end_offset`` already."""
    ended: bool
    """The job had ended and everything it wrote was read."""
    at_end: bool
    """The page was read at the stream's end (the live tail), not at an offset."""


async def output_page(
    logs: LogRelay, source: LogSource, stream: str, *, offset: int | None, page_bytes: int, timeout_s: float
) -> OutputPage:
    """The ``page_bytes`` of ``stream`` from byte ``offset`` on, or the last ``page_bytes`` (the
    tail) when ``offset`` is None.

    Raises:
        Unreadable: as :func:`source_of` and the relay.
    """
    request = pb.ReadJobLogsRequest(job_id=source.job_id, stream=stream, assignment_id=source.assignment_id)
    if offset is None:
        request.has_tail, request.tail_lines, request.tail_max_bytes = True, TAIL_LINES_ALL, page_bytes
    else:
        request.has_offset, request.offset = True, offset
    got = await _read(logs, source, request, limit_bytes=page_bytes, timeout_s=timeout_s)
    data = got.data[:page_bytes]
    start = int(got.chunks[0].offset) if got.chunks else (offset or 0)
    return OutputPage(
        stream=stream,
        text=views.printable(data),
        start_offset=start,
        end_offset=start + len(data),
        dropped_bytes=int(got.chunks[0].dropped_bytes) if got.chunks else 0,
        more=got.cut,
        ended=got.ended,
        at_end=offset is None,
    )


async def whole_output(logs: LogRelay, source: LogSource, stream: str, *, timeout_s: float) -> bytes:
    """Every byte of ``stream`` the worker keeps (as it keeps it: at most its output cap).

    Raises:
        Unreadable: as :func:`output_page`.
    """
    request = pb.ReadJobLogsRequest(job_id=source.job_id, stream=stream, assignment_id=source.assignment_id)
    got = await _read(logs, source, request, limit_bytes=2**62, timeout_s=timeout_s)
    return got.data

r"""Worker.ReadLogs: one assignment's stdout or stderr, read from its job folder and sent in chunks.

:class:`LogReader` serves a :class:`LogQuery` as an async iterator of :class:`Piece`\ s, reading
on worker threads: docs/design.md, "Reading a job's output".
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from agent.output import OUTPUT_FILES, OutputFiles, data_start
from agent.runtimes import job_dir_for
from runtime import metrics
from runtime.errors import Busy, InvalidArgument, NotFound
from runtime.settings.agent import OutputSettings

READ_THREADS = 4
"""Worker threads one agent's readers read on at once (each read is short; more readers wait)."""


def check_stream(stream: str) -> str:
    """The output stream a request names: ``"stdout"`` (also for ``""``) or ``"stderr"``; any
    other name raises InvalidArgument."""
    if stream in ("", "stdout", "stderr"):
        return stream or "stdout"
    raise InvalidArgument("stream", stream, "must be stdout or stderr")


@attrs.frozen(kw_only=True)
class LogQuery:
    """What one ReadLogs asks for."""

    job_id: int
    assignment_id: int
    stream: str
    """``"stdout"`` or ``"stderr"``."""
    follow: bool = False
    tail_lines: int | None = None
    """Begin with the last this-many lines; None: from the start of what is kept."""
    tail_max_bytes: int = 0
    """With ``tail_lines``, begin no earlier than this many bytes before the end (0: no limit)."""
    offset: int | None = None
    """Begin at this offset of the output (every byte the job wrote counts, dropped ones too),
    instead of a tail or the start: a reader going on where its broken stream ended."""


@attrs.frozen(kw_only=True)
class Piece:
    """One chunk of output, as sent."""

    data: bytes = b""
    dropped_bytes: int = 0
    """Bytes the worker no longer keeps, between the previous piece's end and ``data``."""
    job_ended: bool = False
    offset: int = 0
    """Where ``data`` begins in the output (every byte the job wrote counts, dropped ones too)."""


def tail_start(
    read_at: Callable[[int, int], bytes], kept_from: int, size: int, lines: int, block: int
) -> int | None:
    """The offset where the last ``lines`` lines of a file begin, or None when its kept part
    ``[kept_from, size)`` holds fewer (or exactly that many, beginning at ``kept_from`` with no
    way to tell whether an earlier line was dropped: None too when ``kept_from`` is above 0).

    Lines end at ``\\n``; a file's last line counts with or without one (``tail -n``); 0 lines
    is the end of the file. Reads backwards ``block`` bytes (> 0) at a time with
    ``read_at(offset, length)``, so it reads only as much as the lines take.
    """
    if lines == 0:
        return size
    end = size
    if end > kept_from and read_at(end - 1, 1) == b"\n":
        end -= 1  # the last line's own newline
    found = 0
    pos = end
    while pos > kept_from:
        start = max(kept_from, pos - block)
        data = read_at(start, pos - start)
        index = len(data)
        while (index := data.rfind(b"\n", 0, index)) >= 0:
            found += 1
            if found == lines:
                return start + index + 1
        pos = start
    return kept_from if kept_from == 0 else None


def _open(path: Path) -> int | None:
    """(worker thread) The file open for reading; None when it does not exist (yet)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None


def _read(fd: int, path: Path, offset: int, max_bytes: int, files: OutputFiles) -> tuple[bytes, int, int]:
    """(worker thread) Up to ``max_bytes`` of the output from ``offset`` on (offsets count every
    byte the job wrote, truncated ones included), skipping what is no longer kept; returns the
    data, how many bytes were skipped before it, and the offset after it."""
    with files.lock(path):
        removed = files.removed_bytes(path)
        physical = offset - removed
        dropped = 0
        if physical < 0:  # truncated (no hole punching) past it
            dropped, physical = -physical, 0
        start = data_start(fd, physical)
        dropped += start - physical
        data = os.pread(fd, max_bytes, start)
        return data, dropped, removed + start + len(data)


def _tail(fd: int, path: Path, lines: int, max_bytes: int, block: int, files: OutputFiles) -> tuple[int, int]:
    """(worker thread) The offset of the last ``lines`` lines (0, the start, when fewer are
    kept), but no earlier than ``max_bytes`` before the end (0: no limit); and the offset of
    the end they were counted from."""
    with files.lock(path):
        removed = files.removed_bytes(path)
        kept_from, size = data_start(fd, 0), os.fstat(fd).st_size
        start = tail_start(lambda at, length: os.pread(fd, length, at), kept_from, size, lines, block)
        if max_bytes and size - max_bytes > (kept_from if start is None else start):
            return removed + size - max_bytes, removed + size
        return (0 if start is None else removed + start), removed + size


def _end(fd: int, path: Path, files: OutputFiles) -> int:
    """(worker thread) The offset of the output's end now (offsets count every byte written)."""
    with files.lock(path):
        return files.removed_bytes(path) + os.fstat(fd).st_size


@attrs.define
class _Opened:
    """A reader's file descriptor (None until the file exists)."""

    fd: int | None


@attrs.define
class LogReader:
    """Serves ReadLogs for one agent, sharing ``files`` with the output keeper; ``job_done`` is
    the agent's :meth:`agent.core.Agent.job_done`."""

    worker_id: str
    jobs_dir: Path
    settings: OutputSettings
    files: OutputFiles
    job_done: Callable[[int], trio.Event | None]
    max_readers: int = 64
    """Streams served at once; one more is refused (Busy)."""
    readers: int = 0
    """Streams being served now."""
    _threads: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(READ_THREADS))

    async def _on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._threads)

    async def read(self, query: LogQuery) -> AsyncIterator[Piece]:
        """The pieces of ``query``'s output, as docs/design.md, "Reading a job's output", says.

        Raises:
            NotFound: the worker keeps no folder of that assignment (and does not run it).
            Busy: ``max_readers`` streams are served already.
            OSError: the file cannot be read.
        """
        if self.readers >= self.max_readers:
            raise Busy(f"busy: worker {self.worker_id} serves {self.readers} output streams already")
        folder = job_dir_for(self.jobs_dir, query.job_id, query.assignment_id)
        path = folder / OUTPUT_FILES[query.stream]
        done = self.job_done(query.assignment_id)
        fd = await self._on_thread(_open, path)
        if fd is None and done is None and not await self._on_thread(folder.is_dir):
            raise NotFound(
                f"worker {self.worker_id} keeps no output of job {query.job_id} (assignment "
                f"{query.assignment_id}): its folder {folder} is not there (deleted "
                f"{self.settings.output_retention_s:g} s after the job ended, output_retention_s, or "
                "the job never started on this worker)"
            )
        opened = _Opened(fd)
        self.readers += 1
        metrics.AGENT_LOG_READERS.labels(self.worker_id).inc()
        try:
            async for piece in self._pieces(query, path, opened, done):
                yield piece
        finally:
            self.readers -= 1
            metrics.AGENT_LOG_READERS.labels(self.worker_id).dec()
            if opened.fd is not None:
                os.close(opened.fd)

    async def _pieces(
        self, query: LogQuery, path: Path, opened: _Opened, done: trio.Event | None
    ) -> AsyncIterator[Piece]:
        chunk = self.settings.read_chunk_bytes
        offset = 0
        # Without follow, the answer is the output as it was when asked for: it ends there,
        # however fast the job goes on writing (a short read may never come).
        end_at: int | None = None
        if query.offset is not None:
            offset = query.offset
            if opened.fd is not None and not query.follow:
                end_at = await self._on_thread(_end, opened.fd, path, self.files)
        elif opened.fd is not None and query.tail_lines is not None:
            offset, tail_end = await self._on_thread(
                _tail, opened.fd, path, query.tail_lines, query.tail_max_bytes, chunk, self.files
            )
            end_at = None if query.follow else tail_end
        elif opened.fd is not None and not query.follow:
            end_at = await self._on_thread(_end, opened.fd, path, self.files)
        first = True
        last_sent = trio.current_time()
        while True:
            # Whether the job had ended is read before the file: a job that had, wrote all it
            # ever will before this read, so a short read drains it.
            ended = done is None or done.is_set()
            data, dropped = b"", 0
            if opened.fd is not None:
                data, dropped, offset = await self._on_thread(
                    _read, opened.fd, path, offset, chunk, self.files
                )
            at = offset - len(data)
            if end_at is not None and offset >= end_at:
                data = data[: max(0, len(data) - (offset - end_at))]
                yield Piece(data=data, dropped_bytes=dropped, job_ended=ended, offset=at)
                return
            if len(data) == chunk:
                yield Piece(data=data, dropped_bytes=dropped, offset=at)
                first, last_sent = False, trio.current_time()
                continue
            if ended:
                yield Piece(data=data, dropped_bytes=dropped, job_ended=True, offset=at)
                return
            if not query.follow:
                yield Piece(data=data, dropped_bytes=dropped, offset=at)
                return
            if data or dropped or first or trio.current_time() - last_sent >= self.settings.keepalive_s:
                yield Piece(data=data, dropped_bytes=dropped, offset=at)
                first, last_sent = False, trio.current_time()
            assert done is not None
            with trio.move_on_after(self.settings.follow_poll_s):
                await done.wait()
            if opened.fd is None:
                opened.fd = await self._on_thread(_open, path)

"""``stockade logs``: a job's output, from any host, through the control planes (through the
Python client, :meth:`ops.client.Client.logs`), and the output tails ``stockade job`` shows
(:func:`output_tails`). What it prints and how it exits: docs/design.md, "stockade logs".
"""

from __future__ import annotations

import io
import os
import sys
from typing import TYPE_CHECKING, Annotated

import attrs
import typer

from ops.cli.base import app
from ops.cli.common import control_plane_addresses, err_console, errors, fail, interruptible, with_client
from ops.cli.options import ControlPlanesOption, quiet_option
from runtime.validation import MAX_TAIL_LINES

if TYPE_CHECKING:
    from ops.client import Client, LogChunk
    from runtime.errors import NoControlPlaneReachable
    from runtime.text import Tail

START_POLL_S = 1.0
"""How often ``--follow`` asks again for a job that has not started, in seconds."""


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB ({count:,} bytes)"


def dropped_notice(job_id: int, stream: str, chunk: LogChunk) -> str:
    """The notice for bytes a worker no longer keeps before ``chunk``'s data."""
    return (
        f"[stockade logs: {_mib(chunk.dropped_bytes)} of job {job_id}'s {stream} not kept by worker "
        f"{chunk.worker_id or '?'} here: the oldest part of an output over the worker's max_output_mb "
        "is dropped]"
    )


def unreachable_worker(exc: NoControlPlaneReachable) -> str | None:
    """What to say when the replicas that answered said the job's worker is out of reach (they
    name it and its address): their own words, once, and how many were asked (and how many of
    them did not answer at all); None when no replica answered."""
    from runtime.errors import PeerUnavailable

    said = list(dict.fromkeys(f.detail for f in exc.failures if isinstance(f, PeerUnavailable)))
    if not said:
        return None
    asked = len(exc.failures)
    silent = sum(1 for f in exc.failures if not isinstance(f, PeerUnavailable))
    silence = f", {silent} of them did not answer" if silent else ""
    return "; ".join(said) + f" (asked {asked} control plane{'s' if asked != 1 else ''}{silence})"


class _Stdout:
    """Standard output as bytes, flushed after every chunk; a reader that went away (``| head``)
    ends the command quietly."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed or not data:
            return
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            self.closed = True
            # Python flushes stdout again at exit: point it at nothing, so that says nothing.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


async def _show(client: Client, job_id: int, stream: str, *, follow: bool, tail: int | None) -> None:
    """Print the output as it comes; with ``follow``, wait for a job that has not started
    (one that has not ended: ``running`` is started, not yet listed by a heartbeat)."""
    import trio

    from runtime.errors import FailedPrecondition

    out = _Stdout()
    said_waiting = False
    run: int | None = None
    while True:
        try:
            async with client.logs(job_id, stream=stream, follow=follow, tail_lines=tail) as chunks:
                async for chunk in chunks:
                    if chunk.cut_run is not None:
                        sys.stdout.flush()
                        err_console().print(
                            f"[stockade logs: the run of job {job_id} on worker {chunk.worker_id or '?'} "
                            f"(assignment {chunk.cut_run}) ended while its worker did not answer: "
                            f"the rest of its {stream} is kept on that worker only]",
                            markup=False,
                            soft_wrap=True,
                        )
                        continue
                    if run is not None and chunk.assignment_id not in (None, run):
                        sys.stdout.flush()
                        err_console().print(
                            f"[stockade logs: job {job_id} runs again (assignment {chunk.assignment_id} "
                            f"on worker {chunk.worker_id or '?'}): its {stream} from the start]",
                            markup=False,
                            soft_wrap=True,
                        )
                    run = chunk.assignment_id or run
                    if chunk.dropped_bytes:
                        sys.stdout.flush()
                        notice = dropped_notice(job_id, stream, chunk)
                        err_console().print(notice, markup=False, soft_wrap=True)
                    out.write(chunk.data)
                    if out.closed:
                        return
            return
        except FailedPrecondition:
            if not follow:
                raise
            job = await client.get(job_id)
            if job.ended:
                raise
            if not said_waiting:
                why = f" ({job.reason})" if job.reason else ""
                err_console().print(
                    f"[stockade logs: job {job_id} has not started yet: {job.state}{why}; waiting for it]",
                    markup=False,
                    soft_wrap=True,
                )
                said_waiting = True
            await trio.sleep(START_POLL_S)


@app.command("logs")
def logs(
    job_id: Annotated[int, typer.Argument(min=1, help="The job's id.")],
    stderr: Annotated[bool, typer.Option("--stderr", help="Its stderr instead of its stdout.")] = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing what it writes until it ends (waiting for it to start); Ctrl-C stops "
            "following, the job runs on.",
        ),
    ] = False,
    tail: Annotated[
        int | None,
        quiet_option(
            min=0,
            max=MAX_TAIL_LINES,
            metavar="N",
            help="Begin with its last N lines (0: only what comes next) [default: all the worker keeps].",
        ),
    ] = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Print a job's stdout (or --stderr) as its worker keeps it, from any host: its newest run
    that started, through any control plane."""
    from runtime.errors import NoControlPlaneReachable

    stream = "stderr" if stderr else "stdout"
    with errors():
        addresses = control_plane_addresses(control_planes)

    async def body(client: Client) -> None:
        await _show(client, job_id, stream, follow=follow, tail=tail)

    stopped = f"stopped following job {job_id}'s {stream}; the job itself is left as it was"
    with interruptible(lambda: stopped), errors():
        try:
            with_client(addresses, body)
        except NoControlPlaneReachable as exc:
            said = unreachable_worker(exc)
            if said is None:
                raise
            fail(said)


OUTPUT_TAIL_LINES = 50
"""Lines of a job's stdout and stderr that ``stockade job`` shows."""


@attrs.frozen(kw_only=True)
class OutputTail:
    """The end of one output stream of a job, as ``stockade job`` shows it."""

    stream: str
    tail: Tail | None = None
    """Its last lines (None: it could not be read)."""
    worker_id: str = ""
    dropped_bytes: int = 0
    error: str = ""
    """Why it could not be read."""


async def output_tails(client: Client, job_id: int) -> list[OutputTail]:
    """The last :data:`OUTPUT_TAIL_LINES` lines of the job's stdout and stderr, read from its
    worker through a control plane; at most :data:`runtime.text.TAIL_MAX_BYTES` of each, the
    lines cut to :data:`runtime.text.LINE_MAX_BYTES` (a line that began earlier is marked so),
    whatever the output's size. A stream that cannot be read says why instead."""
    from runtime.errors import NoControlPlaneReachable, StockadeError
    from runtime.text import TAIL_MAX_BYTES, tail_of

    async def read(stream: str) -> OutputTail:
        data = bytearray()
        worker_id, dropped = "", 0
        try:
            # One byte more than is shown: whether it is a newline tells if the first line is whole.
            async with client.logs(
                job_id, stream=stream, tail_lines=OUTPUT_TAIL_LINES, tail_max_bytes=TAIL_MAX_BYTES + 1
            ) as chunks:
                async for chunk in chunks:
                    data += chunk.data
                    worker_id = worker_id or chunk.worker_id or ""
                    dropped += chunk.dropped_bytes
        except NoControlPlaneReachable as exc:
            return OutputTail(stream=stream, error=unreachable_worker(exc) or str(exc))
        except StockadeError as exc:
            return OutputTail(stream=stream, error=str(exc))
        tail = tail_of(io.BytesIO(bytes(data)), max_lines=OUTPUT_TAIL_LINES, max_bytes=TAIL_MAX_BYTES)
        return OutputTail(stream=stream, tail=tail, worker_id=worker_id, dropped_bytes=dropped)

    return [await read(stream) for stream in ("stdout", "stderr")]

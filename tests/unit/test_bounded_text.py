"""Text of unbounded size is shown in bounded size: every place that shows the end of a file
(``stockade job``'s output, as its worker sends it, a process's log when the launcher names why
it exited, the embedded PostgreSQL's log and its commands' output) reads only the file's last
bytes, cuts long lines with a marker, and holds memory that does not grow with the file; files
of records skip a line longer than any record without holding it."""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops import cli
from ops.config import INSECURE_ENV
from ops.launcher import pg, pg_tools, procs
from protocol import pb
from runtime.aio import StreamLimits
from runtime.client import ControlPlaneClient
from runtime.text import (
    EARLIER_MARKER,
    LINE_MAX_BYTES,
    TAIL_MAX_BYTES,
    cut_line,
    cut_marker,
    fit_line,
    head_bytes,
    read_jsonl,
    read_lines,
    tail_lines,
)

HUGE_LINE_BYTES = 200 * 1024 * 1024
"""The issue's job output: one line of 200 MB."""
PEAK_LIMIT_BYTES = 16 * 1024 * 1024
"""Most memory a reader may allocate while showing that file (the whole line is 200 MB)."""


def huge_line_file(path: Path, *, before: bytes = b"", after: bytes = b"") -> Path:
    """``before``, then one line of 200 MB ending in ``end of the line``, then ``after``. The
    line is NUL bytes in a sparse file, so writing it costs no disk."""
    with path.open("wb") as file:
        file.write(before)
        file.seek(len(before) + HUGE_LINE_BYTES - len(b"end of the line\n"))
        file.write(b"end of the line\n" + after)
    return path


def peak_bytes(action: Callable[[], object]) -> tuple[object, int]:
    """What ``action`` returns, and the most memory Python allocated while it ran."""
    tracemalloc.start()
    try:
        result = action()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


class TailingWorker:
    """A control plane's ReadJobLogs as the job's worker answers a tail: the last
    ``tail_max_bytes`` bytes of ``path`` at most (the worker's bound), read from the end, in
    chunks of 64 KiB. It stands in for a replica's stream
    (``ControlPlaneClient._stream_attempt``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.asked: list[pb.ReadJobLogsRequest] = []

    @asynccontextmanager
    async def stream(
        self, index: int, rpc_name: str, request: pb.ReadJobLogsRequest, limits: StreamLimits
    ) -> AsyncIterator[object]:
        self.asked.append(request)
        with self.path.open("rb") as file:
            size = file.seek(0, io.SEEK_END)
            file.seek(max(0, size - request.tail_max_bytes))
            data = file.read()

        async def chunks() -> AsyncIterator[pb.LogChunk]:
            for at in range(0, max(len(data), 1), 65536):
                yield pb.LogChunk(data=data[at : at + 65536], worker_id="w-1", job_ended=True)

        yield chunks()


@pytest.fixture
def job_with_huge_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TailingWorker]:
    """``stockade job 1`` answers with a job whose stdout is one line of 200 MB, its tails read
    from it as its worker would send them."""
    stdout = huge_line_file(tmp_path / "stdout.log")
    info = pb.JobInfo(
        job_id=1,
        state="succeeded",
        spec=pb.JobSpec(name="yes", cpu_millis=100, memory_mb=16, command=pb.CommandRuntime(argv=["yes"])),
        started_unix_s=1.0,
        stdout_path=str(stdout),
    )
    worker = TailingWorker(stdout)

    async def replica(*args: object, **kwargs: object) -> pb.JobInfo:
        return info

    monkeypatch.setattr(ControlPlaneClient, "_attempt", replica)
    monkeypatch.setattr(ControlPlaneClient, "_stream_attempt", worker.stream)
    monkeypatch.setenv(INSECURE_ENV, "1")  # the scripted replica needs no certificate
    yield worker


def test_stockade_job_shows_the_end_of_a_200_mb_line_in_bounded_memory(
    job_with_huge_output: TailingWorker,
) -> None:
    """A job that wrote one 200 MB line: ``stockade job`` asks its worker for no more than the
    last 64 KiB (and one byte) of each output and prints that line's end, marked as beginning
    earlier, in a few KiB of output and memory that does not grow with the file."""
    result, peak = peak_bytes(
        lambda: CliRunner().invoke(cli.app, ["job", "1", "--control-planes", "127.0.0.1:1"])
    )
    output = result.output  # type: ignore[attr-defined]
    assert result.exit_code == 0, output  # type: ignore[attr-defined]
    assert {r.tail_max_bytes for r in job_with_huge_output.asked} == {TAIL_MAX_BYTES + 1}
    assert EARLIER_MARKER.strip() in output and "end of the line" in output
    assert "stdout (last 1 line, from w-1)" in output
    assert len(output.encode()) < 4 * LINE_MAX_BYTES
    assert peak < PEAK_LIMIT_BYTES


def _pg_log_tail(path: Path) -> str:
    data_dir = path.parent / "pg"
    data_dir.mkdir()
    huge_line_file(data_dir / "postgres.log", after=b"LOG:  last line\n")
    return pg.EmbeddedPostgres(data_dir=data_dir, port=5432)._log_tail()


def _pg_output_tail(path: Path) -> str:
    with huge_line_file(path, after=b"last line\n").open("rb") as output:
        return pg_tools.output_tail(output)


@pytest.mark.parametrize(
    "show",
    [
        pytest.param(lambda p: procs.tail(huge_line_file(p, after=b"last line\n"), 20), id="launcher log"),
        pytest.param(_pg_log_tail, id="postgres log"),
        pytest.param(_pg_output_tail, id="postgres command output"),
        pytest.param(
            lambda p: "\n".join(tail_lines(huge_line_file(p, after=b"last line\n"), max_lines=50).lines),
            id="tail_lines",
        ),
    ],
)
def test_every_log_shown_holds_its_end_in_bounded_memory(tmp_path: Path, show: Callable[[Path], str]) -> None:
    """A 200 MB line followed by one more: each reader shows the last line and the huge line's
    end, cut and marked, allocating a bounded amount whatever the file's size."""
    shown, peak = peak_bytes(lambda: show(tmp_path / "log"))
    assert isinstance(shown, str)
    assert "last line" in shown and "end of the line" in shown and EARLIER_MARKER.strip() in shown
    assert len(shown.encode()) < 4 * LINE_MAX_BYTES
    assert peak < PEAK_LIMIT_BYTES


def test_a_long_line_keeps_its_start_and_end_and_says_how_much_was_cut(tmp_path: Path) -> None:
    """A 10,000-byte line within the part read is cut to 4,096 bytes: its first and last 2,048,
    and the 5,904 between them named by the marker."""
    path = tmp_path / "out"
    path.write_bytes(b"short\n" + b"a" * 5000 + b"b" * 5000 + b"\n")
    tail = tail_lines(path, max_lines=50)
    assert tail.whole and tail.lines[0] == "short"
    assert tail.lines[1] == "a" * 2048 + cut_marker(5904) + "b" * 2048


def test_cuts_count_utf8_bytes_and_never_split_a_character() -> None:
    """A line of 3,000 two-byte characters (6,000 bytes) is cut by bytes, on character
    boundaries: no replacement character appears."""
    cut = cut_line("é" * 3000)
    head, _, tail = cut.partition(" [… ")
    assert head == "é" * 1024 and tail.endswith("é" * 1024)
    assert "\ufffd" not in cut and "1904 bytes cut" in cut
    assert cut_line("é" * 2048) == "é" * 2048  # exactly 4,096 bytes: kept whole


def test_only_the_last_lines_of_the_last_bytes_are_read(tmp_path: Path) -> None:
    """Of 100,000 numbered lines, the last 50 are shown; only the last 64 KiB was read."""
    path = tmp_path / "out"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    tail = tail_lines(path, max_lines=50)
    assert tail.lines == tuple(f"line {i}" for i in range(99_950, 100_000))
    assert tail.read_bytes == TAIL_MAX_BYTES and not tail.whole
    assert tail_lines(tmp_path / "out", max_lines=50, max_bytes=6).lines == (
        EARLIER_MARKER + "99999",
    )  # the read starts inside the last line


def test_an_empty_file_and_a_last_line_without_newline(tmp_path: Path) -> None:
    """An empty file has no lines; a last line without a newline still counts, and a CRLF
    line ending is dropped."""
    path = tmp_path / "out"
    path.write_bytes(b"")
    assert tail_lines(path, max_lines=5).lines == ()
    path.write_bytes(b"one\r\ntwo")
    assert tail_lines(path, max_lines=5).lines == ("one", "two")


def test_record_files_skip_a_line_longer_than_any_record_without_holding_it(tmp_path: Path) -> None:
    """A worker's agent.jsonl and a harness's events.jsonl with 200 MB of NUL bytes between two
    records (what a crash can leave): both records are read, the garbage is skipped, and memory
    stays bounded."""
    path = huge_line_file(
        tmp_path / "agent.jsonl",
        before=b'{"event": "start", "job_id": 1}\n',
        after=b'{"event": "stop", "job_id": 1}\n',
    )
    records, peak = peak_bytes(lambda: read_jsonl(path))
    assert records == [{"event": "start", "job_id": 1}, {"event": "stop", "job_id": 1}]
    assert peak < PEAK_LIMIT_BYTES
    records, peak = peak_bytes(lambda: read_jsonl(path))
    assert len(records) == 2 and peak < PEAK_LIMIT_BYTES  # type: ignore[arg-type]


def test_read_lines_returns_lines_up_to_the_limit_and_skips_longer_ones() -> None:
    """A line of exactly the limit is returned, one byte longer is skipped, the rest read on."""
    data = io.BytesIO(b"1234\n12345\nok\nlast")
    assert list(read_lines(data, max_bytes=4)) == [b"1234", b"ok", b"last"]


def test_fit_line_keeps_the_marker_within_the_limit_and_head_bytes_whole_characters() -> None:
    """fit_line cuts to at most its limit in all, marker included, and gives text with a UTF-8
    form (a lone surrogate becomes ?); head_bytes keeps whole characters within its limit."""
    for text in ("x" * 100_000, "é" * 50_000, "a\udce9" * 20_000):
        fitted = fit_line(text, 4096)
        assert len(fitted.encode()) <= 4096 and "bytes cut" in fitted
    assert fit_line("short", 4096) == "short"
    assert head_bytes("aé" * 100, 4) == "aéa"
    assert head_bytes("abc", 10) == "abc"

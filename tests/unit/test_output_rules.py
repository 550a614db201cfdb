"""The pure rules of a worker's output files: where a tail begins, how far a trim drops, how
often sizes are checked, which job folders a sweep deletes, and what a ReadLogs may ask."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.logs import check_stream, tail_start
from agent.output import KEEP_FRACTION, JobFolder, expired, next_check_interval_s, parse_folder_name, trim_to
from agent.service import log_query_from_pb
from protocol import pb
from runtime.errors import InvalidArgument
from runtime.settings.agent import OutputSettings
from runtime.validation import MAX_TAIL_LINES, check_tail_lines

MIB = 1024 * 1024


def reader(data: bytes):  # type: ignore[no-untyped-def]
    return lambda offset, length: data[offset : offset + length]


def naive_tail(data: bytes, lines: int) -> bytes:
    """``tail -n lines`` by splitting the whole file at its newlines (only ``\n`` ends a line)."""
    if lines == 0:
        return b""
    whole = [line + b"\n" for line in data.split(b"\n")]
    whole[-1] = whole[-1][:-1]  # what follows the last newline has none
    if whole[-1] == b"":
        whole.pop()
    return b"".join(whole[-lines:])


@given(
    st.lists(st.sampled_from([b"a", b"bb", b"\n", b"ccc\n", b"\r\n", b"\r", b"x" * 40]), max_size=40),
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=1, max_value=64),
)
def test_tail_start_finds_the_last_lines_as_tail_counts_them(
    pieces: list[bytes], lines: int, block: int
) -> None:
    """Whatever the file and the read size, the tail begins where the last N lines (a last
    line without its newline counts) begin, as splitting the whole file says."""
    data = b"".join(pieces)
    start = tail_start(reader(data), 0, len(data), lines, block)
    assert start is not None
    assert data[start:] == naive_tail(data, lines)


def test_a_tail_of_more_lines_than_kept_is_unknown_past_a_dropped_head() -> None:
    """Kept part "b\\nc\\n" after 100 dropped bytes, 5 lines asked: None (begin where the kept
    part begins, saying what was dropped), not the kept start as if it were a line's."""
    data = b"\0" * 100 + b"b\nc\n"
    assert tail_start(reader(data), 100, len(data), 5, 16) is None


def test_a_tail_within_the_kept_part_ignores_the_dropped_head() -> None:
    """Two lines of a kept part of three begin at the second."""
    data = b"\0" * 100 + b"a\nb\nc\n"
    assert tail_start(reader(data), 100, len(data), 2, 4) == 102


def test_tail_of_zero_lines_is_the_end() -> None:
    """--tail 0 begins at the end: only what comes next."""
    assert tail_start(reader(b"a\nb\n"), 0, 4, 0, 8) == 4


def test_a_file_within_its_cap_is_not_trimmed() -> None:
    """A kept part of exactly the cap stays as it is."""
    assert trim_to(100 * MIB + 10, 10, 100 * MIB, 4096) is None


def test_a_file_over_its_cap_keeps_seven_eighths_of_it_at_a_block_boundary() -> None:
    """One byte over a 100 MiB cap: the new start is a multiple of the block, and keeps between
    7/8 of the cap and that plus one block."""
    size = 100 * MIB + 1
    new_from = trim_to(size, 0, 100 * MIB, 4096)
    assert new_from is not None and new_from % 4096 == 0
    kept = size - new_from
    assert int(100 * MIB * KEEP_FRACTION) <= kept < int(100 * MIB * KEEP_FRACTION) + 4096


@given(
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=MIB, max_value=2**30),
    st.sampled_from([512, 4096, 65536]),
)
def test_a_trim_only_moves_forward_and_ends_within_the_cap(
    size: int, kept_from: int, cap: int, block: int
) -> None:
    """A trim never moves the kept part's start back, and leaves at most the cap."""
    kept_from = min(kept_from, size)
    new_from = trim_to(size, kept_from, cap, block)
    if new_from is None:
        return
    assert kept_from < new_from <= size
    assert size - new_from <= cap


def test_quiet_checks_lengthen_the_interval_step_by_step() -> None:
    """Nothing grew: the next check comes after twice the last interval, at most
    check_interval_s (0.02 s, 0.04 s, ... 0.25 s)."""
    settings = OutputSettings()
    intervals = [settings.min_check_interval_s]
    for _ in range(6):
        intervals.append(next_check_interval_s(0, intervals[-1], intervals[-1], 100 * MIB, settings))
    assert intervals == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.25, 0.25, 0.25])


def test_a_fast_writer_is_checked_so_it_passes_its_cap_by_an_eighth_at_most() -> None:
    """A file growing 100 MiB/s under a 100 MiB cap: checked every 0.125 s (an eighth of the cap
    at that rate, within twice the last interval); at 10 GiB/s, every min_check_interval_s."""
    settings = OutputSettings()
    assert next_check_interval_s(50 * MIB, 0.5, 0.25, 100 * MIB, settings) == pytest.approx(0.125)
    assert (
        next_check_interval_s(5 * 1024 * MIB, 0.5, 0.25, 100 * MIB, settings) == settings.min_check_interval_s
    )


def test_a_slow_writer_lengthens_the_interval_no_faster_than_quiet_checks() -> None:
    """A file growing 1 MiB/s after a 0.02 s interval: the next check comes after 0.04 s, not
    the 12.5 s its rate alone would allow."""
    settings = OutputSettings()
    assert next_check_interval_s(MIB // 50, 0.02, 0.02, 100 * MIB, settings) == pytest.approx(0.04)


def test_job_folder_names_are_job_and_assignment_ids() -> None:
    """ "12-34" names job 12's assignment 34; other names are not job folders."""
    assert parse_folder_name("12-34") == (12, 34)
    for name in ("12", "12-", "-34", "a-34", "12-3x", "12-34-5", "١٢-34"):
        assert parse_folder_name(name) is None


def folder(aid: int, changed: float) -> JobFolder:
    return JobFolder(path=Path(f"/w/jobs/1-{aid}"), assignment_id=aid, last_change_unix_s=changed)


def test_a_sweep_deletes_folders_of_jobs_ended_longer_ago_than_the_retention_oldest_first() -> None:
    """With a day's retention at t = 100,000 s: folders last changed before 13,600 s go, the
    oldest first; a newer one stays."""
    folders = [folder(1, 13_000.0), folder(2, 5_000.0), folder(3, 20_000.0)]
    chosen = expired(folders, active=set(), now_unix_s=100_000.0, retention_s=86_400.0, limit=10)
    assert [f.assignment_id for f in chosen] == [2, 1]


def test_a_sweep_never_deletes_the_folder_of_a_job_the_agent_holds() -> None:
    """A folder untouched for a week whose assignment the agent still runs stays."""
    folders = [folder(7, 0.0)]
    assert expired(folders, active={7}, now_unix_s=7 * 86_400.0, retention_s=86_400.0, limit=10) == []


def test_a_sweep_deletes_at_most_its_limit() -> None:
    """Five expired folders, a limit of two: the two oldest."""
    folders = [folder(i, float(i)) for i in range(1, 6)]
    chosen = expired(folders, active=set(), now_unix_s=1e9, retention_s=1.0, limit=2)
    assert [f.assignment_id for f in chosen] == [1, 2]


def test_streams_are_stdout_by_default_or_stderr() -> None:
    """ "" and "stdout" read stdout, "stderr" stderr; anything else is refused naming the field."""
    assert check_stream("") == "stdout"
    assert check_stream("stdout") == "stdout"
    assert check_stream("stderr") == "stderr"
    with pytest.raises(InvalidArgument, match="stream must be stdout or stderr, got 'stdin'"):
        check_stream("stdin")


def test_tail_lines_are_limited() -> None:
    """A tail of more than MAX_TAIL_LINES lines is refused with the limit."""
    assert check_tail_lines(MAX_TAIL_LINES) == MAX_TAIL_LINES
    with pytest.raises(InvalidArgument, match="tail_lines must be between 0 and 100,000"):
        check_tail_lines(MAX_TAIL_LINES + 1)


def test_a_read_logs_request_for_another_worker_is_refused() -> None:
    """A worker refuses a ReadLogs naming another worker, naming both."""
    request = pb.ReadLogsRequest(worker_id="w-2", job_id=1, assignment_id=1)
    with pytest.raises(InvalidArgument, match="worker_id must be this worker's id, 'w-1', got 'w-2'"):
        log_query_from_pb(request, "w-1")


def test_a_read_logs_request_reads_as_a_query() -> None:
    """Without has_tail the query reads from the start; with it, the tail it names."""
    request = pb.ReadLogsRequest(worker_id="w-1", job_id=3, assignment_id=4, stream="stderr", follow=True)
    query = log_query_from_pb(request, "w-1")
    assert (query.job_id, query.assignment_id, query.stream, query.follow, query.tail_lines) == (
        3,
        4,
        "stderr",
        True,
        None,
    )
    request.has_tail, request.tail_lines = True, 0
    assert log_query_from_pb(request, "w-1").tail_lines == 0

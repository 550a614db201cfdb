"""The output keeper on real files: caps by punching holes (and, where a filesystem cannot, by
truncating with a record of what was lost), a last check of a job that ended over its cap,
and the retention sweep of old job folders, which never touches a running job's."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agent import output
from agent.logs import _open, _read
from agent.output import OutputFiles, OutputKeeper, data_start
from runtime.settings.agent import OutputSettings

MIB = 1024 * 1024


class Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def keeper(
    jobs: Path, active: list[tuple[int, int]], files: OutputFiles | None = None, **settings: Any
) -> OutputKeeper:
    return OutputKeeper(
        jobs_dir=jobs,
        settings=OutputSettings(**{"max_output_mb": 1, **settings}),
        active=lambda: list(active),
        files=files or OutputFiles(),
        logger=Quiet(),
        added=trio.Event,
    )


def job_file(jobs: Path, job_id: int, aid: int, size: int, name: str = "stdout.log") -> Path:
    folder = jobs / f"{job_id}-{aid}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with path.open("ab") as file:
        file.write(bytes(48 + i % 10 for i in range(size)))
    return path


async def test_a_running_jobs_file_over_its_cap_loses_its_head_and_keeps_its_length(tmp_path: Path) -> None:
    """3 MiB under a 1 MiB cap: the file keeps its 3 MiB length, its kept part (from where data
    begins) is at most the cap, and the disk space it takes is about that."""
    path = job_file(tmp_path, 1, 1, 3 * MIB)
    await keeper(tmp_path, [(1, 1)]).check_once()
    fd = os.open(path, os.O_RDONLY)
    try:
        kept_from = data_start(fd, 0)
    finally:
        os.close(fd)
    assert path.stat().st_size == 3 * MIB
    assert 0 < 3 * MIB - kept_from <= MIB
    assert path.stat().st_blocks * 512 <= MIB + 64 * 1024


async def test_only_the_jobs_that_write_output_are_checked(tmp_path: Path) -> None:
    """The keeper looks only in the folders of the jobs ``writing`` names (an agent's sleep jobs
    write nothing and are left out): a file in another held job's folder is not opened, so not
    trimmed, until that job is named."""
    path = job_file(tmp_path, 1, 1, 3 * MIB)
    writing: list[tuple[int, int]] = []
    watched = attrs.evolve(keeper(tmp_path, [(1, 1)]), writing=lambda: list(writing))
    assert await watched.check_once() == (0, False)
    assert path.stat().st_blocks * 512 >= 3 * MIB
    writing.append((1, 1))
    await watched.check_once()
    assert path.stat().st_blocks * 512 <= MIB + 64 * 1024


async def test_a_job_that_ended_over_its_cap_is_trimmed_once_more(tmp_path: Path) -> None:
    """A job watched while small, which then wrote past its cap and ended before the next
    check, is trimmed at that check all the same (and no longer watched after)."""
    path = job_file(tmp_path, 2, 2, 1000)
    active = [(2, 2)]
    keep = keeper(tmp_path, active)
    await keep.check_once()
    job_file(tmp_path, 2, 2, 3 * MIB)
    active.clear()
    await keep.check_once()
    assert path.stat().st_blocks * 512 <= MIB + 64 * 1024
    grew, _ = await keep.check_once()
    assert grew == 0


async def test_without_hole_punching_a_file_is_truncated_and_readers_are_told_what_was_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the filesystem cannot punch holes, a file over its cap is truncated whole, the
    bytes lost are recorded next to it, and a reader from the start is told they were dropped,
    then reads what the job wrote after, at its offset in the whole output."""
    monkeypatch.setattr(output, "punch_hole", lambda fd, offset, length: False)
    files = OutputFiles()
    path = job_file(tmp_path, 3, 3, 3 * MIB)
    await keeper(tmp_path, [(3, 3)], files).check_once()
    assert path.stat().st_size == 0
    assert (tmp_path / "3-3" / "stdout.log.removed").read_text() == f"{3 * MIB}\n"
    with path.open("ab") as file:
        file.write(b"after\n")
    fd = _open(path)
    assert fd is not None
    try:
        data, dropped, offset = _read(fd, path, 0, 65536, OutputFiles())  # a later agent: the record
    finally:
        os.close(fd)
    assert (data, dropped, offset) == (b"after\n", 3 * MIB, 3 * MIB + 6)


def test_a_write_landing_between_the_seek_and_the_length_is_read_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower at the end of a running job's file asks where data begins (none yet: ENXIO)
    just before the job writes its next line: that line is read at its offset, and none of it
    is counted as dropped (it once was, as if trimmed away)."""
    path = job_file(tmp_path, 4, 4, 0)
    path.write_bytes(b"one\ntwo\n")
    seek = os.lseek
    wrote: list[bool] = []

    def seek_then_write(fd: int, offset: int, how: int) -> int:
        try:
            return seek(fd, offset, how)
        finally:
            if how == os.SEEK_DATA and not wrote:
                wrote.append(True)
                with path.open("ab") as file:  # the job's write, after the seek looked
                    file.write(b"three\n")

    monkeypatch.setattr(os, "lseek", seek_then_write)
    fd = _open(path)
    assert fd is not None
    try:
        assert _read(fd, path, 8, 65536, OutputFiles()) == (b"three\n", 0, 14)
    finally:
        os.close(fd)
    assert wrote


def aged(folder: Path, age_s: float) -> None:
    then = time.time() - age_s
    for entry in (*folder.iterdir(), folder):
        os.utime(entry, (then, then))


async def test_the_sweep_deletes_folders_of_jobs_that_ended_longer_ago_than_the_retention(
    tmp_path: Path,
) -> None:
    """With a day's retention: a folder last changed two days ago goes; one changed an hour ago,
    and one a job still runs in (however old), stay; names that are not job folders stay."""
    for job_id in (1, 2, 3):
        job_file(tmp_path, job_id, job_id, 10)
    (tmp_path / "notes").mkdir()
    aged(tmp_path / "1-1", 2 * 86_400)
    aged(tmp_path / "2-2", 3_600)
    aged(tmp_path / "3-3", 5 * 86_400)
    aged(tmp_path / "notes", 5 * 86_400)
    deleted = await keeper(tmp_path, [(3, 3)], output_retention_s=86_400.0).sweep_once()
    assert deleted == 1
    assert sorted(os.listdir(tmp_path)) == ["2-2", "3-3", "notes"]


async def test_a_sweep_deletes_at_most_its_limit_oldest_first(tmp_path: Path) -> None:
    """Three expired folders and a limit of two: the two oldest go, the third waits."""
    for job_id, age_days in ((1, 3), (2, 5), (3, 4)):
        job_file(tmp_path, job_id, job_id, 10)
        aged(tmp_path / f"{job_id}-{job_id}", age_days * 86_400)
    deleted = await keeper(tmp_path, [], output_retention_s=86_400.0, max_sweep_deletions=2).sweep_once()
    assert deleted == 2
    assert os.listdir(tmp_path) == ["1-1"]


async def test_a_job_added_while_the_keeper_waits_is_checked_at_once_and_idle_it_never_wakes(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """With the agent's ``added`` event the keeper sleeps until its next check is due (no
    look at the job list in between: a fleet of idle workers costs no wake-ups) and looks at a
    new job as soon as it is added, not an interval later: a job that floods from its first
    instant is capped at once."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    active: list[tuple[int, int]] = []
    looks: list[float] = []
    events = [trio.Event()]

    def listed() -> list[tuple[int, int]]:
        looks.append(trio.current_time())
        return list(active)

    keeper_ = OutputKeeper(
        jobs_dir=jobs,
        settings=OutputSettings(max_output_mb=1, check_interval_s=5.0, min_check_interval_s=0.02),
        active=listed,
        files=OutputFiles(),
        logger=Quiet(),
        added=lambda: events[-1],
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keeper_._cap_loop)
        await trio.sleep(12.0)
        # Idle, the job list was read only by the checks due every 5 s, never in between.
        assert [round(t, 6) for t in looks] == [5.0, 10.0]
        path = job_file(jobs, 7, 70, 2 * MIB)
        active.append((7, 70))
        added_at = trio.current_time()
        events[-1].set()
        events.append(trio.Event())
        # The check runs in a worker thread, which the mock clock does not wait for: wait in
        # real time (a loaded machine may take a while to schedule it).
        deadline = time.monotonic() + 60.0
        while path.stat().st_blocks * 512 > MIB + 64 * 1024 and time.monotonic() < deadline:  # noqa: ASYNC110
            await trio.sleep(0.01)  # a file's size, trimmed by a worker thread: nothing to wait on
        assert path.stat().st_blocks * 512 <= MIB + 64 * 1024, "the new job's flood was not capped"
        assert looks[2] == added_at, "the new job was not looked at when it was added"
        nursery.cancel_scope.cancel()

"""A job supervisor's stop with a grace of its own (a preemption's, :data:`agent.deadman.NOTICE_SIGNAL`):
the rules of :meth:`agent.deadman.Deadman.stop_job`, on a stand-in job that records its signals,
and the grace file the agent writes for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.deadman import STOP_GRACE_FILE, Deadman, clear_files, read_stop_grace, write_stop_grace


class _Job(Deadman):
    """A supervisor whose job only records what it was sent."""

    def __init__(self) -> None:
        super().__init__(grace_s=1.0, deadline_path="")
        self.sent: list[str] = []
        self.exited = False

    def kill(self) -> None:
        self.sent.append("KILL")
        self.killed = True

    def term(self) -> None:
        self.sent.append("TERM")

    def job_exited(self) -> bool:
        return self.exited


def test_a_stop_with_its_own_grace_terms_at_once_and_kills_at_its_end() -> None:
    """The job gets SIGTERM at once and its kill is set later than the supervisor's own grace
    would set it; it counts as stopped."""
    job = _Job()
    job.stop_job(at_once=False, grace_s=600.0)
    assert job.sent == ["TERM"] and job.stopped and job.kill_at is not None
    own = _Job()
    own.stop_job(at_once=False)
    assert own.kill_at is not None and job.kill_at > own.kill_at


def test_an_ordinary_stop_during_the_grace_brings_the_kill_forward_without_a_second_sigterm() -> None:
    """A SIGTERM (the agent shutting down) during a long grace sets the kill to the supervisor's
    own grace from then, and the job gets no second SIGTERM; a later long grace never puts the
    kill off again."""
    job = _Job()
    job.stop_job(at_once=False, grace_s=600.0)
    first = job.kill_at
    job.stop_job(at_once=False)
    assert first is not None and job.kill_at is not None and job.kill_at < first
    hurried = job.kill_at
    job.stop_job(at_once=False, grace_s=600.0)
    assert job.kill_at == hurried
    assert job.sent == ["TERM"]


def test_a_stop_with_its_own_grace_kills_a_paused_job_at_once() -> None:
    """While the fence deadline holds the job paused, a stop with a grace kills it at once, as
    any stop does (the pause is never lifted for a grace)."""
    job = _Job()
    job.paused = True
    job.stop_job(at_once=False, grace_s=600.0)
    assert job.sent == ["KILL"] and job.stopped


def test_a_job_that_ended_keeps_its_own_end() -> None:
    """A job that ended before the stop came is not signalled and not counted stopped."""
    job = _Job()
    job.exited = True
    job.stop_job(at_once=False, grace_s=600.0)
    assert job.sent == [] and not job.stopped


def test_the_grace_file_is_read_in_the_job_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's grace is read back in seconds from the supervisor's working directory (the
    job folder); missing, garbled, negative or infinite: None (the supervisor's own grace); a
    new run's files clear it."""
    monkeypatch.chdir(tmp_path)
    assert read_stop_grace() is None
    write_stop_grace(tmp_path, 2.5)
    assert read_stop_grace() == 2.5
    for text in ("soon", "-1", "inf", "nan"):
        (tmp_path / STOP_GRACE_FILE).write_text(text)
        assert read_stop_grace() is None, text
    clear_files(tmp_path)
    assert not (tmp_path / STOP_GRACE_FILE).exists()

"""The suite's clean-up of job cgroups (tests/job_cgroups.py) takes only its own session's."""

from __future__ import annotations

from pathlib import Path

import job_cgroups

from agent.runtimes import owner_of


def test_only_the_folders_of_workers_whose_work_folders_are_under_the_sessions_are_taken(
    tmp_path: Path,
) -> None:
    """Of the worker folders made during a session, those named for a work folder under the
    session's temporary folder are its own; one named for another session's work folder, with
    the same worker id, is left to that session."""
    mine = tmp_path / "session" / "test_x0" / "stockade" / "workers" / "w-1"
    mine.mkdir(parents=True)
    other = tmp_path / "other-session" / "test_x0" / "stockade" / "workers" / "w-1"
    other.mkdir(parents=True)
    jobs = Path("/sys/fs/cgroup/stockade-jobs")
    made = {
        jobs / f"w-1-{owner_of(str(mine))}",
        jobs / f"w-1-{owner_of(str(other))}",
        Path("/sys/fs/cgroup/cpu") / f"stockade-w-1-{owner_of(str(mine))}",
    }
    assert job_cgroups.owned_by(made, tmp_path / "session") == {
        jobs / f"w-1-{owner_of(str(mine))}",
        Path("/sys/fs/cgroup/cpu") / f"stockade-w-1-{owner_of(str(mine))}",
    }

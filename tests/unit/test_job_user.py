"""The job user setting: command jobs never run as root."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_agent_heartbeat import agent_settings

from agent import reaper
from runtime.errors import InvalidArgument


def test_job_user_defaults_to_stockade_job(tmp_path: Path) -> None:
    """Without a job_user, command jobs of a root agent run as ``stockade-job``."""
    assert agent_settings(tmp_path).job_user == "stockade-job"


@pytest.mark.parametrize("value", ["root", "0", "000"])
def test_job_user_root_is_refused(tmp_path: Path, value: str) -> None:
    """job_user ``root`` (or uid 0 written as a number) is refused, naming the field."""
    with pytest.raises(InvalidArgument, match=f"job_user must name a user other than root .*got '{value}'"):
        agent_settings(tmp_path, job_user=value)


@pytest.mark.parametrize("value", ["", " nobody", "a/b", "a:b", "-D", ".x", "a" * 33])
def test_job_user_must_be_a_user_name(tmp_path: Path, value: str) -> None:
    """An empty or malformed job_user is refused, naming the field."""
    with pytest.raises(InvalidArgument, match="job_user must be a user name"):
        agent_settings(tmp_path, job_user=value)


def test_reaper_argv_carries_the_user_and_the_working_folder() -> None:
    """The reaper's command line names the job's uid, gid and working folder before ``--``."""
    argv = reaper.reaper_argv(
        "python",
        parent_pid=1,
        stop_grace_s=1.0,
        fence_deadline_path=None,
        argv=("id",),
        run_as_uid=995,
        run_as_gid=994,
        job_cwd="work",
    )
    assert argv[-5:] == ["995", "994", "work", "--", "id"]


def test_reaper_argv_needs_both_uid_and_gid() -> None:
    """A uid without a gid (or the reverse) is a programming error."""
    with pytest.raises(ValueError, match="go together"):
        reaper.reaper_argv(
            "python", parent_pid=1, stop_grace_s=1.0, fence_deadline_path=None, argv=("id",), run_as_uid=5
        )

"""The job user setting: command jobs never run as root."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_agent_heartbeat import agent_settings

from agent import reaper
from runtime import os_users
from runtime.errors import InvalidArgument


def test_job_user_defaults_to_none_so_each_job_gets_a_uid(tmp_path: Path) -> None:
    """Without a job_user, a root agent gives each job a uid of its own (no shared user)."""
    settings = agent_settings(tmp_path)
    assert (settings.job_user, settings.job_uids) == ("", None)


@pytest.mark.parametrize("value", ["root", "0", "000"])
def test_job_user_root_is_refused(tmp_path: Path, value: str) -> None:
    """job_user ``root`` (or uid 0 written as a number) is refused, naming the field."""
    with pytest.raises(InvalidArgument, match=f"job_user must name a user other than root .*got '{value}'"):
        agent_settings(tmp_path, job_user=value)


@pytest.mark.parametrize("value", [" nobody", "a/b", "a:b", "-D", ".x", "a" * 33])
def test_job_user_must_be_a_user_name(tmp_path: Path, value: str) -> None:
    """A malformed job_user is refused, naming the field."""
    with pytest.raises(InvalidArgument, match="job_user must be a user name"):
        agent_settings(tmp_path, job_user=value)


def test_reaper_argv_carries_the_user_and_the_working_folder() -> None:
    """The reaper's command line names the job's uid, gid, working folder and timeout before
    ``--``."""
    argv = reaper.reaper_argv(
        "python",
        parent_pid=1,
        stop_grace_s=1.0,
        fence_deadline_path=None,
        argv=("id",),
        run_as_uid=995,
        run_as_gid=994,
        job_cwd="work",
        timeout_s=2.5,
    )
    assert argv[-7:] == ["995", "994", "work", "2.5", "", "--", "id"]  # "": nothing to confine


def test_reaper_argv_needs_both_uid_and_gid() -> None:
    """A uid without a gid (or the reverse) is a programming error."""
    with pytest.raises(ValueError, match="go together"):
        reaper.reaper_argv(
            "python", parent_pid=1, stop_grace_s=1.0, fence_deadline_path=None, argv=("id",), run_as_uid=5
        )


def test_a_job_user_that_cannot_be_created_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root, a job user that neither exists nor can be created raises UserNotCreated (the
    agent refuses to start), never a fallback to root."""

    def missing(name: str) -> object:
        raise KeyError(name)

    def no_useradd(*args: object, **kwargs: object) -> object:
        raise FileNotFoundError(2, "No such file or directory", "useradd")

    monkeypatch.setattr(os_users.os, "geteuid", lambda: 0)
    monkeypatch.setattr(os_users.pwd, "getpwnam", missing)
    monkeypatch.setattr(os_users.subprocess, "run", no_useradd)
    with pytest.raises(os_users.UserNotCreated, match="'stockade-job' could not be created"):
        os_users.resolve_unprivileged_user("stockade-job")


def test_a_job_user_with_uid_0_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root, a job user whose uid is 0 (another name for root) is refused."""
    monkeypatch.setattr(os_users.os, "geteuid", lambda: 0)
    monkeypatch.setattr(os_users.pwd, "getpwnam", lambda name: os_users.pwd.getpwuid(0))
    with pytest.raises(os_users.UserNotCreated, match="never run as root"):
        os_users.resolve_unprivileged_user("toor")

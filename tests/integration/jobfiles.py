"""Files that command jobs run by an agent process write for a test to read.

When the tests run as root, such an agent runs its jobs as its job user
(``AgentSettings.job_user``), which cannot write to a test's ``tmp_path`` (mode 0700, root's).
"""

from __future__ import annotations

from pathlib import Path

from runtime.os_users import ensure_traversable


def job_writable(tmp_path: Path) -> Path:
    """A folder under ``tmp_path`` that every user may write to (sticky, like /tmp)."""
    folder = tmp_path / "shared"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o1777)
    ensure_traversable(folder)
    return folder

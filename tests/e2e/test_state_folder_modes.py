"""Who may read a local cluster's state folder, with the real processes of `stockade up`: its
logs name every account's jobs and commands, so another local user can neither list the folder
nor read a process's log, ``events.jsonl`` or a worker's ``agent.jsonl``; a folder an earlier
release left open is closed by the next `up` (docs/tenancy.md, "What a job can see")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ops.cluster import LocalCluster
from runtime.os_users import ensure_traversable

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="reading as another local user needs root"),
]

OTHER_UID = 65_534
"""Another local user ("nobody"), with no group of the launcher's."""

PROBE = textwrap.dedent("""
    import json, os, sys
    root = sys.argv[1]
    tries = {
        "list_state": lambda: os.listdir(root),
        "list_logs": lambda: os.listdir(root + "/logs"),
        "read_cp_log": lambda: open(root + "/logs/cp-1.log").read(),
        "read_worker_log": lambda: open(root + "/logs/w-1.log").read(),
        "read_old_log": lambda: open(root + "/logs/old.log").read(),
        "read_events": lambda: open(root + "/events.jsonl").read(),
        "list_workers": lambda: os.listdir(root + "/workers"),
        "read_agent_jsonl": lambda: open(root + "/workers/w-1/agent.jsonl").read(),
    }
    got = {}
    for name, attempt in tries.items():
        try:
            attempt()
            got[name] = "succeeded"
        except OSError as exc:
            got[name] = exc.errno
    print(json.dumps(got))
""")


def _mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o7777


def test_another_local_user_reads_nothing_of_the_state_folder(tmp_path: Path, database_url: str) -> None:
    """After `up` on a state folder an earlier release left 0755 with 0644 logs, another local
    user (its parents searchable by all) cannot list the state folder, logs/ or workers/, nor
    read a log, events.jsonl or agent.jsonl (EACCES each); the folder is 0711, logs/ 0700, every
    log, events.jsonl and agent.jsonl 0600."""
    root = tmp_path / "stockade"
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "old.log").write_text("job 7 of alice: sh -c 'secret'\n")
    (root / "events.jsonl").write_text("{}\n")
    for path, mode in ((root, 0o755), (root / "logs", 0o755), (root / "logs" / "old.log", 0o644)):
        path.chmod(mode)
    (root / "events.jsonl").chmod(0o644)
    ensure_traversable(tmp_path)
    local = LocalCluster(root, database_url=database_url)
    try:
        local.up(control_planes=1, workers=1)
        probe = subprocess.run(
            [sys.executable, "-I", "-c", PROBE, str(root)],
            user=OTHER_UID,
            group=OTHER_UID,
            extra_groups=[],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    finally:
        local.down()
    tried = json.loads(probe.stdout)
    assert tried == {name: 13 for name in tried}
    assert _mode(root) == _mode(root / "workers") == 0o711
    assert _mode(root / "logs") == 0o700
    for path in [
        *(root / "logs").glob("*.log"),
        root / "events.jsonl",
        root / "workers" / "w-1" / "agent.jsonl",
    ]:
        assert _mode(path) == 0o600, path

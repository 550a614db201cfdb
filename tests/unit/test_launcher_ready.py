"""When `stockade up` counts a restarted worker as back (ops/launcher/ready.py)."""

from __future__ import annotations

import json
from pathlib import Path

from ops.launcher.ready import registered_since


def test_a_restarted_worker_is_back_once_its_log_has_a_registration_since_its_start(tmp_path: Path) -> None:
    """Only a register line written since the new process started counts: the predecessor's
    (the incarnation a restarted agent continues keeps its number) and a missing log do not."""
    log = tmp_path / "agent.jsonl"
    assert not registered_since(log, 100.0)
    lines = [
        {"event": "register", "time": 50.0, "incarnation": 3},
        {"event": "start", "time": 60.0, "incarnation": 3},
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert not registered_since(log, 100.0)
    with log.open("a") as file:
        file.write(json.dumps({"event": "register", "time": 101.5, "incarnation": 3}) + "\n")
        file.write("{torn")
    assert registered_since(log, 100.0)

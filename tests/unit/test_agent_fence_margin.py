"""The agent keeps its self-fence deadline far enough below the cluster's dead_after."""

from __future__ import annotations

import pytest

from agent.fence import fence_after_s
from runtime.settings.agent import AgentSettings


def settings(self_fence_after_s: float, stop_grace_s: float) -> AgentSettings:
    return AgentSettings(
        worker_id="w-1",
        control_planes=("127.0.0.1:1",),
        cpu_millis=1,
        memory_mb=1,
        work_dir="w",
        self_fence_after_s=self_fence_after_s,
        stop_grace_s=stop_grace_s,
    )


def test_the_defaults_fit_the_default_dead_after() -> None:
    """1.5 s fence + 0.5 s stop grace + 0.5 s margin fits 2.5 s exactly: nothing changes."""
    assert fence_after_s(settings(1.5, 0.5), 2.5) == 1.5


def test_a_fence_too_late_for_dead_after_is_lowered_to_fit() -> None:
    """Fencing at 3 s with a 1 s stop could outlast a 2.5 s dead_after: it fences at 1 s."""
    assert fence_after_s(settings(3.0, 1.0), 2.5) == pytest.approx(
        2.5 - 1.0 - settings(3.0, 1.0).self_fence_margin_s
    )


def test_unknown_dead_after_keeps_the_setting_and_the_floor_holds() -> None:
    """Without the control planes' dead_after the setting stands; it never goes below 0.1 s."""
    assert fence_after_s(settings(3.0, 1.0), None) == 3.0
    assert fence_after_s(settings(3.0, 1.0), 1.0) == 0.1

"""OOM scores of the processes that keep a worker live (runtime/oom.py), on real processes: a
child process asks, so the test process keeps its own score."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.errors import InvalidArgument
from runtime.oom import check_oom_score_adj
from runtime.settings.agent import AgentSettings

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/oom_score_adj is Linux's")

ASK = """
from runtime.oom import protect_process
with open("/proc/self/oom_score_adj", "w") as file:
    file.write("{start}")
result = protect_process({asked})
print(result.now, bool(result.refused))
"""


def _ask_in_a_child(*, start: int, asked: int) -> tuple[int, bool]:
    out = subprocess.run(
        [sys.executable, "-c", ASK.format(start=start, asked=asked)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return int(out[0]), out[1] == "True"


def _own_score() -> int:
    return int(Path("/proc/self/oom_score_adj").read_text())


def test_a_score_outside_the_kernels_range_is_refused_naming_it() -> None:
    """1001 and -1001 are refused with the field, the value and the range; -1000 and 1000 pass."""
    for bad in (1001, -1001):
        with pytest.raises(
            InvalidArgument, match=rf"oom_score_adj must be an integer between -1000 and 1000, got {bad}"
        ):
            check_oom_score_adj(bad)
    assert (check_oom_score_adj(-1000), check_oom_score_adj(1000)) == (-1000, 1000)


@pytest.mark.parametrize(("value", "ok"), [(-1, False), (0, True), (1000, True), (1001, False)])
def test_job_oom_score_adj_must_be_between_0_and_1000(tmp_path: Path, value: int, ok: bool) -> None:
    """job_oom_score_adj is checked at construction: 0..1000 (a job is never better protected
    than a process nobody set), else refused naming field, value and range."""

    def settings() -> AgentSettings:
        return AgentSettings(
            worker_id="w-1",
            control_planes=["127.0.0.1:1"],
            cpu_millis=1000,
            memory_mb=1000,
            work_dir=str(tmp_path),
            job_oom_score_adj=value,
        )

    if ok:
        assert settings().job_oom_score_adj == value
    else:
        with pytest.raises(
            InvalidArgument, match=f"job_oom_score_adj must be an integer between 0 and 1000, got {value}"
        ):
            settings()


def test_a_process_goes_as_low_as_the_kernel_lets_it() -> None:
    """A process at 500 asking for -998 gets it where the kernel grants it; where it refuses, the
    process still goes below 500, to no lower than what it could always have (its parent's
    score, here the test's), and says it was refused."""
    now, refused = _ask_in_a_child(start=500, asked=-998)
    assert now == -998 or (refused and -998 < now <= _own_score())


def test_a_process_already_lower_keeps_its_score() -> None:
    """A process at 300 asking for 700 stays at 300: asking never raises a score."""
    assert _ask_in_a_child(start=300, asked=700) == (300, False)

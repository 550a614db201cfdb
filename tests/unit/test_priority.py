"""CPU priority for the processes that keep the cluster live (runtime/priority.py), on real
processes: a child process asks, so the test process keeps its own priority."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from runtime.errors import InvalidArgument
from runtime.priority import check_nice, children_of, renice_server

ROOT = os.geteuid() == 0

ASK = """
import os, sys
from runtime.priority import ask_for_priority
os.setpriority(os.PRIO_PROCESS, 0, {start})
result = ask_for_priority({asked})
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


def test_a_nice_value_outside_the_kernels_range_is_refused_naming_it() -> None:
    """20 and -21 are refused with the field, the value and the range; -20 and 19 pass."""
    for bad in (20, -21):
        with pytest.raises(InvalidArgument, match=rf"nice must be between -20 and 19, got {bad}"):
            check_nice(bad)
    assert (check_nice(-20), check_nice(19)) == (-20, 19)


@pytest.mark.skipif(
    not ROOT, reason="raising a priority needs CAP_SYS_NICE; this test runs as a user without it"
)
def test_a_process_with_the_right_gets_the_priority_it_asks_for() -> None:
    """As root, a nice-0 process asking for -5 runs at -5."""
    assert _ask_in_a_child(start=0, asked=-5) == (-5, False)


def test_a_process_already_at_a_higher_priority_keeps_it() -> None:
    """A process at nice 3 asking for 7 stays at 3: asking never lowers a priority."""
    assert _ask_in_a_child(start=3, asked=7) == (3, False)


@pytest.mark.skipif(
    ROOT, reason="root may raise priorities; the refusal path needs a user without CAP_SYS_NICE"
)
def test_without_the_right_the_process_keeps_its_priority_and_says_why() -> None:
    """Without CAP_SYS_NICE a nice-0 process asking for -5 stays at 0, refused."""
    assert _ask_in_a_child(start=0, asked=-5) == (0, True)


@pytest.mark.skipif(not ROOT, reason="renicing to a higher priority needs CAP_SYS_NICE")
def test_a_server_and_the_children_it_already_forked_get_the_priority() -> None:
    """A shell that forked a sleep: both run at -5 after renice_server; the test's own
    priority is untouched."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    server = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not children_of(server.pid):
            assert time.monotonic() < deadline, "the shell forked no child"
            time.sleep(0.01)
        result = renice_server(server.pid, -5)
        assert (result.now, result.refused) == (-5, "")
        for child in children_of(server.pid):
            assert os.getpriority(os.PRIO_PROCESS, child) == -5
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
    finally:
        for child in children_of(server.pid):
            os.kill(child, 9)
        server.kill()
        server.wait()

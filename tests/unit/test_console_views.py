"""The console's pure view functions (actors.console.views): states, ages, bars, the packing chart."""

from __future__ import annotations

from typing import Any

import pytest

from actors.console.views import (
    PackingRing,
    PackingSample,
    bar,
    duration,
    job_name,
    labels_of,
    packing_chart,
    printable,
    worker_state,
)


def worker(**changes: Any) -> dict[str, Any]:
    row = {"state": "alive", "cordoned": False, "drain_requested": False, "job_count": 0, "hold_for_s": None}
    return row | changes


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({}, "alive"),
        ({"state": "dead"}, "dead"),
        ({"state": "left", "cordoned": True}, "left"),
        ({"cordoned": True}, "cordoned"),
        ({"cordoned": True, "drain_requested": True, "job_count": 2}, "draining"),
        ({"cordoned": True, "drain_requested": True, "job_count": 0}, "drained"),
        ({"hold_for_s": 12.0}, "held"),
        ({"hold_for_s": -1.0}, "alive"),
        ({"unhealthy": True}, "unhealthy"),
        ({"unhealthy": True, "cordoned": True}, "unhealthy"),
        ({"unhealthy": True, "cordoned": True, "drain_requested": True, "job_count": 1}, "draining"),
    ],
)
def test_a_workers_state_is_one_word(changes: dict[str, Any], shown: str) -> None:
    """Dead and left show as such; an alive worker shows its drain, its mark as unhealthy, its
    cordon or its hold."""
    assert worker_state(worker(**changes)) == shown


def test_durations_read_in_the_largest_fitting_units() -> None:
    """Ages are shown in seconds, minutes, hours or days; None as a dash, a negative age as 0."""
    assert [duration(s) for s in (None, -3, 0.44, 12.9, 184, 7500, 100_000)] == [
        "-",
        "0.0 s",
        "0.4 s",
        "12 s",
        "3 min 4 s",
        "2 h 5 min",
        "1 d 3 h",
    ]


def test_a_bar_clamps_an_allocation_above_capacity_and_says_so() -> None:
    """Half a worker's CPU fills half the bar; more than its capacity fills it and is flagged."""
    half = bar(2000, 4000, "m")
    assert (half.percent, half.over, half.text) == (50.0, False, "2,000 / 4,000 m (50%)")
    over = bar(5000, 4000, "m")
    assert (over.fraction, over.over) == (1.0, True)
    assert bar(0, 0, "MiB").fraction == 0.0


def test_an_arrays_task_is_named_with_its_index_and_a_gangs_with_its_rank() -> None:
    """A task of an array reads name[index] (index 0 too), a gang's task name[rank], as
    ``stockade list`` names them; a job of neither its plain name."""
    assert job_name({"name": "sh", "array_index": 3}) == "sh[3]"
    assert job_name({"name": "sh", "array_index": 0}) == "sh[0]"
    assert job_name({"name": "sh", "array_index": None, "gang_rank": 2}) == "sh[2]"
    assert job_name({"name": "sh", "array_index": None, "gang_rank": None}) == "sh"


def test_labels_are_sorted_pairs() -> None:
    """A worker's labels (JSON text) come back as sorted key, value pairs."""
    assert labels_of('{"zone": "b", "gpu": "1"}') == [("gpu", "1"), ("zone", "b")]
    assert labels_of(None) == []


def test_output_loses_terminal_sequences_and_control_characters_but_keeps_lines() -> None:
    """Colour codes are dropped, other control bytes shown as U+FFFD, invalid UTF-8 too."""
    assert printable(b"\x1b[31mred\x1b[0m\tok\nbell\x07 \xff") == "red\tok\nbell\ufffd \ufffd"


def sample(unix_s: float, cpu: int, memory: int) -> PackingSample:
    return PackingSample(
        unix_s=unix_s,
        cpu_allocated_millis=cpu,
        cpu_capacity_millis=4000,
        memory_allocated_mb=memory,
        memory_capacity_mb=8000,
        job_count=1,
        worker_count=1,
    )


def test_the_ring_keeps_the_newest_samples() -> None:
    """A full ring drops its oldest sample for each new one."""
    ring = PackingRing(size=3)
    for t in range(5):
        ring.add(sample(float(t), 0, 0))
    assert [s.unix_s for s in ring.samples()] == [2.0, 3.0, 4.0]


def test_the_chart_plots_shares_of_capacity_over_the_span() -> None:
    """The newest sample sits at the right edge, an older one left of it by its age; 0% at the
    bottom, 100% at the top; samples older than the span are left out."""
    chart = packing_chart(
        [sample(0.0, 4000, 0), sample(700.0, 4000, 0), sample(1000.0, 2000, 8000)],
        now_unix_s=1000.0,
        span_s=600.0,
        width=648,
        height=240,
    )
    assert chart.samples == 2
    # x1 = 636, x0 = 48: 300 s before now is halfway; y0 = 12 (100%), y1 = 212 (0%).
    assert chart.cpu_points == "342.0,12.0 636.0,112.0"
    assert chart.memory_points == "342.0,212.0 636.0,12.0"
    assert chart.x_ticks[0] == (636.0, "now")
    assert chart.x_ticks[-1][1] == "-10 min"

"""The reports of ``stockade bench fair-share`` and ``stockade bench preemption``: which windows
are judged, when a run is ok, and what is printed."""

from __future__ import annotations

from ops.bench.fair_share import FairShareReport, FairShareSettings, Window
from ops.bench.fair_share import render as render_fair_share
from ops.bench.preemption import PreemptionBenchReport, PreemptionBenchSettings
from ops.bench.preemption import render as render_preemption


def window(k: int, alice: float, bob: float) -> Window:
    return Window(index=k, cpu_millis_s={"alice": alice, "bob": bob}, capacity_millis_s=4 * (alice + bob))


def test_only_the_windows_after_the_first_while_both_had_jobs_are_judged() -> None:
    report = FairShareReport(
        settings=FairShareSettings(window_s=60.0),
        windows=(window(0, 1, 9), window(1, 1, 3.1), window(2, 1, 2.9), window(3, 5, 1)),
        both_busy_until_s=190.0,
    )
    assert [w.index for w in report.judged] == [1, 2]
    assert report.ok  # 3.1 and 2.9 are within 5 % of 3; windows 0 and 3 do not count
    assert "window 3: bob/alice 0.200" in render_fair_share(report)
    off = FairShareReport(
        settings=FairShareSettings(), windows=(window(0, 1, 3), window(1, 1, 3.2)), both_busy_until_s=121
    )
    assert not off.ok
    none = FairShareReport(settings=FairShareSettings(), windows=(window(0, 1, 3),), both_busy_until_s=100)
    assert not none.ok  # nothing judged is no result


def test_a_preemption_run_is_ok_when_every_try_ran_and_the_median_is_within_grace_plus_one() -> None:
    s = PreemptionBenchSettings(tries=3, grace_s=2.0)
    assert PreemptionBenchReport(settings=s, waits_s=(2.4, 2.9, 9.0), preemptions=6).ok
    assert not PreemptionBenchReport(settings=s, waits_s=(3.1, 3.2, 1.0), preemptions=6).ok
    assert not PreemptionBenchReport(settings=s, waits_s=(1.0, 1.0), preemptions=2).ok
    assert "p50 2.9 s" in render_preemption(
        PreemptionBenchReport(settings=s, waits_s=(2.4, 2.9, 9.0), preemptions=6)
    )

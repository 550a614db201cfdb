"""``stockade bench`` builds each benchmark's settings from its options, whose defaults are the
settings class's (:mod:`ops.bench.settings`); nothing is started here (each benchmark's run is
replaced by one that stops at once), and loading the commands loads none of the benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import typer
from typer.testing import CliRunner

from ops.bench import settings as bench_settings
from ops.cli import app

RUNS = {
    "failover": "ops.bench.failover.run_failover_bench",
    "pack": "ops.bench.pack.run_pack",
    "fair-share": "ops.bench.fair_share.run_fair_share",
    "preemption": "ops.bench.preemption.run_preemption_bench",
    "overload": "ops.bench.overload.run_overload",
    "scale": "ops.bench.scale.run_scale",
}
"""Each command, and the run it hands its settings to."""
ASYNC = {"failover", "overload", "scale"}
"""The commands whose run is a coroutine function, run under trio."""


def settings_given(command: str, args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The settings ``stockade bench COMMAND ARGS`` hands its run."""
    given: list[Any] = []

    def run(settings: Any, *rest: Any) -> None:
        given.append(settings)
        raise typer.Exit(0)

    async def run_async(settings: Any, *rest: Any) -> None:
        run(settings)

    monkeypatch.setattr(RUNS[command], run_async if command in ASYNC else run)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", command, "--state-dir", str(tmp_path / "state"), *args])
    assert result.exit_code == 0, result.output
    (settings,) = given
    return settings


@pytest.mark.parametrize(
    ("command", "default"),
    [
        ("failover", bench_settings.FailoverBenchSettings(kills=10, freezes=10, stops=10, worker_kills=10)),
        ("pack", bench_settings.PackSettings()),
        ("fair-share", bench_settings.FairShareSettings()),
        ("preemption", bench_settings.PreemptionBenchSettings()),
        ("overload", bench_settings.OverloadSettings()),
        ("scale", bench_settings.ScaleSettings()),
    ],
)
def test_no_option_runs_the_settings_defaults(
    command: str, default: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without options a benchmark runs its settings class's defaults (failover: 10 of each fault)."""
    assert settings_given(command, [], monkeypatch, tmp_path) == default


@pytest.mark.parametrize(
    ("command", "args", "fields"),
    [
        ("failover", ["--kills", "3", "--worker-kills", "0"], {"kills": 3, "worker_kills": 0}),
        ("pack", ["--seed", "7", "--fleet-size", "0"], {"seed": 7, "fleet_size": 0}),
        ("pack", ["--policy", "worst_fit, best_fit"], {"policies": ("worst_fit", "best_fit")}),
        (
            "pack",
            ["--device-share", "0.25", "--gang-share", "0.5"],
            {"scale_device_share": 0.25, "scale_gang_share": 0.5},
        ),
        ("pack", ["--arrival-rate", "0"], {"arrival_rate_per_s": 0.0}),
        (
            "pack",
            ["--scale-pending", "5,,6", "--scale-workers", "7"],
            {"scale_pending": (5, 6), "scale_workers": (7,)},
        ),
        ("pack", ["--no-scale", "--no-burst"], {"scale": False, "burst": False}),
        ("pack", ["--no-scale", "--only-scale"], {"scale": True, "only_scale": True}),
        (
            "pack",
            ["--insecure", "--docker", "--heartbeat-interval-s", "0.5"],
            {"insecure": True, "docker": True, "heartbeat_interval_s": 0.5},
        ),
        ("fair-share", ["--duration-ms", "5", "--no-alone"], {"duration_ms": 5, "alone": False}),
        ("preemption", ["--grace-s", "0.5", "--no-ignore-term"], {"grace_s": 0.5, "ignore_term": False}),
        ("overload", ["--rates", "1,2.5", "--kind", "sleep"], {"rates": (1.0, 2.5), "kind": "sleep"}),
        ("scale", ["--workers", "10,20", "--real-agents"], {"workers": (10, 20), "real_agents": True}),
        (
            "scale",
            ["--heartbeat-interval-s", "0.5", "--insecure"],
            {"heartbeat_interval_s": 0.5, "insecure": True},
        ),
    ],
)
def test_the_options_set_their_fields(
    command: str, args: list[str], fields: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each option sets the field it names (``--device-share``: ``scale_device_share``; a listed
    one parsed) and no other; ``--only-scale`` runs the scale curve whatever ``--scale`` says."""
    default = settings_given(command, [], monkeypatch, tmp_path)
    assert settings_given(command, args, monkeypatch, tmp_path) == attrs.evolve(default, **fields)


def test_the_commands_load_no_benchmark() -> None:
    """Registering the bench commands (their ``--help``) reads the defaults from
    :mod:`ops.bench.settings` and loads none of the benchmarks, which load the cluster's code."""
    code = (
        "import sys; from ops.cli import load_commands; load_commands(['bench']); "
        "heavy = ('ops.bench', 'trio', 'ops.launcher'); "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(heavy))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["ops.bench", "ops.bench.settings"]

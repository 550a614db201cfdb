"""``stockade bench fair-share``: two accounts of weights 1 and 3 submit their jobs at once into
a local cluster they saturate; their allocated shares are measured over fixed windows from the
database's assignments (docs/fair-share.md). Then one account alone, with fair share on and off,
for the cluster use a lone account reaches.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from ops import certs as certs_module
from ops.bench import operator_client
from ops.bench.settings import FairShareSettings
from ops.launcher.control import LocalCluster
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.tls import TlsFiles

# $1 window (s). Per account and window since the first placement: cpu_millis x seconds its
# runs held in the window (each run from its placement to its end, or now), with the cluster's
# capacity; only jobs of the bench accounts.
WINDOWS = """
WITH start AS (SELECT min(created_at) AS t0 FROM assignments),
runs AS (
    SELECT j.owner, a.cpu_millis,
           extract(epoch FROM a.created_at - s.t0)::float8 AS t_from,
           extract(epoch FROM coalesce(a.ended_at, now()) - s.t0)::float8 AS t_to
      FROM assignments a JOIN jobs j ON j.id = a.job_id, start s
),
windows AS (
    SELECT k, k * $1::float8 AS w_from, (k + 1) * $1::float8 AS w_to
      FROM generate_series(0, (SELECT floor(max(t_to) / $1)::int FROM runs)) k
)
SELECT w.k, r.owner,
       sum(r.cpu_millis * greatest(0, least(r.t_to, w.w_to) - greatest(r.t_from, w.w_from)))::float8
           AS cpu_millis_s
  FROM windows w JOIN runs r ON r.t_from < w.w_to AND r.t_to > w.w_from
 GROUP BY w.k, r.owner ORDER BY w.k, r.owner
"""

# Per account: when its last job ended (s after the first placement; NULL while some are not).
FINISHED = """
WITH start AS (SELECT min(created_at) AS t0 FROM assignments)
SELECT j.owner, bool_and(j.state IN ('succeeded', 'failed', 'cancelled')) AS done,
       extract(epoch FROM max(j.finished_at) - s.t0)::float8 AS last_end_s
  FROM jobs j, start s GROUP BY j.owner, s.t0
"""

CAPACITY = "SELECT coalesce(sum(cpu_millis), 0)::float8 FROM workers WHERE state = 'alive'"

# The cluster's CPU use while jobs waited: cpu_millis x seconds the runs held from the first
# placement to the last one (the queue was never empty before it), over the alive workers'
# cpu_millis x that span.
USE_WHILE_BACKLOGGED = """
WITH span AS (SELECT min(created_at) AS t0, max(created_at) AS t1 FROM assignments)
SELECT sum(a.cpu_millis * greatest(0, extract(epoch FROM least(coalesce(a.ended_at, now()), s.t1)
                                                       - greatest(a.created_at, s.t0))))::float8
       / nullif((SELECT sum(cpu_millis) FROM workers WHERE state = 'alive')
                * extract(epoch FROM s.t1 - s.t0), 0) AS use
  FROM assignments a, span s GROUP BY s.t0, s.t1
"""


@attrs.frozen(kw_only=True)
class Window:
    index: int
    cpu_millis_s: dict[str, float]
    capacity_millis_s: float

    @property
    def ratio(self) -> float | None:
        """bob's allocation over alice's (None: alice had none)."""
        a, b = self.cpu_millis_s.get("alice", 0.0), self.cpu_millis_s.get("bob", 0.0)
        return None if a <= 0 else b / a

    @property
    def use(self) -> float:
        """The cluster's CPU allocated in the window, a fraction of its capacity."""
        return sum(self.cpu_millis_s.values()) / self.capacity_millis_s if self.capacity_millis_s else 0.0


@attrs.frozen(kw_only=True)
class FairShareReport:
    settings: FairShareSettings
    windows: tuple[Window, ...]
    both_busy_until_s: float
    """Until when (s after the first placement) both accounts still had jobs to run."""
    alone_use: dict[str, float] = attrs.field(factory=dict)
    """"fair_share" / "no_fair_share" -> the cluster's CPU use while the lone account's jobs
    waited (from the first placement to the last)."""

    @property
    def judged(self) -> tuple[Window, ...]:
        """The windows after the first that end while both accounts had jobs left."""
        w = self.settings.window_s
        return tuple(x for x in self.windows if x.index >= 1 and (x.index + 1) * w <= self.both_busy_until_s)

    @property
    def ok(self) -> bool:
        target = self.settings.weights[1] / self.settings.weights[0]
        return bool(self.judged) and all(
            x.ratio is not None and abs(x.ratio / target - 1) <= 0.05 for x in self.judged
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": attrs.asdict(self.settings),
            "windows": [
                {"index": x.index, "cpu_millis_s": x.cpu_millis_s, "ratio": x.ratio, "use": round(x.use, 4)}
                for x in self.windows
            ],
            "both_busy_until_s": self.both_busy_until_s,
            "judged": [x.index for x in self.judged],
            "alone_use": dict(self.alone_use),
            "ok": self.ok,
        }


def _client(config: Any, cert_dir: Path, who: str) -> ControlPlaneClient:
    tls = None if config.client_tls is None else TlsFiles.in_dir(cert_dir, who)
    return ControlPlaneClient(config.control_plane_addresses, timeout_s=10.0, tls=tls)


def _specs(settings: FairShareSettings, name: str, count: int) -> list[pb.JobSpec]:
    return [
        pb.JobSpec(
            name=f"{name}-{n}",
            cpu_millis=settings.cpu_millis,
            memory_mb=settings.memory_mb,
            sleep=pb.SleepRuntime(duration_ms=settings.duration_ms),
        )
        for n in range(count)
    ]


async def _submit(client: ControlPlaneClient, specs: Sequence[pb.JobSpec]) -> None:
    for start in range(0, len(specs), 1000):
        await client.call(
            "submit_jobs", pb.SubmitJobsRequest(specs=list(specs[start : start + 1000])), timeout_s=60
        )


async def _windows(database_url: str, window_s: float) -> tuple[list[Window], dict[str, Any]]:
    db = await PgConnection.connect(database_url)
    try:
        capacity = float(await db.fetchval(CAPACITY)) * window_s
        rows = await db.fetch(WINDOWS, window_s)
        finished = {r["owner"]: r for r in await db.fetch(FINISHED)}
    finally:
        await db.close()
    by_window: dict[int, dict[str, float]] = {}
    for r in rows:
        by_window.setdefault(int(r["k"]), {})[r["owner"]] = float(r["cpu_millis_s"])
    return [
        Window(index=k, cpu_millis_s=v, capacity_millis_s=capacity) for k, v in sorted(by_window.items())
    ], finished


async def _wait_done(
    database_url: str, owners: Sequence[str] | None, timeout_s: float, progress: Callable[[str], None]
) -> None:
    """Wait until every job of ``owners`` (None: of anyone) has ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        db = await PgConnection.connect(database_url)
        try:
            rows = await db.fetch(
                "SELECT owner, count(*) FILTER (WHERE state NOT IN ('succeeded', 'failed', 'cancelled'))"
                " AS left FROM jobs GROUP BY owner"
            )
        finally:
            await db.close()
        left = {r["owner"]: int(r["left"]) for r in rows}
        named = sorted(left) if owners is None else owners
        progress("jobs left: " + ", ".join(f"{o} {left.get(o, 0)}" for o in named))
        if all(left.get(o, 0) == 0 for o in named):
            return
        await trio.sleep(5)
    raise TimeoutError(f"the jobs did not finish within {timeout_s:g} s")


async def _run_two(
    settings: FairShareSettings, cluster: LocalCluster, progress: Callable[[str], None]
) -> FairShareReport:
    config = cluster.config()
    cert_dir = cluster.state.cert_dir
    if config.client_tls is not None:
        for who in ("alice", "bob"):
            with contextlib.suppress(certs_module.CertificateExists):
                certs_module.issue(cert_dir, role="user", id=who)
    async with asyncio_bridge():
        async with operator_client(config) as operator:
            for who, weight in zip(("alice", "bob"), settings.weights, strict=True):
                await operator.call(
                    "set_account", pb.SetAccountRequest(name=who, has_weight=True, weight=weight)
                )
        clients = {who: _client(config, cert_dir, who) for who in ("alice", "bob")}
        try:
            async with trio.open_nursery() as nursery:
                for who, client in clients.items():
                    nursery.start_soon(_submit, client, _specs(settings, who, settings.jobs))
        finally:
            for client in clients.values():
                client.close()
        await _wait_done(config.database_url, ("alice", "bob"), settings.timeout_s, progress)
        windows, finished = await _windows(config.database_url, settings.window_s)
    both_until = min(float(finished[o]["last_end_s"] or 0.0) for o in ("alice", "bob"))
    return FairShareReport(settings=settings, windows=tuple(windows), both_busy_until_s=both_until)


async def _run_alone(
    settings: FairShareSettings, cluster: LocalCluster, progress: Callable[[str], None]
) -> float:
    config = cluster.config()
    async with asyncio_bridge():
        async with operator_client(config) as client:
            await _submit(client, _specs(settings, "alone", settings.alone_jobs))
        await _wait_done(config.database_url, None, settings.timeout_s, progress)
        db = await PgConnection.connect(config.database_url)
        try:
            use = await db.fetchval(USE_WHILE_BACKLOGGED)
        finally:
            await db.close()
    return round(float(use or 0.0), 4)


def run_fair_share(
    settings: FairShareSettings, root: Path, progress: Callable[[str], None]
) -> FairShareReport:
    """Run the two accounts on a fresh cluster under ``root``, then (``settings.alone``) one
    account alone with fair share on and off, each on a fresh cluster; every cluster is stopped.

    Raises:
        ClusterError: a cluster could not be started.
        TimeoutError: the jobs did not finish within ``settings.timeout_s``.
    """

    def cluster(name: str, *cp_args: str) -> LocalCluster:
        # A fresh cluster: a run's windows are read from every assignment of its database, so
        # one left by an earlier run would be measured again.
        folder = root / name
        LocalCluster(folder).down()
        shutil.rmtree(folder, ignore_errors=True)
        return LocalCluster(folder, fleet_size=settings.workers, cp_args=cp_args)

    two = cluster("two")
    try:
        two.up(control_planes=3, workers=settings.workers, timeout_s=240)
        report = trio.run(_run_two, settings, two, progress)
    finally:
        two.down()
    if not settings.alone:
        return report
    alone: dict[str, float] = {}
    for name, args in (("fair_share", ()), ("no_fair_share", ("--no-fair-share",))):
        lone = cluster(f"alone-{name}", *args)
        try:
            lone.up(control_planes=3, workers=settings.workers, timeout_s=240)
            alone[name] = trio.run(_run_alone, settings, lone, progress)
        finally:
            lone.down()
    return attrs.evolve(report, alone_use=alone)


def render(report: FairShareReport) -> str:
    """The report as lines of text."""
    s = report.settings
    target = s.weights[1] / s.weights[0]
    lines = [
        f"two accounts, weights alice {s.weights[0]:g} and bob {s.weights[1]:g}, {s.jobs} jobs each of "
        f"{s.cpu_millis} cpu_millis for {s.duration_ms} ms, on {s.workers} workers; "
        f"windows of {s.window_s:g} s",
        f"both had jobs left until {report.both_busy_until_s:.1f} s after the first placement",
    ]
    judged = {x.index for x in report.judged}
    for x in report.windows:
        ratio = "-" if x.ratio is None else f"{x.ratio:.3f}"
        off = "" if x.ratio is None else f" ({(x.ratio / target - 1) * 100:+.1f} % from {target:g})"
        mark = " judged" if x.index in judged else ""
        lines.append(f"window {x.index}: bob/alice {ratio}{off}, cluster CPU use {x.use:.3f}{mark}")
    for name, use in report.alone_use.items():
        lines.append(
            f"one account alone, {name.replace('_', ' ')}: cluster CPU use while its jobs waited {use:.3f}"
        )
    if report.judged:
        lines.append(f"every judged window within 5 % of {target:g}: {report.ok}")
    else:
        lines.append(
            "no window could be judged (none after the first ended while both accounts had jobs left): "
            "give the run more work (--jobs, --duration-ms) or shorter windows (--window-s)"
        )
    return "\n".join(lines)

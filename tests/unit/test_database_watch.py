"""The database watch on trio's mock clock, against a scripted store: when it samples, what it
exports, and that each threshold it crosses is logged once per crossing."""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import structlog.testing
import trio
import trio.testing
from prometheus_client import REGISTRY

from actors.database_watch import (
    HOT_TABLES,
    DatabaseSample,
    DatabaseWatch,
    OpenTransaction,
    TableRows,
    over_thresholds,
)
from runtime.errors import DatabaseUnavailable
from runtime.settings.control_plane import DatabaseWatchSettings

SETTINGS = DatabaseWatchSettings(
    sample_interval_s=5.0, oldest_transaction_warn_s=60.0, dead_rows_warn_ratio=10.0, dead_rows_warn_min=1000
)


def open_for(age_s: float) -> OpenTransaction:
    return OpenTransaction(
        age_s=age_s, pid=4242, application_name="psql", client="10.0.0.9", state="idle in transaction"
    )


def sample(oldest_s: float | None = None, **dead_rows: tuple[int, int]) -> DatabaseSample:
    """A sample whose oldest transaction is ``oldest_s`` old (None: none open) and whose tables
    hold ``table=(live, dead)`` rows (others: 10 live, 0 dead)."""
    return DatabaseSample(
        oldest=None if oldest_s is None else open_for(oldest_s),
        tables=tuple(
            TableRows(table=t, live_rows=dead_rows.get(t, (10, 0))[0], dead_rows=dead_rows.get(t, (10, 0))[1])
            for t in HOT_TABLES
        ),
    )


@attrs.define
class ScriptedStore:
    """Answers each sample with the next of ``script`` (an exception is raised), recording when
    it was asked; once the script is spent, every later sample waits for ever."""

    script: list[DatabaseSample | Exception]
    asked: list[float] = attrs.field(factory=list)
    tables: list[tuple[str, ...]] = attrs.field(factory=list)
    closed: bool = False

    async def sample(self, tables: Iterable[str]) -> DatabaseSample:
        self.asked.append(trio.current_time())
        self.tables.append(tuple(tables))
        if not self.script:
            await trio.sleep_forever()
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def close(self) -> None:
        self.closed = True


async def run_script(
    script: list[DatabaseSample | Exception],
) -> tuple[ScriptedStore, list[dict[str, object]]]:
    """Run a watch through ``script``; returns its store and the lines it logged."""
    store = ScriptedStore(script=list(script))
    watch = DatabaseWatch(settings=SETTINGS, store=store)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run)
            await trio.sleep(SETTINGS.sample_interval_s * (len(script) - 1) + 1.0)
            nursery.cancel_scope.cancel()
    return store, [dict(line) for line in logs]


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_the_watch_samples_at_once_then_every_interval_and_closes_its_store(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Samples are taken at 0, 5 and 10 s, each of the hot tables, and the store is closed when
    the watch stops."""
    store, _ = await run_script([sample(), sample(), sample()])
    assert store.asked == [0.0, 5.0, 10.0]
    assert store.tables == [HOT_TABLES] * 3
    assert store.closed


async def test_a_sample_is_exported_as_gauges(autojump_clock: trio.testing.MockClock) -> None:
    """The oldest transaction's age and each table's live and dead rows become the gauges; no
    transaction open sets the age to 0."""
    await run_script([sample(75.5, workers=(20, 6675))])
    assert gauge("stockade_database_oldest_transaction_seconds") == 75.5
    assert gauge("stockade_database_dead_rows", table="workers") == 6675
    assert gauge("stockade_database_live_rows", table="workers") == 20
    await run_script([sample(None)])
    assert gauge("stockade_database_oldest_transaction_seconds") == 0.0


async def test_an_old_transaction_is_warned_about_once_per_crossing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Open for 10 s: nothing; 70 s: a warning naming the session; 75 s: nothing more; none
    open: an info line; 65 s: a warning again."""
    _, logs = await run_script([sample(10), sample(70), sample(75), sample(None), sample(65)])
    lines = [(line["log_level"], line.get("age_s")) for line in logs if "oldest_transaction_warn_s" in line]
    assert lines == [("warning", 70), ("info", None), ("warning", 65)]
    warning = next(line for line in logs if line["log_level"] == "warning")
    assert (warning["pid"], warning["application_name"], warning["client"], warning["state"]) == (
        4242,
        "psql",
        "10.0.0.9",
        "idle in transaction",
    )


async def test_dead_rows_are_warned_about_past_the_ratio_and_the_minimum(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """workers with 20 live rows warns once at 6675 dead (over 10 x 20 and over 1000), not at
    500 (under the minimum) nor again at 7000; lease with 1 live row and 60 dead never warns;
    back at 100 dead, workers gets an info line."""
    _, logs = await run_script(
        [
            sample(workers=(20, 500), lease=(1, 60)),
            sample(workers=(20, 6675), lease=(1, 60)),
            sample(workers=(20, 7000)),
            sample(workers=(20, 100)),
        ]
    )
    lines = [(line["log_level"], line["table"], line["dead_rows"]) for line in logs if "table" in line]
    assert lines == [("warning", "workers", 6675), ("info", "workers", 100)]


async def test_a_failed_sample_is_skipped(autojump_clock: trio.testing.MockClock) -> None:
    """A sample the database does not answer changes nothing: the crossing already warned about
    is not warned about again, and the next sample is taken on time."""
    store, logs = await run_script([sample(70), DatabaseUnavailable("gone"), sample(80)])
    assert store.asked == [0.0, 5.0, 10.0]
    assert [line["log_level"] for line in logs if "oldest_transaction_warn_s" in line] == ["warning"]


def test_the_thresholds_are_strictly_over() -> None:
    """Exactly at a threshold is not over it: 60 s open, 1000 dead rows, 10 times the live ones."""
    assert over_thresholds(sample(60.0, workers=(100, 1000), jobs=(50, 1001)), SETTINGS) == frozenset(
        {"dead_rows:jobs"}
    )

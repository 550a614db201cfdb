"""Worker health and retries, the decisions as pure functions: which workers the health rule
marks unhealthy and clears (:func:`actors.health.judge_health`), how a round treats an unhealthy
worker (nothing but a due probe, one job at a time) and where a retry goes (elsewhere than
where its job failed, when it can).

The reconciler's part (the judgement every ``health_interval_s``, its fenced write, the gauge)
is in tests/unit/test_reconciler.py, with the actor's other passes; the whole on a real
PostgreSQL with real agents in tests/integration/test_unhealthy_workers.py."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from actors.health import JOB_FAULTS, HealthChange, Run, WorkerRuns, judge_health
from actors.messages import WorkerRef
from actors.pending_queue import PendingJob, PendingQueue
from actors.placement import place_queue
from actors.placer_store import LiveWorker
from actors.rooms import WorkerRoom
from actors.round_plan import not_counting_cordoned, plan_round, probe_limit
from ops.cli.render import render_status, status_json
from ops.cli.workers import schedule_line
from ops.client.admin_results import schedule_from_pb
from ops.client.results import status_from_pb
from protocol import pb
from runtime.errors import InvalidArgument
from runtime.settings.leader import (
    PlacerSettings,
    ReconcilerSettings,
)

HEALTH = ReconcilerSettings()
PLACER = PlacerSettings(initial_window=100, max_unconfirmed_per_worker=100)


def runs(
    worker_id: str,
    outcomes: str,
    *,
    first_job: int = 1,
    after_mark: int = 0,
    every_s: float = 1.0,
    newest_s: float = 0.0,
    array_id: int | None = None,
    spec: str = "",
    elsewhere: str = "",
    **kw: object,
) -> WorkerRuns:
    """``worker_id`` with one run per letter of ``outcomes`` (``F`` failed, ``S`` succeeded),
    newest first, each of another job from ``first_job`` on, ended ``newest_s`` ago and then
    ``every_s`` apart; the newest ``after_mark`` of them ended after its mark; ``array_id``: all
    of one array; ``spec``: all of one command. ``elsewhere``: per run, ``s`` the job succeeded
    on another worker, ``f`` it failed on another worker, ``-`` neither (the default)."""
    return WorkerRuns(
        worker_id=worker_id,
        version=0,
        runs=tuple(
            Run(
                job_id=first_job + k,
                failed=o == "F",
                detail=f"exit code {k}",
                after_mark=k < after_mark,
                age_s=newest_s + k * every_s,
                array_id=array_id,
                spec_key=spec,
                succeeded_elsewhere=elsewhere[k : k + 1] == "s",
                failed_elsewhere=elsewhere[k : k + 1] == "f",
            )
            for k, o in enumerate(outcomes)
        ),
        **kw,  # type: ignore[arg-type]
    )


def marked(verdict_changes: tuple[HealthChange, ...]) -> set[str]:
    return {c.worker_id for c in verdict_changes if c.unhealthy}


def cleared(verdict_changes: tuple[HealthChange, ...]) -> set[str]:
    return {c.worker_id for c in verdict_changes if not c.unhealthy}


# ---------------------------------------------------------------- the rule


def test_a_worker_whose_runs_all_fail_beside_healthy_ones_is_marked_with_its_reason() -> None:
    """The issue's worker: every run fails there, the same command succeeds on the others
    meanwhile; it is marked, and its reason counts its runs, the others' over the same span and
    quotes its last failure."""
    verdict = judge_health(
        [
            runs("w-bad", "FFFFFFFF", every_s=0.6, spec="sleep 1"),
            runs("w-1", "SSSSS", first_job=20, spec="sleep 1"),
            runs("w-2", "SSSFS", first_job=30),
        ],
        HEALTH,
    )
    (change,) = verdict.changes
    assert change == HealthChange(
        worker_id="w-bad",
        version=0,
        unhealthy=True,
        reason="unhealthy: 8 of the last 8 runs failed (other workers meanwhile: 1 of 10), last: exit code 0",
    )
    assert verdict.unhealthy == ("w-bad",)


def test_with_too_few_runs_elsewhere_to_compare_a_worker_is_marked_once_its_jobs_succeed_elsewhere() -> None:
    """Jobs that fail in milliseconds on one worker while the others' runs are still going: the
    rate is not compared with nothing; the worker is marked once three of those jobs succeeded
    on other workers, not before."""
    assert judge_health([runs("w-bad", "FFF"), runs("w-1", "")], HEALTH).changes == ()
    assert judge_health([runs("w-bad", "FFF", elsewhere="ss-"), runs("w-1", "")], HEALTH).changes == ()
    verdict = judge_health([runs("w-bad", "FFF", elsewhere="sss"), runs("w-1", "")], HEALTH)
    assert marked(verdict.changes) == {"w-bad"}
    assert (
        "(other workers meanwhile: 0 of 0; 3 of those jobs succeeded elsewhere)" in verdict.changes[0].reason
    )


def test_the_others_runs_before_the_workers_span_are_not_compared() -> None:
    """The issue's F1a: a worker whose ten last runs ended within the last seconds is compared
    with the runs the others ended within those seconds, not with their older successes."""
    w_bad = runs("w-bad", "F" * 10, every_s=0.1)
    old_successes = [runs(f"w-{i}", "S" * 10, first_job=100 * i, newest_s=60.0) for i in (1, 2, 3)]
    # Nothing else ended meanwhile and nothing succeeded elsewhere: no evidence, no mark.
    assert judge_health([w_bad, *old_successes], HEALTH).changes == ()
    # The others' runs that did end meanwhile failed as often: no mark either.
    failing_too = [runs(f"w-{i}", "FFFFFSSSSS", first_job=100 * i, every_s=0.2) for i in (1, 2, 3)]
    assert judge_health([w_bad, *failing_too], HEALTH).changes == ()


def test_a_batch_that_fails_everywhere_marks_no_worker_whichever_worker_it_reached_first() -> None:
    """The issue's F1a: an array of ``false`` fills one worker's window first while the others'
    still hold older successes; its failures are excused by the same array failing elsewhere."""
    first = runs("w-1", "F" * 10, array_id=7, every_s=0.05)
    later = [
        WorkerRuns(
            worker_id=f"w-{i}",
            version=0,
            runs=(
                *runs("x", "FF", first_job=100 * i, array_id=7, every_s=0.05).runs,
                *runs("x", "S" * 8, first_job=100 * i + 50, newest_s=0.2, every_s=0.05).runs,
            ),
        )
        for i in (2, 3, 4)
    ]
    assert judge_health([first, *later], HEALTH).changes == ()


def test_jobs_that_failed_elsewhere_too_are_not_held_against_a_worker() -> None:
    """The worker's failed jobs failed on another worker too (their retries): not counted."""
    verdict = judge_health(
        [runs("w-1", "FFFF", elsewhere="ffff"), runs("w-2", "SSSSSS", first_job=10)], HEALTH
    )
    assert verdict.changes == ()


def test_siblings_by_command_excuse_a_failure_but_a_success_elsewhere_outweighs_them() -> None:
    """Jobs of the same command failing on another worker excuse the worker's failures of that
    command, unless the very job succeeded elsewhere (then the failure is the worker's)."""

    def of(worker_id: str, outcomes: str, first_job: int, elsewhere: str = "") -> WorkerRuns:
        w = runs(worker_id, outcomes, first_job=first_job, elsewhere=elsewhere)
        return attrs.evolve(w, runs=tuple(attrs.evolve(r, spec_key="false") for r in w.runs))

    others = [of("w-2", "FSSSSS", 10), runs("w-3", "SSSSSS", first_job=20)]
    assert judge_health([of("w-1", "FFFF", 1), *others], HEALTH).changes == ()
    assert marked(judge_health([of("w-1", "FFFF", 1, "sss"), *others], HEALTH).changes) == {"w-1"}


def test_failures_of_fewer_jobs_than_the_minimum_mark_nothing() -> None:
    """Two jobs failing again and again on a worker are the jobs' doing, not the worker's."""
    two_jobs = WorkerRuns(
        worker_id="w-1",
        version=0,
        runs=tuple(Run(job_id=1 + k % 2, failed=True, succeeded_elsewhere=True) for k in range(6)),
    )
    assert judge_health([two_jobs, runs("w-2", "SSSS", first_job=10)], HEALTH).changes == ()


def test_a_lone_worker_is_never_marked() -> None:
    """With no other worker taking placements there is nothing to compare with, and nowhere
    else to go: a cordoned neighbour does not count."""
    assert judge_health([runs("w-1", "FFFFF", elsewhere="sssss")], HEALTH).changes == ()
    assert (
        judge_health(
            [runs("w-1", "FFFFF", elsewhere="sssss"), runs("w-2", "SSSSSS", takes_placements=False)], HEALTH
        ).changes
        == ()
    )


def test_of_two_failing_workers_at_most_the_first_is_marked_when_only_they_take_placements() -> None:
    """Two workers whose runs all fail and no other that takes placements: the first (by id) is
    marked only if the second stays healthy, so the cluster keeps a worker."""
    verdict = judge_health(
        [runs("w-1", "FFFF", elsewhere="ssss"), runs("w-2", "FFFF", first_job=10, elsewhere="ssss")], HEALTH
    )
    assert len(marked(verdict.changes)) <= 1


AGES = st.floats(0.0, 600.0)


@st.composite
def failing_everywhere(draw: st.DrawFn) -> list[WorkerRuns]:
    """Two to six workers, each with at least one failed run of one batch (an array, or jobs of
    one command) that never succeeded anywhere, and any number of successes of other jobs, all
    at any time in the window."""
    by_array = draw(st.booleans())
    workers = []
    for i in range(draw(st.integers(2, 6))):
        failures = [
            Run(
                job_id=draw(st.integers(1, 50)),
                failed=True,
                age_s=draw(AGES),
                array_id=1 if by_array else None,
                spec_key="" if by_array else "false",
                failed_elsewhere=draw(st.booleans()),
            )
            for _ in range(draw(st.integers(1, 10)))
        ]
        successes = [
            Run(job_id=1000 * (i + 1) + k, failed=False, age_s=draw(AGES))
            for k in range(draw(st.integers(0, 10)))
        ]
        ended = sorted(failures + successes, key=lambda r: r.age_s)[: HEALTH.health_window_runs]
        workers.append(WorkerRuns(worker_id=f"w-{i}", version=0, runs=tuple(ended)))
    return workers


@given(failing_everywhere())
def test_a_batch_that_fails_on_every_worker_marks_no_worker(workers: list[WorkerRuns]) -> None:
    """Whatever when each worker ran its part of a batch that fails wherever it runs, and
    whatever else they ran, no worker is marked."""
    assert marked(judge_health(workers, HEALTH).changes) == set()


@given(st.lists(st.integers(1, 10), min_size=2, max_size=6))
def test_jobs_that_fail_everywhere_mark_no_worker(counts: list[int]) -> None:
    """Every run of every worker fails, and no job succeeded anywhere: whatever how many runs
    each worker has, none is marked."""
    workers = [runs(f"w-{i}", "F" * n, first_job=100 * i) for i, n in enumerate(counts)]
    assert judge_health(workers, HEALTH).changes == ()


@given(
    st.integers(HEALTH.health_min_failed_jobs, 10),
    st.lists(st.tuples(st.integers(0, 10), AGES), min_size=1, max_size=5),
    AGES,
)
def test_a_worker_where_jobs_fail_that_succeed_elsewhere_is_marked(
    failing: int, others: list[tuple[int, float]], newest_s: float
) -> None:
    """A worker whose last runs all failed, of jobs that succeeded on other workers, beside
    workers whose runs succeed (any number, at any time), is marked."""
    bad = runs("w-0", "F" * failing, elsewhere="s" * failing, every_s=0.01, newest_s=newest_s)
    workers = [
        runs(f"w-{i}", "S" * n, first_job=100 * i, newest_s=age, every_s=0.1)
        for i, (n, age) in enumerate(others, 1)
    ]
    assert marked(judge_health([bad, *workers], HEALTH).changes) == {"w-0"}


@given(
    st.lists(
        st.lists(
            st.tuples(st.booleans(), st.sampled_from("sf-"), st.integers(0, 3), st.floats(0.0, 20.0)),
            max_size=10,
        ),
        min_size=1,
        max_size=8,
    )
)
def test_a_mark_always_has_its_grounds(workers_runs: list[list[tuple[bool, str, int, float]]]) -> None:
    """Every mark has, among the worker's successes and its failures of jobs that (or whose
    siblings, unless they also failed elsewhere) succeeded on other workers, runs of at least
    health_min_failed_jobs jobs failed and at least health_min_failure_rate of them; and either
    at least health_min_compared_runs runs of the others over its span and at least
    health_rate_factor times their rate, or fewer and at least health_min_failed_jobs of its
    failed jobs succeeded elsewhere; and it leaves another worker healthy."""
    workers = [
        WorkerRuns(
            worker_id=f"w-{i}",
            version=0,
            runs=tuple(
                Run(
                    job_id=100 * i + k,
                    failed=failed,
                    age_s=age,
                    array_id=array or None,
                    succeeded_elsewhere=e == "s",
                    failed_elsewhere=e == "f",
                )
                for k, (failed, e, array, age) in enumerate(sorted(rs, key=lambda r: r[3]))
            ),
        )
        for i, rs in enumerate(workers_runs)
    ]
    verdict = judge_health(workers, HEALTH)
    for change in verdict.changes:
        assert change.unhealthy
        (w,) = [w for w in workers if w.worker_id == change.worker_id]
        others = [r for o in workers if o is not w for r in o.runs]
        span_s = max(r.age_s for r in w.runs)
        failed_arrays = {o.array_id for o in others if o.failed and o.array_id is not None}
        fine_arrays = {o.array_id for o in others if not o.failed and o.array_id is not None}
        counted = [
            r
            for r in w.runs
            if not r.failed
            or r.succeeded_elsewhere
            or (not r.failed_elsewhere and r.array_id not in failed_arrays and r.array_id in fine_arrays)
        ]
        failed = [r for r in counted if r.failed]
        assert len({r.job_id for r in failed}) >= HEALTH.health_min_failed_jobs
        assert len(failed) / len(counted) >= HEALTH.health_min_failure_rate
        meanwhile = [r for r in others if r.age_s <= span_s]
        if len(meanwhile) >= HEALTH.health_min_compared_runs:
            rate = sum(r.failed for r in meanwhile) / len(meanwhile)
            assert len(failed) / len(counted) >= HEALTH.health_rate_factor * rate
        else:
            assert sum(r.succeeded_elsewhere for r in failed) >= HEALTH.health_min_failed_jobs
    assert len(verdict.unhealthy) < len(workers)


def test_a_run_succeeding_after_the_mark_clears_it() -> None:
    """A run that was already there when the worker was marked (or its probe) succeeds: the
    mark is cleared, saying why."""
    verdict = judge_health(
        [runs("w-bad", "SFFFF", after_mark=1, unhealthy=True), runs("w-1", "SSSS", first_job=10)], HEALTH
    )
    (change,) = verdict.changes
    assert (change.worker_id, change.unhealthy) == ("w-bad", False)
    assert change.reason == "a run succeeded there after the mark (job 1)"
    assert verdict.unhealthy == ()


def test_a_run_failing_after_the_mark_renews_it() -> None:
    """A probe (or a run already there) that fails after the mark marks the worker again: its
    next probe waits anew."""
    verdict = judge_health(
        [
            runs("w-bad", "FFFF", after_mark=1, unhealthy=True, elsewhere="ssss"),
            runs("w-1", "SSSS", first_job=10),
        ],
        HEALTH,
    )
    (change,) = verdict.changes
    assert (change.unhealthy, change.renewed) == (True, True)
    assert change.reason.startswith("unhealthy: 4 of the last 4 runs failed")


def test_a_probe_failing_as_its_siblings_do_elsewhere_neither_renews_nor_clears() -> None:
    """A probe of a batch that fails everywhere says nothing of the worker: its mark stands and
    its next probe is not pushed back."""
    bad = runs("w-bad", "FFFF", unhealthy=True, elsewhere="-sss")
    probe = attrs.evolve(bad.runs[0], after_mark=True, array_id=9)
    verdict = judge_health(
        [
            attrs.evolve(bad, runs=(probe, *bad.runs[1:])),
            runs("w-1", "FSSS", first_job=10, array_id=9),
        ],
        HEALTH,
    )
    assert verdict.changes == ()
    assert verdict.unhealthy == ("w-bad",)


def test_a_mark_stands_while_nothing_ran_there_since() -> None:
    """No run ended after the mark and the worker still stands out: nothing changes, also once
    its runs have aged out of the window (only a probe, or an uncordon, clears it then)."""
    assert (
        judge_health(
            [runs("w-bad", "FFFF", unhealthy=True), runs("w-1", "SSSS", first_job=9)], HEALTH
        ).changes
        == ()
    )
    assert (
        judge_health([runs("w-bad", "", unhealthy=True), runs("w-1", "SSSS", first_job=9)], HEALTH).changes
        == ()
    )
    assert (
        judge_health(
            [runs("w-bad", "F", after_mark=1, unhealthy=True, elsewhere="s"), runs("w-1", "S", first_job=9)],
            HEALTH,
        )
        .changes[0]
        .renewed
    )


def test_a_mark_is_cleared_once_its_jobs_fail_on_the_other_workers_too() -> None:
    """A worker marked while its jobs failed first there: once the same jobs fail on the other
    workers too, its failures are the jobs' and the mark is cleared."""
    verdict = judge_health(
        [
            runs("w-1", "FFF", unhealthy=True, elsewhere="fff"),
            runs("w-2", "SSSS", first_job=10),
        ],
        HEALTH,
    )
    assert cleared(verdict.changes) == {"w-1"}
    assert verdict.changes[0].reason == (
        "the jobs that failed there failed on other workers too (0 of its 3 runs failed where they did not)"
    )


def test_a_batch_failing_elsewhere_after_the_mark_does_not_clear_it() -> None:
    """The issue's F1a: a truly broken worker (its jobs succeeded elsewhere) stays marked while
    another batch fails on every other worker, however often."""
    verdict = judge_health(
        [
            runs("w-bad", "FFFF", unhealthy=True, elsewhere="ssss", every_s=1.0, newest_s=30.0),
            runs("w-1", "F" * 10, first_job=10, array_id=9, every_s=0.1),
            runs("w-2", "F" * 10, first_job=30, array_id=9, every_s=0.1),
        ],
        HEALTH,
    )
    assert verdict.changes == ()
    assert verdict.unhealthy == ("w-bad",)


def test_the_reason_quotes_at_most_200_characters_of_the_last_failure() -> None:
    """A long detail is cut."""
    (change,) = judge_health(
        [
            runs("w-1", "FFF", elsewhere="sss"),
            WorkerRuns(worker_id="w-2", version=0, runs=()),
        ],
        attrs.evolve(HEALTH),
    ).changes
    assert change.reason.endswith("last: exit code 0")
    long = WorkerRuns(
        worker_id="w-1",
        version=0,
        runs=tuple(Run(job_id=k, failed=True, detail="x" * 500, succeeded_elsewhere=True) for k in range(3)),
    )
    (change,) = judge_health([long, WorkerRuns(worker_id="w-2", version=0, runs=())], HEALTH).changes
    assert change.reason.endswith("last: " + "x" * 200)


def test_the_job_faults_are_those_the_worker_is_not_to_blame_for() -> None:
    """Timeouts, OOM kills at the job's limit, a working folder missing or closed to it and a
    command missing from its image are the job's; a failure to start (a pids limit, a cgroup, an
    image) is not in the list."""
    assert set(JOB_FAULTS) == {
        "timeout",
        "oom_killed",
        "workdir_not_found",
        "workdir_denied",
        "command_not_found",
    }


def test_health_settings_are_checked_naming_the_field() -> None:
    """A rate outside (0, 1], a factor below 1 and a minimum above the window are refused."""
    with pytest.raises(InvalidArgument, match="health_min_failure_rate"):
        ReconcilerSettings(health_min_failure_rate=0.0)
    with pytest.raises(InvalidArgument, match="health_rate_factor"):
        ReconcilerSettings(health_rate_factor=0.5)
    with pytest.raises(InvalidArgument, match="health_min_failed_jobs must be <= health_window_runs = 2"):
        ReconcilerSettings(health_window_runs=2, health_min_failed_jobs=3)
    with pytest.raises(InvalidArgument, match="health_probe_after_s"):
        ReconcilerSettings(health_probe_after_s=-1.0)
    with pytest.raises(InvalidArgument, match="health_min_compared_runs"):
        ReconcilerSettings(health_min_compared_runs=0)
    with pytest.raises(InvalidArgument, match="trial_run_s"):
        PlacerSettings(trial_run_s=-1.0)


# ---------------------------------------------------------------- the round


def live(
    worker_id: str,
    cpu_millis: int = 4000,
    *,
    unhealthy: bool = False,
    probe_due: bool = False,
    trial: bool = False,
    allocated: int = 0,
    port: int = 1,
) -> LiveWorker:
    return LiveWorker(
        ref=WorkerRef(worker_id=worker_id, address=f"127.0.0.1:{port}", incarnation=port),
        room=WorkerRoom(
            worker_id=worker_id, cpu_millis=cpu_millis, memory_mb=8192, cpu_allocated_millis=allocated
        ),
        unhealthy=unhealthy,
        probe_due=probe_due,
        trial=trial,
    )


def queue_of(*jobs: PendingJob) -> PendingQueue:
    queue = PendingQueue()
    queue.replace(list(jobs))
    return queue


def job(job_id: int, cpu: int = 100, *failed_on: str) -> PendingJob:
    return PendingJob(job_id=job_id, cpu_millis=cpu, memory_mb=10, failed_on=failed_on)


@given(
    st.lists(st.tuples(st.integers(100, 8000), st.booleans(), st.booleans()), min_size=1, max_size=6),
    st.lists(st.integers(1, 9000), max_size=30),
)
def test_a_round_places_on_an_unhealthy_worker_only_its_due_probe(
    workers: list[tuple[int, bool, bool]], sizes: list[int]
) -> None:
    """Whatever the workers and jobs, an unhealthy worker gets nothing unless its probe is due,
    and then one job at most (it holds none); every unschedulable reason names the unhealthy
    workers it did not count."""
    workers_ = [
        live(f"w-{i}", cpu, unhealthy=u, probe_due=p, port=i + 1) for i, (cpu, u, p) in enumerate(workers)
    ]
    plan = plan_round(
        queue_of(*(job(k, s) for k, s in enumerate(sizes, 1))), workers_, PLACER, max_rows=500, now=0.0
    )
    per_worker: dict[str, int] = {}
    for p in plan.placements:
        per_worker[p.worker_id] = per_worker.get(p.worker_id, 0) + 1
    left_out = [w.ref.worker_id for w in workers_ if w.unhealthy and not w.probe_due]
    for w in workers_:
        if w.unhealthy:
            assert per_worker.get(w.ref.worker_id, 0) <= (1 if w.probe_due else 0)
    for _, reason in plan.reasons:
        if reason and left_out:
            assert "unhealthy " + left_out[0] in reason


def test_a_due_probe_waits_while_the_worker_still_holds_a_job() -> None:
    """An unhealthy worker whose probe is due takes one job while it holds none, none while it
    holds one (the probe, or a run from before its mark), and a healthy worker its window."""
    assert probe_limit(live("w-1", unhealthy=True, probe_due=True), 16) == 1
    assert probe_limit(live("w-1", unhealthy=True, probe_due=True, allocated=100), 16) == 0
    assert probe_limit(live("w-1", unhealthy=True), 16) == 0
    assert probe_limit(live("w-1"), 16) == 16


def test_a_worker_on_trial_takes_one_job_at_a_time() -> None:
    """A worker on trial (new, re-registered, or its mark cleared, and nothing succeeded there
    since) takes one job while it holds none, none while it holds one; an unhealthy worker's
    rule is unchanged by a trial."""
    assert probe_limit(live("w-1", trial=True), 16) == 1
    assert probe_limit(live("w-1", trial=True, allocated=100), 16) == 0
    assert probe_limit(live("w-1", trial=True, unhealthy=True), 16) == 0
    assert probe_limit(live("w-1", trial=True, unhealthy=True, probe_due=True), 16) == 1


@given(
    st.lists(st.tuples(st.integers(100, 8000), st.booleans(), st.integers(0, 1)), min_size=1, max_size=6),
    st.lists(st.integers(1, 9000), max_size=30),
)
def test_a_round_places_at_most_one_job_on_a_worker_on_trial_and_none_while_it_holds_one(
    workers: list[tuple[int, bool, int]], sizes: list[int]
) -> None:
    """The issue's F1b: whatever the workers and jobs, a worker on trial beside a proven one gets
    at most one job in a round, and none while it holds one: it cannot swallow a burst."""
    workers_ = [
        live(f"w-{i}", cpu, trial=trial, allocated=100 * holds, port=i + 1)
        for i, (cpu, trial, holds) in enumerate(workers)
    ]
    plan = plan_round(
        queue_of(*(job(k, s) for k, s in enumerate(sizes, 1))), workers_, PLACER, max_rows=500, now=0.0
    )
    proven = any(not w.trial for w in workers_)
    for w in workers_:
        if w.trial and proven:
            placed = sum(1 for p in plan.placements if p.worker_id == w.ref.worker_id)
            assert placed <= (0 if w.room.cpu_allocated_millis else 1)


def test_a_new_worker_beside_a_proven_one_takes_one_job_but_a_cluster_of_new_ones_is_not_held_back() -> None:
    """Best fit would fill the tightest worker at once; on trial, the new one takes one job and
    the proven one the rest. When every worker is new there is nowhere better to go: none is
    held back."""
    queue = queue_of(*(job(k, 100) for k in range(1, 9)))
    plan = plan_round(
        queue, [live("w-new", 1000, trial=True), live("w-old", 8000, port=2)], PLACER, max_rows=500, now=0.0
    )
    assert sum(p.worker_id == "w-new" for p in plan.placements) == 1
    assert len(plan.placements) == 8
    plan = plan_round(
        queue,
        [live("w-1", 1000, trial=True), live("w-2", 8000, trial=True, port=2)],
        PLACER,
        max_rows=500,
        now=0.0,
    )
    assert sum(p.worker_id == "w-1" for p in plan.placements) == 8


def test_a_job_only_an_unhealthy_worker_could_hold_says_so() -> None:
    """The reason of a job too large for the healthy workers names the unhealthy one left out."""
    plan = plan_round(
        queue_of(job(1, 6000)),
        [live("w-1", 8000, unhealthy=True), live("w-2", 4000, port=2)],
        PLACER,
        max_rows=500,
        now=0.0,
    )
    assert plan.reasons == (
        (1, "unschedulable: needs 6000 cpu_millis, largest worker has 4000 (not counting unhealthy w-1)"),
    )
    assert not_counting_cordoned("unschedulable: x", ("w-1",), ("w-2", "w-3")) == (
        "unschedulable: x (not counting cordoned w-1; unhealthy w-2, w-3)"
    )


def test_a_retry_goes_elsewhere_than_where_it_failed_even_if_that_is_the_best_fit() -> None:
    """The job failed on w-1, the tightest fit: it goes to w-2."""
    rooms = [
        WorkerRoom(worker_id="w-1", cpu_millis=1000, memory_mb=1000),
        WorkerRoom(worker_id="w-2", cpu_millis=8000, memory_mb=8000),
    ]
    assert place_queue(queue_of(job(1, 500, "w-1")), rooms).placements == ((1, "w-2"),)


def test_a_retry_waits_for_another_worker_rather_than_go_back_where_it_failed() -> None:
    """The only free room is where it failed, and another worker could hold it once it has
    room: it is not placed now."""
    rooms = [
        WorkerRoom(worker_id="w-1", cpu_millis=1000, memory_mb=1000),
        WorkerRoom(worker_id="w-2", cpu_millis=1000, memory_mb=1000, cpu_allocated_millis=1000),
    ]
    assert place_queue(queue_of(job(1, 500, "w-1")), rooms).placements == ()


def test_a_retry_that_failed_wherever_it_could_run_goes_back_to_one() -> None:
    """Failed on every worker that could hold it (the other is too small): placed by best fit
    among those (a soft preference)."""
    rooms = [
        WorkerRoom(worker_id="w-1", cpu_millis=4000, memory_mb=1000),
        WorkerRoom(worker_id="w-2", cpu_millis=1000, memory_mb=1000),
    ]
    assert place_queue(queue_of(job(1, 2000, "w-1")), rooms).placements == ((1, "w-1"),)


def test_a_retry_held_back_says_it_waits_for_a_worker_where_it_has_not_failed() -> None:
    """Only w-1, where it failed, has room: the round stores why the job waits; once w-2 has
    room it is placed there."""
    queue = queue_of(job(1, 500, "w-1"))
    busy = [live("w-1", 1000), live("w-2", 1000, allocated=1000, port=2)]
    plan = plan_round(queue, busy, PLACER, max_rows=500, now=0.0)
    assert (plan.placements, plan.reasons) == (
        (),
        ((1, "waiting for a worker where it has not failed (failed on w-1)"),),
    )
    queue.reasons.update(dict(plan.reasons))
    plan = plan_round(queue, [live("w-1", 1000), live("w-2", 1000, port=2)], PLACER, max_rows=500, now=0.0)
    assert [(p.job_id, p.worker_id) for p in plan.placements] == [(1, "w-2")]
    assert plan.reasons == ()  # the placement's claim clears it (COMMIT_PLACEMENTS)


@given(
    st.lists(st.integers(500, 4000), min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(1, 4000), st.sets(st.integers(0, 4))), max_size=20),
)
def test_a_retry_goes_back_where_it_failed_only_when_no_other_worker_could_hold_it(
    capacities: list[int], jobs: list[tuple[int, set[int]]]
) -> None:
    """Whatever the workers and the jobs' past failures, a job placed on a worker where it
    failed could be held (by capacity) by no worker where it did not fail."""
    rooms = [WorkerRoom(worker_id=f"w-{i}", cpu_millis=c, memory_mb=1000) for i, c in enumerate(capacities)]
    pending = [job(k, cpu, *(f"w-{i}" for i in failed)) for k, (cpu, failed) in enumerate(jobs, 1)]
    by_id = {j.job_id: j for j in pending}
    for job_id, worker_id in place_queue(queue_of(*pending), rooms).placements:
        j = by_id[job_id]
        if worker_id in j.failed_on:
            assert not any(r.cpu_millis >= j.cpu_millis for r in rooms if r.worker_id not in j.failed_on)


def test_the_queue_keeps_where_its_jobs_failed_until_they_leave_it() -> None:
    """Read in full or added, a job's failed_on is kept with it, and dropped when it is removed."""
    queue = queue_of(job(1, 100, "w-1"), job(2))
    queue.add([job(3, 100, "w-2", "w-3")])
    assert queue.failed_on == {1: ("w-1",), 3: ("w-2", "w-3")}
    assert [j.failed_on for j in queue.jobs()] == [("w-1",), (), ("w-2", "w-3")]
    queue.remove([1])
    assert queue.failed_on == {3: ("w-2", "w-3")}
    assert attrs.evolve(job(4), failed_on=("w-9",)).failed_on == ("w-9",)


# ---------------------------------------------------------------- what status shows


REASON = "unhealthy: 8 of the last 8 runs failed (other workers: 1 of 40), last: exit code 2"


def status_reply() -> pb.StatusReply:
    return pb.StatusReply(
        leader="cp-1",
        epoch=1,
        answered_by="cp-1",
        workers=[
            pb.WorkerInfo(id="w-1", state="alive", cpu_millis=4000, memory_mb=4096),
            pb.WorkerInfo(
                id="w-bad",
                state="alive",
                cpu_millis=4000,
                memory_mb=4096,
                unhealthy=True,
                unhealthy_reason=REASON,
                unhealthy_since_unix_s=1.7e9,
            ),
        ],
    )


def test_status_shows_an_unhealthy_worker_its_reason_and_since_when() -> None:
    """The typed status carries the mark; the text view says `unhealthy` in the state column
    and lists why under "unhealthy workers"; --json has the three keys (null when healthy)."""
    status = status_from_pb(status_reply())
    healthy, sick = status.workers
    assert (healthy.unhealthy, healthy.unhealthy_reason, healthy.unhealthy_since_unix_s) == (False, "", None)
    assert (sick.unhealthy, sick.unhealthy_reason, sick.unhealthy_since_unix_s) == (True, REASON, 1.7e9)
    console = Console(width=200, record=True)
    console.print(render_status(status))
    text = console.export_text()
    assert "alive, unhealthy" in text and "unhealthy workers" in text and REASON in text
    shown = status_json(status)["workers"]
    assert [(w["unhealthy"], w["unhealthy_reason"], w["unhealthy_since_unix_s"]) for w in shown] == [
        (False, None, None),
        (True, REASON, 1.7e9),
    ]


def test_status_shows_an_unschedulable_gang_once_with_its_size() -> None:
    """An unschedulable gang (listed once, by its id) reads ``118 (gang of 8)``; a single job
    its id alone."""
    reply = status_reply()
    reason = "unschedulable: needs 2 gpu, no worker offers gpu"
    gang = pb.JobGang(gang_id=118, rank=0, size=8, state="live")
    reply.unschedulable = [
        pb.JobInfo(job_id=118, state="pending", reason=reason, gang=gang),
        pb.JobInfo(job_id=130, state="pending", reason=reason),
    ]
    console = Console(width=200, record=True)
    console.print(render_status(status_from_pb(reply)))
    rows = [line.split() for line in console.export_text().splitlines() if reason in line]
    assert [row[: row.index("unschedulable:")] for row in rows] == [["118", "(gang", "of", "8)"], ["130"]]


def test_status_shows_an_ipv6_address_as_it_is_not_as_markup() -> None:
    """An IPv6 control plane's ``[fe80::1]:7000`` reads as it is: rich would take a str cell's
    ``[fe80::1]`` for a markup tag and show ``:7000``."""
    reply = status_reply()
    reply.control_planes = [pb.ControlPlaneInfo(id="cp-1", address="[fe80::1]:7000", role="leader")]
    console = Console(width=200, record=True)
    console.print(render_status(status_from_pb(reply)))
    assert "[fe80::1]:7000" in console.export_text()


@pytest.mark.parametrize("width", [100, 120, 160])
def test_a_busy_workers_table_keeps_ids_bars_labels_and_addresses_whole(width: int) -> None:
    """At 100 to 160 columns, with usage, a dozen jobs and metrics addresses, every label and
    address is shown whole on a line of its own (rich folded them mid-word at 120, the width
    of piped output, and cut addresses to ``127.0.0.1:318…``), and so is every bar."""
    reply = status_reply()
    labels = {"container": "docker", "resources": "cgroup1"}
    usage = pb.UsageNow(cpu_millis=1930, memory_mb=41, age_s=3.0)
    reply.workers = [
        pb.WorkerInfo(
            id=f"w-{n}", state="alive", cpu_millis=4000 * n, memory_mb=8192 * n,
            cpu_allocated_millis=1500 * n, labels=labels, usage=usage,
            job_ids=list(range(100 * n, 100 * n + 12)),
        )
        for n in range(1, 6)
    ]  # fmt: skip
    metrics = {f"w-{n}": f"127.0.0.1:3{n}869" for n in range(1, 6)}
    console = Console(width=width, record=True)
    console.print(render_status(status_from_pb(reply), metrics))
    cells = [cell for line in console.export_text().splitlines() for cell in line.split()]
    for whole in ("container=docker", "resources=cgroup1", *metrics.values(), "1500/4000", "█████░░░░░░░░░"):
        assert whole in cells, (width, whole)


def test_a_healthy_cluster_shows_no_unhealthy_table() -> None:
    """No worker marked: no "unhealthy workers" table."""
    reply = status_reply()
    reply.workers = reply.workers[:1]
    console = Console(width=200, record=True)
    console.print(render_status(status_from_pb(reply)))
    assert "unhealthy" not in console.export_text()


def test_cordon_and_drain_lines_add_the_workers_health() -> None:
    """The one line the worker commands print ends with the mark's reason when it has one."""
    common = {"draining": False, "drained": False, "drain_deadline_unix_s": 0.0, "job_ids": []}
    assert schedule_line("w-bad", cordoned=True, unhealthy_reason=REASON, **common) == (  # type: ignore[arg-type]
        f"w-bad: cordoned, no new placements; no job there; {REASON}"
    )
    assert schedule_line("w-bad", cordoned=False, unhealthy_reason=REASON, **common) == (  # type: ignore[arg-type]
        f"w-bad: not cordoned; {REASON}"
    )
    reply = pb.WorkerScheduleReply(worker_id="w-bad", unhealthy=True, unhealthy_reason=REASON)
    assert schedule_from_pb(reply).unhealthy_reason == REASON

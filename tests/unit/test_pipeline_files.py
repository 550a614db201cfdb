"""Pipelines: jobs of one batch (a job file, a SubmitJobs) naming each other in ``after``, the
order they are stored in, and the refusals (a cycle named, an unknown name, a name two jobs
share) with the file's line (runtime.validation.pipeline_order, ops.jobfile)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from ops.jobfile import read_job_file
from ops.jobfile_syntax import JobFileError
from runtime.errors import InvalidArgument
from runtime.jobs import ArrayRange, JobSpec, SleepRuntime
from runtime.validation import PipelineError, check_jobs, pipeline_order

PIPELINE = """\
[[job]]
name = "collect"
cpu_millis = 100
memory_mb = 64
command = ["sh", "-c", "cat parts/*"]
after = ["shards"]

[[job]]
name = "shards"
cpu_millis = 100
memory_mb = 64
command = ["sh", "-c", "echo $STOCKADE_ARRAY_INDEX"]
array = "0-3"
max_failed_tasks = 1
after = ["prepare", 12]

[[job]]
name = "prepare"
cpu_millis = 100
memory_mb = 64
command = ["true"]
"""


def job(name: str, *after_names: str) -> JobSpec:
    return JobSpec(
        name=name, cpu_millis=1, memory_mb=1, runtime=SleepRuntime(duration_ms=1), after_names=after_names
    )


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_pipeline_file_reads_names_ids_and_arrays(tmp_path: Path) -> None:
    """A file's ``after`` holds names of its jobs and ids of stored ones; an array sits beside
    other jobs; the order of storing puts each job after those it names."""
    specs = read_job_file(write(tmp_path, PIPELINE))
    collect, shards, prepare = specs
    assert collect.after_names == ("shards",) and collect.after == ()
    assert (shards.after_names, shards.after) == (("prepare",), (12,))
    assert (prepare.after_names, prepare.after) == ((), ())
    assert shards.array == ArrayRange(first_index=0, last_index=3, max_failed_tasks=1)
    assert pipeline_order(specs) == [2, 1, 0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[job]]\nname = "a"\nsleep_s = 1\ncpu_millis = 1\nmemory_mb = 1\nafter = ["b"]\n'
            '[[job]]\nname = "b"\nsleep_s = 1\ncpu_millis = 1\nmemory_mb = 1\nafter = ["a"]\n',
            "p.toml:6: after: cycle a -> b -> a",
        ),
        (
            'name = "a"\nsleep_s = 1\ncpu_millis = 1\nmemory_mb = 1\nafter = ["a"]\n',
            "p.toml:5: after: cycle a -> a",
        ),
        (
            '[[job]]\nname = "a"\nsleep_s = 1\ncpu_millis = 1\nmemory_mb = 1\n'
            '[[job]]\nname = "b"\nsleep_s = 1\ncpu_millis = 1\nmemory_mb = 1\nafter = ["c"]\n',
            "p.toml:11: after names 'c', which is no job of this file nor a job id",
        ),
        (
            '[[job]]\nname = "a"\nsleep_s = 1\ncpu_millis = 1\nmemory_mb = 1\n'
            '[[job]]\nname = "a"\nsleep_s = 1\ncpu_millis = 1\nmemory_mb = 1\nafter = [3]\n'
            '[[job]]\nname = "b"\nsleep_s = 1\ncpu_millis = 1\nmemory_mb = 1\nafter = ["a"]\n',
            "p.toml:7: name 'a' is job 1's too; jobs that name each other in after need names of their own",
        ),
    ],
)
def test_a_pipeline_that_does_not_resolve_is_refused_with_its_line(
    tmp_path: Path, text: str, message: str
) -> None:
    """A cycle is refused naming it, an unknown name naming it, a shared name naming both
    jobs; each at the line of the job at fault, before anything is sent."""
    with pytest.raises(JobFileError) as info:
        read_job_file(write(tmp_path, text))
    assert str(info.value).replace(str(tmp_path) + "/", "") == message


def test_same_names_are_fine_when_no_job_names_another() -> None:
    """Without names in after, a batch may hold jobs of one name (as before), in its order."""
    assert pipeline_order([job("x"), job("x"), job("x")]) == [0, 1, 2]


@st.composite
def dags(draw: st.DrawFn) -> list[JobSpec]:
    """A random batch whose jobs name only jobs of a random order before them, given shuffled."""
    count = draw(st.integers(1, 12))
    names = [f"j{i}" for i in range(count)]
    specs = []
    for i, name in enumerate(names):
        before = draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else []
        specs.append(job(name, *before))
    return draw(st.permutations(specs))


@settings(max_examples=examples(200))
@given(specs=dags())
def test_any_dag_is_accepted_in_an_order_with_every_job_after_those_it_names(specs: list[JobSpec]) -> None:
    """Any acyclic batch, in any order, is accepted: the order of storing holds every job once
    and each after the jobs it names."""
    order = pipeline_order(specs)
    assert sorted(order) == list(range(len(specs)))
    place = {specs[index].name: n for n, index in enumerate(order)}
    for spec in specs:
        assert all(place[name] < place[spec.name] for name in spec.after_names)
    assert check_jobs(specs) == specs


@settings(max_examples=examples(200))
@given(specs=dags(), data=st.data())
def test_a_back_edge_closing_a_cycle_is_refused_naming_it(specs: list[JobSpec], data: st.DataObject) -> None:
    """Adding to a DAG an edge from a job to one that (directly or not) waits for it, or to
    itself, makes a cycle: refused, the cycle named from a job on it back to itself, each
    step a name the job before it lists."""
    by_name = {s.name: s for s in specs}

    def waits_for(name: str) -> set[str]:
        found: set[str] = set()
        todo = [name]
        while todo:
            for dep in by_name[todo.pop()].after_names:
                if dep not in found:
                    found.add(dep)
                    todo.append(dep)
        return found

    target = data.draw(st.sampled_from(sorted(by_name)))
    sources = sorted(n for n in by_name if target in waits_for(n) or n == target)
    source = data.draw(st.sampled_from(sources))
    changed = [
        JobSpec(**{**_fields(s), "after_names": (*s.after_names, source)}) if s.name == target else s
        for s in specs
    ]
    with pytest.raises(PipelineError) as info:
        pipeline_order(changed)
    words = info.value.words
    assert words.startswith("after: cycle ")
    cycle = words.removeprefix("after: cycle ").split(" -> ")
    assert cycle[0] == cycle[-1]
    changed_by_name = {s.name: s for s in changed}
    assert all(b in changed_by_name[a].after_names for a, b in itertools.pairwise(cycle))
    with pytest.raises(InvalidArgument, match=r"must not close a cycle \(after: cycle "):
        check_jobs(changed)


def _fields(spec: JobSpec) -> dict[str, object]:
    import attrs

    return attrs.asdict(spec, recurse=False)

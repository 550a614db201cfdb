"""The Python client's documentation: docs/client.md shows the examples the suite runs, word
for word, the examples do what the doc says, and both faces offer the same documented calls."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scripted_control_plane import ScriptedControlPlane, serve

from ops.client import AsyncioClient, AsyncioLogStream, Client, LogStream
from protocol import pb

ROOT = Path(__file__).parents[2]


def python_blocks(markdown: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)]


def test_the_docs_show_the_examples_the_suite_runs() -> None:
    """The "Python client" section's code blocks are docs/examples/client_trio.py and
    client_asyncio.py, as they are (tests/e2e/test_client_examples.py runs those files)."""
    section = (ROOT / "docs" / "client.md").read_text().split("## Python client", 1)[1]
    examples = [
        (ROOT / "docs" / "examples" / name).read_text().strip()
        for name in ("client_trio.py", "client_asyncio.py")
    ]
    assert python_blocks(section) == examples


def own_members(cls: type) -> dict[str, Any]:
    """What ``cls`` defines, with what its bases other than ``object`` define (Client's calls
    on workers and schedules are written in classes of their own)."""
    found: dict[str, Any] = {}
    for base in reversed(cls.__mro__[:-1]):
        found.update(vars(base))
    return found


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in own_members(cls).items()
        if not name.startswith("_") and callable(member) and name != "open"
    }


def test_both_faces_offer_the_same_calls_with_the_same_arguments() -> None:
    """AsyncioClient has every call of Client, with the same parameters and defaults."""
    trio_face, asyncio_face = public_methods(Client), public_methods(AsyncioClient)
    assert sorted(asyncio_face) == sorted(n for n in trio_face if n != "close")
    for name, signature in asyncio_face.items():
        assert signature.parameters == trio_face[name].parameters, name


def test_every_public_call_is_documented_with_its_errors() -> None:
    """Each public method has a docstring, and each that calls the cluster says what it raises."""
    for cls in (Client, AsyncioClient, LogStream, AsyncioLogStream):
        for name, member in own_members(cls).items():
            if name.startswith("_") or not callable(getattr(cls, name)):
                continue
            doc = inspect.getdoc(getattr(cls, name)) or ""
            assert doc, f"{cls.__name__}.{name} has no docstring"
            if name not in ("close", "aclose", "__aiter__") and inspect.iscoroutinefunction(member):
                assert "Raises:" in doc, f"{cls.__name__}.{name} does not say what it raises"


@pytest.mark.parametrize("example", ["client_trio.py", "client_asyncio.py"])
def test_each_example_prints_the_jobs_end_and_its_output(example: str, tmp_path: Path) -> None:
    """Run as a program against a scripted control plane (found through
    $STOCKADE_CONTROL_PLANES, plaintext through $STOCKADE_INSECURE), an example prints the
    job's end, then its output as the stream sent it."""
    service = ScriptedControlPlane(
        submit_job=pb.SubmitJobReply(job_id=3),
        get_job=pb.JobInfo(job_id=3, state="succeeded", has_exit_code=True, exit_code=0),
        read_job_logs=[pb.LogChunk(data=b"hello from "), pb.LogChunk(data=b"a job\n", job_ended=True)],
    )
    with serve(service) as (address,):
        env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_")}
        env.update(
            STOCKADE_CONTROL_PLANES=address,
            STOCKADE_INSECURE="1",
            STOCKADE_CONFIG=str(tmp_path / "config.toml"),
            PYTHONPATH=str(ROOT),
        )
        done = subprocess.run(
            [sys.executable, str(ROOT / "docs" / "examples" / example)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "job 3 succeeded, exit code 0\nhello from a job\n"
    assert [rpc for rpc, _ in service.requests] == ["submit_job", "get_job", "read_job_logs"]

"""`stockade submit --image`: a container job's spec as sent, and bad input refused before
anything is sent (exit 2, one line naming the field)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from ops.cli import app
from ops.cli import jobs as cli_jobs
from protocol import pb
from runtime.jobs import JobSpec
from runtime.wire_jobs import job_spec_to_pb

NOWHERE = "127.0.0.1:1"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[pb.JobSpec]:
    """The specs `submit` sends, answered with job id 5 (no cluster is called)."""
    specs: list[pb.JobSpec] = []

    def fake_submit(addresses: list[str], sent: list[JobSpec], **_: Any) -> list[int]:
        specs.extend(job_spec_to_pb(spec) for spec in sent)
        return [5]

    monkeypatch.setattr(cli_jobs, "submit_specs", fake_submit)
    return specs


def test_submit_image_sends_a_container_job_named_after_the_image(sent: list[pb.JobSpec]) -> None:
    """--image with a command after -- sends a container runtime with that argv; the default
    name is the image's repository name."""
    result = CliRunner().invoke(
        app,
        [
            "submit",
            "--cpu-millis",
            "500",
            "--memory-mb",
            "64",
            "--image",
            "reg.example:5000/team/app:1.2",
            "--control-planes",
            NOWHERE,
            "--",
            "python3",
            "-c",
            "print(1)",
        ],
    )
    assert result.exit_code == 0, result.output
    (spec,) = sent
    assert spec.container == pb.ContainerRuntime(
        image="reg.example:5000/team/app:1.2", argv=["python3", "-c", "print(1)"]
    )
    assert spec.name == "app" and spec.command is None and spec.sleep is None


def test_submit_image_without_a_command_runs_the_images_own(sent: list[pb.JobSpec]) -> None:
    """--image alone: an empty argv (the image's own command)."""
    result = CliRunner().invoke(
        app,
        ["submit", "--cpu-millis", "10", "--memory-mb", "6", "--image", "app", "--control-planes", NOWHERE],
    )
    assert result.exit_code == 0, result.output
    assert sent[0].container == pb.ContainerRuntime(image="app", argv=[])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--image", "../etc", "--", "true"], "--image must be an image reference, not a path"),
        (["--image", "App:1"], "--image must be a Docker image reference"),
        (["--image", "app;id"], "--image must not contain shell metacharacters (;)"),
        (
            ["--image", "app", "--sleep-s", "1"],
            "give --image IMAGE [-- CMD ARGS...] or --sleep-s SECONDS, not both",
        ),
    ],
)
def test_bad_container_submissions_are_refused_before_sending(
    sent: list[pb.JobSpec], args: list[str], message: str
) -> None:
    """A bad image, or --image with --sleep-s, exits 2 naming the rule; nothing is sent."""
    result = CliRunner().invoke(
        app, ["submit", "--cpu-millis", "1", "--memory-mb", "1", "--control-planes", NOWHERE, *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert sent == []

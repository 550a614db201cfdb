"""The CLI's idempotency keys: checked before anything is sent, and named when a mutating
command ends without an answer, so running it again with that key cannot do it twice."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, EXIT_UNAVAILABLE, app
from ops.cli.common import batch_keys
from ops.config import INSECURE_ENV
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument, Unavailable

SUBMIT = ["submit", "--cpu-millis", "100", "--memory-mb", "10", "--sleep-s", "1"]
NOWHERE = ["--control-planes", "127.0.0.1:1"]


@pytest.fixture(autouse=True)
def _plaintext_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """These commands call addresses where nothing, or a plaintext fake, listens."""
    monkeypatch.setenv(INSECURE_ENV, "1")


@pytest.fixture
def silent_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every control plane takes the connection and never answers: the call's outcome is unknown."""

    async def silent(
        self: ControlPlaneClient, index: int, rpc: str, request: object, *, timeout_s: float
    ) -> None:
        raise Unavailable(f"{self.addresses[index]} did not answer within {timeout_s:g} s")

    monkeypatch.setattr(ControlPlaneClient, "_attempt", silent)


@pytest.mark.parametrize("command", [[*SUBMIT, *NOWHERE], ["cancel", "3", *NOWHERE], ["jobs", "2", *NOWHERE]])
def test_a_mutating_command_without_an_answer_names_its_key(
    command: list[str], silent_replicas: None
) -> None:
    """No control plane answered: the error names the key to run the command again with."""
    result = CliRunner().invoke(app, [*command, "--idempotency-key", "key-7"])
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "127.0.0.1:1 did not answer within" in result.output
    assert "the same command with --idempotency-key key-7 returns that answer" in result.output


def test_a_drawn_key_is_named_too(silent_replicas: None) -> None:
    """Without --idempotency-key the command draws a key, and names that one."""
    result = CliRunner().invoke(app, [*SUBMIT, *NOWHERE])
    assert result.exit_code == EXIT_UNAVAILABLE
    key = result.output.split("--idempotency-key ", 1)[1].split()[0]
    assert len(key) == 36 and key.count("-") == 4


def test_a_command_every_replica_refused_names_no_key() -> None:
    """Every connection was refused: nothing was sent, so there is no answer to recover and
    no key to name."""
    result = CliRunner().invoke(app, [*SUBMIT, *NOWHERE, "--idempotency-key", "key-7"])
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "nothing was sent" in result.output
    assert "key-7" not in result.output


def test_a_bad_key_is_refused_before_anything_is_sent() -> None:
    """An empty key exits 2 naming the field (the control-plane address is never asked)."""
    result = CliRunner().invoke(app, [*SUBMIT, *NOWHERE, "--idempotency-key", ""])
    assert result.exit_code == EXIT_INVALID
    assert "idempotency_key must not be empty" in result.output


def test_each_batch_of_one_submission_has_a_key_of_its_own() -> None:
    """One batch sends the key; more send key/1, key/2, ...; a key too long to extend is refused."""
    assert batch_keys("k", 1) == ["k"]
    assert batch_keys("k", 3) == ["k/1", "k/2", "k/3"]
    with pytest.raises(InvalidArgument, match="idempotency_key must be at most 128 bytes"):
        batch_keys("k" * 127, 2)

"""The fence rule between the settings: a fenced write's longest hold of the lease's share lock
against the step-down margin, checked where the settings live together
(ControlPlaneSettings)."""

from __future__ import annotations

import pytest

from runtime.errors import InvalidArgument
from runtime.settings.control_plane import ControlPlaneSettings
from runtime.settings.leader import (
    LeaseSettings,
    LedgerSettings,
    PlacerSettings,
)


def control_plane(**groups: object) -> ControlPlaneSettings:
    return ControlPlaneSettings(cp_id="cp-1", database_url="postgresql://x/y", **groups)  # type: ignore[arg-type]


def test_the_defaults_keep_a_fenced_write_within_the_step_down_margin() -> None:
    """By default a fenced write holds the share lock at most 2 x 0.2 s = 0.4 s, no more than
    the 0.4 s step-down margin; a round's placements and any fenced write hold at most 500
    rows."""
    settings = control_plane()
    assert settings.ledger.longest_share_lock_hold_s == pytest.approx(0.4)
    assert settings.ledger.longest_share_lock_hold_s <= settings.lease.step_down_margin_s
    assert settings.placer.max_placements_per_round == settings.ledger.max_rows_per_fenced_write == 500


def test_a_hold_longer_than_the_step_down_margin_is_refused() -> None:
    """With a 0.3 s step-down margin the default 0.2 s ledger statement timeout (0.4 s hold) is
    refused; 0.15 s fits."""
    with pytest.raises(
        InvalidArgument,
        match=r"ledger.statement_timeout_s must be <= "
        r"lease.step_down_margin_s / 2 = 0.15: .*, got 0.2",
    ):
        control_plane(lease=LeaseSettings(step_down_margin_s=0.3))
    control_plane(
        lease=LeaseSettings(step_down_margin_s=0.3), ledger=LedgerSettings(statement_timeout_s=0.15)
    )


def test_a_round_larger_than_one_fenced_write_is_refused() -> None:
    """2,000 placements per round with at most 500 rows per fenced write: refused."""
    with pytest.raises(
        InvalidArgument,
        match=r"placer.max_placements_per_round must be <= ledger.max_rows_per_fenced_write = 500 .*got 2000",
    ):
        control_plane(placer=PlacerSettings(max_placements_per_round=2000))
    control_plane(
        placer=PlacerSettings(max_placements_per_round=2000),
        ledger=LedgerSettings(max_rows_per_fenced_write=2000),
    )

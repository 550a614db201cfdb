"""Preemption's settings (runtime/settings/leader.py): off by default, bad values refused
naming the field, the value and the limit, and one grace for the placer and the reconciler."""

from __future__ import annotations

import math
import re

import pytest

from runtime.errors import InvalidArgument
from runtime.settings.control_plane import ControlPlaneSettings
from runtime.settings.leader import PlacerSettings, ReconcilerSettings


def test_preemption_is_off_by_default() -> None:
    """A placer preempts nothing unless asked; the defaults are 5 s grace, 60 s cooldown, 8 per round."""
    s = PlacerSettings()
    assert (s.preemption, s.preempt_grace_s, s.preempt_cooldown_s, s.max_preemptions_per_round) == (
        False,
        5.0,
        60.0,
        8,
    )
    assert ReconcilerSettings().preempt_grace_s == 5.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("preempt_grace_s", 0.0, "preempt_grace_s must be a finite number > 0 and <= 600, got 0.0"),
        ("preempt_grace_s", 601.0, "preempt_grace_s must be a finite number > 0 and <= 600, got 601.0"),
        ("preempt_grace_s", math.inf, "preempt_grace_s must be a finite number > 0 and <= 600, got inf"),
        (
            "preempt_cooldown_s",
            -1.0,
            "preempt_cooldown_s must be a finite number >= 0 and <= 86400, got -1.0",
        ),
        # The database's interval arithmetic overflowed past about 1e11 s, and the placer gave up.
        (
            "preempt_cooldown_s",
            1e300,
            "preempt_cooldown_s must be a finite number >= 0 and <= 86400, got 1e+300",
        ),
        (
            "fair_share_half_life_s",
            1e300,
            "fair_share_half_life_s must be a finite number >= 0 and <= 3.1536e+07, got 1e+300",
        ),
        ("fair_share_half_life_s", -1.0, "fair_share_half_life_s must be a finite number >= 0"),
        ("max_preemptions_per_round", 0, "max_preemptions_per_round"),
        ("max_preemptions_per_round", 501, "max_preemptions_per_round"),
    ],
)
def test_bad_values_are_refused_naming_field_value_and_limit(field: str, value: float, message: str) -> None:
    """Each bad value is refused with the field, the value and the rule."""
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        PlacerSettings(**{field: value})


def test_the_placer_and_the_reconciler_share_one_grace() -> None:
    """A control plane whose placer holds a worker for another grace than the reconciler asks
    is refused, naming both."""
    with pytest.raises(
        InvalidArgument, match=re.escape("reconciler.preempt_grace_s must be placer.preempt_grace_s = 5")
    ):
        ControlPlaneSettings(
            cp_id="cp-1", database_url="postgresql://x/y", reconciler=ReconcilerSettings(preempt_grace_s=9.0)
        )

"""Each switching criterion fires on a synthetic loss curve where it should, and not where it should not."""
from __future__ import annotations

import numpy as np
import pytest

from psbench.systems.switch.criteria import FixedPoint, LossPlateau, LossVariance, Observation, describe, parse_criterion
from psbench.core.errors import ConfigError


def _first_switch(criterion, losses, steps_per_epoch: int = 50) -> int | None:
    for step, loss in enumerate(losses, start=1):
        if criterion.should_switch(Observation(step, steps_per_epoch, len(losses), float(loss))):
            return step
    return None


def _decaying_then_flat(n: int = 400, knee: int = 200, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    clean = np.where(t < knee, 2.0 * np.exp(-t / 40.0) + 0.3, 2.0 * np.exp(-knee / 40.0) + 0.3)
    return clean * (1 + 0.01 * rng.standard_normal(n))


def test_fixed_point_fires_exactly_at_the_epoch_or_fraction() -> None:
    losses = np.ones(300)
    assert _first_switch(FixedPoint(epoch=2), losses, steps_per_epoch=50) == 100
    assert _first_switch(FixedPoint(fraction=0.25), losses) == 75
    assert _first_switch(FixedPoint(epoch=10), losses, steps_per_epoch=50) is None


def test_plateau_fires_after_the_knee_and_not_while_the_loss_still_falls() -> None:
    losses = _decaying_then_flat()
    step = _first_switch(LossPlateau(window=20, threshold=0.01), losses)
    assert step is not None and 150 <= step <= 260
    still_falling = 2.0 * np.exp(-np.arange(150) / 60.0) + 0.3
    assert _first_switch(LossPlateau(window=20, threshold=0.01), still_falling) is None


def test_variance_fires_on_a_flat_noisy_loss_and_not_on_a_steep_one() -> None:
    flat = 0.5 * (1 + 0.01 * np.random.default_rng(1).standard_normal(100))
    assert _first_switch(LossVariance(window=20, threshold=0.05), flat) == 20
    steep = np.linspace(2.0, 0.2, 100)
    assert _first_switch(LossVariance(window=20, threshold=0.05), steep) is None


def test_parse_and_describe_round_trip_for_the_manifest() -> None:
    c = parse_criterion("plateau:window=30,threshold=0.02")
    assert isinstance(c, LossPlateau) and describe(c) == {"window": 30, "threshold": 0.02, "alpha": 0.2,
                                                          "kind": "plateau"}
    assert describe(parse_criterion("fixed:fraction=0.5"))["fraction"] == 0.5


@pytest.mark.parametrize("text, message", [
    ("sometime", "unknown switch criterion"),
    ("fixed:", "exactly one of epoch"),
    ("fixed:epoch=1,fraction=0.5", "exactly one of epoch"),
    ("plateau:window=1", "window must be >= 2"),
    ("plateau:window=x", "window must be a number"),
    ("variance:speed=3", "parameters allowed: window, threshold"),
    ("fixed:fraction=2", "fraction must be in"),
])
def test_bad_criteria_are_clear_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_criterion(text)

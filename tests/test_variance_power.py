"""bench/report/variance_power.py: the sharding design's power and the paper's 5-run design under
no effect, checked against the F distribution's own figures and by simulation."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from psbench.bench.report import variance_power as vp


def test_the_papers_ratios_under_no_effect():
    # F(4, 4): what 5 runs a side give; the figures the sharding issue states
    assert sps.f.ppf(0.95, 4, 4) == pytest.approx(6.39, abs=0.005)
    assert sps.f.ppf(0.99, 4, 4) == pytest.approx(15.98, abs=0.005)
    assert vp.null_tail(8.48, 5, 5) == pytest.approx(0.031, abs=0.0005)
    assert vp.null_tail(6.11, 5, 5) == pytest.approx(0.054, abs=0.0005)
    assert vp.largest_of(vp.null_tail(8.48, 5, 5), 12) == pytest.approx(0.31, abs=0.005)
    text = vp.paper_design_text()
    assert "F(4, 4)" in text and "P(F ≥ 8.48) = 0.031" in text and "largest of 12" in text


def test_simulated_largest_matches_the_formula_when_comparisons_are_independent():
    # one strategy per "data set": no shared baseline, so the k ratios are independent
    p = vp.null_tail(8.48, 5, 5)
    assert vp.largest_of_simulated(8.48, 5, datasets=12, strategies=1, reps=100_000) == \
        pytest.approx(vp.largest_of(p, 12), abs=0.01)
    # a shared baseline correlates the ratios: the largest reaches a bar less often than 12 independent ones
    assert vp.largest_of_simulated(8.48, 5, datasets=3, strategies=4) < vp.largest_of(p, 12)


@pytest.mark.parametrize("n, alpha", [(5, 0.05), (20, 0.05 / 8)])
def test_detectable_ratio_has_the_stated_power_and_level(n, alpha):
    rng = np.random.default_rng(1)
    reps, df = 40_000, n - 1
    bar = sps.f.ppf(1 - alpha, df, df)

    def rejections(true_ratio: float) -> float:
        base = true_ratio * rng.chisquare(df, reps) / df
        other = rng.chisquare(df, reps) / df
        return float((base / other > bar).mean())

    assert rejections(vp.detectable_ratio(n, n, alpha)) == pytest.approx(vp.POWER, abs=0.01)
    assert rejections(1.0) == pytest.approx(alpha, abs=0.004)


def test_seeds_for_is_the_smallest_that_detects_the_effect():
    need = vp.seeds_for(2.0, 0.05 / 8)
    assert vp.detectable_ratio(need, need, 0.05 / 8) <= 2.0 < vp.detectable_ratio(need - 1, need - 1, 0.05 / 8)
    assert vp.seeds_for(2.0) < need  # a correction costs seeds
    assert vp.seeds_for(1.0001) is None  # no design in reach separates a ratio this close to 1

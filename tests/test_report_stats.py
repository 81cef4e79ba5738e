"""The report's statistics on samples whose answers are known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from psbench.bench.report.stats import (bootstrap_ci, holm, mlperf_time_to_target, ratio_ci, variance_ratio)


def test_bootstrap_ci_brackets_the_mean_and_is_reproducible():
    x = [10.0, 11.0, 12.0, 13.0, 14.0]
    ci = bootstrap_ci(x)
    assert ci.n == 5 and ci.estimate == pytest.approx(12.0)
    assert ci.lo < 12.0 < ci.hi
    assert 10.0 <= ci.lo and ci.hi <= 14.0  # a resampled mean cannot leave the data's range
    assert bootstrap_ci(x) == ci  # fixed RNG seed: the same records give the same interval


def test_bootstrap_ci_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = sum(bootstrap_ci(rng.normal(5.0, 1.0, 40), n_boot=2000).contains(5.0) for _ in range(200))
    assert 0.88 <= hits / 200 <= 0.99  # percentile bootstrap, n=40: close to nominal


def test_bootstrap_ci_narrows_with_more_runs_and_handles_tiny_samples():
    rng = np.random.default_rng(1)
    wide, narrow = bootstrap_ci(rng.normal(0, 1, 5)), bootstrap_ci(rng.normal(0, 1, 500))
    assert narrow.hi - narrow.lo < wide.hi - wide.lo
    one = bootstrap_ci([3.0, float("nan")])
    assert one.n == 1 and one.estimate == 3.0 and math.isnan(one.lo) and math.isnan(one.hi)
    assert bootstrap_ci([]).n == 0
    med = bootstrap_ci([1.0, 2.0, 100.0], statistic="median")
    assert med.estimate == 2.0


def test_ratio_ci_of_a_speedup():
    fast, slow = [200.0, 210.0, 190.0, 205.0], [100.0, 102.0, 98.0]
    ci = ratio_ci(fast, slow)
    assert ci.estimate == pytest.approx(np.mean(fast) / np.mean(slow))
    assert ci.n == 3 and 1.8 < ci.lo < ci.estimate < ci.hi < 2.2


def test_variance_ratio_finds_a_large_ratio():
    rng = np.random.default_rng(7)
    noisy, calm = rng.normal(0.8, 0.05, 12), rng.normal(0.8, 0.01, 12)  # true ratio 25
    vr = variance_ratio(noisy, calm)
    assert vr.ratio == pytest.approx(noisy.var(ddof=1) / calm.var(ddof=1))
    assert vr.lo > 1 and vr.lo < vr.ratio < vr.hi
    assert vr.p_brown_forsythe < 0.05 and vr.p_f < 0.05


def test_variance_ratio_of_alike_groups_rejects_at_about_the_nominal_rate():
    rng = np.random.default_rng(3)
    tests = [variance_ratio(rng.normal(0, 1, 10), rng.normal(0, 1, 10), n_boot=1000) for _ in range(300)]
    false_f = np.mean([t.p_f < 0.05 for t in tests])
    false_bf = np.mean([t.p_brown_forsythe < 0.05 for t in tests])
    assert 0.01 <= false_f <= 0.10 and false_bf <= 0.10  # F is exact for normal data; BF is conservative
    assert np.mean([t.lo < 1 < t.hi for t in tests]) >= 0.85


def test_variance_ratio_needs_two_runs_a_side():
    vr = variance_ratio([1.0, 2.0, 3.0], [1.0])
    assert vr.n_other == 1 and math.isnan(vr.ratio) and math.isnan(vr.p_f)
    constant = variance_ratio([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])
    assert constant.ratio == math.inf and math.isnan(constant.p_f)


def test_mlperf_time_to_target_drops_the_fastest_and_the_slowest():
    tta = mlperf_time_to_target([10.0, 1.0, 12.0, 11.0, 100.0])
    assert tta.value == pytest.approx(11.0)  # mean of 10, 11, 12: 1 and 100 dropped
    assert (tta.n, tta.reached, tta.kept) == (5, 5, 3)
    assert (tta.fastest, tta.slowest) == (1.0, 100.0)


def test_mlperf_time_to_target_with_runs_that_missed_the_target():
    one_missed = mlperf_time_to_target([10.0, None, 12.0, 11.0])
    assert one_missed.value == pytest.approx(11.5)  # the miss counts as the slowest and is dropped
    assert one_missed.reached == 3 and one_missed.slowest == 12.0
    two_missed = mlperf_time_to_target([10.0, None, float("nan"), 11.0])
    assert two_missed.value is None and two_missed.reached == 2
    few = mlperf_time_to_target([4.0, 6.0])  # under 3 runs nothing is dropped
    assert few.value == pytest.approx(5.0) and few.kept == 2
    assert mlperf_time_to_target([4.0, None]).value is None


def test_holm_steps_down_between_uncorrected_and_bonferroni():
    # uncorrected, both would pass 0.05; Holm's first step needs 0.05 / 2
    assert holm([0.03, 0.04]) == [False, False]
    # Bonferroni would keep only 0.01 (0.02 > 0.05 / 2); Holm's second step needs 0.05 / 1
    assert holm([0.02, 0.01]) == [True, True]
    # it stops at the first failure: 0.03 > 0.05 / 2, so 0.04 is not tested at 0.05
    assert holm([0.01, 0.04, 0.03]) == [True, False, False]
    assert holm([math.nan, 0.04]) == [False, True]  # a nan is no test and does not count

"""bench/report/variance_power.py: the sharding design's power and the paper's 5-run design under
no effect, checked against the F distribution's own figures and by simulation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from psbench.bench.report import variance_power as vp
from psbench.bench.report.claims import SHARDING
from psbench.bench.report.stats import paired_variance_ratio


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


# ---- the verdict's test, from observed tails ------------------------------------------------------

def _heavy_pool(n: int = 4000) -> np.ndarray:
    """Standardised draws with tails like final accuracies' (Student t, 4 degrees of freedom)."""
    return vp.standardised_residuals([np.random.default_rng(2).standard_t(4, n)])


def test_the_robust_test_holds_its_level_under_heavy_tails_where_the_f_test_does_not():
    pool, n, alpha = _heavy_pool(), 60, 0.01
    assert vp.simulated_level(pool, n, alpha) == pytest.approx(alpha, abs=0.004)
    rng = np.random.default_rng(1)  # null draws like the simulation's, through the two-sided F test
    a, b = (pool[rng.integers(0, len(pool), size=(40_000, n))] for _ in range(2))
    ratio = a.var(axis=1, ddof=1) / b.var(axis=1, ddof=1)
    f_rejects = np.mean((sps.f.sf(ratio, n - 1, n - 1) < alpha / 2) | (sps.f.cdf(ratio, n - 1, n - 1) < alpha / 2))
    assert f_rejects > 3 * alpha


@pytest.mark.parametrize("n", [40, 120])
def test_the_detectable_ratio_has_the_stated_power_on_fresh_draws(n):
    pool, alpha = _heavy_pool(), 0.05 / 16
    detectable = vp.simulated_detectable_ratio(pool, n, alpha)
    # other draws than the search's own (another seed): the power holds up to simulation noise
    assert vp.simulated_power(pool, n, detectable, alpha, seed=99) == pytest.approx(vp.POWER, abs=0.025)
    assert vp.simulated_power(pool, n, detectable / 1.5, alpha, seed=99) < vp.POWER - 0.1
    # heavier tails than normal: the robust test needs a larger ratio than the normal-theory F figure
    assert detectable > vp.detectable_ratio(n, n, alpha)


def test_seeds_from_the_tails_are_the_fewest_that_reach_the_power():
    pool, alpha = _heavy_pool(), 0.05 / 16
    need = vp.simulated_seeds_for(pool, 2.0, alpha)
    assert vp.simulated_power(pool, need, 2.0, alpha) >= vp.POWER > vp.simulated_power(pool, need - 1, 2.0, alpha)
    assert vp.simulated_power(pool, need - 10, 2.0, alpha) < vp.POWER
    assert need > vp.seeds_for(2.0, alpha)
    assert vp.simulated_seeds_for(pool, 1.01, alpha) is None
    found = vp.tail_power(pool, 110, alpha, 2.0)
    assert found.seeds_for_effect == need and f"2x needs {need} seeds" in found.text()
    assert vp.tail_power(pool[:20], 110, alpha, 2.0) is None  # too few values to carry a shape


def test_standardised_residuals_take_each_samples_scale_out():
    pooled = vp.standardised_residuals([np.array([1.0, 2.0, 3.0, 10.0]), np.array([100.0, 300.0, 200.0]),
                                        np.array([5.0, 5.0, 5.0]), np.array([1.0, np.nan])])
    assert len(pooled) == 7  # the constant and the too-short samples carry no shape
    assert pooled[:4].std(ddof=1) == pytest.approx(1.0) and pooled[4:].std(ddof=1) == pytest.approx(1.0)
    assert np.median(pooled[4:]) == 0.0


def test_the_papers_null_with_normal_tails_is_the_normal_figure():
    normal = vp.standardised_residuals([np.random.default_rng(4).standard_normal(20_000)])
    assert vp.paper_null_with_tails(normal, 8.48) == pytest.approx(
        vp.largest_of_simulated(8.48, vp.PAPER_RUNS, vp.PAPER_DATASETS, vp.PAPER_STRATEGIES), abs=0.015)
    assert vp.paper_null_with_tails(_heavy_pool(), 8.48) > vp.paper_null_with_tails(normal, 8.48) + 0.05


def test_the_powered_designs_seeds_are_what_the_pilots_tails_ask_for():
    """bench/experiments/extra/sharding_powered.toml runs the seeds a 2x effect needs at 0.05 / 16
    by the verdict's test, simulated from the pilot's random-shard runs (results/pilot/): change the
    test, the level or the pilot and this fails until the design's seeds follow."""
    import pandas as pd
    from psbench.bench.harness.matrix import load_experiment
    from psbench.bench.report import sharding as shards

    root = Path(__file__).resolve().parents[1]
    design = load_experiment(root / "bench/experiments/extra/sharding_powered.toml")
    seeds = sorted({spec.seed for spec in design.specs})
    cells = {(s.workload, s.sharding, s.stragglers) for s in design.specs}
    tested = sum(sharding != "random" for _, sharding, _ in cells) * len(shards.SHARDING_TESTED)
    assert tested == 16 and len(design.specs) == len(cells) * len(seeds) and seeds == list(range(len(seeds)))
    pilot = pd.read_csv(root / "results/pilot/sharding-powered-0524d41.csv")
    assert len(pilot) == 1320 and pilot["git_sha"].str.startswith("0524d41").all()
    pool = shards.random_residuals(pilot)
    assert len(seeds) == vp.simulated_seeds_for(pool, SHARDING.effect, shards.ALPHA / tested)


def test_the_simulated_statistic_is_the_verdicts_test_row_by_row():
    """The power simulation stands for the verdict's test only while both compute the same statistic:
    each simulated row's t, through the t distribution, is the p the verdict's paired test gives the
    same runs (both sides' deviations from their own medians, then a paired t)."""
    pool, n, reps, seed = _heavy_pool(), 25, 30, 7
    rng = np.random.default_rng(seed)  # the draws _deviations makes from this seed
    a, b = (pool[rng.integers(0, len(pool), size=(reps, n))] for _ in range(2))
    dev_a, dev_b = vp._deviations(pool, n, reps, seed)
    t = vp._t(dev_a, dev_b)
    for row in range(reps):
        verdict_p = paired_variance_ratio(a[row], b[row]).p_paired_brown_forsythe
        assert 2 * sps.t.sf(abs(t[row]), n - 1) == pytest.approx(verdict_p, rel=1e-9)


def test_the_rule_out_bound_is_the_verdicts_interval_in_closed_form():
    """The simulation's upper bounds (delta method) stand beside the verdict's paired bootstrap bounds on the
    same samples: within 5% at the designs' sizes (60 and 243 seeds), at the corrected level."""
    from psbench.bench.report.stats import abs_deviations, paired_variance_ratio
    rng = np.random.default_rng(11)
    pool = rng.standard_t(5, size=4000)
    level = 1 - 0.05 / 16
    for n in (60, 243):
        for _ in range(3):
            a, b = pool[rng.integers(0, len(pool), n)], pool[rng.integers(0, len(pool), n)]
            boot = paired_variance_ratio(a, b, spread_confidence=level).spread_hi
            closed = float(vp.spread_upper_bounds(abs_deviations(a)[None], abs_deviations(b)[None], level)[0])
            assert closed == pytest.approx(boot, rel=0.05)


def test_ruling_2x_out_needs_seeds_and_rises_with_them():
    rng = np.random.default_rng(12)
    pool = rng.standard_t(5, size=2000)
    level = 1 - 0.05 / 16
    few, many = (vp.simulated_rule_out(pool, n, 2.0, level, reps=1000) for n in (20, 400))
    assert few < 0.1 and many > 0.95  # 20 seeds seldom rule 2x out; 400 almost always do
    need = vp.simulated_seeds_to_rule_out(pool, 2.0, level)
    assert vp.simulated_rule_out(pool, need, 2.0, level) >= vp.POWER > vp.simulated_rule_out(pool, need - 1, 2.0, level)
    assert vp.rule_out_power(pool[:100], 50, level, 2.0, 8) is None  # too few results to read the tails
    found = vp.rule_out_power(pool, 243, level, 2.0, 8)
    assert found.seeds_for_power == need and f"all 8 at once" in found.text()

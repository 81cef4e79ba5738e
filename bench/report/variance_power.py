"""What a variance-ratio design can tell: the smallest true ratio it detects, the seeds an effect
needs, and how likely a reported ratio is when there is no effect at all.

Under no effect, the ratio of two sample variances from n_a and n_b normal runs follows
F(n_a - 1, n_b - 1). The sharding suite tests random's variance ÷ a strategy's, one-sided (a
strategy should lower it). With a true ratio rho the observed ratio is rho x F, so a one-sided F test
at level alpha detects rho with the stated power when rho >= F_{1-alpha} / F_{1-power}. Our runs are
paired by seed (Pitman–Morgan); the independent F is the design's yardstick here, and pairing
only helps when the seeds' metrics correlate, so the figures are what the design can promise.

The paper (Provatas et al., IEEE BigData 2021) ran 5 runs per strategy and compared 3 data sets x
4 strategies (stratified and 3 values of k) on each metric; its headline ratios are 8.48x and 6.11x.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

POWER = 0.8
ALPHA = 0.05
PAPER_RUNS = 5                     # runs per strategy in the paper
PAPER_DATASETS, PAPER_STRATEGIES, PAPER_METRICS = 3, 4, 4
PAPER_RATIOS = (8.48, 6.11)        # distribution-aware on training accuracy; stratified on validation accuracy
MAX_SEEDS = 2000                   # seeds_for looks no further


def null_tail(ratio: float, n_a: int, n_b: int) -> float:
    """P(a ratio of sample variances >= `ratio`) under no effect: F(n_a - 1, n_b - 1)'s upper tail."""
    return float(sps.f.sf(ratio, n_a - 1, n_b - 1))


def largest_of(p: float, k: int) -> float:
    """P(the largest of k independent null ratios reaches a value each reaches with probability p)."""
    return float(1.0 - (1.0 - p) ** k)


def largest_of_simulated(ratio: float, n: int, datasets: int, strategies: int, reps: int = 200_000,
                         seed: int = 0) -> float:
    """The same by simulation when a data set's comparisons share random's runs (the paper's design:
    each strategy against the same random baseline), which makes them correlated: the share of
    `reps` null experiments whose largest ratio reaches `ratio`."""
    rng = np.random.default_rng(seed)
    df = n - 1
    base = rng.chisquare(df, size=(reps, datasets, 1)) / df            # random's sample variance (true 1)
    others = rng.chisquare(df, size=(reps, datasets, strategies)) / df  # each strategy's, no effect
    return float(((base / others).max(axis=(1, 2)) >= ratio).mean())


def detectable_ratio(n_a: int, n_b: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true variance ratio a one-sided F test at `alpha` detects with `power`."""
    d_a, d_b = n_a - 1, n_b - 1
    return float(sps.f.ppf(1 - alpha, d_a, d_b) / sps.f.ppf(1 - power, d_a, d_b))


def seeds_for(effect: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Seeds per strategy (equal on both sides) for `effect` to be detected; None beyond MAX_SEEDS."""
    lo, hi = 2, MAX_SEEDS
    if detectable_ratio(hi, hi, alpha, power) > effect:
        return None
    while lo < hi:  # detectable_ratio falls as n grows
        mid = (lo + hi) // 2
        if detectable_ratio(mid, mid, alpha, power) <= effect:
            hi = mid
        else:
            lo = mid + 1
    return lo


def seeds_label(effect: float, alpha: float = ALPHA, power: float = POWER) -> int | str:
    """seeds_for as a table cell or text: the count, or '> MAX_SEEDS' beyond reach."""
    need = seeds_for(effect, alpha, power)
    return need if need is not None else f"> {MAX_SEEDS}"


@dataclass(frozen=True)
class PaperNull:
    """One of the paper's reported ratios, read against its own design under no effect."""
    ratio: float
    p_alone: float             # one ratio this large by chance
    p_largest_of_metric: float  # the largest of its 3 x 4 ratios on one metric, independent
    p_largest_simulated: float  # the same, simulated with each data set's shared random baseline
    p_largest_of_all: float     # the largest of all 3 x 4 x 4 ratios, independent


def paper_null(ratio: float) -> PaperNull:
    per_metric = PAPER_DATASETS * PAPER_STRATEGIES
    p = null_tail(ratio, PAPER_RUNS, PAPER_RUNS)
    return PaperNull(ratio, p, largest_of(p, per_metric),
                     largest_of_simulated(ratio, PAPER_RUNS, PAPER_DATASETS, PAPER_STRATEGIES),
                     largest_of(p, per_metric * PAPER_METRICS))


@functools.lru_cache(maxsize=1)
def paper_design_text() -> str:
    """One line for the report and the verdict: the paper's design against no effect (module
    constants and a seeded simulation: computed once a process, not per report and verdict)."""
    d = PAPER_RUNS - 1
    parts = [f"under no effect its {PAPER_RUNS}-run ratios follow F({d}, {d}): 95th percentile "
             f"{sps.f.ppf(0.95, d, d):.2f}, 99th {sps.f.ppf(0.99, d, d):.2f}"]
    for r in map(paper_null, PAPER_RATIOS):
        parts.append(f"P(F ≥ {r.ratio:g}) = {r.p_alone:.3f} alone, {r.p_largest_of_metric:.2f} as the largest of "
                     f"{PAPER_DATASETS * PAPER_STRATEGIES} ({r.p_largest_simulated:.2f} simulated with shared "
                     f"random baselines), {r.p_largest_of_all:.2f} of all "
                     f"{PAPER_DATASETS * PAPER_STRATEGIES * PAPER_METRICS}")
    return "; ".join(parts)

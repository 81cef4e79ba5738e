"""Statistics behind every figure of a report: bootstrap intervals over seeds, variance-ratio tests,
MLPerf-style time to accuracy. Pure functions of arrays of per-run values (one value per seed).

Intervals are percentile bootstraps with a fixed RNG seed, so a report rebuilt from the same
records prints the same intervals. With the 3-5 seeds a suite affords, a bootstrap interval is
narrow (a resample can only repeat the seeds there are): read it with its n.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
N_BOOT = 10_000
BOOT_SEED = 20250  # fixed: the same records give the same intervals

Statistic = Callable[[np.ndarray], np.ndarray]  # (resamples, n) -> (resamples,)


def _clean(values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def _quantiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    # inverted_cdf: no interpolation, so resamples that are infinite (a zero variance in a
    # denominator) give an infinite bound rather than inf - inf = nan.
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(samples, [alpha, 1 - alpha], method="inverted_cdf")
    return float(lo), float(hi)


def _resample(values: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    return values[rng.integers(0, len(values), size=(n_boot, len(values)))]


STATISTICS: dict[str, Statistic] = {
    "mean": lambda x: x.mean(axis=-1),
    "median": lambda x: np.median(x, axis=-1),
}


@dataclass(frozen=True)
class Interval:
    """An estimate over n runs with its 95% bootstrap interval (nan bounds when n < 2)."""
    n: int
    estimate: float
    lo: float
    hi: float

    def contains(self, value: float) -> bool:
        return self.lo <= value <= self.hi


def bootstrap_ci(values: Sequence[float] | np.ndarray, statistic: str = "mean", confidence: float = CONFIDENCE,
                 n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> Interval:
    """The statistic of the finite values and its percentile-bootstrap interval over them."""
    x = _clean(values)
    f = STATISTICS[statistic]
    if len(x) == 0:
        return Interval(0, math.nan, math.nan, math.nan)
    estimate = float(f(x))
    if len(x) < 2:
        return Interval(1, estimate, math.nan, math.nan)
    lo, hi = _quantiles(f(_resample(x, np.random.default_rng(seed), n_boot)), confidence)
    return Interval(len(x), estimate, lo, hi)


def ratio_ci(numerator: Sequence[float] | np.ndarray, denominator: Sequence[float] | np.ndarray,
             confidence: float = CONFIDENCE, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> Interval:
    """mean(numerator) / mean(denominator), both groups resampled independently (e.g. a speed-up:
    N-worker runs over single-process runs). n is the smaller group's size."""
    a, b = _clean(numerator), _clean(denominator)
    if len(a) == 0 or len(b) == 0 or b.mean() == 0:
        return Interval(min(len(a), len(b)), math.nan, math.nan, math.nan)
    estimate = float(a.mean() / b.mean())
    if max(len(a), len(b)) < 2:
        return Interval(1, estimate, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = _resample(a, rng, n_boot).mean(axis=1) / _resample(b, rng, n_boot).mean(axis=1)
    lo, hi = _quantiles(ratios[~np.isnan(ratios)], confidence)
    return Interval(min(len(a), len(b)), estimate, lo, hi)


@dataclass(frozen=True)
class VarianceRatio:
    """var(base) / var(other) (sample variances, ddof=1): > 1 means `other` varies less than `base`.
    p-values test equal variances: Brown–Forsythe (Levene's test centred on the median, robust to
    non-normal data) and the two-sided F test (exact for normal data, fragile otherwise). Paired
    samples add the Pitman–Morgan test (exact for normal pairs only) and the paired Brown–Forsythe
    test with its spread ratio (see paired_variance_ratio)."""
    n_base: int
    n_other: int
    ratio: float
    lo: float
    hi: float
    p_brown_forsythe: float
    p_f: float
    p_pitman_morgan: float = math.nan  # paired samples only (see paired_variance_ratio)
    p_paired_brown_forsythe: float = math.nan
    spread_ratio: float = math.nan     # (mean |base - median| ÷ mean |other - median|)^2
    spread_lo: float = math.nan        # its interval at spread_confidence
    spread_hi: float = math.nan
    spread_confidence: float = math.nan


def variance_ratio(base: Sequence[float] | np.ndarray, other: Sequence[float] | np.ndarray,
                   confidence: float = CONFIDENCE, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> VarianceRatio:
    a, b = _clean(base), _clean(other)
    nan = math.nan
    if len(a) < 2 or len(b) < 2:
        return VarianceRatio(len(a), len(b), nan, nan, nan, nan, nan)
    va, vb = a.var(ddof=1), b.var(ddof=1)
    ratio = va / vb if vb > 0 else (math.inf if va > 0 else nan)
    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = _resample(a, rng, n_boot).var(axis=1, ddof=1) / _resample(b, rng, n_boot).var(axis=1, ddof=1)
    boot = boot[~np.isnan(boot)]  # 0/0: both resamples repeat one value, no ratio
    lo, hi = _quantiles(boot, confidence) if len(boot) else (nan, nan)
    with warnings.catch_warnings():  # constant groups: scipy warns and returns nan, which we keep
        warnings.simplefilter("ignore")
        p_bf = float(sps.levene(a, b, center="median").pvalue)
    if vb > 0 and va > 0:
        f_dist = sps.f(len(a) - 1, len(b) - 1)
        p_f = float(min(1.0, 2 * min(f_dist.cdf(ratio), f_dist.sf(ratio))))
    else:
        p_f = nan
    return VarianceRatio(len(a), len(b), float(ratio), lo, hi, p_bf, p_f)


def _pairs(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
           allow_inf: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Aligned values (one pair per seed), pairs with a nan (or an inf, unless allowed) dropped."""
    x, y = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if len(x) != len(y):
        raise ValueError(f"paired samples differ in length: {len(x)} vs {len(y)}")
    keep = ~(np.isnan(x) | np.isnan(y)) if allow_inf else np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def paired_ratio_ci(numerator: Sequence[float] | np.ndarray, denominator: Sequence[float] | np.ndarray,
                    statistic: str = "median", confidence: float = CONFIDENCE, n_boot: int = N_BOOT,
                    seed: int = BOOT_SEED) -> Interval:
    """statistic(numerator) / statistic(denominator) over pairs run alike (one pair per seed: the
    same seed gave both runs the same initial weights, batch order and straggler schedule), the
    pairs resampled together. inf is allowed (a run that never reached a target): the median
    copes with a few, and a resample whose ratio is inf/inf is dropped."""
    a, b = _pairs(numerator, denominator, allow_inf=True)
    f = STATISTICS[statistic]
    if len(a) == 0:
        return Interval(0, math.nan, math.nan, math.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = float(f(a) / f(b))
        if len(a) < 2:
            return Interval(1, estimate, math.nan, math.nan)
        idx = np.random.default_rng(seed).integers(0, len(a), size=(n_boot, len(a)))
        ratios = f(a[idx]) / f(b[idx])
    ratios = ratios[~np.isnan(ratios)]
    lo, hi = _quantiles(ratios, confidence) if len(ratios) else (math.nan, math.nan)
    return Interval(len(a), estimate, lo, hi)


def paired_diff_ci(values: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray,
                   confidence: float = CONFIDENCE, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> Interval:
    """Mean of (value - baseline) over pairs (one per seed), with its bootstrap interval."""
    a, b = _pairs(values, baseline)
    return bootstrap_ci(a - b, "mean", confidence, n_boot, seed)


def abs_deviations(x: np.ndarray) -> np.ndarray:
    """|x - median| along the last axis, each row from its own median: the Brown–Forsythe test's data
    (one function for the verdict's test and variance_power's simulation of it)."""
    return np.abs(x - np.median(x, axis=-1, keepdims=True))


def paired_variance_ratio(base: Sequence[float] | np.ndarray, other: Sequence[float] | np.ndarray,
                          confidence: float = CONFIDENCE, n_boot: int = N_BOOT, seed: int = BOOT_SEED,
                          spread_confidence: float | None = None) -> VarianceRatio:
    """var(base) / var(other) over pairs (one per seed; between the two only the treatment changed,
    e.g. the shard assignment), the pairs resampled together, plus two tests of equal spread for
    paired samples:
    - Pitman–Morgan: r = corr(a + b, a - b); t = r sqrt((n - 2) / (1 - r^2)), n - 2 degrees of
      freedom. Exact for normal pairs; under heavy tails it rejects far more often than its level.
    - paired Brown–Forsythe: a paired t test on each sample's absolute deviations from its median,
      which holds its level under heavy tails. Its effect size is the spread ratio, (mean absolute
      deviation of base ÷ of other)^2: the variance ratio where the two differ in scale only, with
      a paired bootstrap interval at `spread_confidence` (default `confidence`; enough resamples
      for its tails, e.g. a Bonferroni-corrected level).
    The unpaired tests are kept beside them."""
    a, b = _pairs(base, other)
    unpaired = variance_ratio(a, b, confidence, n_boot, seed)
    if len(a) < 3:
        return unpaired
    idx = np.random.default_rng(seed).integers(0, len(a), size=(n_boot, len(a)))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = a[idx].var(axis=1, ddof=1) / b[idx].var(axis=1, ddof=1)
    boot = boot[~np.isnan(boot)]
    lo, hi = _quantiles(boot, confidence) if len(boot) else (math.nan, math.nan)
    s, d = a + b, a - b
    if s.std() > 0 and d.std() > 0:
        r = float(np.corrcoef(s, d)[0, 1])
        t = r * math.sqrt((len(a) - 2) / max(1e-300, 1 - r * r))
        p_pm = float(2 * sps.t(len(a) - 2).sf(abs(t)))
    else:
        p_pm = math.nan
    dev_a, dev_b = abs_deviations(a), abs_deviations(b)
    level = confidence if spread_confidence is None else spread_confidence
    spread = paired_ratio_ci(dev_a, dev_b, "mean", level, boot_size(level, n_boot), seed)
    diffs = dev_a - dev_b
    p_bf = float(sps.ttest_1samp(diffs, 0.0).pvalue) if diffs.std() > 0 else math.nan
    return VarianceRatio(len(a), len(b), unpaired.ratio, lo, hi, unpaired.p_brown_forsythe, unpaired.p_f, p_pm,
                         p_bf, spread.estimate ** 2, spread.lo ** 2, spread.hi ** 2, level)


TAIL_RESAMPLES = 100  # a percentile bound needs at least this many resamples beyond it


def boot_size(confidence: float, n_boot: int = N_BOOT) -> int:
    """Resamples for a percentile interval at `confidence`: n_boot, or more where its tails would
    hold fewer than TAIL_RESAMPLES (a Bonferroni-corrected 99.7 % interval needs about 64,000)."""
    return max(n_boot, math.ceil(TAIL_RESAMPLES / ((1 - confidence) / 2)))


@dataclass(frozen=True)
class TimeToTarget:
    """Time to a target accuracy as MLPerf scores it: over n runs, drop the fastest and the slowest
    and average the rest (a run that never reached the target counts as the slowest). `value` is
    None when the runs kept include one that never reached it. `fastest`/`slowest`: the spread over
    the runs that reached it."""
    n: int
    reached: int
    kept: int
    value: float | None
    fastest: float | None
    slowest: float | None


def mlperf_time_to_target(times: Sequence[float | None]) -> TimeToTarget:
    """`times`: one per run, None or nan for a run that did not reach the target. With fewer than 3
    runs nothing can be dropped: the plain mean (of all runs, each must have reached the target)."""
    arr = np.array([math.inf if t is None or not math.isfinite(float(t)) else float(t) for t in times])
    reached = arr[np.isfinite(arr)]
    kept = np.sort(arr)[1:-1] if len(arr) >= 3 else arr
    value = float(kept.mean()) if len(kept) and np.isfinite(kept).all() else None
    spread = (float(reached.min()), float(reached.max())) if len(reached) else (None, None)
    return TimeToTarget(len(arr), len(reached), len(kept), value, *spread)


# ---- paired t: intervals that hold at small n, one-sided tests, Holm's correction ------------------

@dataclass(frozen=True)
class PairedT:
    """A paired comparison of n pairs by Student's t: the estimate, its two-sided interval at
    `confidence`, and the one-sided p-value of H0 'effect <= threshold' (so a small p says the effect
    exceeds the threshold). For ratios the t runs on log ratios and everything is back on the ratio
    scale. `mde` is the smallest effect this design detects against the threshold with 80% power
    at the test's alpha, given the spread observed."""
    n: int
    estimate: float
    lo: float
    hi: float
    p: float
    mde: float

    @property
    def interval(self) -> Interval:
        return Interval(self.n, self.estimate, self.lo, self.hi)


def paired_t(diffs: Sequence[float] | np.ndarray, threshold: float = 0.0, confidence: float = CONFIDENCE,
             alpha: float = 0.05, power: float = 0.8) -> PairedT:
    """Mean of paired differences with a t interval, and the one-sided test of mean > threshold."""
    d = _clean(diffs)
    n = len(d)
    if n < 2:
        est = float(d.mean()) if n else math.nan
        return PairedT(n, est, math.nan, math.nan, math.nan, math.nan)
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    half = float(sps.t.ppf(1 - (1 - confidence) / 2, n - 1)) * se
    if se == 0:
        p = 0.0 if mean > threshold else 1.0
    else:
        p = float(sps.t.sf((mean - threshold) / se, n - 1))
    mde = threshold + (float(sps.t.ppf(1 - alpha, n - 1)) + float(sps.t.ppf(power, n - 1))) * se
    return PairedT(n, mean, mean - half, mean + half, p, mde)


def paired_log_ratio_t(numerator: Sequence[float] | np.ndarray, denominator: Sequence[float] | np.ndarray,
                       threshold: float = 1.0, confidence: float = CONFIDENCE, alpha: float = 0.05) -> PairedT:
    """numerator / denominator per pair (e.g. sync's time to target / switch's: a speed-up), its
    geometric mean with a t interval on the log scale, and the one-sided test of ratio > threshold."""
    a, b = _pairs(numerator, denominator)
    if not len(a) or (a <= 0).any() or (b <= 0).any():
        return PairedT(len(a), math.nan, math.nan, math.nan, math.nan, math.nan)
    t = paired_t(np.log(a) - np.log(b), math.log(threshold), confidence, alpha)
    return PairedT(t.n, math.exp(t.estimate), math.exp(t.lo) if t.n > 1 else math.nan,
                   math.exp(t.hi) if t.n > 1 else math.nan, t.p, math.exp(t.mde) if t.n > 1 else math.nan)


def holm(p_values: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down correction: which of the hypotheses are rejected at family-wise `alpha`
    (nan p-values are never rejected and do not count as tests)."""
    ps = [(p, i) for i, p in enumerate(p_values) if not math.isnan(p)]
    ps.sort()
    rejected = [False] * len(p_values)
    m = len(ps)
    for rank, (p, i) in enumerate(ps):
        if p > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected

"""What a variance-ratio design can tell: the smallest true ratio it detects, the seeds an effect
needs, and how likely a reported ratio is when there is no effect at all.

Two yardsticks. Normal theory: under no effect, the ratio of two sample variances from n_a and n_b
normal runs follows F(n_a - 1, n_b - 1); with a true ratio rho the observed ratio is rho x F, so a
one-sided F test at alpha detects rho with the stated power when rho >= F_{1-alpha} / F_{1-power}.
That holds only for normal metrics. Final accuracies over seeds are heavy-tailed (a run now and then
ends far off), and there the F and Pitman–Morgan tests reject far more often than their level says.
So the verdict's test is the paired Brown–Forsythe (bench/report/stats.py), and its power is
simulated: runs are drawn from the suite's own random-shard runs, standardised (x - median) / sd
per comparison and pooled, the strategy's side scaled down by sqrt(rho); pairs are drawn
independently (the seeds' pairs barely correlate in our records), which is what the design can
promise without pairing's help.

The paper (Provatas et al., IEEE BigData 2021) ran 5 runs per strategy and compared 3 data sets x
4 strategies (stratified and 3 values of k) on each metric; its headline ratios are 8.48x and 6.11x.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from scipy import stats as sps

from psbench.bench.report.claims import SHARDING
from psbench.bench.report.stats import abs_deviations

POWER = 0.8
ALPHA = 0.05
PAPER_RUNS = SHARDING.runs         # runs per strategy in the paper
PAPER_DATASETS, PAPER_STRATEGIES, PAPER_METRICS = 3, 4, 4
PAPER_RATIOS = (SHARDING.distribution_aware, SHARDING.stratified)  # on training and validation accuracy
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


# ---- from observed tails: the verdict's test ------------------------------------------------------

SIM_REPS = 4000       # simulated experiments behind a power figure (seeded: the same records, the same figure)
LEVEL_REPS = 40_000   # ... behind a level check (a Bonferroni level of 0.003 needs many to be seen)
SIM_SEED = 28
MIN_POOL = 200        # fewer standardised values carry no shape of the tails: draws from a few
                     # values repeat them, which makes odd tails of their own
TOO_FEW_TAILS = "too few random-shard results to read the tails from"  # the report's and thesis.md's words


def standardised_residuals(samples: Iterable[np.ndarray]) -> np.ndarray:
    """(x - median) / sd of each sample (one per comparison: the same data, condition and shards),
    pooled: the shape of the metric's spread with its scale taken out. Samples under 3 values or
    with no spread carry no shape and are skipped."""
    parts = []
    for sample in samples:
        x = np.asarray(sample, dtype=float)
        x = x[np.isfinite(x)]
        if len(x) >= 3 and x.std(ddof=1) > 0:
            parts.append((x - np.median(x)) / x.std(ddof=1))
    return np.concatenate(parts) if parts else np.empty(0)


def _bar(n: int, alpha: float) -> float:
    return float(sps.t.ppf(1 - alpha / 2, n - 1))  # the two-sided test's bar, crossed in the claimed direction


def approximate_power(pool: np.ndarray, n: int, ratio: float, alpha: float) -> float:
    """The test's power by its noncentral t: with a true variance ratio rho the pairs' difference of
    absolute deviations has mean m(1 - 1/sqrt(rho)) and variance v(1 + 1/rho), m and v those of the
    pool's absolute deviations (pairs independent). A little below the simulated power (it ignores
    that each sample's median is estimated): used to bracket the seeds' search."""
    dev = abs_deviations(pool)
    mean = float(dev.mean()) * (1 - 1 / math.sqrt(ratio))
    sd = math.sqrt(float(dev.var()) * (1 + 1 / ratio))
    return float(sps.nct.sf(_bar(n, alpha), n - 1, math.sqrt(n) * mean / sd))


def _deviations(pool: np.ndarray, n: int, reps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Absolute deviations from their row's median of reps x n runs drawn from the pool, twice.
    Scaling a row scales its deviations, so one draw serves every true ratio."""
    rng = np.random.default_rng(seed)
    a, b = (pool[rng.integers(0, len(pool), size=(reps, n))] for _ in range(2))
    return abs_deviations(a), abs_deviations(b)


def _t(dev_a: np.ndarray, dev_b: np.ndarray) -> np.ndarray:
    """The paired Brown–Forsythe t of each row pair (> 0: a spreads more than b), as stats computes it."""
    d = dev_a - dev_b
    sd = d.std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sd > 0, d.mean(axis=1) / (sd / math.sqrt(d.shape[1])), 0.0)


def simulated_power(pool: np.ndarray, n: int, ratio: float, alpha: float, reps: int = SIM_REPS,
                    seed: int = SIM_SEED) -> float:
    """The share of simulated n-seed comparisons, runs drawn from the pool and the strategy's side
    scaled by 1 / sqrt(ratio), in which the test at two-sided `alpha` finds the strategy less variable."""
    dev_a, dev_b = _deviations(pool, n, reps, seed)
    return float((_t(dev_a, dev_b / math.sqrt(ratio)) > _bar(n, alpha)).mean())


def simulated_level(pool: np.ndarray, n: int, alpha: float, reps: int = LEVEL_REPS, seed: int = SIM_SEED) -> float:
    """The test's rejection rate (either direction) under no effect: at most about `alpha` if it holds its level."""
    return float((np.abs(_t(*_deviations(pool, n, reps, seed))) > _bar(n, alpha)).mean())


def simulated_detectable_ratio(pool: np.ndarray, n: int, alpha: float, power: float = POWER,
                               limit: float = 1e6) -> float:
    """The smallest true ratio detected with `power` (bisection over the same draws, on which the
    power only rises with the ratio); inf beyond `limit`."""
    dev_a, dev_b = _deviations(pool, n, SIM_REPS, SIM_SEED)
    bar = _bar(n, alpha)

    def enough(ratio: float) -> bool:
        return float((_t(dev_a, dev_b / math.sqrt(ratio)) > bar).mean()) >= power

    if not enough(limit):
        return math.inf
    lo, hi = 1.0, limit
    while hi / lo > 1.0001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def simulated_seeds_for(pool: np.ndarray, effect: float, alpha: float, power: float = POWER) -> int | None:
    """Seeds per strategy for `effect` to be detected with `power` by simulation: a bisection whose
    answer reaches the power and whose answer less one, where tried, did not; None beyond MAX_SEEDS.
    The noncentral t brackets it (it errs low on power, so high on seeds)."""
    def enough(n: int) -> bool:
        return simulated_power(pool, n, effect, alpha) >= power

    if approximate_power(pool, MAX_SEEDS, effect, alpha) < power and not enough(MAX_SEEDS):
        return None
    hi = MAX_SEEDS
    for n in range(3, MAX_SEEDS + 1):  # the noncentral t's answer, the bracket's top if it holds
        if approximate_power(pool, n, effect, alpha) >= power:
            hi = n if enough(n) else MAX_SEEDS
            break
    lo = max(3, hi // 2)
    return _fewest(enough, 3 if enough(lo) else lo, hi)


def _fewest(enough, lo: int, hi: int) -> int:
    """The smallest n in [lo, hi] for which `enough` holds, `enough` rising with n and holding at hi."""
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


@dataclass(frozen=True)
class TailPower:
    """A design's power by the verdict's own test, simulated from a suite's observed tails."""
    residuals: int           # standardised values in the pool
    excess_kurtosis: float   # 0 for normal metrics
    seeds: int
    alpha: float
    level: float             # the test's simulated rejection rate under no effect (nominal: alpha)
    detectable: float        # the smallest true ratio detected with POWER
    effect: float
    seeds_for_effect: int | None

    def text(self) -> str:
        need = self.seeds_for_effect if self.seeds_for_effect is not None else f"> {MAX_SEEDS}"
        return (f"{self.seeds} seeds a strategy detect {self.detectable:.2f}x with {POWER:.0%} power by the paired "
                f"Brown–Forsythe test at {self.alpha:.2g}; {self.effect:g}x needs {need} seeds (simulated from "
                f"{self.residuals} standardised random-shard results, excess kurtosis {self.excess_kurtosis:.1f}; "
                f"the test's simulated level {self.level:.4f} at nominal {self.alpha:.4f})")


def tail_power(pool: np.ndarray, seeds: int, alpha: float, effect: float) -> TailPower | None:
    """None where the pool is too small to carry a shape (under MIN_POOL values) or seeds < 3."""
    if len(pool) < MIN_POOL or seeds < 3:
        return None
    return _tail_power(np.ascontiguousarray(pool, dtype=float).tobytes(), seeds, alpha, effect)


@functools.lru_cache(maxsize=32)
def _tail_power(pool_bytes: bytes, seeds: int, alpha: float, effect: float) -> TailPower:
    # Cached on the pool's bytes: a report asks for one design's power in its sharding table, the
    # table's caption and its verdict, and the simulations behind it are the dear part.
    pool = np.frombuffer(pool_bytes)
    return TailPower(len(pool), float(sps.kurtosis(pool)), seeds, alpha, simulated_level(pool, seeds, alpha),
                     simulated_detectable_ratio(pool, seeds, alpha), effect, simulated_seeds_for(pool, effect, alpha))


def paper_null_with_tails(pool: np.ndarray, ratio: float, reps: int = 50_000, seed: int = 0) -> float:
    """largest_of_simulated's probability with the paper's 5-run samples drawn from a pool of
    standardised results (tails like ours) instead of normal ones."""
    rng = np.random.default_rng(seed)

    def variances(*shape: int) -> np.ndarray:
        return pool[rng.integers(0, len(pool), size=(*shape, PAPER_RUNS))].var(axis=-1, ddof=1)

    base = variances(reps, PAPER_DATASETS, 1)
    others = variances(reps, PAPER_DATASETS, PAPER_STRATEGIES)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(((base / others).max(axis=(1, 2)) >= ratio).mean())


# ---- the other way: ruling an effect out ------------------------------------------------------------

def spread_upper_bounds(dev_a: np.ndarray, dev_b: np.ndarray, confidence: float) -> np.ndarray:
    """Each row pair's spread ratio's upper bound at `confidence`, (mean |dev a| ÷ mean |dev b|)^2, by the
    delta method on the log of the ratio of paired means: a closed form of the verdict's paired bootstrap
    interval (stats.paired_variance_ratio), which a simulation of thousands of designs cannot afford at a
    corrected level's tens of thousands of resamples each. tests/test_variance_power.py holds the two side by side."""
    n = dev_a.shape[-1]
    mean_a, mean_b = dev_a.mean(axis=-1, keepdims=True), dev_b.mean(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        influence = dev_a / mean_a - dev_b / mean_b
        se = influence.std(axis=-1, ddof=1) / math.sqrt(n)
        log_ratio = np.log(mean_a[..., 0] / mean_b[..., 0])
    z = float(sps.norm.ppf(1 - (1 - confidence) / 2))
    return np.exp(2 * (log_ratio + z * se))


def simulated_rule_out(pool: np.ndarray, n: int, effect: float, confidence: float, reps: int = SIM_REPS,
                       seed: int = SIM_SEED) -> float:
    """The share of simulated n-seed comparisons with no true effect (both sides drawn from the pool) whose
    spread ratio's upper bound at `confidence` lies below `effect`: the power to rule `effect` out."""
    dev_a, dev_b = _deviations(pool, n, reps, seed)
    return float((spread_upper_bounds(dev_a, dev_b, confidence) < effect).mean())


def simulated_seeds_to_rule_out(pool: np.ndarray, effect: float, confidence: float,
                                power: float = POWER) -> int | None:
    """Seeds per strategy for a no-effect design to rule `effect` out with `power` (bisection over n, on which
    the share only rises); None beyond MAX_SEEDS."""
    def enough(n: int) -> bool:
        return simulated_rule_out(pool, n, effect, confidence) >= power

    return _fewest(enough, 3, MAX_SEEDS) if enough(MAX_SEEDS) else None


@dataclass(frozen=True)
class RuleOutPower:
    """A design's power to rule an effect out when there is none, simulated from a suite's observed tails."""
    seeds: int
    confidence: float
    effect: float
    power: float                  # one ratio's chance that its upper bound falls below `effect`
    ratios: int                   # the ratios the verdict needs below `effect` at once
    seeds_for_power: int | None   # seeds for one ratio to rule `effect` out with POWER

    def text(self) -> str:
        need = self.seeds_for_power if self.seeds_for_power is not None else f"> {MAX_SEEDS}"
        every = self.power ** self.ratios
        return (f"with no true effect, one ratio's {self.confidence:.4g} upper bound falls below {self.effect:g}x "
                f"in {self.power:.0%} of simulated {self.seeds}-seed designs ({every:.0%} for all {self.ratios} at "
                f"once, were they independent); {POWER:.0%} needs {need} seeds a strategy")


def rule_out_power(pool: np.ndarray, seeds: int, confidence: float, effect: float,
                   ratios: int) -> RuleOutPower | None:
    """None where the pool is too small to carry a shape (under MIN_POOL values) or seeds < 3."""
    if len(pool) < MIN_POOL or seeds < 3:
        return None
    return _rule_out_power(np.ascontiguousarray(pool, dtype=float).tobytes(), seeds, confidence, effect, ratios)


@functools.lru_cache(maxsize=32)
def _rule_out_power(pool_bytes: bytes, seeds: int, confidence: float, effect: float, ratios: int) -> RuleOutPower:
    pool = np.frombuffer(pool_bytes)
    return RuleOutPower(seeds, confidence, effect, simulated_rule_out(pool, seeds, effect, confidence), ratios,
                        simulated_seeds_to_rule_out(pool, effect, confidence))

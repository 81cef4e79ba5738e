"""The sharding finding (Provatas et al., IEEE BigData 2021): which runs form a comparison, random's
variance of a final metric ÷ a strategy's, paired by seed, and the verdict per strategy by the paired
Brown–Forsythe test with Holm within its pre-specified family; the design's powers, simulated from
the random runs' own tails (variance_power.py). thesis.py words the finding, tables.py and plots.py
show its table and plot."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from psbench.bench.harness.results import SuiteResults
from psbench.bench.report import stats, variance_power
from psbench.bench.report.claims import SHARDING, Verdict
from psbench.bench.report.stats import VarianceRatio, paired_variance_ratio, variance_ratio

ALPHA = 0.05
TRAINED_FACTOR = 2.0  # a sharding comparison counts only if its runs learned: accuracy >= 2 x chance

RULE = (f"per strategy (distribution-aware's k set per data set), one pre-specified family: its ratios of "
        f"final training and validation accuracy (random ÷ strategy, paired by seed) over every data set and "
        f"condition, at {ALPHA:g} ÷ the strategies, Holm within the family, by the paired Brown–Forsythe test "
        f"(a paired t on absolute deviations from the median: it holds its level under the heavy tails final "
        f"accuracies show); a rejected ratio's direction is its spread ratio's (random's mean absolute "
        f"deviation ÷ the strategy's, squared), shown with its interval at {ALPHA:g} ÷ all ratios tested. "
        f"A strategy is reproduced if some ratio is significantly less variable than random and none more; "
        f"not reproduced if some is significantly more variable and none less (said so), or none is "
        f"significant and every spread interval lies below {SHARDING.effect:g}x; else inconclusive. Both "
        f"powers are stated: to detect {SHARDING.effect:g}x and to rule it out, simulated from the random "
        f"runs' own tails. Comparisons whose runs stayed below {TRAINED_FACTOR:g}x chance accuracy are left "
        f"out and named")


SHARDING_METRICS = [("final_train_loss", "final training loss"), ("final_val_loss", "final validation loss"),
                    ("final_train_accuracy", "final training accuracy"),
                    ("final_val_accuracy", "final validation accuracy")]
# The metrics a sharding verdict tests (the paper's figures are on accuracy, claims.SHARDING); the
# losses are shown beside them, not tested, so the correction and the
# seeds a design needs count only these (bench/experiments/extra/sharding_powered.toml: 16 ratios).
SHARDING_TESTED = ("final_train_accuracy", "final_val_accuracy")

SHARDING_GROUP = ["workload", "label", "workers", "batch_size", "conditions"]


def sharding_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs of sharding comparisons: configurations (all but the sharding alike) run under several
    strategies, at least one of them over several seeds."""
    def compared(group: pd.DataFrame) -> bool:
        return group["sharding"].nunique() >= 2 and group.groupby("sharding")["seed"].nunique().max() >= 2

    keep = [g for _, g in runs.groupby(SHARDING_GROUP) if compared(g)]
    return pd.concat(keep) if keep else runs.iloc[0:0]


def strategy_order(strategies) -> list[str]:
    """random first, then stratified, then the rest by name: the order tables and plots show them."""
    order = {"random": 0, "stratified": 1}
    return sorted(strategies, key=lambda s: (order.get(s, 2), s))


def sharding_variance_ratio(base: pd.DataFrame, other: pd.DataFrame, metric: str,
                            spread_confidence: float | None = None) -> VarianceRatio:
    """random's (`base`) variance of a final metric ÷ a strategy's (`other`), one value per seed:
    paired over the seeds both ran when at least 3 did (the design: a seed fixes the initial
    weights, batch order and split, so only the shards change; intervals over resampled seeds, the
    paired Brown–Forsythe and Pitman–Morgan tests), otherwise as two independent samples over all
    their seeds. `spread_confidence`: the level of the spread ratio's interval (the verdict's
    corrected level)."""
    a = base.dropna(subset=[metric]).groupby("seed")[metric].first()
    b = other.dropna(subset=[metric]).groupby("seed")[metric].first()
    seeds = sorted(set(a.index) & set(b.index))
    if len(seeds) >= 3:
        return paired_variance_ratio(a.loc[seeds].to_numpy(dtype=float), b.loc[seeds].to_numpy(dtype=float),
                                     spread_confidence=spread_confidence)
    return variance_ratio(a.to_numpy(dtype=float), b.to_numpy(dtype=float))


def _comparisons(res: SuiteResults) -> Iterator[tuple[tuple, pd.DataFrame, str, pd.DataFrame, str, str]]:
    """(configuration key, random's runs, strategy, its runs, metric, title) of every strategy run
    alike beside random sharding."""
    runs = sharding_runs(res.runs)
    for key, group in runs.groupby(SHARDING_GROUP, sort=True):
        base = group[group["sharding"] == "random"]
        if base.empty:
            continue
        for strategy in strategy_order(group["sharding"].unique()):
            if strategy == "random":
                continue
            for metric, title in SHARDING_METRICS:
                if metric in group.columns:
                    yield key, base, strategy, group[group["sharding"] == strategy], metric, title


def sharding_level(res: SuiteResults) -> tuple[float, int]:
    """(Bonferroni level, ratios tested): the accuracies' ratios of comparisons whose runs learned."""
    failed = untrained(res)
    tested = sum(metric in SHARDING_TESTED and (key[0], key[4]) not in failed
                 for key, _, _, _, metric, _ in _comparisons(res))
    return ALPHA / max(1, tested), tested


def random_residuals(runs: pd.DataFrame, left_out: Iterable[tuple[str, str]] = ()) -> np.ndarray:
    """The random-shard runs' tested metrics, standardised per configuration and metric and pooled
    (variance_power.standardised_residuals): the tails a design's power is simulated from, free of
    any strategy's effect. `runs`: one row a run with the SHARDING_GROUP columns (a suite's, or the
    pilot's table in results/pilot/); `left_out`: (workload, conditions) not to count."""
    skip = set(left_out)
    samples = [group.loc[group["sharding"] == "random", metric].to_numpy(dtype=float)
               for key, group in runs.groupby(SHARDING_GROUP, sort=True) if (key[0], key[4]) not in skip
               for metric in SHARDING_TESTED if metric in group.columns]
    return variance_power.standardised_residuals(samples)


def sharding_residuals(res: SuiteResults) -> np.ndarray:
    """random_residuals of a suite's comparisons whose runs learned."""
    return random_residuals(sharding_runs(res.runs), untrained(res))


RATIO_COLUMNS = ["workload", "label", "workers", "batch_size", "conditions", "sharding", "metric", "tested", "seeds",
                 "ratio", "lo", "hi", "spread", "spread_lo", "spread_hi", "p_bf_paired", "p_paired", "p_brown_forsythe",
                 "p_f"]


def sharding_ratios(res: SuiteResults) -> pd.DataFrame:
    """Per configuration, strategy and final metric: random's variance ÷ the strategy's over the
    seeds both ran (paired: only the shard assignment changed) with its 95% interval, and the
    spread ratio with its interval at the verdict's corrected level and the paired tests."""
    alpha, _ = sharding_level(res)
    rows = []
    for key, base, strategy, other, metric, title in _comparisons(res):
        vr = sharding_variance_ratio(base, other, metric, spread_confidence=1 - alpha)
        rows.append({"workload": key[0], "label": key[1], "workers": key[2], "batch_size": key[3],
                     "conditions": key[4], "sharding": strategy,
                     "metric": title, "tested": metric in SHARDING_TESTED,
                     "seeds": vr.n_base, "ratio": vr.ratio, "lo": vr.lo, "hi": vr.hi,
                     "spread": vr.spread_ratio, "spread_lo": vr.spread_lo, "spread_hi": vr.spread_hi,
                     "p_bf_paired": vr.p_paired_brown_forsythe, "p_paired": vr.p_pitman_morgan,
                     "p_brown_forsythe": vr.p_brown_forsythe, "p_f": vr.p_f})
    return pd.DataFrame(rows, columns=RATIO_COLUMNS)


def untrained(res: SuiteResults) -> dict[tuple[str, str], tuple[float, float]]:
    """(workload, conditions) -> (mean final validation accuracy, chance) of the sharding comparisons
    whose runs did not learn: below TRAINED_FACTOR x chance, chance = 1 / the classes in their shard
    reports (a comparison with no shard report is not judged)."""
    runs = sharding_runs(res.runs)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for (workload, conditions), group in runs.groupby(["workload", "conditions"]):
        counts = res.shard_counts[res.shard_counts["run_id"].isin(group["run_id"])] if len(res.shard_counts) else None
        classes = counts["class"].nunique() if counts is not None else 0
        accuracy = float(pd.to_numeric(group["final_val_accuracy"], errors="coerce").mean())
        if classes and not accuracy >= TRAINED_FACTOR / classes:
            out[(workload, conditions)] = (accuracy, 1.0 / classes)
    return out


def strategy_family(sharding: str) -> str:
    """distribution-aware:60 and :100 are one strategy whose k is set per data set, as in the paper."""
    return sharding.split(":", 1)[0]


@dataclass(frozen=True)
class StrategyTest:
    """One strategy's pre-specified family: its tested ratios over every data set and condition, Holm at
    the family's level, the counts each way and its verdict by the sharding rule."""
    family: str
    ratios: pd.DataFrame    # sharding_ratios' rows of this strategy, with 'holm' (rejected) added
    alpha: float            # the family's level: ALPHA ÷ the strategies tested
    lower: int              # significantly less variable than random (the paper's direction)
    higher: int             # significantly more variable
    points_lower: int       # point estimates in the paper's direction (spread ratio > 1), significant or not
    points_higher: int
    verdict: Verdict
    reason: str


def strategy_tests(ratios: pd.DataFrame) -> list[StrategyTest]:
    """`ratios`: the tested ratios of comparisons whose runs learned (sharding_ratios' rows)."""
    families = strategy_order({strategy_family(s) for s in ratios["sharding"]})
    alpha = ALPHA / max(1, len(families))
    out = []
    for family in families:
        rows = ratios[[strategy_family(s) == family for s in ratios["sharding"]]].copy()
        p = rows["p_bf_paired"].fillna(1.0).to_list()
        rows["holm"] = stats.holm(p, alpha)
        lower = int((rows["holm"] & (rows["spread"] > 1)).sum())
        higher = int((rows["holm"] & (rows["spread"] < 1)).sum())
        if lower and higher:
            verdict, reason = Verdict.INCONCLUSIVE, "ratios significant both ways: the effect depends on the data"
        elif lower:
            verdict, reason = Verdict.REPRODUCED, f"{lower} ratio(s) significantly less variable than random, none more"
        elif higher:
            verdict, reason = Verdict.NOT_REPRODUCED, f"more variable than random: {higher} ratio(s) significant, none lower"
        elif (rows["spread_hi"] < SHARDING.effect).all():
            verdict, reason = Verdict.NOT_REPRODUCED, f"no ratio significant and every upper bound below {SHARDING.effect:g}x"
        else:
            reaching = int((rows["spread_hi"] >= SHARDING.effect).sum())
            verdict, reason = Verdict.INCONCLUSIVE, (f"no ratio significant; {reaching} of {len(rows)} upper bounds still "
                                             f"reach {SHARDING.effect:g}x")
        out.append(StrategyTest(family, rows, alpha, lower, higher, int((rows["spread"] > 1).sum()),
                                int((rows["spread"] < 1).sum()), verdict, reason))
    return out


def strategy_table(test: StrategyTest) -> str:
    """thesis.md's table of one strategy's tested ratios."""
    lines = ["| data | conditions | k | final metric | var ratio [95% CI] | spread ratio [corrected CI] | "
             "paired B–F p | Holm |", "|---|---|---|---|---|---|---|---|"]
    for _, r in test.ratios.iterrows():
        k = r["sharding"].split(":", 1)[1] if ":" in r["sharding"] else "–"
        lines.append(f"| {r['workload']} | {r['conditions']} | {k} | {r['metric']} | "
                     f"{r['ratio']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}] | "
                     f"{r['spread']:.2f} [{r['spread_lo']:.2f}, {r['spread_hi']:.2f}] | {r['p_bf_paired']:.3g} | "
                     f"{'rejects' if r['holm'] else '–'} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class StrategyPower:
    """What a strategy's design can tell about the paper's smallest effect (claims.SHARDING.effect), by
    the verdict's test simulated from the random runs' own tails; None where too few tails were seen."""
    detect: variance_power.TailPower | None         # to detect it, at one ratio's level within the family
    rule_out: variance_power.RuleOutPower | None    # to rule it out, at the spread intervals' corrected level


def strategy_power(pool: np.ndarray, seeds: int, test: StrategyTest, level: float) -> StrategyPower:
    """`pool`: sharding_residuals; `level`: the spread intervals' confidence (1 - sharding_level)."""
    m = len(test.ratios)
    return StrategyPower(variance_power.tail_power(pool, seeds, test.alpha / m, SHARDING.effect),
                         variance_power.rule_out_power(pool, seeds, level, SHARDING.effect, m))


def design_power(res: SuiteResults, seeds: int) -> variance_power.TailPower | None:
    """The power to detect SHARDING.effect with `seeds` a strategy at the verdict's Bonferroni level."""
    alpha, _ = sharding_level(res)
    return variance_power.tail_power(sharding_residuals(res), seeds, alpha, SHARDING.effect)

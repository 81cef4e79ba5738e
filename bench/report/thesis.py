"""The thesis' findings set beside ours: each computed from a suite's records, with n, an
interval and a verdict by a stated rule (reproduced / not reproduced / inconclusive), never typed in.

- kassela: per-mini-batch time falls with the mini-batch for the PS (>= 10x from 100 % to 1 %) and
  barely for Spark MLlib (<= 1.5x), measured at the paper's data per core. Kassela et al., IEEE
  BigData 2019: up to 14x vs at most 1.36x.
- throughput: specialised systems (PS, allreduce) deliver more samples/s than Spark's general-purpose
  paths, the more so with more workers (the thesis' abstract).
- switch: Strategy-Switch reaches the target >= 1.3x sooner than synchronous all-reduce, with final
  accuracy within 0.5 pp. Provatas et al., IEEE Access 2025; Sync-Switch (ICDCS 2021).
- sharding: stratified or distribution-aware shards lower the run-to-run variance of final metrics
  (random's variance / the strategy's > 1). Provatas et al., IEEE BigData 2021: 8.48x on training
  accuracy (CIFAR-10, k = 30), 6.11x stratified on validation (CIFAR-100 coarse), ~2x validation.

`psbench thesis RESULTS_DIR` writes RESULTS_DIR/thesis.md over every suite there; a suite's report
shows the findings its own records hold.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from psbench.bench.harness.results import SuiteResults, load_suite
from psbench.bench.report import measures
from psbench.bench.report.plots import (SHARDING_GROUP, SHARDING_METRICS, SHARDING_TESTED, _strategy_order,
                                        sharding_runs)
from psbench.bench.report.switching import (SWITCH_ACC_PP, SWITCH_RULE_EXTRA, SWITCH_SPEEDUP, switch_comparisons,
                                            switch_verdict_table)
from psbench.bench.report import variance_power
from psbench.bench.report.stats import (Interval, VarianceRatio, paired_variance_ratio,
                                        variance_ratio)
from psbench.core.atomic import atomic_write_text
from psbench.core.errors import ConfigError

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"

PS_FALL_MIN = 10.0      # the PS's per-mini-batch time falls at least this much over the range
SPARK_FALL_MAX = 1.5    # Spark MLlib's at most this much
PAPER_POINT_TOLERANCE = 0.25  # a measured data per core within 25 % of a paper setup's is measured "at" it
SHARDING_EFFECT = 2.0   # the paper's smallest reported variance reduction (~2x on validation)
ALPHA = 0.05

PAPER = {
    "kassela": "PS per-mini-batch time fell up to 14x as mini-batches shrank; Spark MLlib's at most 1.36x "
               "(Kassela et al., IEEE BigData 2019)",
    "throughput": "specialised architectures deliver substantially higher throughput than general-purpose "
                  "data-processing frameworks at large scales (the thesis' abstract; Kassela et al. 2019: up to 16x "
                  "faster convergence than Spark MLlib)",
    "switch": "Strategy-Switch: accuracy comparable to synchronous all-reduce while training much faster "
              "(Provatas et al., IEEE Access 2025); Sync-Switch: up to 5x faster to target (ICDCS 2021)",
    "sharding": "variance of final metrics, random ÷ strategy: distribution-aware 8.48x on training accuracy "
                "(CIFAR-10, k=30), ~2x on validation; stratified 6.11x on validation accuracy (CIFAR-100 "
                "coarse) (Provatas et al., IEEE BigData 2021)",
}
TRAINED_FACTOR = 2.0  # a sharding comparison counts only if its runs learned: accuracy >= 2 x chance
RULES = {
    "kassela": f"with both sides on real compute (no emulated device), measured at the paper's data per core "
               f"(a setup's rows per core within {PAPER_POINT_TOLERANCE:.0%}: 39k, its 141 x 2-vCPU VMs; 1.1 M, its 5 "
               f"nodes): reproduced if at one of them the PS's fall 100 % → 1 % (paired by seed) has its 95% "
               f"interval at or above {PS_FALL_MIN:g}x and every Spark MLlib native variant's at or below "
               f"{SPARK_FALL_MAX:g}x; not reproduced if at each of them the PS's interval lies below {PS_FALL_MIN:g}x "
               f"or every Spark variant's above {SPARK_FALL_MAX:g}x; else inconclusive. The fall to 0.01 % and the "
               f"cost model's projections are shown, never the verdict; an emulated device is inconclusive by "
               f"construction",
    "throughput": "reproduced if, for a workload, the specialised ÷ general-purpose throughput ratio (the fastest of "
                  "each kind at each worker count, paired by seed, t interval on the log scale) has its 95% interval "
                  "above 1 at every measured worker count and rising: the largest count's interval above the "
                  "smallest count's estimate; not reproduced if at the largest count the interval lies at or below 1 "
                  "or below the smallest count's estimate; else inconclusive",
    "switch": f"reproduced if a switch variant's time to target (training clock, hand-over on it) is shown "
              f"> {SWITCH_SPEEDUP:g}x sooner than the fastest sync system's and its final validation accuracy "
              f"shown within {SWITCH_ACC_PP:g} pp of it (both one-sided paired t tests at alpha {0.05:g}, Holm "
              f"over the variants); not reproduced if every variant that switched has its speed-up interval "
              f"below {SWITCH_SPEEDUP:g}x or its accuracy interval below -{SWITCH_ACC_PP:g} pp; else inconclusive",
    "sharding": f"the ratios tested are those of final training and validation accuracy (the paper's figures' "
                f"metrics; the losses are shown in the suite's report, not tested), each paired by seed. A ratio "
                f"counts where the paired Brown–Forsythe test (a paired t test on absolute deviations from the "
                f"median; it holds its level under the heavy tails final accuracies show, where the F and "
                f"Pitman–Morgan tests do not) rejects equal spread at {ALPHA:g} ÷ the ratios tested (Bonferroni); "
                f"its direction is the spread ratio's (random's mean absolute deviation ÷ the strategy's, squared: "
                f"the variance ratio where the two differ in scale only), shown with its interval at that level. "
                f"Reproduced if some ratio counts as lower variance and none as higher; not reproduced if some "
                f"counts as higher and none as lower, or none counts and every spread ratio's corrected interval "
                f"lies below {SHARDING_EFFECT:g}x (the paper's smallest effect ruled out); inconclusive otherwise, "
                f"or where ratios count both ways. The variance ratio with its 95% interval and the Pitman–Morgan p "
                f"are shown, not tested. Power: the test's, from the random-shard runs' own tails (bench/report/"
                f"variance_power.py). Only comparisons whose runs learned count: a workload and condition whose "
                f"mean final validation accuracy stays below {TRAINED_FACTOR:g}x chance (1 / its classes, from the "
                f"shard reports) is left out and named (the variance of untrained models says nothing of sharding)",
}


@dataclass(frozen=True)
class Finding:
    finding: str
    paper: str
    ours: str
    verdict: str
    rule: str
    suite: str
    seeds: int = 0  # the design's seeds a comparison, where several suites test the same finding
    # thesis.md's summary row and section: the headline figure (95% interval, n) and the condition that
    # decides it, each at most SUMMARY_CELL characters, and the section's Markdown (its table of twins or
    # conditions, what ran where: emulated device or real compute, processes per core, oversubscribed)
    headline: str = ""
    decides: str = ""
    detail: str = ""


SUMMARY_CELL = 200


def _fmt_ci(iv: Interval, unit: str = "x", digits: int = 2) -> str:
    if math.isnan(iv.estimate):
        return "n/a"
    if math.isnan(iv.lo):
        return f"{iv.estimate:.{digits}f}{unit} (n={iv.n}, no interval)"
    return f"{iv.estimate:.{digits}f}{unit} [{iv.lo:.{digits}f}, {iv.hi:.{digits}f}] (n={iv.n})"


# ---- Kassela 2019: per-mini-batch time against the mini-batch ------------------------------------

SPARK_NATIVE = "spark-mllib-native"  # MLlib's own trainer, as the paper ran it (every variant run)


def _native_labels(res: SuiteResults) -> set[str]:
    return set(res.runs.loc[res.runs["system"] == SPARK_NATIVE, "label"])


def _emulated(res: SuiteResults) -> bool:
    """Whether any run of the suite had an emulated device: then the two sides are not measured alike."""
    return any((m.get("spec") or {}).get("emulate_device") for m in res.manifests.values())


@dataclass(frozen=True)
class KasselaFall:
    """One system (variant) at one data per core: its fall 100 % → the paper's smallest fraction
    (tested) and → the suite's smallest (shown), each paired by seed (measures.FALL_RULE)."""
    label: str
    system: str
    workload: str
    workers: int
    rows_per_core: float
    setup: str | None        # the paper setup this data per core matches, or None
    fractions: tuple[float, float, float]  # largest, the tested smallest (~1 %: nan if none), the suite's smallest
    tested: Interval | None  # fall to ~1 % (None: no batch near 1 %)
    shown: Interval          # fall to the suite's smallest fraction
    ms: tuple[float, float]  # mean ms per mini-batch at the largest and the tested smallest (else the smallest)


def _paper_setup(rows_per_core: float) -> str | None:
    from psbench.bench.report import cost_model

    for name, rows, cores in cost_model.PAPER_SETUPS:
        if abs(rows_per_core / (rows / cores) - 1) <= PAPER_POINT_TOLERANCE:
            return name
    return None


def kassela_falls(res: SuiteResults) -> list[KasselaFall]:
    """Every system's fall 100 % → ~1 % (the batch whose fraction is nearest the paper's 1 %, within
    a factor 1.5) and → the suite's smallest fraction, per workload and worker count, with the data
    per core (training rows ÷ workers: one worker a core)."""
    from psbench.bench.report import cost_model

    if res.runs.empty or res.steps.empty:
        return []
    fractions = measures.batch_fractions(res)
    means = measures.run_step_means(res)
    runs = res.runs[res.runs["run_id"].isin(means.dropna().index)]
    out = []
    for (label, workload, workers), group in runs.groupby(["label", "workload", "workers"], sort=True):
        frac = fractions.reindex(group["run_id"]).to_numpy()
        by_batch = pd.Series(frac, index=group["batch_size"].to_numpy()).groupby(level=0).median()
        if len(by_batch) < 2 or not np.isfinite(by_batch.to_numpy()).all():
            continue
        largest = int(by_batch.index.max())
        nearest = (np.log(by_batch / cost_model.PAPER_SMALLEST_FRACTION)).abs().drop(largest)
        near = not nearest.empty and nearest.min() <= math.log(1.5)
        small = int(nearest.idxmin()) if near else int(by_batch.index.min())
        rows_per_core = float(largest / by_batch[largest])  # batch per worker ÷ its fraction of all rows
        tested = measures.fall_ratio(group[group["batch_size"].isin([largest, small])], means) if near else None
        shown = measures.fall_ratio(group, means)
        ms = tuple(float(means.reindex(group.loc[group["batch_size"] == b, "run_id"]).mean()) * 1e3
                   for b in (largest, small))
        out.append(KasselaFall(label, str(group["system"].iloc[0]), workload, int(workers), rows_per_core,
                               _paper_setup(rows_per_core),
                               (float(by_batch[largest]), float(by_batch[small]) if near else math.nan,
                                float(by_batch.min())),
                               Interval(tested.n, tested.estimate, tested.lo, tested.hi) if tested else None,
                               Interval(shown.n, shown.estimate, shown.lo, shown.hi), ms))
    return out


def _per_core(rows: float) -> str:
    return f"{rows / 1e6:.2g} M" if rows >= 1e6 else f"{rows / 1e3:.3g}k"


def _iv(iv: Interval) -> str:
    if math.isnan(iv.lo):
        return f"{iv.estimate:.3g}x (no interval)"
    return f"{iv.estimate:.3g}x [{iv.lo:.3g}, {iv.hi:.3g}]"


def _cell(text: str) -> str:
    return text if len(text) <= SUMMARY_CELL else text[:SUMMARY_CELL - 1] + "…"


def kassela(res: SuiteResults) -> Finding | None:
    from psbench.bench.report import cost_model

    if res.suite in cost_model.CHECK_SUITES.values():
        return None  # a check suite's falls are shown in the suite it checks, not a second verdict
    every = kassela_falls(res)
    falls = [f for f in every if f.tested is not None]
    natives = _native_labels(res)
    if not any(f.system == "ps" for f in falls) or not any(f.label in natives for f in falls):
        return None
    name = "per-mini-batch time falls with the mini-batch for the PS, not for Spark MLlib"
    if _emulated(res):
        text = ("an emulated device paces one side and not the other: the fall is the device profile's, not the "
                "systems' (bench/experiments/kassela.toml measures both on real compute)")
        return Finding(name, PAPER["kassela"], text, INCONCLUSIVE, RULES["kassela"], res.suite,
                       headline=_cell(text), decides="an emulated device on one side only")
    # the tested points: a paper setup's data per core, with the PS and Spark's native trainer measured there
    points: dict[str, tuple[KasselaFall, list[KasselaFall]]] = {}
    for key in sorted({(f.workload, f.workers) for f in falls}):
        here = [f for f in falls if (f.workload, f.workers) == key]
        ps = next((f for f in here if f.label == "ps"), None)
        spark = [f for f in here if f.label in natives]
        if ps is not None and spark and ps.setup is not None:
            points[ps.setup] = (ps, spark)
    heads, holds, fails, why = [], [], [], []
    for setup, (ps, spark) in points.items():
        top = max(spark, key=lambda f: f.tested.hi if not math.isnan(f.tested.hi) else f.tested.estimate)
        heads.append(f"{_per_core(ps.rows_per_core)} rows/core: PS {_iv(ps.tested)}, Spark native up to {_iv(top.tested)}")
        ps_holds, ps_fails = ps.tested.lo >= PS_FALL_MIN, ps.tested.hi < PS_FALL_MIN
        spark_holds = all(f.tested.hi <= SPARK_FALL_MAX for f in spark)
        spark_fails = all(f.tested.lo > SPARK_FALL_MAX for f in spark)
        holds.append(ps_holds and spark_holds)
        fails.append(ps_fails or spark_fails)
        at = _per_core(ps.rows_per_core)
        why.append(f"{at}: PS lower bound {ps.tested.lo:.3g} {'≥' if ps_holds else '<'} {PS_FALL_MIN:g}x, Spark upper "
                   f"{max(f.tested.hi for f in spark):.3g} {'≤' if spark_holds else '>'} {SPARK_FALL_MAX:g}x"
                   if holds[-1] or not fails[-1] else
                   f"{at}: " + " and ".join(
                       ([f"PS upper bound {ps.tested.hi:.3g} < {PS_FALL_MIN:g}x"] if ps_fails else [])
                       + ([f"every Spark lower bound > {SPARK_FALL_MAX:g}x (least {min(f.tested.lo for f in spark):.3g})"]
                          if spark_fails else [])))
    all_setups = {name for name, _, _ in cost_model.PAPER_SETUPS}
    if any(holds):
        verdict = REPRODUCED
    elif points and set(points) == all_setups and all(fails):
        verdict = NOT_REPRODUCED
    else:
        verdict = INCONCLUSIVE
    n = sorted({f.tested.n for ps, spark in points.values() for f in [ps, *spark]})
    n_text = f"n={n[0]}" if len(n) == 1 else f"n={n[0]}–{n[-1]}" if n else "n=0"
    if points:
        headline = _cell("; ".join(heads) + f" (100 → 1 %, {n_text})")
        missing = sorted(all_setups - set(points))
        decides = _cell("; ".join(why) + ("" if verdict != INCONCLUSIVE or not missing else
                                          f"; not measured at {len(missing)} of the paper's setups"))
    else:
        headline = _cell("not measured at the paper's data per core (39k or 1.1 M rows a core); measured at "
                         + ", ".join(sorted({_per_core(f.rows_per_core) for f in falls})) + " rows a core")
        decides = _cell("no measurement at a paper setup's data per core (within "
                        f"{PAPER_POINT_TOLERANCE:.0%}); the cost model's projection is shown, never a verdict")
    detail = _kassela_detail(res, every, natives)
    return Finding(name, PAPER["kassela"], headline, verdict, RULES["kassela"], res.suite,
                   headline=headline, decides=decides, detail=detail)


def _kassela_detail(res: SuiteResults, falls: list[KasselaFall], natives: set[str]) -> str:
    """The section: the falls per data per core and system, the cost model's projections (shown),
    the check suite's falls (shown), the rule, the conditions."""
    from psbench.bench.report import cost_model

    lines = ["| data per core | paper setup | system | 100 % → ~1 %: fall (95% interval) | n | ms per mini-batch "
             "at 100 % / ~1 % | → smallest fraction (shown) |", "|---|---|---|---|---|---|---|"]
    for f in sorted(falls, key=lambda f: (f.rows_per_core, f.label != "ps", f.label not in natives, f.label)):
        if f.tested is None:
            continue
        lines.append(f"| {_per_core(f.rows_per_core)} rows ({f.workers} w) | {f.setup or '—'} | {f.label} | "
                     f"{f.fractions[0]:.0%} → {f.fractions[1]:.2%}: {_iv(f.tested)} | {f.tested.n} | "
                     f"{f.ms[0]:.3g} / {f.ms[1]:.3g} | {f.fractions[2]:.4%}: {_iv(f.shown)} |")
    check = cost_model.check_suite(res)
    if check is not None:
        shown = kassela_falls(check)
        if shown:
            lines += ["", f"Shown, not a verdict ({check.suite}, the model's check at another data size): "
                      + "; ".join(f"{f.label} at {_per_core(f.rows_per_core)} rows a core, {f.fractions[0]:.0%} → "
                                  f"{f.fractions[2]:.4%}: {_iv(f.shown)} (n={f.shown.n})" for f in shown) + "."]
    fits = cost_model.fit_costs(res)
    if fits:
        checked = cost_model.checked_labels(cost_model.size_check(fits, check))
        projected = cost_model.predicted_falls(fits, checked)
        paper = projected[projected["setup"].isin([s for s, _, _ in cost_model.PAPER_SETUPS])]
        lines += ["", "The cost model (the explanation, never the verdict; " + cost_model.MODEL_RULE + "), "
                  "projected to the paper's setups from each measured size: "
                  + "; ".join(f"{r['system']} from {r['workload']} at {r['rows per core']:,.0f} rows a core "
                              f"{_iv(r['fall to 1 %'])}" + ("" if r["validated"] else " (not validated)")
                              for _, r in paper.iterrows() if r["system"] == "ps" or r["system"] in natives) + "."]
    lines += ["", f"Rule: {RULES['kassela']}. {measures.FALL_RULE}."]
    lines += ["", "Conditions: " + _kassela_conditions(res)]
    return "\n".join(lines)


def _kassela_conditions(res: SuiteResults) -> str:
    """Real compute or an emulated device; processes per core (the CPU plan's processes ÷ cores);
    how many runs were oversubscribed, per system."""
    per_system: dict[str, list[tuple[float, bool]]] = {}
    for manifest in res.manifests.values():
        spec, cond = manifest.get("spec") or {}, ((manifest.get("extra") or {}).get("conditions") or {})
        plan, cores = cond.get("cpu_plan") or {}, cond.get("cores")
        procs = sum(int(v.get("count", 0)) for v in plan.values() if isinstance(v, dict))
        per_system.setdefault(spec.get("system", "?"), []).append(
            (procs / cores if cores and procs else math.nan, cond.get("oversubscribed") is True))
    device = "an emulated device" if _emulated(res) else "real compute on every side (no emulated device)"
    parts = []
    for system, values in sorted(per_system.items()):
        per_core = [v for v, _ in values if not math.isnan(v)]
        over = sum(o for _, o in values)
        parts.append(f"{system} {max(per_core):.3g} processes a core" if per_core else f"{system} (no CPU plan)")
        parts[-1] += f", {over} of {len(values)} runs oversubscribed"
    return device + "; " + "; ".join(parts) + "."


# ---- specialised vs general-purpose throughput ----------------------------------------------------

def throughput(res: SuiteResults) -> Finding | None:
    from psbench.bench.report import throughput_gap

    parts, holds, fails = [], [], []
    for workload, mine in throughput_gap.scaling_gaps(res).items():
        parts.append(f"{workload}: " + ", ".join(f"{g.workers} workers {_fmt_ci(g.ratio)} ({g.specialised} ÷ "
                                                 f"{g.general})" for g in mine))
        holds.append(throughput_gap.holds(mine))
        fails.append(throughput_gap.fails(mine))
    if not parts:
        return None
    verdict = REPRODUCED if any(holds) else NOT_REPRODUCED if all(fails) else INCONCLUSIVE
    return Finding("specialised systems' throughput above general-purpose frameworks', rising with workers",
                   PAPER["throughput"], "; ".join(parts) + f" ({throughput_gap.GAP_RULE})", verdict,
                   RULES["throughput"], res.suite)


# ---- Strategy-Switch -----------------------------------------------------------------------------

def switch(res: SuiteResults) -> Finding | None:
    found = switch_comparisons(res)
    if not found:
        return None
    table = switch_verdict_table(found)
    tested = [c for c in found if c.in_verdict]
    parts, holds, map_parts = [], [], []
    for c, (_, row) in zip(found, table.iterrows()):
        if c.map_cell:
            map_parts.append(f"map cell ({c.conditions}, n={c.speedup.n}, not tested): {c.variant} vs {c.baseline} "
                             f"{_fmt_ci(c.speedup.interval)}, val acc {_fmt_ci(c.accuracy_pp.interval, ' pp')}")
            continue
        parts.append(f"{c.variant} ({c.workload}, {c.workers} workers) vs {c.baseline}: time to target "
                     f"{_fmt_ci(c.time_to_target.interval, ' s')} vs {_fmt_ci(c.base_time_to_target.interval, ' s')}, "
                     f"speed-up {_fmt_ci(c.speedup.interval)}, p={c.speedup.p:.3g}, detectable {c.speedup.mde:.2f}x; "
                     f"val acc {_fmt_ci(c.accuracy_pp.interval, ' pp')}; reached {c.reached}"
                     + (f"; never switched {c.never_switched}" if c.never_switched not in ("–", "0/0") else "")
                     + ("" if c.in_verdict or c.never_switched == "–" else " (never acted: not in the verdict)"))
        if c.in_verdict:
            holds.append(row[f"> {SWITCH_SPEEDUP:g}x after Holm"] == "yes" and
                         row[f"within {SWITCH_ACC_PP:g} pp after Holm"] == "yes")
    fails = [c.speedup.hi < SWITCH_SPEEDUP or c.accuracy_pp.hi < -SWITCH_ACC_PP for c in tested]
    verdict = (REPRODUCED if any(holds) else NOT_REPRODUCED if tested and all(fails) else INCONCLUSIVE)
    return Finding("Strategy-Switch: sync accuracy, sooner to target", PAPER["switch"], "; ".join(parts + map_parts),
                   verdict, RULES["switch"] + ". " + SWITCH_RULE_EXTRA, res.suite)


# ---- sharding variance ---------------------------------------------------------------------------

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
        for strategy in _strategy_order(group["sharding"].unique()):
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


def sharding(res: SuiteResults) -> Finding | None:
    ratios = sharding_ratios(res).dropna(subset=["ratio"])
    ratios = ratios[ratios["tested"].astype(bool)]
    if ratios.empty:
        return None
    failed = untrained(res)
    idle = [f"{w} ({c}): mean final validation accuracy {acc:.3f}, chance {chance:.3f}: the runs did not learn, "
            f"left out" for (w, c), (acc, chance) in failed.items()]
    ratios = ratios[[(w, c) not in failed for w, c in zip(ratios["workload"], ratios["conditions"])]]
    if ratios.empty:
        return Finding("smarter sharding lowers run-to-run variance", PAPER["sharding"], "; ".join(idle),
                       INCONCLUSIVE, RULES["sharding"], res.suite)
    alpha, m = sharding_level(res)
    significant = ratios["p_bf_paired"] < alpha
    lower = ratios[significant & (ratios["spread"] > 1)]   # the strategy less variable than random
    higher = ratios[significant & (ratios["spread"] < 1)]  # more variable: against the paper
    best = ratios.loc[ratios["ratio"].idxmax()]

    def where(r: pd.Series) -> str:
        return f"{r['workload']}, {r['conditions']}" if ratios["conditions"].nunique() > 1 else r["workload"]

    def describe(r: pd.Series) -> str:
        return (f"{r['sharding']} {r['metric']} ({where(r)}) variance ratio "
                f"{_fmt_ci(Interval(int(r['seeds']), r['ratio'], r['lo'], r['hi']))}, spread ratio "
                f"{r['spread']:.2f} [{r['spread_lo']:.2f}, {r['spread_hi']:.2f}] at {1 - alpha:.4f}, "
                f"paired Brown–Forsythe p={r['p_bf_paired']:.3g} (Pitman–Morgan p={r['p_paired']:.3g})")

    parts = [f"largest: {describe(best)}",
             f"{len(lower)} of {m} ratios significantly lower (paired Brown–Forsythe at {ALPHA:g}/{m}), "
             f"{len(higher)} significantly higher"]
    parts += [f"lower: {describe(r)}" for _, r in lower.iterrows()]
    parts += [f"higher (against the paper): {describe(r)}" for _, r in higher.iterrows()]
    seeds = int(ratios["seeds"].min())
    pool = sharding_residuals(res)
    tails = variance_power.tail_power(pool, seeds, alpha, SHARDING_EFFECT)
    parts.append("power: " + (tails.text() if tails else f"{seeds} seeds a strategy; {variance_power.TOO_FEW_TAILS} "
                                                         f"({len(pool)}; {variance_power.MIN_POOL} needed)")
                 + f"; were the metrics normal, an F test would detect "
                 f"{variance_power.detectable_ratio(seeds, seeds, alpha):.2f}x and {SHARDING_EFFECT:g}x would need "
                 f"{variance_power.seeds_label(SHARDING_EFFECT, alpha)} seeds")
    parts.append("the paper's design: " + variance_power.paper_design_text())
    if tails:
        parts.append("with tails like ours, the largest of its 12 null ratios reaches "
                     + ", ".join(f"{r:g} with probability {variance_power.paper_null_with_tails(pool, r):.2f}"
                                 for r in variance_power.PAPER_RATIOS))
    parts += idle
    if len(lower) and len(higher):
        verdict = INCONCLUSIVE  # significant both ways: the strategies' effect depends on the data
    elif len(lower):
        verdict = REPRODUCED
    elif len(higher) or (ratios["spread_hi"] < SHARDING_EFFECT).all():
        verdict = NOT_REPRODUCED
    else:
        verdict = INCONCLUSIVE
    return Finding("smarter sharding lowers run-to-run variance", PAPER["sharding"], "; ".join(parts), verdict,
                   RULES["sharding"], res.suite, seeds)


FINDINGS = (kassela, throughput, switch, sharding)


def findings(res: SuiteResults) -> list[Finding]:
    """The findings this suite's records hold data for."""
    res = measures.annotate(res)
    return [f for compute in FINDINGS if (f := compute(res)) is not None]


def findings_table(found: list[Finding]) -> pd.DataFrame:
    return pd.DataFrame([asdict(f) for f in found], columns=list(Finding.__dataclass_fields__))


def collect(results_dir: Path, quick: bool = False) -> list[Finding]:
    """Every finding over the suites of a results folder (a suite is a folder of run folders):
    the full suites, or with `quick` the quick ones (`<suite>-quick`), never the two mixed."""
    found: list[Finding] = []
    for suite in sorted(p for p in Path(results_dir).iterdir() if p.is_dir() and any(p.glob("*/manifest.json"))):
        if suite.name.endswith("-quick") == quick:
            found.extend(findings(load_suite(suite)))
    return one_verdict_each(found)


SUBSET = "shown, not the verdict"


def one_verdict_each(found: list[Finding]) -> list[Finding]:
    """Where several suites test one finding by seeded designs (make bench's 20-seed sharding suite
    and the powered one), the design with the most seeds gives the verdict; a smaller one stays in
    the table as what it is, its own verdict named but not counted."""
    most: dict[str, Finding] = {}
    for f in found:
        if f.seeds and (f.finding not in most or f.seeds > most[f.finding].seeds):
            most[f.finding] = f
    out = []
    for f in found:
        top = most.get(f.finding)
        if f.seeds and top is not None and f is not top:
            f = replace(f, verdict=SUBSET, ours=f"a smaller design ({f.seeds} seeds a comparison; the verdict is "
                        f"{top.suite}'s, {top.seeds}); by itself: {f.verdict}; " + f.ours)
        out.append(f)
    return out


def render(found: list[Finding], quick: bool = False) -> str:
    lines = ["# The thesis' findings, reproduced on this machine" + (" (quick sizes)" if quick else ""), "",
             "Computed by `psbench thesis` from the suites' records; each verdict follows the rule below it.", "",
             "| finding | the paper | ours (95% interval, n) | verdict | suite |", "|---|---|---|---|---|"]
    for f in found:
        lines.append(f"| {f.finding} | {f.paper} | {f.ours} | **{f.verdict}** | {f.suite} |")
    lines += ["", "Rules:", ""] + [f"- **{f.finding}**: {f.rule}" for f in found]
    if not found:
        lines += ["", "No suite here holds the records of a finding (run `psbench bench`)."]
    return "\n".join(lines) + "\n"


def write(results_dir: Path, quick: bool = False) -> tuple[Path, list[Finding]]:
    """RESULTS_DIR/thesis.md (thesis-quick.md for the quick suites), written whole or not at all."""
    found = collect(Path(results_dir), quick)
    out = Path(results_dir) / ("thesis-quick.md" if quick else "thesis.md")
    atomic_write_text(out, render(found, quick))
    return out, found


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results_dir", help="results root holding the suites (e.g. results/reference)")
    p.add_argument("--quick", action="store_true", help="the quick suites (<suite>-quick) instead of the full ones")


def main(args: argparse.Namespace) -> int:
    if not Path(args.results_dir).is_dir():
        raise ConfigError(f"results folder {args.results_dir} does not exist; give one that `psbench bench` wrote")
    out, found = write(Path(args.results_dir), args.quick)
    for f in found:
        print(f"{f.verdict:>15}  {f.finding}  [{f.suite}]")
    print(f"thesis: {out}")
    return 0

"""The thesis' findings set beside ours: each computed from a suite's records, with n, an
interval and a verdict by a stated rule (claims.Verdict), never typed in. The papers' figures and the
rules' bounds are in claims.py; each finding's statistics and rule in its own module, worded here:

- kassela (kassela.py): per-mini-batch time falls with the mini-batch for the PS and barely for
  Spark MLlib, measured at the paper's data per core (Kassela et al., IEEE BigData 2019).
- throughput (throughput_gap.py): specialised systems deliver more samples/s than Spark's
  data-processing paths, like for like (the thesis' abstract): PS BSP against spark-mllib and
  spark-barrier, by a margin.
- switch (switching.py): Strategy-Switch reaches the target sooner than its own sync system (the
  fastest), with final accuracy within a margin (Provatas et al., IEEE Access 2025; Sync-Switch, ICDCS 2021).
- sharding (sharding.py): stratified or distribution-aware shards lower the run-to-run variance of
  final metrics (random's variance / the strategy's > 1), each strategy its own finding (Provatas et
  al., IEEE BigData 2021).

`psbench thesis RESULTS_DIR` writes RESULTS_DIR/thesis.md over every suite there; a suite's report
shows the findings its own records hold.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from psbench.bench.harness import store
from psbench.bench.harness.results import (INCLUDE_LOST_FLAG, OnlyLostRuns, SuiteResults, load_suite,
                                            lost_left_out_line)
from psbench.bench.report import measures
from psbench.bench.report.switching import (SWITCH_ACC_PP, SWITCH_RULE, SWITCH_RULE_EXTRA, SWITCH_SPEEDUP,
                                            switch_comparisons, switch_verdict_table)
from psbench.bench.report import kassela as kassela_stats, sharding as sharding_stats, throughput_gap, variance_power
from psbench.bench.report.claims import KASSELA, SHARDING, SHARDING_ANY, SWITCH, THROUGHPUT, Verdict
from psbench.bench.report.markdown import markdown_table
from psbench.bench.report.stats import Interval
from psbench.core.atomic import atomic_write_text
from psbench.core.errors import ConfigError


RULES = {  # each stated where it is computed
    "kassela": kassela_stats.RULE,
    "throughput": throughput_gap.TWIN_RULE,
    "switch": SWITCH_RULE,
    "sharding": sharding_stats.RULE,
}


@dataclass(frozen=True)
class Finding:
    finding: str
    paper: str
    ours: str
    verdict: Verdict
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


def conditions_text(res: SuiteResults) -> str:
    """What a finding's runs ran on, from their manifests: an emulated device or real compute, and per
    system its processes per core (the CPU plan's processes over the usable cores) and how many of its
    runs oversubscribed the cores."""
    devices: set[str] = set()
    per_system: dict[str, list[tuple[float, bool]]] = {}
    for manifest in res.manifests.values():
        spec, cond = manifest.get("spec") or {}, ((manifest.get("extra") or {}).get("conditions") or {})
        device = cond.get("emulate_device")
        if isinstance(device, dict):
            devices.add(f"{device.get('name')} ({device.get('step_ms', 0):g} ms a step)")
        plan, cores = cond.get("cpu_plan") or {}, cond.get("cores")
        procs = sum(int(v.get("count", 0)) for v in plan.values() if isinstance(v, dict))
        per_system.setdefault(spec.get("system", "?"), []).append(
            (procs / float(cores) if cores and procs else math.nan, cond.get("oversubscribed") is True))
    where = (f"an emulated device, {', '.join(sorted(devices))}: each step sleeps to its target, the systems' own "
             f"communication and waiting on top" if devices else "real compute (no emulated device)")
    parts = []
    for system, values in sorted(per_system.items()):
        per_core = [v for v, _ in values if not math.isnan(v)]
        parts.append((f"{system} {max(per_core):.3g} processes a core" if per_core else f"{system} (no CPU plan)")
                     + f", {sum(o for _, o in values)} of {len(values)} runs oversubscribed")
    return f"Conditions: {where}; " + "; ".join(parts) + f" ({res.suite}, {len(res.runs)} runs)."


# ---- Kassela 2019: per-mini-batch time against the mini-batch ------------------------------------

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
    every = kassela_stats.kassela_falls(res)
    shown = [f for f in every if f.tested is not None]
    natives = kassela_stats.native_labels(res)
    if not any(f.system == "ps" for f in shown) or not any(f.label in natives for f in shown):
        return None
    falls = [f for f in shown if not f.oversubscribed]  # a verdict holds without oversubscribed runs
    name = KASSELA.finding
    if kassela_stats.emulated(res):
        text = ("an emulated device paces one side and not the other: the fall is the device profile's, not the "
                "systems' (bench/experiments/kassela.toml measures both on real compute)")
        return Finding(name, KASSELA.paper, text, Verdict.INCONCLUSIVE, RULES["kassela"], res.suite,
                       headline=_cell(text), decides="an emulated device on one side only")
    tests = kassela_stats.setup_tests(falls, natives)
    heads, why = [], []
    for t in tests.values():
        ps, spark = t.ps, t.spark
        top = max(spark, key=lambda f: f.tested.hi if not math.isnan(f.tested.hi) else f.tested.estimate)
        heads.append(f"{_per_core(ps.rows_per_core)} rows/core: PS {_iv(ps.tested)}, Spark native up to {_iv(top.tested)}")
        at = _per_core(ps.rows_per_core)
        why.append(f"{at}: PS lower bound {ps.tested.lo:.3g} {'≥' if t.ps_holds else '<'} {KASSELA.ps_fall_min:g}x, "
                   f"Spark upper {max(f.tested.hi for f in spark):.3g} {'≤' if t.spark_holds else '>'} "
                   f"{KASSELA.spark_fall_max:g}x"
                   if t.holds or not t.fails else
                   f"{at}: " + " and ".join(
                       ([f"PS upper bound {ps.tested.hi:.3g} < {KASSELA.ps_fall_min:g}x"] if t.ps_fails else [])
                       + ([f"every Spark lower bound > {KASSELA.spark_fall_max:g}x (least "
                           f"{min(f.tested.lo for f in spark):.3g})"] if t.spark_fails else [])))
    verdict = kassela_stats.verdict(tests)
    n = sorted({f.tested.n for t in tests.values() for f in [t.ps, *t.spark]})
    n_text = f"n={n[0]}" if len(n) == 1 else f"n={n[0]}–{n[-1]}" if n else "n=0"
    if tests:
        headline = _cell("; ".join(heads) + f" (100 → 1 %, {n_text})")
        missing = sorted(kassela_stats.paper_setups() - set(tests))
        decides = _cell("; ".join(why) + ("" if verdict != Verdict.INCONCLUSIVE or not missing else
                                          f"; not measured at {len(missing)} of the paper's setups"))
    elif any(f.setup is not None for f in shown if f.oversubscribed):
        headline = _cell("at the paper's data per core only runs that oversubscribed the cores: "
                         + ", ".join(sorted({_per_core(f.rows_per_core) for f in shown if f.oversubscribed}))
                         + " rows a core (shown, not counted)")
        decides = _cell("no run at a paper setup's data per core that fits the cores; a verdict holds without "
                        "oversubscribed runs")
    else:
        headline = _cell("not measured at the paper's data per core (39k or 1.1 M rows a core); measured at "
                         + ", ".join(sorted({_per_core(f.rows_per_core) for f in shown})) + " rows a core")
        decides = _cell("no measurement at a paper setup's data per core (within "
                        f"{kassela_stats.PAPER_POINT_TOLERANCE:.0%}); the cost model's projection is shown, never a "
                        "verdict")
    detail = _kassela_detail(res, every, natives)
    return Finding(name, KASSELA.paper, headline, verdict, RULES["kassela"], res.suite,
                   headline=headline, decides=decides, detail=detail)


def _kassela_detail(res: SuiteResults, falls: list[kassela_stats.KasselaFall], natives: set[str]) -> str:
    """The section: the falls per data per core and system, the cost model's projections (shown),
    the check suite's falls (shown), the rule, the conditions."""
    from psbench.bench.report import cost_model

    lines = ["| data per core | paper setup | system | 100 % → ~1 %: fall (95% interval) | n | ms per mini-batch "
             "at 100 % / ~1 % | → smallest fraction (shown) |", "|---|---|---|---|---|---|---|"]
    for f in sorted(falls, key=lambda f: (f.rows_per_core, f.label != "ps", f.label not in natives, f.label)):
        if f.tested is None:
            continue
        crowded = ", oversubscribed: not counted" if f.oversubscribed else ""
        lines.append(f"| {_per_core(f.rows_per_core)} rows ({f.workers} w{crowded}) | {f.setup or '—'} | {f.label} | "
                     f"{f.fractions[0]:.0%} → {f.fractions[1]:.2%}: {_iv(f.tested)} | {f.tested.n} | "
                     f"{f.ms[0]:.3g} / {f.ms[1]:.3g} | {f.fractions[2]:.4%}: {_iv(f.shown)} |")
    check = cost_model.check_suite(res)
    if check is not None:
        shown = kassela_stats.kassela_falls(check)
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
    lines += ["", conditions_text(res)]
    return "\n".join(lines)


# ---- specialised vs general-purpose throughput ----------------------------------------------------

def throughput(res: SuiteResults) -> Finding | None:
    tg = throughput_gap

    found = tg.twins(res)
    tested = tg.verdict_twins(found)
    if all(t.missing for t in tested):
        return None  # no twin with both sides run: the suite is no throughput design (e.g. `systems`)
    verdict = Verdict.REPRODUCED if tg.holds(found) else Verdict.NOT_REPRODUCED if tg.fails(found) else Verdict.INCONCLUSIVE
    counted = [t for t in tested if t.counted and not math.isnan(t.ratio.lo)]
    missing = [t for t in tested if t.missing]
    crowded = [t for t in tested if t.oversubscribed]

    def at(t: tg.Twin) -> str:
        return f"{t.workload}, {t.workers} worker{'s' * (t.workers > 1)}"

    # the headline: each synchronous twin's weakest counted point (the verdict hinges on it), and the ring's twin
    weakest = {}
    for t in counted:
        if t.pair not in weakest or t.ratio.lo < weakest[t.pair].ratio.lo:
            weakest[t.pair] = t
    heads = [f"{pair} {_fmt_ci(t.ratio, digits=1 if t.ratio.estimate >= 10 else 2)} at {t.workers}w {t.workload}"
             for pair, t in sorted(weakest.items())]
    rings = [t for t in found if t.role == tg.LAUNCHER and not t.oversubscribed and not t.missing]
    if rings:
        ring = max(rings, key=lambda t: (t.workers, t.workload))
        heads.append(f"ddp ÷ spark-torch {_fmt_ci(ring.ratio)} at {ring.workers}w")
    headline = "; ".join(heads)
    while len(headline) > SUMMARY_CELL and len(heads) > 1:
        heads.pop()
        headline = "; ".join(heads)
    headline = headline[:SUMMARY_CELL]
    if missing:
        decides = f"a twin missing: {missing[0].pair} at {at(missing[0])}" + (f" (+{len(missing) - 1} more)"
                                                                             if len(missing) > 1 else "")
    elif weakest:
        low = min(weakest.values(), key=lambda t: t.ratio.lo)
        decides = (f"the weakest counted twin's lower bound against {tg.MARGIN:g}x: {low.pair} at {at(low)}; "
                   f"{len(crowded)} oversubscribed point{'s' * (len(crowded) != 1)} not counted")
    else:
        decides = f"no synchronous twin at a worker count that fits the cores ({len(crowded)} oversubscribed)"
    decides = decides[:SUMMARY_CELL]

    # Spark as a launcher: DDP ÷ spark-torch per step, and its launch once
    launcher = []
    for t in (t for t in found if t.role == tg.LAUNCHER and not t.missing):
        launch = tg.launch_cost(res, t.workload, t.workers)
        launcher.append({"workload": t.workload, "workers": t.workers,
                         "ddp ÷ spark-torch, per step": tg.fmt_ratio(t.ratio),
                         "spark-torch launch − ddp's (s), once": tg.fmt_interval(launch) if launch.n else "–",
                         "oversubscribed": "yes" if t.oversubscribed else "no"})
    runs = measures.annotate(res).runs
    device = sorted({str((m.get("spec") or {}).get("emulate_device") or "none") for m in res.manifests.values()})
    cores = pd.to_numeric(runs["cores"], errors="coerce").dropna()
    per_core = (", ".join(f"{w}: {w / cores.max():g}" for w in sorted(runs["workers"].unique()))
                if len(cores) else "cores not recorded")
    ocs = sorted({f"{t.pair} at {at(t)}" for t in crowded})
    ring_near = [r for r in (t for t in found if t.role == tg.LAUNCHER and not t.missing and not t.oversubscribed)
                 if not math.isnan(r.ratio.lo) and r.ratio.lo <= 1.05 and r.ratio.hi >= 0.95]
    detail = "\n\n".join(filter(None, [
        "**Twins** (samples/s after warm-up, paired by seed):\n\n" + markdown_table(tg.twin_table(found)),
        ("**Spark as a launcher** (the same DDP ring, started by TorchDistributor): per step, DDP ÷ spark-torch; "
         "once, the launch's extra seconds (paired by seed)" + (
             f"; within 5 % of 1 at {len(ring_near)} of the counts that fit the cores: once running, "
             f"Spark adds nothing measurable per step, its cost is the launch" if ring_near else "")
         + ".\n\n" + markdown_table(pd.DataFrame(launcher))) if launcher else "",
        "**Each exchange alone** (ms):\n\n" + markdown_table(tg.exchange_table(res)),
        f"**Conditions.** Emulated device: {', '.join(device)} (a mini-batch's compute paced to its profile). "
        f"Workers per core: {per_core}; Spark adds its driver JVM and Python workers. Oversubscribed (shown, not "
        f"counted): {'; '.join(ocs) if ocs else 'none'}.",
    ]))
    ours = headline + (f"; {decides}" if missing else "")
    return Finding(THROUGHPUT.finding, THROUGHPUT.paper, ours, verdict, RULES["throughput"], res.suite,
                   headline=headline, decides=decides, detail=detail)


# ---- Strategy-Switch -----------------------------------------------------------------------------

def switch(res: SuiteResults) -> Finding | None:
    from psbench.bench.report import switching as sw

    judged = sw.switch_verdict(res)
    if judged is None:
        return None
    found = judged.combined
    table = switch_verdict_table(found)
    parts, map_parts = [], []
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
                     + ("" if c.in_verdict or c.never_switched == "–" else
                        " (never acted: not in the verdict)" if not c.switched else f" ({sw.variant_role(c)})"))
    verdict = {sw.Outcome.HOLDS: Verdict.REPRODUCED,
               sw.Outcome.FAILS: Verdict.NOT_REPRODUCED}.get(judged.outcome, Verdict.INCONCLUSIVE)
    blocks = "; ".join(f"{name}: {outcome}" for name, outcome in judged.block_outcomes.items()) or "none judged"
    tested = [c for c in found if c.in_verdict]
    lead = max(tested or [c for c in found if not c.map_cell] or found, key=lambda c: c.speedup.estimate)
    headline = (f"{lead.variant} vs {lead.baseline}: {_fmt_ci(lead.speedup.interval)} sooner to "
                f"{lead.target:.3f}, final acc {_fmt_ci(lead.accuracy_pp.interval, ' pp', 1)}")
    if judged.outcome == sw.Outcome.BLOCKS_DISAGREE:
        decides = (f"the seed blocks disagree ({blocks}): needs more seeds, another block of {sw.BLOCK_SEEDS}")
    elif judged.outcome == sw.Outcome.HOLDS:
        decides = (f"a switch with {lead.baseline}'s sync phase shown > {SWITCH_SPEEDUP:g}x sooner and within "
                   f"{SWITCH_ACC_PP:g} pp after Holm; blocks: {blocks}")
    else:
        decides = (f"speed-up interval vs {SWITCH_SPEEDUP:g}x and accuracy interval vs -{SWITCH_ACC_PP:g} pp "
                   f"({'both ruled out' if judged.outcome == sw.Outcome.FAILS else 'not both shown'}); blocks: {blocks}")
    return Finding(SWITCH.finding, SWITCH.paper, "; ".join(parts + map_parts),
                   verdict, RULES["switch"] + ". " + SWITCH_RULE_EXTRA, res.suite,
                   headline=_cell(headline), decides=_cell(decides), detail=_switch_detail(res, judged, verdict))


def _switch_detail(res: SuiteResults, judged, verdict: Verdict) -> str:
    """The switch's section: per block and on all seeds, each variant against the fastest sync
    system; then what ran where."""
    from psbench.bench.report import switching as sw

    lines = ["| seeds | variant | vs | n | time to target (s) | speed-up | final acc diff (pp) | reached | "
             "in the verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for name, found in [*judged.blocks.items(), ("all seeds", judged.combined)]:
        for c in found:
            if c.map_cell:
                continue
            lines.append(f"| {name} | {c.variant} | {c.baseline} | {c.speedup.n} | "
                         f"{c.time_to_target.estimate:.2f} vs {c.base_time_to_target.estimate:.2f} | "
                         f"{_fmt_ci(c.speedup.interval)} | {_fmt_ci(c.accuracy_pp.interval, '', 1)} | {c.reached} | "
                         f"{sw.variant_role(c)} |")
    outcomes = ", ".join(f"{name}: {o}" for name, o in [*judged.block_outcomes.items()]) or "one block"
    point = [c for c in judged.combined if not c.map_cell]
    runs = res.runs[res.runs["workers"].isin({c.workers for c in point})]
    device = sorted({str(d) for d in runs["emulate_device"].dropna()}) or ["none (real compute)"]
    stragglers = sorted({str(x) for x in runs["stragglers"].dropna() if str(x)}) or ["none"]
    workers = sorted({int(w) for w in runs["workers"]})
    cores = sorted({int(c) for c in runs["cores"].dropna()}) if "cores" in runs else []
    over = int(runs["oversubscribed"].eq(True).sum()) if "oversubscribed" in runs else 0
    per_core = ", ".join(f"{w / c:.1f}" for w in workers for c in cores) or "?"
    target = point[0] if point else judged.combined[0]
    lines += ["", f"Outcome per block: {outcomes}; on all seeds: {sw.switch_outcome(judged.combined)}; "
                  f"verdict: {verdict}" + (" (the blocks disagree: needs more seeds)" if
                                           judged.outcome == sw.Outcome.BLOCKS_DISAGREE else "") + ".",
              f"Target {target.target:.3f} ({target.target_source}).",
              f"Conditions: device {', '.join(device)}; stragglers {', '.join(stragglers)}; "
              f"{', '.join(map(str, workers))} workers a phase on {', '.join(map(str, cores)) or '?'} cores ({per_core} workers per core; a switch "
              f"also holds its async phase's processes waiting, and the PS a shard); oversubscribed: {over} of "
              f"{len(runs)} runs."]
    return "\n".join(lines)


# ---- sharding variance ---------------------------------------------------------------------------

def _sharding_where(r: pd.Series) -> str:
    return f"{r['workload']}, {r['conditions']}"


def sharding(res: SuiteResults) -> list[Finding] | None:
    """One finding per strategy (the paper's claims are per strategy), each its own pre-specified family."""
    ratios = sharding_stats.sharding_ratios(res).dropna(subset=["ratio"])
    ratios = ratios[ratios["tested"].astype(bool)]
    if ratios.empty:
        return None
    failed = sharding_stats.untrained(res)
    idle = [f"{w} ({c}): mean final validation accuracy {acc:.3f}, chance {chance:.3f}: the runs did not learn, "
            f"left out" for (w, c), (acc, chance) in failed.items()]
    ratios = ratios[[(w, c) not in failed for w, c in zip(ratios["workload"], ratios["conditions"])]]
    if ratios.empty:
        return [Finding(SHARDING_ANY, SHARDING.paper, "; ".join(idle),
                        Verdict.INCONCLUSIVE, RULES["sharding"], res.suite, headline="every comparison's runs did not learn",
                        decides="; ".join(idle)[:SUMMARY_CELL])]
    pool = sharding_stats.sharding_residuals(res)
    seeds = int(ratios["seeds"].min())
    level = 1 - sharding_stats.sharding_level(res)[0]  # the spread intervals' corrected level
    conditions = conditions_text(res)
    out = []
    for test in sharding_stats.strategy_tests(ratios):
        m = len(test.ratios)
        per_ratio = test.alpha / m
        best = test.ratios.loc[test.ratios["spread"].idxmax()]
        worst = test.ratios.loc[test.ratios["spread"].idxmin()]
        counts = (f"{test.points_lower} of {m} ratios point the paper's way, {test.points_higher} the other; "
                  f"significant (Holm at {test.alpha:.3g}): {test.lower} lower, {test.higher} higher")
        powers = sharding_stats.strategy_power(pool, seeds, test, level)
        detect, rule_out = powers.detect, powers.rule_out
        power = [f"to detect {SHARDING.effect:g}x: "
                 + (detect.text() if detect else f"{seeds} seeds a strategy; {variance_power.TOO_FEW_TAILS} "
                                                 f"({len(pool)}; {variance_power.MIN_POOL} needed)")
                 + f"; were the metrics normal, an F test would detect "
                 f"{variance_power.detectable_ratio(seeds, seeds, per_ratio):.2f}x and {SHARDING.effect:g}x would "
                 f"need {variance_power.seeds_label(SHARDING.effect, per_ratio)} seeds",
                 f"to rule {SHARDING.effect:g}x out: "
                 + (rule_out.text() + " (delta-method bounds)" if rule_out else variance_power.TOO_FEW_TAILS)]
        headline = (f"spread ratio {best['spread']:.2f}x [{best['spread_lo']:.2f}, {best['spread_hi']:.2f}] at most, "
                    f"{worst['spread']:.2f}x [{worst['spread_lo']:.2f}, {worst['spread_hi']:.2f}] at least "
                    f"(n={int(best['seeds'])}); {test.points_lower}↑ {test.points_higher}↓ of {m}")
        detail = "\n".join([
            f"{counts}. Largest: {best['metric']} ({_sharding_where(best)}); smallest: {worst['metric']} "
            f"({_sharding_where(worst)}). Ratios are random ÷ {test.family}: above 1 is the paper's direction.", "",
            sharding_stats.strategy_table(test), "",
            "Power " + "; power ".join(power) + ".", "",
            "The paper's design: " + variance_power.paper_design_text() + "."
            + ("" if not detect else " With tails like ours, the largest of its 12 null ratios reaches "
               + ", ".join(f"{r:g} with probability {variance_power.paper_null_with_tails(pool, r):.2f}"
                           for r in variance_power.PAPER_RATIOS) + "."),
            "", conditions] + [f"- {i}" for i in idle])
        ours = f"{counts}; {headline}; power " + "; power ".join(power) + ("; " + "; ".join(idle) if idle else "")
        out.append(Finding(SHARDING.finding.format(test.family), SHARDING.per_strategy(test.family) or SHARDING.paper,
                           ours, test.verdict, RULES["sharding"], res.suite, seeds, headline=headline,
                           decides=test.reason, detail=detail))
    return out


FINDINGS = (kassela, throughput, switch, sharding)


def findings(res: SuiteResults) -> list[Finding]:
    """The findings this suite's records hold data for."""
    res = measures.annotate(res)
    found: list[Finding] = []
    for compute in FINDINGS:
        f = compute(res)
        found.extend([] if f is None else f if isinstance(f, list) else [f])
    return found


SUMMARY_COLUMNS = ["finding", "the paper's figure (what it measured)", "ours: headline (95% interval, n)", "verdict",
                   "what decides it", "rule"]


def findings_table(found: list[Finding]) -> pd.DataFrame:
    """A suite report's verdicts: thesis.md's summary columns (cells as bounded there) and the rule."""
    return pd.DataFrame([[summary_cell(f.finding), summary_cell(f.paper), summary_cell(f.headline or f.ours),
                          f.verdict, summary_cell(f.decides or "–"), f.rule] for f in found], columns=SUMMARY_COLUMNS)


def suites_of(results_dir: Path, quick: bool = False,
              include_lost: bool = False) -> tuple[dict[str, SuiteResults], int]:
    """The suites of a results folder (a suite is a folder of run folders): the full suites, or with `quick`
    the quick ones (`<suite>-quick`), never the two mixed; and how many runs that lost a worker load_suite
    left out (none with include_lost)."""
    suites: dict[str, SuiteResults] = {}
    left_out = 0
    for suite in sorted(p for p in Path(results_dir).iterdir() if store.is_suite(p)):
        if suite.name.endswith("-quick") != quick:
            continue
        try:
            suites[suite.name] = res = load_suite(suite, include_lost)
        except OnlyLostRuns as only_lost:  # a fault experiment's suite: nothing of it counts
            left_out += only_lost.n_runs
            continue
        left_out += len(res.lost_left_out)
    return suites, left_out


def _gather(results_dir: Path, quick: bool, include_lost: bool) -> tuple[dict[str, SuiteResults], list[Finding], int]:
    suites, left_out = suites_of(results_dir, quick, include_lost)
    return suites, one_verdict_each([f for res in suites.values() for f in findings(res)]), left_out


def collect(results_dir: Path, quick: bool = False, include_lost: bool = False) -> tuple[list[Finding], int]:
    """Every finding over the suites of a results folder, and the runs left out for a lost worker."""
    _, found, left_out = _gather(results_dir, quick, include_lost)
    return found, left_out


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
            f = replace(f, verdict=Verdict.SUBSET, ours=f"a smaller design ({f.seeds} seeds a comparison; the verdict is "
                        f"{top.suite}'s, {top.seeds}); by itself: {f.verdict}; " + f.ours,
                        decides=f"a smaller design ({f.seeds} seeds); {top.suite}'s {top.seeds} give the verdict; "
                                f"by itself: {f.verdict}")
        out.append(f)
    return out


def summary_cell(text: str) -> str:
    """A summary table cell: at most SUMMARY_CELL characters (the whole text stands in the finding's section)."""
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= SUMMARY_CELL else text[:SUMMARY_CELL - 1].rstrip() + "…"


def summary_table(found: list[Finding]) -> str:
    """thesis.md's first table, one row a finding; the README's findings table is this table."""
    lines = ["| finding | the paper's figure (what it measured) | ours: headline (95% interval, n) | verdict | "
             "what decides it |", "|---|---|---|---|---|"]
    for f, row in zip(found, findings_table(found).itertuples(index=False)):
        finding, paper, headline, verdict, decides, _ = row
        lines.append(f"| {finding} ({f.suite}) | {paper} | {headline} | **{verdict}** | {decides} |")
    return "\n".join(lines)


def _provenance(found_suites: dict[str, SuiteResults]) -> str:
    commits: dict[str, int] = {}
    dirty = 0
    for res in found_suites.values():
        for sha, unclean in zip(res.runs.get("git_sha", pd.Series(dtype=object)),
                                res.runs.get("git_dirty", pd.Series(dtype=object))):
            commits[str(sha)[:8]] = commits.get(str(sha)[:8], 0) + 1
            dirty += bool(unclean)
    if not commits:
        return ""
    made = ", ".join(f"{n} from {sha}" for sha, n in sorted(commits.items(), key=lambda kv: -kv[1]))
    return f"Records: {sum(commits.values())} runs ({made}; {dirty} from a dirty checkout)."


def render(found: list[Finding], quick: bool = False, provenance: str = "", left_out: str = "") -> str:
    lines = ["# The thesis' findings, reproduced on this machine" + (" (quick sizes)" if quick else ""), "",
             "Computed by `psbench thesis` from the suites' records, each verdict by the rule in its section. "
             + provenance, "", *([left_out + ".", ""] if left_out else []), "## Summary", "",
             summary_table(found) if found else
             "No suite here holds the records of a finding (run `psbench bench`)."]
    ruled: dict[str, str] = {}
    for f in found:
        title = f"{f.finding} ({f.suite})"
        lines += ["", f"## {title}", "", f"**Verdict: {f.verdict}**" + (f" ({f.decides})" if f.decides else "") + ".",
                  "", f"The paper: {f.paper}.", "", f.detail or f"Ours: {f.ours}.", ""]
        lines.append(f"Rule: as for {ruled[f.rule]}." if f.rule in ruled else f"Rule: {f.rule}.")
        ruled.setdefault(f.rule, title)
    return "\n".join(lines) + "\n"


def write(results_dir: Path, quick: bool = False, include_lost: bool = False) -> tuple[Path, list[Finding], str]:
    """RESULTS_DIR/thesis.md (thesis-quick.md for the quick suites), written whole or not at all; and
    the line naming the runs left out ('' when none)."""
    suites, found, n_left_out = _gather(Path(results_dir), quick, include_lost)
    left_out = lost_left_out_line(n_left_out, f"{results_dir}")
    out = Path(results_dir) / ("thesis-quick.md" if quick else "thesis.md")
    atomic_write_text(out, render(found, quick, _provenance(suites), left_out))
    return out, found, left_out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results_dir", help="results root holding the suites (e.g. results/reference)")
    p.add_argument("--quick", action="store_true", help="the quick suites (<suite>-quick) instead of the full ones")
    p.add_argument(INCLUDE_LOST_FLAG, dest="include_lost", action="store_true",
                   help="count runs that lost a worker (left out of verdicts and intervals by default)")


def main(args: argparse.Namespace) -> int:
    if not Path(args.results_dir).is_dir():
        raise ConfigError(f"results folder {args.results_dir} does not exist; give one that `psbench bench` wrote")
    out, found, left_out = write(Path(args.results_dir), args.quick, getattr(args, "include_lost", False))
    if left_out:
        print(f"psbench thesis: {left_out}")
    for f in found:
        print(f"{f.verdict:>15}  {f.finding}  [{f.suite}]")
    print(f"thesis: {out}")
    return 0

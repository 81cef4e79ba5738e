"""A suite report's tables, one builder each (a frame per configuration, with n and intervals), and
the captions above them as data: document.py composes them into the report in its outline's order.
The Strategy-Switch roles and the peer parameter servers are read off the registry's system facts."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from psbench.core.records import HOST_GPU_COPIES, STEP_TIME_COLUMNS
from psbench.core.spec import workload_label
from psbench.systems import SYNC, known_as, names_where
from psbench.bench.harness.results import SuiteResults
from psbench.bench.report import cost_model, measures, switching, throughput_gap, variance_power
from psbench.bench.report import sharding as sharding_stats
from psbench.bench.report.claims import KASSELA, SHARDING, SHARDING_ANY, SWITCH
from psbench.bench.report.markdown import fmt_cell as _fmt, missing as _missing
from psbench.bench.report.plots import baseline_runs, breakdown_groups, throughput_column
from psbench.bench.report.sharding import (SHARDING_GROUP, SHARDING_METRICS, SHARDING_TESTED, sharding_runs,
                                           strategy_order)
from psbench.bench.report.stats import Interval, bootstrap_ci, mlperf_time_to_target, ratio_ci
from psbench.bench.report.throughput_gap import PS_DEFAULT_CONSISTENCY


@dataclass(frozen=True)
class Caption:
    """A table's section in the report: its heading and the paragraph above it; a text with {fields}
    is completed per suite by compose (what only the suite's records can say)."""
    title: str
    text: str = ""

    def fill(self, **fields: str) -> str:
        return self.text.format(**fields) if fields else self.text


CAPTIONS: dict[str, Caption] = {
    "systems": Caption(
        "Systems",
        "Samples/s: all workers together, after warm-up, over the span in which every worker trains (see "
        "Method). Speed-up and efficiency compare with the `single` system on the same workload, batch size "
        "and conditions (or the variant's own 1-worker runs); efficiency = speed-up ÷ N. Budget: what ended "
        "the runs (a step or epoch count per worker, or a global count of updates or samples)."),
    "accuracy": Caption(
        "Time to accuracy and costs",
        "Launch (process start, a Spark session) and the Strategy-Switch hand-over in their own columns, and "
        "included in the time to target beside it."),
    "verdicts": Caption(
        "Thesis verdicts",
        "Each of the thesis' findings this suite holds records for: the paper's figure, ours with its 95% "
        "interval and n, and a verdict by the rule beside it (bench/report/thesis.py), computed from the records. "
        "`psbench thesis RESULTS_DIR` gathers them over every suite."),
    "switch_verdict": Caption(
        "Strategy-Switch against the fastest sync system",
        "Each switch variant and pure ASP against the faster of ddp and ps bsp, paired by seed: "
        + switching.SWITCH_RULE_EXTRA + " 'detectable speed-up': the smallest speed-up this design shows "
        "with 80% power at the test's alpha, given the spread seen."),
    "thesis": Caption(
        "Thesis figures beside ours",
        "Our runs are small and on one machine; the shape of a finding is what carries over, not its size. "
        "Strategy-Switch is compared with pure sync and pure async runs set up alike, never with itself."),
    "breakdown": Caption(
        "Per-step time breakdown",
        "Median milliseconds per step of each part (after warm-up; median over steps, then over runs): compute "
        "(real), emulated (device or straggler sleep), communication, waiting on other workers (barrier, SSP "
        "block, allGather, the slowest rank of a collective), update (the optimizer step; a PS worker: loading "
        "the answered parameters), each with its 95% interval over runs; '–' where a system cannot tell. One "
        "pacing contract holds for every system (ARCHITECTURE.md, 'Pacing'): communication started inside "
        "backward overlaps only the emulated backward after its gradients are ready. {untold}"),
    "batch_sweep": Caption(
        "Per-mini-batch cost vs batch size",
        "Median time between a worker's consecutive mini-batches (launch and start-up excluded) at the smallest "
        "and largest batch size of each variant, median over runs."),
    "fall": Caption(
        "Mini-batch fall ratio (Kassela et al. 2019)",
        measures.FALL_RULE.capitalize() + ". Fractions: the global mini-batch over the training rows. Target "
        f"(the thesis): the PS's time falls >= {KASSELA.ps_fall_min:g}x over the range, Spark MLlib's <= "
        f"{KASSELA.spark_fall_max:g}x; the parts at both ends (ms per step, median) say why a time does or does "
        "not fall."),
    "cost_terms": Caption(
        "Per-mini-batch cost model",
        cost_model.MODEL_RULE.capitalize() + ". 'largest fit error': the fit against the mean of the runs at "
        f"each measured batch size; the model projects only where it is within {cost_model.VALIDATION_TOLERANCE:.0%}"
        " at every measured size."),
    "fixed_ratios": Caption(
        "Fixed cost per mini-batch against the PS's",
        "What a mini-batch costs before any example is processed (scheduling, broadcast, aggregation, the "
        "driver's update for Spark; a round trip to the server for the PS), as a ratio, with its interval."),
    "size_check": Caption(
        "The model at another data size",
        "The fits above predict the runs of suite '{check_suite}' (another data size, same systems) from their "
        "rows per core and fraction; the model projects only where every batch there is met within "
        f"{cost_model.VALIDATION_TOLERANCE:.0%}."),
    "predicted_falls": Caption(
        "Predicted falls at other data sizes",
        "The fall (100 % ÷ the smallest fraction) the model predicts at the data per core of each setup; the "
        "paper's setups are stated assumptions (bench/report/cost_model.py PAPER_SETUPS); the paper's "
        "smallest fraction was 1 % (100 mini-batches). The PS's prediction is per worker, without the load of "
        "141 workers on one server (the scale model's part)."),
    "twins": Caption(
        "Specialised ÷ general-purpose throughput, by twins",
        "At each worker count a specialised system ÷ the Spark path doing the same job (mean samples/s after "
        "warm-up, paired by seed, 95% t interval on the log ratio); the verdict's rule is in the thesis section "
        "below."),
    "exchanges": Caption(
        "Each system's exchange timed alone",
        "; ".join(f"{label}: {what}" for label, _, what in throughput_gap.EXCHANGES) + ". Each run's median over "
        "its repeats; their geometric mean over runs with a 95% t interval, n runs."),
    "peers": Caption(
        "Parameter servers: ours vs peers",
        "`ps` beside `ray-ps` (Ray actors as shards and workers, Ray's parameter-server example) and `rpc-ps` "
        "(torch.distributed.rpc, PyTorch's parameter-server tutorials), run alike: same workload, data shards, "
        "server-side SGD and evaluation. Samples/s is the mean over seeds; ps ÷ peer > 1 means ours is faster "
        "(goal: >= 2 at 4 workers). Time to target: mean over the seeds that reached it."),
    "staleness": Caption(
        "Staleness",
        "Server versions between a worker's pull and the apply of its update; the mean's interval is over runs, "
        "the percentiles pool every update."),
    "sharding": Caption(
        "Sharding variability",
        "Mean and variance (over seeds) of the final metrics; var ratio = variance under random sharding ÷ "
        "variance under the strategy (> 1: less variable than random), with its 95% interval; spread ratio = "
        "(random's mean absolute deviation from the median ÷ the strategy's)^2, the variance ratio where the two "
        "differ in scale only, with its interval at the verdict's corrected level. The verdict tests the "
        f"accuracies' ratios (the paper's figures are on accuracy) by the paired Brown–Forsythe test at "
        f"{sharding_stats.ALPHA:g} ÷ the ratios tested (Bonferroni): final accuracies are heavy-tailed, and there "
        "the Pitman–Morgan test (shown) and the F test reject far more often than their level. The losses' ratios "
        "are shown, not tested. Power: the smallest true ratio this many seeds detect with "
        f"{variance_power.POWER:.0%} power by the verdict's test, and the seeds per strategy a {SHARDING.effect:g}x "
        "effect needs, from the random-shard runs' own tails; 'detectable if normal': the one-sided F test's "
        "figure, which holds for normal metrics only (bench/report/variance_power.py). {power} The paper's design "
        f"({SHARDING.runs} runs a strategy): {{paper_design}}"),
    "switch": Caption(
        "Strategy-Switch",
        "Strategy-Switch runs (role switch) and the pure sync and async runs set up alike: time of the sync → "
        "async switch, hand-over, time to target (MLPerf, incl. launch + hand-over) and final accuracy."),
    "bytes": Caption(
        "What the bytes column holds",
        "Per system: measured on the wire, or computed from the model size (how the system's adapter fills it)."),
    "runs": Caption(
        "Runs",
        "Every run: its budget, length, launch and hand-over costs, too-short flag and code version."),
    "environment": Caption("Machine and versions", "From the run manifests."),
    "workload_sources": Caption(
        "The user's own workloads",
        "Workloads defined outside psbench's registry (--model/--dataset or a workload file): the model factory "
        "and dataset loader as the user named them, the workload file, and the sha256 of each file they were "
        "read from (first 12 hex digits), from the run manifests."),
}


GROUP = ["workload", "label", "batch_size", "sharding", "conditions", "workers"]  # one configuration
GROUP_NAMES = {"label": "system", "batch_size": "batch/worker"}

def _key_cells(key: tuple) -> dict[str, Any]:
    return {GROUP_NAMES.get(k, k): v for k, v in zip(GROUP, key)}


def _ci(interval: Interval, scale: float = 1.0) -> str:
    """'lo – hi' of a 95% interval, '–' where there is none (fewer than 2 runs)."""
    if _missing(interval.lo) or _missing(interval.hi):
        return "–"
    return f"{_fmt(interval.lo * scale)} – {_fmt(interval.hi * scale)}"


def with_ci(row: dict[str, Any], name: str, values: Any, statistic: str = "mean", scale: float = 1.0) -> None:
    """row[name] = the statistic over runs; row[name + ' 95% CI'] = its bootstrap interval."""
    ci = bootstrap_ci([] if values is None else pd.to_numeric(values, errors="coerce"), statistic)
    row[name] = None if ci.n == 0 else ci.estimate * scale
    row[f"{name} 95% CI"] = _ci(ci, scale)


def _estimate(interval: Interval) -> float | None:
    return None if _missing(interval.estimate) else interval.estimate


def _budgets(group: pd.DataFrame) -> str:
    return ", ".join(sorted(group["budget"].dropna().astype(str).unique())) or "–"


def _runs_n(group: pd.DataFrame) -> int | str:
    """The runs behind a per-step figure: all of them, or 'k of n with steps' where `psbench slim`
    dropped some runs' per-step rows."""
    if group["steps_kept"].all():
        return len(group)
    return f"{int(group['steps_kept'].sum())} of {len(group)} with steps"


def _too_short(group: pd.DataFrame) -> str:
    return f"{int((group['too_short'] != '').sum())}/{len(group)}"


def summary_table(res: SuiteResults) -> pd.DataFrame:
    """Throughput per configuration: mean over runs with a 95% bootstrap interval, speed-up and
    scaling efficiency against baseline_runs (intervals from resampling both sides)."""
    res = measures.annotate(res)
    runs = res.runs
    value = throughput_column(runs)
    rows = []
    for key, group in runs.groupby(GROUP, sort=True):
        row = {**_key_cells(key), "budget": _budgets(group), "runs": _runs_n(group)}
        with_ci(row, "samples/s", group[value])
        base = baseline_runs(runs, group.iloc[0])
        speedup = ratio_ci(group[value], base[value]) if len(base) else Interval(0, math.nan, math.nan, math.nan)
        row["speed-up vs single"] = _estimate(speedup)
        row["speed-up 95% CI"] = _ci(speedup)
        row["scaling eff."] = None if row["speed-up vs single"] is None else row["speed-up vs single"] / key[-1]
        row["scaling eff. 95% CI"] = _ci(speedup, scale=1 / key[-1])
        row["too short"] = _too_short(group)
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_table(res: SuiteResults) -> pd.DataFrame:
    """Time to target as MLPerf scores it, with the launch and hand-over costs in their own columns
    and included, and the final quality with intervals."""
    res = measures.annotate(res)
    runs = res.runs
    handover = runs["handover_s"].notna().any() if "handover_s" in runs else False
    rows = []
    for key, group in runs.groupby(GROUP, sort=True):
        row: dict[str, Any] = {**_key_cells(key), "runs": len(group)}
        with_ci(row, "launch (s)", group["setup_s"])
        if handover:
            with_ci(row, "hand-over (s)", group["handover_s"])
        clock = mlperf_time_to_target(group["time_to_target_s"].tolist())
        costs = mlperf_time_to_target(group["tta_with_costs_s"].tolist())
        row["time to target, training clock (s)"] = clock.value
        row["time to target incl. launch + hand-over (s)"] = costs.value
        row["spread (s)"] = "–" if costs.fastest is None else f"{_fmt(costs.fastest)} – {_fmt(costs.slowest)}"
        row["reached target"] = f"{clock.reached}/{clock.n}"
        with_ci(row, "final val acc", group.get("final_val_accuracy"))
        with_ci(row, "final train loss", group.get("final_train_loss"))
        rows.append(row)
    return pd.DataFrame(rows)


def breakdown_table(res: SuiteResults) -> pd.DataFrame:
    """Median per-step time of each part per configuration (median over steps after warm-up, then
    over runs), the median step with its interval over runs, the slowest worker's median step ÷ the
    median worker's, and the bytes per step with what they are (measured or computed)."""
    runs = breakdown_groups(measures.annotate(res))
    rows = []
    for key, group in runs.groupby(GROUP, sort=True):
        row: dict[str, Any] = {**_key_cells(key), "runs": len(group)}  # runs with steps only (breakdown_groups)
        for col, name in zip(STEP_TIME_COLUMNS, ("compute", "emulated", "communication", "waiting", "update",
                                                      "batch assembly", "host-GPU copies"),
                             strict=True):
            with_ci(row, f"{name} (ms)", group[col], "median", scale=1000)
            row[f"{name} (ms)"] = math.nan if row[f"{name} (ms)"] is None else row[f"{name} (ms)"]  # untold: nan
        with_ci(row, "step (ms)", group["step_s"], "median", scale=1000)
        if "allreduce_alone_s" in group and group["allreduce_alone_s"].notna().any():
            # the same tensors' allreduce timed alone in the same ranks: what communication costs
            # with nothing to overlap; comm above it is contention, below it overlap
            with_ci(row, "allreduce alone (ms)", group["allreduce_alone_s"], "median", scale=1000)
        if "ps_roundtrip_alone_s" in group and group["ps_roundtrip_alone_s"].notna().any():
            # a push + pull of the same tensors against one shard, alone: the PS's counterpart
            with_ci(row, "PS round trip alone (ms)", group["ps_roundtrip_alone_s"], "median", scale=1000)
        row["slowest ÷ median worker"] = _median(group["slowest_ratio"])
        row["bytes/step"] = _median(group["bytes_per_step"])
        first = group.iloc[0]
        row["bytes are"] = measures.bytes_source(first["system"], res.manifests.get(first["run_id"]))
        rows.append(row)
    frame = pd.DataFrame(rows)
    copies = "host-GPU copies (ms)"
    if copies in frame and not (frame[copies] > 0).any():  # no run copied: every report before GPUs, unchanged
        frame = frame.drop(columns=[c for c in frame.columns if c.startswith(copies)])
    return frame


def _median(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.median()) if len(values) else math.nan


def runs_table(res: SuiteResults) -> pd.DataFrame:
    """One row per run: its budget, length, costs, flags and code version."""
    runs = measures.annotate(res).runs
    frame = pd.DataFrame({
        "run": runs["run_id"], "system": runs["label"], "workers": runs["workers"], "seed": runs["seed"],
        "conditions": runs["conditions"], "budget": runs["budget"], "steps/worker": runs["steps_per_worker"],
        "train (s)": runs.get("train_s"), "launch (s)": runs["setup_s"], "hand-over (s)": runs["handover_s"],
        "time to target incl. costs (s)": runs["tta_with_costs_s"],
        "too short": runs["too_short"].replace("", "no"),
        "git sha": runs["git_sha"].fillna("unknown").astype(str).str[:10],
        "uncommitted changes": runs["git_dirty"].map({True: "yes", False: "no"}).fillna("unknown"),
    })
    if runs["oversubscribed"].notna().any():
        frame["oversubscribed"] = runs["oversubscribed"]
    if runs["cpu_measured"].notna().any():  # the plan beside what the run's processes used (cores)
        frame["CPU planned"] = runs["cpu_demand"]
        frame["CPU used"] = runs["cpu_measured"]
        frame["CPU flag"] = runs["cpu_flag"].replace("", "no")
    if runs["handover_s"].isna().all():
        frame = frame.drop(columns=["hand-over (s)"])
    return frame


def batch_sweep_table(res: SuiteResults) -> pd.DataFrame:
    """Per variant: step time at the smallest and the largest batch (median over runs, with its
    interval), and the fall between them."""
    runs = res.runs.dropna(subset=["median_step_s"])
    rows = []
    for key, group in runs.groupby(["workload", "label", "workers", "sharding", "conditions"], sort=True):
        by_batch = group.groupby("batch_size")["median_step_s"].median()
        if len(by_batch) < 2:
            continue
        row: dict[str, Any] = {"workload": key[0], "system": key[1], "workers": key[2], "sharding": key[3],
                               "conditions": key[4]}
        for end, batch in (("smallest", by_batch.index[0]), ("largest", by_batch.index[-1])):
            at = group.loc[group["batch_size"] == batch, "median_step_s"]
            row[f"{end} batch"] = batch
            row[f"runs at {end}"] = len(at)
            with_ci(row, f"ms/step at {end}", at, "median", scale=1000)
        row["cost fall (largest ÷ smallest)"] = by_batch.iloc[-1] / by_batch.iloc[0]
        row["per-example cost ratio"] = ((by_batch.iloc[0] / by_batch.index[0])
                                         / (by_batch.iloc[-1] / by_batch.index[-1]))
        rows.append(row)
    return pd.DataFrame(rows)


def fall_table(res: SuiteResults) -> pd.DataFrame:
    """measures.batch_fall_ratios, formatted: fractions in %, times in ms."""
    falls = measures.batch_fall_ratios(res)
    if falls.empty:
        return falls
    rows = []
    for r in falls.to_dict("records"):
        row = {"workload": r["workload"], "system": r["system"], "workers": r["workers"],
               "fractions": f"{r['largest_fraction']:.2%} → {r['smallest_fraction']:.4%}",
               "ms/step at largest": r["largest_step_s"] * 1000, "ms/step at smallest": r["smallest_step_s"] * 1000,
               "fall ratio": f"{r['fall_ratio']:.3g} [{r['lo']:.3g}, {r['hi']:.3g}]", "n": r["n"]}
        for end in ("largest", "smallest"):
            row[f"compute/emul/comm/wait/update/data ms at {end}"] = " / ".join(
                "–" if _missing(r[f"{end}_{c}"]) else f"{r[f'{end}_{c}'] * 1000:.3g}"
                for c in STEP_TIME_COLUMNS if c != HOST_GPU_COPIES)  # Kassela's suite runs on cpu: no copies
        rows.append(row)
    return pd.DataFrame(rows)


def staleness_table(res: SuiteResults) -> pd.DataFrame:
    steps = res.steps.dropna(subset=["staleness"])
    if steps.empty:
        return pd.DataFrame()
    steps = steps.drop(columns=["system", "workload"]).merge(
        res.runs[["run_id", "workload", "label", "workers", "conditions"]], on="run_id")
    rows = []
    for key, group in steps.groupby(["workload", "label", "workers", "conditions"], sort=True):
        values = group["staleness"].to_numpy(dtype=float)
        row: dict[str, Any] = {"workload": key[0], "system": key[1], "workers": key[2], "conditions": key[3],
                               "runs": group["run_id"].nunique(), "updates": len(values)}
        with_ci(row, "mean", group.groupby("run_id")["staleness"].mean())  # interval over runs
        row.update({"p50": np.percentile(values, 50), "p95": np.percentile(values, 95), "max": int(values.max()),
                    "fresh (0)": f"{(values == 0).mean():.0%}"})
        rows.append(row)
    return pd.DataFrame(rows)


def _metric_short(title: str) -> str:
    return title.replace("final ", "")


def sharding_table(res: SuiteResults) -> pd.DataFrame:
    """Per configuration, final metric and sharding strategy: mean over seeds with its interval, the
    variance, and random's variance ÷ the strategy's (the thesis' variability reduction; > 1 means
    less variable than random) with its interval, the spread ratio and the tests the verdict reads
    (sharding.sharding_ratios), and the design's power at the verdict's level."""
    runs = sharding_runs(res.runs)
    metrics = [(m, t) for m, t in SHARDING_METRICS if m in runs.columns and runs[m].notna().any()]
    if runs.empty or not metrics:
        return pd.DataFrame()
    ratios = {(r.workload, r.label, r.workers, r.batch_size, r.conditions, r.sharding, r.metric): r
              for r in sharding_stats.sharding_ratios(res).itertuples()}
    alpha, _ = sharding_stats.sharding_level(res)
    pool = sharding_stats.sharding_residuals(res)
    rows = []
    for key, group in runs.groupby(SHARDING_GROUP, sort=True):
        for metric, title in metrics:
            for strategy in strategy_order(group["sharding"].unique()):
                values = group.loc[group["sharding"] == strategy, metric].dropna()
                row: dict[str, Any] = {"workload": key[0], "system": key[1], "workers": key[2],
                                       "batch/worker": key[3], "conditions": key[4], "metric": _metric_short(title),
                                       "sharding": strategy, "seeds": len(values)}
                with_ci(row, "mean", values)
                row["variance"] = values.var(ddof=1) if len(values) > 1 else None
                same = strategy == "random"  # random against itself: ratio 1 by definition, nothing to test
                r = ratios.get((*key, strategy, title))
                shown = not same and r is not None
                row["var ratio (random ÷ this)"] = 1.0 if same else None if not shown or _missing(r.ratio) else r.ratio
                row["ratio 95% CI"] = _ci(Interval(r.seeds, r.ratio, r.lo, r.hi)) if shown else "–"
                row["spread ratio"] = None if not shown or _missing(r.spread) else r.spread
                row[f"spread CI ({1 - alpha:.4f})"] = _ci(Interval(r.seeds, r.spread, r.spread_lo, r.spread_hi)) \
                    if shown else "–"
                row["p (paired Brown–Forsythe)"] = None if not shown or _missing(r.p_bf_paired) else r.p_bf_paired
                row["p (Pitman–Morgan)"] = None if not shown or _missing(r.p_paired) else r.p_paired
                row["p (Brown–Forsythe)"] = r.p_brown_forsythe if shown else None
                row["p (F)"] = r.p_f if shown else None
                rows.append(row)
    frame = pd.DataFrame(rows)
    # The design's power at the verdict's Bonferroni level (every ratio tested counts: the
    # accuracies'; a loss's is shown, not tested), by the verdict's test from the observed tails
    tested = (frame["sharding"] != "random") & frame["metric"].isin(
        [_metric_short(t) for m, t in SHARDING_METRICS if m in SHARDING_TESTED])
    frame["in the verdict"] = ["yes" if t else "–" if s == "random" else "no: shown, not tested"
                               for t, s in zip(tested, frame["sharding"])]
    effect = SHARDING.effect
    power = [variance_power.tail_power(pool, int(n), alpha, effect) if t else None
             for t, n in zip(tested, frame["seeds"])]  # one simulation per seed count: tail_power is cached
    frame[f"detectable ratio ({variance_power.POWER:.0%} power)"] = [p.detectable if p else None for p in power]
    frame[f"seeds for {effect:g}x"] = [
        None if p is None else p.seeds_for_effect if p.seeds_for_effect is not None else f"> {variance_power.MAX_SEEDS}"
        for p in power]
    frame["detectable if normal (F)"] = [
        variance_power.detectable_ratio(int(n), int(n), alpha) if t and n >= 2 else None
        for t, n in zip(tested, frame["seeds"])]
    return frame


def sharding_power_text(res: SuiteResults, sharding: pd.DataFrame) -> str:
    """The caption's line on the design's power and tails, at the tested ratios' fewest seeds."""
    tested = sharding[sharding["in the verdict"] == "yes"] if not sharding.empty else sharding
    if tested.empty:
        return ""
    tails = sharding_stats.design_power(res, int(tested["seeds"].min()))
    return f"Power: {tails.text()}." if tails else f"Power: {variance_power.TOO_FEW_TAILS}."


def environment_table(res: SuiteResults) -> pd.DataFrame:
    rows = {}
    for manifest in res.manifests.values():
        machine = manifest.get("machine") or {}
        versions = manifest.get("versions") or {}
        key = json.dumps([machine, versions, manifest.get("git_sha"), manifest.get("git_dirty")], sort_keys=True)
        entry = rows.setdefault(key, {
            "cores": machine.get("cores"), "memory (GiB)": machine.get("memory_gib"),
            "platform": machine.get("platform"),
            **{k: v for k, v in sorted(versions.items()) if v is not None},
            "git sha": (manifest.get("git_sha") or "")[:10],
            "uncommitted changes": {True: "yes", False: "no"}.get(manifest.get("git_dirty"), "unknown"), "runs": 0})
        entry["runs"] += 1
    return pd.DataFrame(list(rows.values()))


def workload_sources_table(res: SuiteResults) -> pd.DataFrame:
    """One row per user workload and source: where its model and data came from (manifest extra.workload_source)."""
    rows: dict[str, dict[str, Any]] = {}
    for run_id, manifest in sorted(res.manifests.items()):
        source = (manifest.get("extra") or {}).get("workload_source")
        if not isinstance(source, dict):
            continue
        digests = source.get("sha256") if isinstance(source.get("sha256"), dict) else {}
        files = "; ".join(f"{Path(f).name} {str(d).removeprefix('sha256:')[:12]}" for f, d in sorted(digests.items()))
        entry = rows.setdefault(json.dumps(source, sort_keys=True, default=str), {
            "workload": workload_label(str(manifest["spec"]["workload"])), "model": source.get("model"),
            "dataset": source.get("dataset"), "workload file": source.get("workload_file") or "",
            "files (sha256)": files, "runs": 0})
        entry["runs"] += 1
    return pd.DataFrame(list(rows.values()))


def bytes_table(res: SuiteResults) -> pd.DataFrame:
    """What each system's `bytes` column holds: measured on the wire or computed from the model size."""
    rows = []
    for system, group in res.runs.groupby("system", sort=True):
        rows.append({"system": system, "bytes column": measures.bytes_source(
            system, res.manifests.get(group["run_id"].iloc[0]))})
    return pd.DataFrame(rows)


# ---- the Strategy-Switch roles and the peer servers: tables that read the registry's system facts ----

SWITCH_SYSTEMS = known_as("switch")
SYNC_SYSTEMS = names_where(synchrony=SYNC)
PEERS = names_where(peer_of="ps")  # the peer parameter servers set beside ours (the goal: ps >= 2x each at 4 workers)


def peers_table(res: SuiteResults) -> pd.DataFrame:
    """Our PS beside the peer parameter servers run alike (workload, consistency, shards, batch, workers):
    mean samples/s over seeds, ps ÷ each peer, and time to the workload's target accuracy."""
    runs = res.runs[res.runs["system"].isin(("ps",) + PEERS)]
    if not runs["system"].isin(PEERS).any():
        return pd.DataFrame()
    runs = runs.assign(consistency=runs.get("opt_consistency", pd.Series(PS_DEFAULT_CONSISTENCY, index=runs.index))
                       .fillna(PS_DEFAULT_CONSISTENCY),
                       servers=runs.get("opt_servers", pd.Series(1, index=runs.index)).fillna(1).astype(int))
    rows = []
    keys = ["workload", "consistency", "servers", "batch_size", "workers"]
    for key, group in runs.groupby(keys, sort=True):
        speed = group.groupby("system")["samples_per_s"].mean()
        ttt = group.groupby("system")["time_to_target_s"].mean() if "time_to_target_s" in group else {}
        row: dict[str, Any] = dict(zip(["workload", "consistency", "servers", "batch/worker", "workers"], key))
        for system in ("ps",) + PEERS:
            row[f"{system} samples/s"] = speed.get(system)
        for peer in PEERS:
            row[f"ps ÷ {peer}"] = _ratio_of(speed.get("ps"), speed.get(peer))
        for system in ("ps",) + PEERS:
            row[f"{system} time to target (s)"] = ttt.get(system)
        rows.append(row)
    return pd.DataFrame(rows)


def _ratio_of(a: Any, b: Any) -> float | None:
    return None if _missing(a) or _missing(b) or not b else a / b


def role(run: pd.Series) -> str | None:
    """'switch', 'sync' or 'async': what a run is in the Strategy-Switch comparison (None: neither)."""
    if run["system"] in SWITCH_SYSTEMS:
        return "switch"
    consistency = run.get("opt_consistency")
    if run["system"] == "ps" or isinstance(consistency, str):
        consistency = consistency if isinstance(consistency, str) else PS_DEFAULT_CONSISTENCY
        return "sync" if consistency == "bsp" else "async"
    return "sync" if run["system"] in SYNC_SYSTEMS else None


def _phase(run: pd.Series) -> tuple[str, str | None]:
    """(system, consistency) of a pure run, as a switch run's phases are named."""
    consistency = run.get("opt_consistency")
    if run["system"] == "ps":
        return "ps", consistency if isinstance(consistency, str) else PS_DEFAULT_CONSISTENCY
    return run["system"], None


def _switch_phases(run: pd.Series) -> dict[str, tuple[str, str | None]]:
    """The pure runs a switch run's phases are: sync ddp or ps bsp, async ps with its consistency."""
    sync = run.get("opt_sync") if isinstance(run.get("opt_sync"), str) else "ddp"
    async_ = run.get("opt_async_consistency")
    async_ = async_ if isinstance(async_, str) else "asp"
    return {"sync": ("ps", "bsp") if sync == "ps-bsp" else ("ddp", None), "async": ("ps", async_)}


def switch_runs(res: SuiteResults) -> pd.DataFrame:
    """Strategy-Switch runs and the pure sync and async runs set up alike (same workload, workers,
    batch size, sharding and conditions), with their role."""
    runs = measures.annotate(res).runs
    switched = runs[runs["system"].isin(SWITCH_SYSTEMS)]
    if switched.empty:
        return switched
    alike = ["workload", "workers", "batch_size", "sharding", "conditions"]
    runs = runs.merge(switched[alike].drop_duplicates(), on=alike)
    runs["role"] = runs.apply(role, axis=1)
    return runs[runs["role"].notna()]


def switch_table(res: SuiteResults) -> pd.DataFrame:
    runs = switch_runs(res)
    rows = []
    for key, group in runs.groupby(["workload", "label", "workers", "conditions"], sort=True):
        tta = mlperf_time_to_target(group["tta_with_costs_s"].tolist())
        sw = group["switch_t_wall"].dropna()
        is_switch = group["role"].iloc[0] == "switch"
        row: dict[str, Any] = {"workload": key[0], "system": key[1], "role": group["role"].iloc[0],
                               "workers": key[2], "conditions": key[3], "runs": len(group),
                               "switched": f"{len(sw)}/{len(group)}" if is_switch else "–"}
        with_ci(row, "switch at (s)", sw)
        with_ci(row, "hand-over (s)", group["handover_s"])
        row["time to target incl. costs (s)"] = tta.value
        row["spread (s)"] = "–" if tta.fastest is None else f"{_fmt(tta.fastest)} – {_fmt(tta.slowest)}"
        row["reached target"] = f"{tta.reached}/{tta.n}"
        with_ci(row, "train time (s)", group["train_s"])
        with_ci(row, "final val acc", group.get("final_val_accuracy"))
        rows.append(row)
    return pd.DataFrame(rows)


def thesis_table(res: SuiteResults, batch: pd.DataFrame, sharding: pd.DataFrame,
                 switch: pd.DataFrame) -> pd.DataFrame:
    rows = []
    if not batch.empty:
        ours = "; ".join(f"{r['system']}{_where(r)}: {r['cost fall (largest ÷ smallest)']:.2f}x "
                         f"(batch {r['largest batch']}→{r['smallest batch']})" for _, r in batch.iterrows())
        rows.append({"claim": "per-mini-batch cost falls as batches shrink", "thesis": KASSELA.paper,
                     "ours": ours})
    if not sharding.empty:
        parts = []
        for strategy, g in sharding[sharding["sharding"] != "random"].groupby("sharding", sort=False):
            found = [text for split, name in (("train", "training"), ("val", "validation"))
                     if (text := _max_ratio(g, split, name))]
            parts.append(f"{strategy}: " + ", ".join(found) if found else f"{strategy}: no ratio (too few seeds)")
        rows.append({"claim": SHARDING_ANY, "thesis": SHARDING.paper,
                     "ours": "; ".join(parts) or "only random sharding in this suite"})
    if not switch.empty and (switch["role"] == "switch").any():
        rows.append({"claim": "Strategy-Switch: sync accuracy at async speed", "thesis": SWITCH.paper,
                     "ours": "; ".join(_switch_verdicts(res, switch))})
    return pd.DataFrame(rows)


def _switch_verdicts(res: SuiteResults, switch: pd.DataFrame) -> list[str]:
    """Each switch variant against pure sync and pure async runs set up alike, never against
    another switch variant; the baseline matching the switch's own phases comes first."""
    parts = []
    first_run = res.runs.drop_duplicates("label").set_index("label")
    for _, g in switch.groupby(["workload", "workers", "conditions"], sort=True):
        for _, sw in g[g["role"] == "switch"].iterrows():
            phases = _switch_phases(first_run.loc[sw["system"]])
            never = " (criterion never fired: sync throughout)" if str(sw["switched"]).startswith("0/") else ""
            for kind in ("sync", "async"):
                pure = g[g["role"] == kind]
                if pure.empty:
                    parts.append(f"{sw['system']}{_where(sw)} vs pure {kind}: no pure {kind} run set up alike "
                                 "in this suite")
                    continue
                matching = [i for i, r in pure.iterrows() if _phase(first_run.loc[r["system"]]) == phases[kind]]
                other = pure.loc[matching[0]] if matching else pure.iloc[0]
                acc = _diff(sw["final val acc"], other["final val acc"])
                speed = _ratio(other["time to target incl. costs (s)"], sw["time to target incl. costs (s)"])
                parts.append(f"{sw['system']}{_where(sw)}{never} vs pure {kind} {other['system']}: final val acc "
                             f"{acc}, time to target {speed}")
    return parts


def _where(row: pd.Series) -> str:
    return f" ({row['workload']}, {row['workers']} workers)"


def _max_ratio(group: pd.DataFrame, split: str, name: str) -> str:
    """The largest variance ratio over the split's metrics, with its interval and p-values."""
    rows = group[group["metric"].str.startswith(name) & group["var ratio (random ÷ this)"].notna()]
    rows = rows[np.isfinite(rows["var ratio (random ÷ this)"].astype(float))]
    if rows.empty:
        return ""
    r = rows.loc[rows["var ratio (random ÷ this)"].astype(float).idxmax()]
    return (f"up to {_fmt(r['var ratio (random ÷ this)'])}x ({r['metric']}; 95% CI {r['ratio 95% CI']}, "
            f"paired Brown–Forsythe p={_fmt(r['p (paired Brown–Forsythe)'])}, {r['seeds']} seeds)")


def _diff(a: Any, b: Any) -> str:
    if _missing(a) or _missing(b):
        return "n/a"
    return f"{a:.3f} vs {b:.3f} ({a - b:+.3f})"


def _ratio(slow: Any, fast: Any) -> str:
    if _missing(slow) or _missing(fast) or fast <= 0:
        return "n/a (target not reached by both)"
    return f"{slow / fast:.2f}x faster" if slow >= fast else f"{fast / slow:.2f}x slower"


def compact(table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Drop columns that hold one value in every row; say those values once instead."""
    if len(table) < 2:
        return table, ""
    constant = [c for c in ("workload", "batch/worker", "sharding", "workers", "conditions", "budget")
                if c in table.columns
                and table[c].astype(str).nunique() == 1]
    note = ", ".join(f"{c} = {table[c].iloc[0]}" for c in constant)
    return table.drop(columns=constant), (f"All rows: {note}." if note else "")

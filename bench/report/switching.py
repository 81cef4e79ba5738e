"""Strategy-Switch against the fastest synchronous system, from a suite's records: the target set
on calibration seeds, time to target on the timer evaluator's curve, paired t comparisons per
variant with Holm's correction, and which variants never switched. bench/report/thesis.py turns
these into the finding's verdict; the report shows the table and the regime heatmap (plots.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from psbench.bench.harness.results import SuiteResults
from psbench.bench.report import stats
from psbench.core.records import TARGET_WINDOW

SWITCH_SPEEDUP = 1.3    # switch's time to target: sync's / switch's at least this
SWITCH_ACC_PP = 0.5     # switch's final accuracy at most this many points below sync's
ALPHA = 0.05

CALIBRATION_SEED_MIN = 100   # seeds >= this are calibration seeds: they set the target, never the verdict
TARGET_SHARE = 0.97          # the target: this share of ddp's best smoothed validation accuracy (calibration)
TARGET_K = TARGET_WINDOW      # smoothed: the mean of k consecutive evaluations (as a run's own summary)
SWITCH_RULE_EXTRA = (f"Target per workload: {TARGET_SHARE:g} x ddp's best mean of {TARGET_K} consecutive validation "
                     f"evaluations, averaged over the calibration seeds (>= {CALIBRATION_SEED_MIN}); time to target: "
                     f"the first evaluation at which the mean of the last {TARGET_K} reaches it; a run that never "
                     f"does counts as its time budget or training time (a lower bound). Compared, paired by seed on the other "
                     f"seeds, with the fastest sync system (ddp or ps bsp, by median time to target on the "
                     f"calibration seeds); paired t intervals (log scale for speed-ups), one-sided tests against "
                     f"{SWITCH_SPEEDUP:g}x and -{SWITCH_ACC_PP:g} pp with Holm's correction over the variants; "
                     f"a variant whose criterion never fired is 'never switched', not a switch result; the verdict "
                     f"tests the configuration(s) with the most paired seeds (the thesis' point): a configuration "
                     f"with fewer is a cell of the regime map, shown in its table and heatmap, not tested.")


def _paired(runs: pd.DataFrame, base: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """The column of `runs` and of `base` aligned on seed (the seeds both have)."""
    a = runs.groupby("seed")[column].first()
    b = base.groupby("seed")[column].first()
    seeds = sorted(set(a.index) & set(b.index))
    return a.loc[seeds].to_numpy(dtype=float), b.loc[seeds].to_numpy(dtype=float)


def _curve_time(evals: pd.DataFrame, target: float, k: int = TARGET_K) -> float:
    """The first time the mean of the last k validation accuracies reaches `target` (nan: never)."""
    val = evals.sort_values("t_wall", kind="stable")
    hit = val[val["accuracy"].rolling(k).mean() >= target]
    return float(hit["t_wall"].iloc[0]) if len(hit) else math.nan


def _best_smoothed(evals: pd.DataFrame, k: int = TARGET_K) -> float:
    return float(evals.sort_values("t_wall", kind="stable")["accuracy"].rolling(k).mean().max())


def _budget_s(run: pd.Series) -> float:
    """What an unreached target counts as: the run's time budget, else its training time (a lower
    bound of when it would have got there)."""
    kind, _, value = str(run.get("budget") or "").partition("=")
    return float(value) if kind == "seconds" else float(run.get("train_s") or math.nan)


@dataclass(frozen=True)
class SwitchComparison:
    """One switch variant (or pure ASP) against the fastest sync system of its configuration."""
    workload: str
    workers: int
    conditions: str
    variant: str
    baseline: str
    target: float
    target_source: str
    speedup: stats.PairedT
    accuracy_pp: stats.PairedT
    time_to_target: stats.PairedT       # the variant's, training clock (hand-over on it): geometric mean, t on logs
    base_time_to_target: stats.PairedT  # the fastest sync system's, on the same seeds
    reached: str
    never_switched: str
    spikes_mean: float
    switched: bool   # a switch variant whose criterion fired in at least one run
    map_cell: bool   # fewer paired seeds than the thesis' point: the regime map's, not the verdict's

    @property
    def in_verdict(self) -> bool:
        return self.switched and not self.map_cell


def switch_comparisons(res: SuiteResults) -> list[SwitchComparison]:
    """Every switch variant and pure ASP against the fastest sync system, per configuration."""
    runs = res.runs.assign(kind=[_switch_kind(r) for _, r in res.runs.iterrows()])
    val = res.evals[res.evals["split"] == "val"]
    verdict_seeds = (runs[runs["seed"] < CALIBRATION_SEED_MIN]
                     .groupby(["workload", "workers", "conditions"])["seed"].nunique())
    most_seeds = int(verdict_seeds.max()) if len(verdict_seeds) else 0
    out = []
    for (workload, workers, conditions), group in runs.groupby(["workload", "workers", "conditions"], sort=True):
        sync = {k: g for k, g in group[group["kind"].isin(["ddp", "ps (bsp)"])].groupby("kind")}
        if "ddp" not in sync or not (group["kind"] == "switch").any():
            continue
        calib = group[group["seed"] >= CALIBRATION_SEED_MIN]
        ddp_calib = calib[calib["kind"] == "ddp"]
        if len(ddp_calib):
            best = [_best_smoothed(val[val["run_id"] == r]) for r in ddp_calib["run_id"]]
            target = math.floor(TARGET_SHARE * float(np.nanmean(best)) / 0.005) * 0.005
            source = f"{TARGET_SHARE:g} x ddp's best on {len(ddp_calib)} calibration seed(s)"
        else:
            target = float(group["target_accuracy"].dropna().iloc[0])
            source = "the workload's registry target (no calibration seeds)"
        times = {r["run_id"]: _curve_time(val[val["run_id"] == r["run_id"]], target) for _, r in group.iterrows()}
        budget = {r["run_id"]: _budget_s(r) for _, r in group.iterrows()}
        group = group.assign(tta=group["run_id"].map(times),
                             tta_bounded=[times[r] if not math.isnan(times[r]) else budget[r] for r in group["run_id"]])
        calib = group[group["seed"] >= CALIBRATION_SEED_MIN]
        chooser = calib if len(calib) else group
        medians = {k: chooser[chooser["kind"] == k]["tta_bounded"].median() for k in sync}
        fastest = min(medians, key=lambda k: (math.inf if math.isnan(medians[k]) else medians[k], k))
        base = group[(group["kind"] == fastest) & (group["seed"] < CALIBRATION_SEED_MIN)]
        contenders = group[group["kind"].isin(["switch", "ps (asp)"]) & (group["seed"] < CALIBRATION_SEED_MIN)]
        map_cell = int(verdict_seeds.get((workload, workers, conditions), 0)) < most_seeds
        for variant, runs_v in contenders.groupby("label", sort=True):
            is_switch = (runs_v["kind"] == "switch").all()
            fired = [bool(((res.manifests.get(r) or {}).get("extra") or {}).get("switch", {}).get("fired"))
                     for r in runs_v["run_id"]] if is_switch else []
            t_v, t_b = _paired(runs_v, base, "tta_bounded")
            a_v, a_b = _paired(runs_v, base, "final_val_accuracy")
            reached_v = int(runs_v["tta"].notna().sum())
            spikes = [(((res.manifests.get(r) or {}).get("extra") or {}).get("switch", {}).get("spikes") or {})
                      .get("spikes") for r in runs_v["run_id"]] if is_switch else []
            spikes = [x for x in spikes if x is not None]
            out.append(SwitchComparison(
                workload, int(workers), conditions, variant, fastest, target, source,
                stats.paired_log_ratio_t(t_b, t_v, SWITCH_SPEEDUP),
                stats.paired_t((a_v - a_b) * 100, -SWITCH_ACC_PP),
                _geometric_mean_t(t_v), _geometric_mean_t(t_b),
                f"{reached_v}/{len(runs_v)} vs {int(base['tta'].notna().sum())}/{len(base)}",
                f"{fired.count(False)}/{len(fired)}" if is_switch else "–",
                float(np.mean(spikes)) if spikes else math.nan,
                is_switch and any(fired), map_cell))
    return out


def _geometric_mean_t(times: np.ndarray) -> stats.PairedT:
    """Times to target on the log scale, as the speed-up is: sync's geometric mean ÷ the variant's is
    the speed-up's estimate exactly, and an interval never holds a negative time."""
    return stats.paired_log_ratio_t(times, np.ones_like(times))


def _switch_kind(run: pd.Series) -> str:
    if run["system"] in ("switch", "strategy-switch"):
        return "switch"
    if run["system"] == "ps":
        return f"ps ({run.get('opt_consistency') or 'asp'})"
    return str(run["system"])


def switch_verdict_table(found: list[SwitchComparison]) -> pd.DataFrame:
    tested = [c for c in found if c.in_verdict]
    rejected_speed = stats.holm([c.speedup.p for c in tested], ALPHA)
    rejected_acc = stats.holm([c.accuracy_pp.p for c in tested], ALPHA)
    holm = {id(c): (rs, ra) for c, rs, ra in zip(tested, rejected_speed, rejected_acc)}
    rows = []
    for c in found:
        rs, ra = holm.get(id(c), (None, None))
        rows.append({"workload": c.workload, "workers": c.workers, "conditions": c.conditions, "variant": c.variant,
                     "vs (fastest sync)": c.baseline, "target acc": c.target, "n pairs": c.speedup.n,
                     "time to target (s, geo. mean)": c.time_to_target.estimate,
                     "time to target 95% CI": _ci_text(c.time_to_target),
                     "sync's time to target (s)": c.base_time_to_target.estimate,
                     "sync's 95% CI": _ci_text(c.base_time_to_target),
                     "speed-up": c.speedup.estimate, "speed-up 95% CI": _ci_text(c.speedup),
                     f"p (speed-up > {SWITCH_SPEEDUP:g}x)": c.speedup.p,
                     f"> {SWITCH_SPEEDUP:g}x after Holm": "–" if rs is None else ("yes" if rs else "no"),
                     "detectable speed-up (80% power)": c.speedup.mde,
                     "val acc diff (pp)": c.accuracy_pp.estimate, "val acc diff 95% CI": _ci_text(c.accuracy_pp),
                     f"within {SWITCH_ACC_PP:g} pp after Holm": "–" if ra is None else ("yes" if ra else "no"),
                     "reached target": c.reached, "never switched": c.never_switched,
                     "in the verdict": _role(c),
                     "loss spikes (mean)": c.spikes_mean})
    return pd.DataFrame(rows)


def _role(c: SwitchComparison) -> str:
    if c.in_verdict:
        return "yes"
    if c.never_switched == "–":
        return "no: pure ASP, shown beside"
    if c.map_cell:
        return "no: a map cell (fewer seeds)"
    return "no: never switched"


def _ci_text(t: stats.PairedT) -> str:
    return "–" if math.isnan(t.lo) else f"[{t.lo:.3g}, {t.hi:.3g}]"



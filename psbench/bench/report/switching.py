"""Strategy-Switch against the fastest synchronous system, from a suite's records: the target set
on calibration seeds, time to target on the timer evaluator's curve, paired t comparisons per
variant with Holm's correction, and which variants never switched. bench/report/thesis.py turns
these into the finding's verdict; the report shows the table and the regime heatmap (plots.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pandas as pd

from psbench.bench.harness.results import SuiteResults
from psbench.bench.report import stats
from psbench.bench.report.claims import SWITCH
from psbench.core.records import TARGET_WINDOW
from psbench import systems

SWITCH_SPEEDUP = SWITCH.speedup_min  # switch's time to target: sync's / switch's at least this
SWITCH_ACC_PP = SWITCH.accuracy_pp   # switch's final accuracy at most this many points below sync's
ALPHA = 0.05

CALIBRATION_SEED_MIN = 100   # seeds >= this are calibration seeds: they set the target, never the verdict
TARGET_SHARE = 0.99          # the target: this share of the fastest sync system's final accuracy (calibration)
TARGET_K = TARGET_WINDOW      # smoothed: the mean of k consecutive evaluations (as a run's own summary)
FINAL_K = 5                  # a run's final accuracy: the mean of its last FINAL_K validation evaluations
BLOCK_SEEDS = 10             # the verdict's seeds fall in pre-specified blocks: seed // BLOCK_SEEDS (0-9, 10-19)
SWITCH_RULE = (f"reproduced if a switch variant whose sync phase is the fastest sync system has its time to target "
               f"(training clock, hand-over on it) shown > {SWITCH_SPEEDUP:g}x sooner than that system's and its "
               f"final validation accuracy shown within {SWITCH_ACC_PP:g} pp of it (both one-sided paired t tests at "
               f"alpha {ALPHA:g}, Holm over the variants); not reproduced if every such variant that switched has its "
               f"speed-up interval below {SWITCH_SPEEDUP:g}x or its accuracy interval below -{SWITCH_ACC_PP:g} pp; "
               f"else inconclusive; and inconclusive whenever the pre-specified seed blocks disagree")
SWITCH_RULE_EXTRA = (f"The fastest sync system (ddp or ps bsp: the same averaged update, so the one with more "
                     f"samples/s on the calibration seeds, >= {CALIBRATION_SEED_MIN}) sets the target: "
                     f"{TARGET_SHARE:g} x its mean final accuracy on those seeds (floored to 0.005); a run's final "
                     f"accuracy is the mean of its last {FINAL_K} validation evaluations; time to target: the first "
                     f"evaluation at which the mean of the last {TARGET_K} reaches the target; a run that never "
                     f"does counts as its time budget or training time (a lower bound). Each switch variant whose "
                     f"sync phase is that system is compared with it, paired by seed on the other seeds: paired t "
                     f"intervals (log scale for speed-ups), one-sided tests against {SWITCH_SPEEDUP:g}x and "
                     f"-{SWITCH_ACC_PP:g} pp with Holm's correction over the variants; pure ASP, a switch with "
                     f"another sync phase, a variant whose criterion never fired and a configuration with fewer "
                     f"paired seeds than the thesis' point (a regime-map cell) are shown, not tested. Stability: the "
                     f"verdict seeds split into pre-specified blocks of {BLOCK_SEEDS} (seed // {BLOCK_SEEDS}); "
                     f"the rule is applied to each block and to all seeds; blocks that disagree make the verdict "
                     f"inconclusive (more seeds needed: another block), else the verdict is the one on all seeds.")


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


def _final_accuracy(evals: pd.DataFrame, k: int = FINAL_K) -> float:
    """A run's final accuracy: the mean of its last k validation evaluations (one collapsing
    evaluation at the end moves it by a k-th, not whole)."""
    return float(evals.sort_values("t_wall", kind="stable")["accuracy"].tail(k).mean())


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
    own_sync: bool = True  # pure ASP, or a switch whose sync phase is the fastest sync system (the baseline)
    block: str = "all seeds"

    @property
    def in_verdict(self) -> bool:
        return self.switched and not self.map_cell and self.own_sync


def switch_comparisons(res: SuiteResults, block: int | None = None) -> list[SwitchComparison]:
    """Every switch variant and pure ASP against the fastest sync system, per configuration; with
    `block`, paired on that block's verdict seeds only (the target stays the calibration seeds')."""
    runs = res.runs.assign(kind=[_switch_kind(r) for _, r in res.runs.iterrows()],
                           sync=[_sync_kind(r) for _, r in res.runs.iterrows()])
    val = res.evals[res.evals["split"] == "val"]
    finals = {run_id: _final_accuracy(g) for run_id, g in val.groupby("run_id")}
    runs = runs.assign(final_acc=runs["run_id"].map(finals))
    verdict_seeds = (runs[runs["seed"] < CALIBRATION_SEED_MIN]
                     .groupby(["workload", "workers", "conditions"])["seed"].nunique())
    most_seeds = int(verdict_seeds.max()) if len(verdict_seeds) else 0
    in_block = (runs["seed"] < CALIBRATION_SEED_MIN) & (block is None or runs["seed"] // BLOCK_SEEDS == block)
    block_name = "all seeds" if block is None else f"seeds {block * BLOCK_SEEDS}–{(block + 1) * BLOCK_SEEDS - 1}"
    out = []
    for (workload, workers, conditions), group in runs.groupby(["workload", "workers", "conditions"], sort=True):
        sync = sorted(set(group["kind"]) & {"ddp", "ps (bsp)"})
        if "ddp" not in sync or not (group["kind"] == "switch").any():
            continue
        calib = group[group["seed"] >= CALIBRATION_SEED_MIN]
        chooser = calib if len(calib) else group
        speed = {k: chooser.loc[chooser["kind"] == k, "samples_per_s"].median() for k in sync}
        fastest = max(sync, key=lambda k: (-math.inf if math.isnan(speed[k]) else speed[k], k))
        fastest_calib = calib[calib["kind"] == fastest]
        if len(fastest_calib):
            mean_final = float(np.nanmean(fastest_calib["final_acc"]))
            target = math.floor(TARGET_SHARE * mean_final / 0.005) * 0.005
            source = (f"{TARGET_SHARE:g} x {fastest}'s mean final accuracy {mean_final:.3f} on "
                      f"{len(fastest_calib)} calibration seed(s)")
        else:
            target = float(group["target_accuracy"].dropna().iloc[0])
            source = "the workload's registry target (no calibration seeds)"
        times = {r["run_id"]: _curve_time(val[val["run_id"] == r["run_id"]], target) for _, r in group.iterrows()}
        budget = {r["run_id"]: _budget_s(r) for _, r in group.iterrows()}
        group = group.assign(tta=group["run_id"].map(times),
                             tta_bounded=[times[r] if not math.isnan(times[r]) else budget[r] for r in group["run_id"]])
        chosen = in_block.loc[group.index]
        base = group[(group["kind"] == fastest) & chosen]
        contenders = group[group["kind"].isin(["switch", "ps (asp)"]) & chosen]
        map_cell = int(verdict_seeds.get((workload, workers, conditions), 0)) < most_seeds
        for variant, runs_v in contenders.groupby("label", sort=True):
            is_switch = (runs_v["kind"] == "switch").all()
            fired = [bool(((res.manifests.get(r) or {}).get("extra") or {}).get("switch", {}).get("fired"))
                     for r in runs_v["run_id"]] if is_switch else []
            t_v, t_b = _paired(runs_v, base, "tta_bounded")
            a_v, a_b = _paired(runs_v, base, "final_acc")
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
                is_switch and any(fired), map_cell,
                not is_switch or set(runs_v["sync"]) == {fastest}, block_name))
    return out


class Outcome(StrEnum):
    """The switch rule on one set of seeds (or the seed blocks disagreeing), printed as its value."""
    HOLDS = "holds"
    FAILS = "fails"
    OPEN = "open"
    BLOCKS_DISAGREE = "blocks disagree"


def switch_outcome(found: list[SwitchComparison]) -> Outcome:
    """The rule on one set of seeds: HOLDS if a tested variant is shown > SWITCH_SPEEDUP sooner and
    within SWITCH_ACC_PP (both after Holm), FAILS if every tested variant's speed-up interval lies
    below SWITCH_SPEEDUP or its accuracy interval below -SWITCH_ACC_PP, else OPEN."""
    tested = [c for c in found if c.in_verdict]
    table = switch_verdict_table(found)
    speed, accuracy = f"> {SWITCH_SPEEDUP:g}x after Holm", f"within {SWITCH_ACC_PP:g} pp after Holm"
    holds = [row[speed] == "yes" and row[accuracy] == "yes"
             for c, (_, row) in zip(found, table.iterrows()) if c.in_verdict]
    if any(holds):
        return Outcome.HOLDS
    if tested and all(c.speedup.hi < SWITCH_SPEEDUP or c.accuracy_pp.hi < -SWITCH_ACC_PP for c in tested):
        return Outcome.FAILS
    return Outcome.OPEN


@dataclass(frozen=True)
class SwitchVerdict:
    outcome: Outcome                      # HOLDS / FAILS / OPEN on all seeds, or BLOCKS_DISAGREE
    combined: list[SwitchComparison]      # on all verdict seeds
    blocks: dict[str, list[SwitchComparison]]  # per pre-specified block of seeds
    block_outcomes: dict[str, Outcome]


def switch_verdict(res: SuiteResults) -> SwitchVerdict | None:
    """The rule on each block of BLOCK_SEEDS verdict seeds and on all of them: blocks that disagree
    make it BLOCKS_DISAGREE (more seeds needed), else the outcome on all seeds stands."""
    combined = switch_comparisons(res)
    if not combined:
        return None
    seeds = res.runs.loc[res.runs["seed"] < CALIBRATION_SEED_MIN, "seed"]
    blocks = {}
    for b in sorted(set(int(s) // BLOCK_SEEDS for s in seeds)):
        found = switch_comparisons(res, b)
        if any(c.in_verdict for c in found):
            blocks[found[0].block] = found
    block_outcomes = {name: switch_outcome(found) for name, found in blocks.items()}
    outcome = Outcome.BLOCKS_DISAGREE if len(set(block_outcomes.values())) > 1 else switch_outcome(combined)
    return SwitchVerdict(outcome, combined, blocks, block_outcomes)


def _geometric_mean_t(times: np.ndarray) -> stats.PairedT:
    """Times to target on the log scale, as the speed-up is: sync's geometric mean ÷ the variant's is
    the speed-up's estimate exactly, and an interval never holds a negative time."""
    return stats.paired_log_ratio_t(times, np.ones_like(times))


def _sync_kind(run: pd.Series) -> str | None:
    """A switch run's sync phase, named as the sync systems' kinds (None for other runs)."""
    if _switch_kind(run) != "switch":
        return None
    sync = run.get("opt_sync")
    return "ps (bsp)" if isinstance(sync, str) and sync == "ps-bsp" else "ddp"


def _switch_kind(run: pd.Series) -> str:
    if run["system"] in systems.known_as("switch"):
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
                     "in the verdict": variant_role(c),
                     "loss spikes (mean)": c.spikes_mean})
    return pd.DataFrame(rows)


def variant_role(c: SwitchComparison) -> str:
    if c.in_verdict:
        return "yes"
    if c.never_switched == "–":
        return "no: pure ASP, shown beside"
    if c.map_cell:
        return "no: a map cell (fewer seeds)"
    if not c.own_sync:
        return f"no: its sync phase is not {c.baseline}, shown beside"
    return "no: never switched"


def _ci_text(t: stats.PairedT) -> str:
    return "–" if math.isnan(t.lo) else f"[{t.lo:.3g}, {t.hi:.3g}]"



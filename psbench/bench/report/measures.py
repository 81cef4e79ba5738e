"""Per-run figures a report derives from the records, each under a rule it states: throughput
after a warm-up, the too-short flag, the per-step time breakdown, time to target with launch and
hand-over costs, what a run's `bytes` column is, and which code versions a suite mixes."""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from psbench.bench.harness.results import SuiteResults
from psbench.bench.harness.steady import (WARMUP_FRACTION, WARMUP_MIN_STEPS, WARMUP_RULE, steady_rate,  # noqa: F401
                                         steady_window, step_intervals, warmup_mask)
from psbench.core.records import STEP_TIME_COLUMNS
from psbench import systems

if TYPE_CHECKING:
    from psbench.bench.report.stats import PairedT

# A run below either minimum is too short to compare: its throughput is start-up and scheduler noise.
MIN_STEPS_PER_WORKER = 200
MIN_TRAIN_S = 5.0
SHORT_RULE = f"fewer than {MIN_STEPS_PER_WORKER} steps per worker or under {MIN_TRAIN_S:g} s of training"
# Per-iteration sweeps measure the time of one mini-batch, each iteration a sample: they state their
# own minimum, in iterations (the reason is in the suite's experiment file), and no seconds minimum.
SUITE_MIN_STEPS = {"kassela": 34, "kassela-10m": 34, "throughput": 60}

# A process tree cannot use more CPU than the cores, so a demand beyond them shows as the cores all
# busy: a run that kept this share of them busy had no spare core (others' load came on top). And a
# plan far below what a run used misjudged its processes (the harness refuses runs by the plan).
SATURATED_SHARE = 0.95
UNDERPLANNED = (1.25, 0.1)  # used > 1.25 x the plan and > 0.1 core more
CPU_RULE = (f"CPU used = CPU seconds of the run's process tree over its training span ÷ the span; flagged when it "
            f"reached {SATURATED_SHARE:.0%} of the usable cores (the demand exceeded them, or nearly) or exceeded "
            f"the plan by over {UNDERPLANNED[0] - 1:.0%} (and {UNDERPLANNED[1]:g} core)")

# What each system's `bytes` column holds (the registry's; a manifest's extra.bytes_source overrides it).
BYTES_SOURCE = systems.by_name("bytes_source")


def too_short(steps_per_worker: float, train_s: float, suite: str = "") -> str:
    """Why a run is too short to compare ('' when it is long enough)."""
    reasons = []
    min_steps = SUITE_MIN_STEPS.get(suite, MIN_STEPS_PER_WORKER)
    if not steps_per_worker >= min_steps:
        reasons.append(f"{steps_per_worker:.0f} steps/worker < {min_steps}")
    if suite not in SUITE_MIN_STEPS and not train_s >= MIN_TRAIN_S:
        reasons.append(f"{train_s:.2g} s < {MIN_TRAIN_S:g} s")
    return "; ".join(reasons)


def cpu_flag(cores: Any, planned: Any, used: Any) -> str:
    """Why a run's measured CPU is flagged ('' when it is not, or was not measured)."""
    cores, planned, used = _num(cores), _num(planned), _num(used)
    reasons = []
    if used >= SATURATED_SHARE * cores:
        reasons.append(f"used {used:.2f} of {cores:g} cores")
    if used > UNDERPLANNED[0] * planned and used - planned > UNDERPLANNED[1]:
        reasons.append(f"used {used:.2f}, planned {planned:.2f}")
    return "; ".join(reasons)


def annotate(res: SuiteResults) -> SuiteResults:
    """The suite with per-run columns added: steady_samples_per_s, steps_per_worker, too_short,
    cpu_flag, switch_t_wall, tta_with_costs_s. Idempotent."""
    if "steady_samples_per_s" in res.runs.columns:
        return res
    runs = res.runs.copy()
    for col in ("train_s", "time_to_target_s", "setup_s", "handover_s", "final_val_accuracy", "final_train_loss",
                "cores", "cpu_demand", "cpu_measured"):
        if col not in runs.columns:  # a summary field older results lack
            runs[col] = math.nan
    by_run = dict(tuple(res.steps.groupby("run_id"))) if len(res.steps) else {}
    steady, per_worker = {}, {}
    for run_id, rows in by_run.items():
        steady[run_id] = steady_rate(rows)
        per_worker[run_id] = len(rows) / max(1, rows["worker"].nunique())
    runs["steady_samples_per_s"] = runs["run_id"].map(steady).astype(float)
    # a run whose rows were dropped (psbench slim): its summary's step count, taken when it ended
    summary_steps = pd.to_numeric(runs["steps"], errors="coerce") if "steps" in runs else math.nan
    runs["steps_per_worker"] = (runs["run_id"].map(per_worker).astype(float)
                                .where(runs["steps_kept"], summary_steps / runs["workers"]).fillna(0.0))
    train_s = pd.to_numeric(runs["train_s"], errors="coerce").fillna(0.0)
    runs["too_short"] = [too_short(s, t, res.suite) for s, t in zip(runs["steps_per_worker"], train_s)]
    runs["cpu_flag"] = [cpu_flag(c, p, u) for c, p, u in zip(runs["cores"], runs["cpu_demand"], runs["cpu_measured"])]
    switches = res.events[res.events["kind"] == "switch"]
    runs["switch_t_wall"] = runs["run_id"].map(switches.groupby("run_id")["t_wall"].min()).astype(float)
    runs["tta_with_costs_s"] = runs.apply(_tta_with_costs, axis=1) if len(runs) else []
    return dataclasses.replace(res, runs=runs)


def _num(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _tta_with_costs(run: pd.Series) -> float:
    """Time to target on the training clock plus launch (setup_s) plus, for a Strategy-Switch run
    whose hand-over lay off the clock and came before the target, the hand-over."""
    tta = _num(run.get("time_to_target_s"))
    if math.isnan(tta):
        return math.nan
    total = tta + _num(run.get("setup_s"))  # unknown launch cost: unknown total (nan)
    handover, switched = _num(run.get("handover_s")), _num(run.get("switch_t_wall"))
    if not run.get("handover_on_clock", False) and not math.isnan(handover) and switched <= tta:
        total += handover
    return total


def batch_fractions(res: SuiteResults) -> pd.Series:
    """Per run (index run_id): its global mini-batch (batch_size x workers) as a fraction of the
    training rows (from shards.json's class counts, or the manifest's mini_batch_fraction for a
    system that shards nothing itself, e.g. spark-mllib-native); capped at 1."""
    n_train = res.shard_counts.groupby("run_id")["count"].sum() if len(res.shard_counts) else pd.Series(dtype=float)
    out = {}
    for run in res.runs.itertuples():
        extra = (res.manifests.get(run.run_id) or {}).get("extra") or {}
        if run.run_id in n_train.index and n_train[run.run_id] > 0:
            out[run.run_id] = min(1.0, run.batch_size * run.workers / float(n_train[run.run_id]))
        else:
            out[run.run_id] = _num(extra.get("mini_batch_fraction"))
    return pd.Series(out, dtype=float)


FALL_RULE = ("fall ratio = a run's mean time per mini-batch (its step intervals after the warm-up cut) at the "
             "largest batch ÷ at the smallest, paired by seed; the geometric mean over seeds with a 95% t interval "
             "on the log scale (n = seeds with both ends)")


def run_step_means(res: SuiteResults) -> pd.Series:
    """Each run's mean step interval after the warm-up cut (s), by run_id."""
    out = {}
    for run_id, steps in res.steps.groupby("run_id"):
        gaps = step_intervals(steps)
        gaps = gaps[gaps.index.isin(steps.index[warmup_mask(steps)])]
        out[run_id] = float(gaps.mean()) if len(gaps) else math.nan
    return pd.Series(out, dtype=float)


def batch_fall_ratios(res: SuiteResults) -> pd.DataFrame:
    """Per system (label), workload and worker count with >= 2 batch sizes: the mini-batch fractions
    at both ends, the mean per-mini-batch time there, the fall ratio largest ÷ smallest with its
    interval and n (FALL_RULE), and the median compute / emulated / comm / wait seconds per step at
    both ends (why a time does or does not fall)."""
    if res.runs.empty or res.steps.empty:
        return pd.DataFrame()
    fractions = batch_fractions(res)
    means = run_step_means(res)
    by_run = dict(tuple(res.steps.groupby("run_id")))
    rows = []
    for (label, workload, workers), group in res.runs.groupby(["label", "workload", "workers"], sort=True):
        group = group[group["run_id"].isin(by_run)]
        if group["batch_size"].nunique() < 2:
            continue
        ends = {"largest": group["batch_size"].max(), "smallest": group["batch_size"].min()}
        row: dict[str, Any] = {"system": label, "workload": workload, "workers": int(workers)}
        per_seed = {}
        for end, batch in ends.items():
            runs = group[group["batch_size"] == batch]
            ids = runs["run_id"]
            steps = pd.concat([by_run[i] for i in ids])
            per_seed[end] = pd.Series(means.reindex(ids).to_numpy(), index=runs["seed"].to_numpy())
            row[f"{end}_batch"] = int(batch)
            row[f"{end}_fraction"] = float(fractions.reindex(ids).median())
            row[f"{end}_step_s"] = float(per_seed[end].mean())
            kept = steps[pd.concat([warmup_mask(by_run[i]) for i in ids])]
            for col in STEP_TIME_COLUMNS:
                values = kept[col].dropna()
                row[f"{end}_{col}"] = float(values.median()) if len(values) else math.nan
        t = fall_ratio(group, means)
        row.update(fall_ratio=t.estimate, lo=t.lo, hi=t.hi, n=t.n)
        rows.append(row)
    return pd.DataFrame(rows)


def fall_ratio(runs: pd.DataFrame, means: pd.Series) -> PairedT:
    """FALL_RULE over `runs` (one system's runs at two or more batch sizes): each seed's mean step
    (`means`, from run_step_means) at the largest batch ÷ at the smallest, the geometric mean over
    the seeds with both ends, with its t interval. The report's table and its plots' legends both
    take this one definition."""
    from psbench.bench.report.stats import paired_log_ratio_t

    per_seed = {end: runs[runs["batch_size"] == batch].assign(mean=lambda r: means.reindex(r["run_id"]).to_numpy())
                .groupby("seed")["mean"].mean()
                for end, batch in (("largest", runs["batch_size"].max()), ("smallest", runs["batch_size"].min()))}
    seeds = per_seed["largest"].index.intersection(per_seed["smallest"].index)
    return paired_log_ratio_t(per_seed["largest"].reindex(seeds).to_numpy(),
                              per_seed["smallest"].reindex(seeds).to_numpy())


def time_breakdown(res: SuiteResults) -> pd.DataFrame:
    """One row per run: the median seconds per step of each part (compute, emulated, comm, wait, update,
    batch assembly),
    the median step interval, and the slowest worker's median step ÷ the median worker's, all after
    warm-up. Parts a system cannot tell stay nan."""
    rows = []
    for run_id, steps in res.steps.groupby("run_id"):
        after = steps[warmup_mask(steps)]
        row: dict[str, Any] = {"run_id": run_id}
        for col in STEP_TIME_COLUMNS:
            values = after[col].dropna()
            row[col] = float(values.median()) if len(values) else math.nan
        gaps = step_intervals(steps)
        row["step_s"] = float(gaps.median()) if len(gaps) else math.nan
        per_worker = gaps.groupby(steps.loc[gaps.index, "worker"]).median()
        row["slowest_ratio"] = float(per_worker.max() / per_worker.median()) if len(per_worker) and \
            per_worker.median() > 0 else math.nan
        nbytes = after["bytes"].dropna()
        row["bytes_per_step"] = float(nbytes.median()) if len(nbytes) else math.nan
        rows.append(row)
    columns = ["run_id", *STEP_TIME_COLUMNS, "step_s", "slowest_ratio", "bytes_per_step"]
    return pd.DataFrame(rows, columns=columns)


def bytes_source(system: str, manifest: dict[str, Any] | None = None) -> str:
    extra = (manifest or {}).get("extra") or {}
    return str(extra.get("bytes_source") or BYTES_SOURCE.get(system, "unknown"))


def code_versions(res: SuiteResults) -> pd.DataFrame:
    """git sha (short) x dirty -> runs."""
    rows = [{"git sha": (m.get("git_sha") or "unknown")[:10], "uncommitted changes": m.get("git_dirty")}
            for m in res.manifests.values()]
    frame = pd.DataFrame(rows, columns=["git sha", "uncommitted changes"])
    frame["uncommitted changes"] = frame["uncommitted changes"].map({True: "yes", False: "no"}).fillna("unknown")
    return frame.groupby(["git sha", "uncommitted changes"]).size().rename("runs").reset_index()


def mixed_versions_warning(res: SuiteResults) -> str:
    """A warning when the runs do not come from one known, clean code version ('' when they do)."""
    versions = code_versions(res)
    shas = sorted(versions["git sha"].unique())
    parts = []
    if len(shas) > 1:
        listed = ", ".join(f"{sha} ({int(versions.loc[versions['git sha'] == sha, 'runs'].sum())} runs)"
                           for sha in shas)
        parts.append(f"the runs come from {len(shas)} code versions ({listed}): a difference between them may "
                     "come from the code, not the systems")
    dirty = int(versions.loc[versions["uncommitted changes"] == "yes", "runs"].sum())
    if dirty:
        parts.append(f"{dirty} run(s) were made from a working tree with uncommitted changes, so their code is "
                     "not known exactly")
    return ("Warning: " + "; ".join(parts) + ". Rerun them from one clean commit to compare.") if parts else ""

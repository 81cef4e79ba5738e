"""Specialised ÷ general-purpose throughput by twins (the thesis' first finding, as its abstract
states it): at each worker count, a specialised system over the Spark path that does the same job,
by mean samples/s after warm-up, paired by seed (the same seed gives both the same shards, initial
weights and straggler schedule), with a t interval on the log ratio.

- synchronous data parallelism: PS BSP ÷ spark-mllib (a Spark job a mini-batch) and PS BSP ÷
  spark-barrier (barrier mode, gradients through allGather): the verdict's twins;
- the same ring: DDP ÷ spark-torch (DDP launched by TorchDistributor): what Spark costs as a
  launcher, per step (this ratio) and once (launch, setup_s), shown as its own finding;
- beside, never in the verdict: PS ASP (another consistency, lower accuracy) and Horovod.

A point where either side's run oversubscribed the cores (manifest `oversubscribed`) is shown,
flagged, and not counted: its ratio measures contention. Beside the ratios, each system's exchange
timed alone: the gradients' gloo allreduce in DDP's ranks (`allreduce_alone_s`) and a PS push + pull
of the same size against one shard (`ps_roundtrip_alone_s`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from psbench.bench.harness.results import SuiteResults
from psbench.bench.report import measures
from psbench.bench.report.claims import THROUGHPUT
from psbench.bench.report.stats import Interval, paired_log_ratio_t, paired_t

MARGIN = THROUGHPUT.margin  # "substantially higher": a twin's interval must clear it, not merely 1

VERDICT, LAUNCHER, BESIDE = "verdict", "launcher", "beside"
PS_BSP, PS_ASP = "ps (bsp)", "ps (asp)"
# (specialised, general-purpose, role): the labels of the runs paired
TWINS = ((PS_BSP, "spark-mllib", VERDICT), (PS_BSP, "spark-barrier", VERDICT), ("ddp", "spark-torch", LAUNCHER),
         (PS_ASP, "spark-mllib", BESIDE), (PS_ASP, "spark-barrier", BESIDE), (PS_ASP, "spark-torch", BESIDE),
         ("horovod", "spark-torch", BESIDE))

TWIN_RULE = (f"reproduced if, on every workload, each synchronous twin (PS BSP ÷ spark-mllib, PS BSP ÷ "
             f"spark-barrier: mean samples/s after warm-up, paired by seed, geometric mean with a 95% t interval on "
             f"the log scale) has its interval above {MARGIN:g}x at every worker count where neither side "
             f"oversubscribed the cores (oversubscribed points shown, flagged, not counted); not reproduced if a "
             f"counted twin's interval lies at or below {MARGIN:g}x; else inconclusive (a twin missing at a worker "
             f"count, too few seeds, no counted point). DDP ÷ spark-torch (the same ring, Spark as launcher), PS ASP "
             f"and Horovod are shown, not tested")


@dataclass(frozen=True)
class Twin:
    workload: str
    workers: int
    specialised: str
    general: str
    role: str                 # VERDICT, LAUNCHER or BESIDE
    specialised_sps: float    # mean over the paired seeds (nan: a side missing)
    general_sps: float
    ratio: Interval           # n = the seeds paired (0: a side missing at this count)
    oversubscribed: bool      # either side's run oversubscribed the cores

    @property
    def missing(self) -> bool:
        return self.ratio.n == 0

    @property
    def counted(self) -> bool:
        return self.role == VERDICT and not self.oversubscribed

    @property
    def pair(self) -> str:
        return f"{self.specialised} ÷ {self.general}"


PS_DEFAULT_CONSISTENCY = "asp"  # the ps adapter's default (a run without the option)


def twin_names(runs: pd.DataFrame) -> pd.Series:
    """The name a run goes by in TWINS: 'ps (bsp)' / 'ps (asp)' by its consistency, whatever the
    suite's labels show (a suite with one consistency labels it plain 'ps'), else its system."""
    consistency = (runs["opt_consistency"] if "opt_consistency" in runs else pd.Series(None, index=runs.index))
    consistency = consistency.where(consistency.notna(), PS_DEFAULT_CONSISTENCY).astype(str)
    return runs["system"].where(runs["system"] != "ps", "ps (" + consistency + ")")


def _per_seed(runs: pd.DataFrame, name: str, value: str) -> pd.Series:
    return runs[twin_names(runs) == name].groupby("seed")[value].mean().dropna()


def _scaling_workloads(runs: pd.DataFrame) -> list[str]:
    """Workloads run as a scaling comparison: >= 2 worker counts, one batch size a worker count (a
    batch sweep at one worker count, as kassela's, is not one)."""
    out = []
    for workload, group in runs.groupby("workload", sort=True):
        per_count = group.groupby("workers")["batch_size"].nunique()
        if len(per_count) >= 2 and (per_count == 1).all():
            out.append(str(workload))
    return out


def twins(res: SuiteResults) -> list[Twin]:
    """Every twin pair at every worker count of every scaling workload where either side ran; a
    verdict or launcher twin with a side missing at a count is kept, its n 0 (beside pairs are
    dropped then)."""
    runs = measures.annotate(res).runs
    if runs.empty:
        return []
    value = "steady_samples_per_s"
    found = []
    for workload in _scaling_workloads(runs):
        mine = runs[runs["workload"] == workload]
        for workers, group in mine.groupby("workers", sort=True):
            for spec, gen, role in TWINS:
                a, b = _per_seed(group, spec, value), _per_seed(group, gen, value)
                if a.empty and b.empty:
                    continue
                seeds = a.index.intersection(b.index)
                if not len(seeds) and role == BESIDE:
                    continue
                t = paired_log_ratio_t(a.reindex(seeds).to_numpy(), b.reindex(seeds).to_numpy())
                sides = group[twin_names(group).isin([spec, gen])]
                over = bool(sides["oversubscribed"].eq(True).any())
                found.append(Twin(workload, int(workers), spec, gen, role,
                                  float(a.reindex(seeds).mean()) if len(seeds) else math.nan,
                                  float(b.reindex(seeds).mean()) if len(seeds) else math.nan, t.interval, over))
    return found


def verdict_twins(found: list[Twin]) -> list[Twin]:
    return [t for t in found if t.role == VERDICT]


def holds(found: list[Twin]) -> bool:
    """Every synchronous twin present on every workload at every worker count, each counted (not
    oversubscribed) on at least one count, and every counted one with its interval above MARGIN."""
    tested = verdict_twins(found)
    if not tested or any(t.missing for t in tested):
        return False
    needed = {(t.workload, f"{spec} ÷ {gen}") for t in found for spec, gen, role in TWINS if role == VERDICT}
    counted = [t for t in tested if t.counted]
    if {(t.workload, t.pair) for t in counted} != needed:
        return False
    return all(t.ratio.lo > MARGIN for t in counted)


def fails(found: list[Twin]) -> bool:
    """A counted synchronous twin whose interval lies at or below MARGIN: not substantially faster there."""
    return any(t.ratio.hi <= MARGIN for t in verdict_twins(found) if t.counted)


def fmt_ratio(iv: Interval) -> str:
    if iv.n == 0:
        return "missing"
    if math.isnan(iv.lo):
        return f"{iv.estimate:.3g}x (n={iv.n}, no interval)"
    return f"{iv.estimate:.3g}x [{iv.lo:.3g}, {iv.hi:.3g}] (n={iv.n})"


def twin_table(found: list[Twin]) -> pd.DataFrame:
    """Workload × workers × pair: both sides' samples/s, the ratio with its interval, whether the
    point oversubscribed the cores and what it counts for."""
    def counts(t: Twin) -> str:
        if t.role == VERDICT:
            return "no: oversubscribed" if t.oversubscribed else "yes"
        return "no: Spark as launcher" if t.role == LAUNCHER else "no: shown beside"

    return pd.DataFrame([{"workload": t.workload, "workers": t.workers, "pair": t.pair,
                          "samples/s": round(t.specialised_sps) if not math.isnan(t.specialised_sps) else math.nan,
                          "samples/s ": round(t.general_sps) if not math.isnan(t.general_sps) else math.nan,
                          "ratio (95% interval, n)": fmt_ratio(t.ratio),
                          f"above {MARGIN:g}x": ("–" if t.missing or math.isnan(t.ratio.lo)
                                                 else "yes" if t.ratio.lo > MARGIN else "no"),
                          "oversubscribed": "yes" if t.oversubscribed else "no", "in verdict": counts(t)}
                         for t in found])


# ---- what Spark costs as a launcher ---------------------------------------------------------------

def launch_cost(res: SuiteResults, workload: str, workers: int) -> Interval:
    """spark-torch's launch (setup_s) less DDP's, paired by seed: seconds, once a run."""
    runs = measures.annotate(res).runs
    group = runs[(runs["workload"] == workload) & (runs["workers"] == workers)]
    a = _per_seed(group, "spark-torch", "setup_s")
    b = _per_seed(group, "ddp", "setup_s")
    seeds = a.index.intersection(b.index)
    return paired_t(a.reindex(seeds).to_numpy() - b.reindex(seeds).to_numpy()).interval


# ---- each system's exchange timed alone ----------------------------------------------------------

EXCHANGES = (("ddp", "allreduce_alone_s", "gloo allreduce of the gradients' size, in DDP's ranks after training"),
             (PS_BSP, "ps_roundtrip_alone_s", "PS push + pull of the gradients' size against one shard"))


def _geometric(values: np.ndarray) -> Interval:
    """The runs' medians' geometric mean with a t interval on the log scale (times are skewed)."""
    return paired_log_ratio_t(values, np.ones_like(values)).interval


def exchange_table(res: SuiteResults) -> pd.DataFrame:
    """Per workload and worker count: each exchange's time alone (ms; each run's median over its
    repeats; their geometric mean with a t interval over runs)."""
    runs = measures.annotate(res).runs
    rows = []
    for workload in _scaling_workloads(runs):
        mine = runs[runs["workload"] == workload]
        for workers, group in mine.groupby("workers", sort=True):
            row = {"workload": workload, "workers": int(workers)}
            for label, column, _ in EXCHANGES:
                if column not in group:
                    continue
                values = pd.to_numeric(group.loc[twin_names(group) == label, column], errors="coerce").dropna()
                row[f"{label}: {column.removesuffix('_s').replace('_', ' ')} (ms)"] = (
                    fmt_interval(_geometric(values.to_numpy() * 1e3)) if len(values) else "–")
            if len(row) > 2:
                rows.append(row)
    return pd.DataFrame(rows)


def fmt_interval(iv: Interval) -> str:
    if math.isnan(iv.lo):
        return f"{iv.estimate:.3g} (n={iv.n})"
    return f"{iv.estimate:.3g} [{iv.lo:.3g}, {iv.hi:.3g}] (n={iv.n})"

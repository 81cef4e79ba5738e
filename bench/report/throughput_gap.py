"""Specialised ÷ general-purpose throughput against workers (issue 27, the thesis' first finding as
its abstract states it): at each worker count, the fastest specialised system (parameter server,
allreduce) over the fastest general-purpose one (Spark's paths), by mean samples/s after warm-up,
paired by seed (the same seed gives both the same shards, initial weights and straggler schedule),
with a t interval on the log ratio.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from psbench.bench.harness.results import SuiteResults
from psbench.bench.report import measures
from psbench.bench.report.stats import Interval, paired_log_ratio_t

SPECIALISED = ("ps", "ddp", "horovod", "ray-ps", "rpc-ps")
GENERAL_PURPOSE = ("spark-mllib", "spark-mllib-native", "spark-barrier", "spark-torch")
GAP_RULE = ("at each worker count, the fastest specialised system (ps, ddp, horovod) ÷ the fastest general-purpose "
            "one (Spark's paths), each chosen by mean samples/s after warm-up, paired by seed, geometric mean with "
            "a 95% t interval on the log scale")


@dataclass(frozen=True)
class Gap:
    workload: str
    workers: int
    specialised: str
    general: str
    specialised_sps: float
    general_sps: float
    ratio: Interval


def _fastest(runs: pd.DataFrame, systems: tuple[str, ...], value: str) -> tuple[str, pd.Series] | None:
    kind = runs[runs["system"].isin(systems)]
    if kind.empty:
        return None
    means = kind.groupby("label")[value].mean()
    label = str(means.idxmax())
    chosen = kind[kind["label"] == label]
    return label, chosen.set_index("seed")[value].groupby(level=0).mean()


def gaps(res: SuiteResults) -> list[Gap]:
    """One Gap per workload, batch size and worker count where both kinds ran."""
    runs = measures.annotate(res).runs
    if runs.empty:
        return []
    value = "steady_samples_per_s"
    found = []
    for (workload, _, workers), group in runs.groupby(["workload", "batch_size", "workers"], sort=True):
        spec, gen = _fastest(group, SPECIALISED, value), _fastest(group, GENERAL_PURPOSE, value)
        if spec is None or gen is None:
            continue
        seeds = spec[1].index.intersection(gen[1].index)
        t = paired_log_ratio_t(spec[1].reindex(seeds).to_numpy(), gen[1].reindex(seeds).to_numpy())
        found.append(Gap(workload, int(workers), spec[0], gen[0], float(spec[1].mean()), float(gen[1].mean()),
                         t.interval))
    return found


def scaling_gaps(res: SuiteResults) -> dict[str, list[Gap]]:
    """Per workload, its gaps where they form a scaling comparison: >= 2 worker counts, one batch
    size a worker count (a batch sweep at one worker count, as kassela's, is not one)."""
    found = gaps(res)
    out = {}
    for workload in sorted({g.workload for g in found}):
        mine = [g for g in found if g.workload == workload]
        counts = {g.workers for g in mine}
        if len(counts) >= 2 and len(mine) == len(counts):
            out[workload] = mine
    return out


def gap_table(found: list[Gap]) -> pd.DataFrame:
    def ci(iv: Interval) -> str:
        if math.isnan(iv.lo):
            return f"{iv.estimate:.3g}x (n={iv.n}, no interval)"
        return f"{iv.estimate:.3g}x [{iv.lo:.3g}, {iv.hi:.3g}]"

    return pd.DataFrame([{"workload": g.workload, "workers": g.workers, "fastest specialised": g.specialised,
                          "samples/s": round(g.specialised_sps), "fastest general-purpose": g.general,
                          "samples/s ": round(g.general_sps), "specialised ÷ general-purpose": ci(g.ratio),
                          "seeds": g.ratio.n} for g in found])


def holds(found: list[Gap]) -> bool:
    """Above 1 at every worker count, and rising: the largest count's interval lies above the
    smallest count's estimate (one workload's gaps, >= 2 worker counts)."""
    if len(found) < 2:
        return False
    first, last = found[0], found[-1]
    return all(g.ratio.lo > 1 for g in found) and last.ratio.lo > first.ratio.estimate


def fails(found: list[Gap]) -> bool:
    """General-purpose as fast at the largest count, or the gap shown to shrink with workers."""
    if len(found) < 2:
        return False
    first, last = found[0], found[-1]
    return last.ratio.hi <= 1 or last.ratio.hi < first.ratio.estimate

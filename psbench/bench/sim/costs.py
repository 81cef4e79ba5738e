"""The scale model's costs from measured runs: every figure read from a results folder's records
(the suites `make bench` writes), each with the runs it came from and its interval. No figure is
typed in; what is assumed (a cluster's wire in a projection) is stated where it is used.

Per system and workload (bench/sim/events.py `SystemCosts`):
- compute_cpu_s: the median real compute (`compute_s`) of the system's 1-worker run at that batch;
  at a batch no 1-worker run had, the harness' CPU calibration's gradient time (each manifest's
  cpu_calibration.compute_s, measured alone at the workload's batch) scaled by the batch, linearly.
- update_cpu_s: the median `update_s` of its 1-worker runs.
- comm_fixed_s: the median `comm_s + wait_s` of its 1-worker runs (one worker: nothing to wait for;
  a PS: the whole push and reply on loopback; DDP and Horovod: their per-step hooks at N = 1).
- worker_cpu_s / server_cpu_s (PS family): the CPU figures the harness measured for the system's
  processes (manifest cpu_calibration: CPU seconds a worker spends per own step beyond the gradient,
  less its update; a shard's per update).
- allreduce alpha and beta (ddp, horovod): least squares over the multi-worker runs'
  `allreduce_alone_s` (the gradients' allreduce timed alone in the same ranks after training),
  t = alpha x 2(N - 1) + beta x 2(N - 1)/N x M; and, from the runs with more ranks than cores,
  this machine's extra wait per ring step (validation only: a projection gives each rank a machine).
- job_s and the per-worker growth of Spark's round systems: from their runs at 1..N workers (the
  throughput suite), c0 + c1 (N - 1), least squares.
The last two use only runs whose workers fit the cores they had (`fits_cores`): with 4 or 8
workers on 2 cores, a cost that grows with N would carry this machine's contention into every
projection, where each worker has its own machine.
- handover_s (switch): the median of the switch runs' measured hand-overs.
Intervals: a median's 95% order-statistic interval (binomial ranks); a fit's 95% t interval.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from psbench.bench.harness.results import SuiteResults, load_suite
from psbench.bench.harness.steady import warmup_mask
from psbench.bench.sim.events import ALLREDUCE_FAMILY, PS_FAMILY, SPARK_ROUNDS, SystemCosts
from psbench.bench.sim.model_size import model_bytes
from psbench.core.errors import ConfigError

@dataclass(frozen=True)
class Figure:
    """One measured cost: its value, 95% interval, and where it came from."""
    system: str
    workload: str
    name: str
    value: float
    lo: float | None
    hi: float | None
    n: int
    source: str


@dataclass
class MeasuredCosts:
    """Costs per (system, workload); the figures behind them; the suites read."""
    costs: dict[tuple[str, str], SystemCosts] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    compute_by_batch: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)  # (s at batch, batch)
    suites: list[str] = field(default_factory=list)

    def for_run(self, system: str, workload: str, batch_size: int) -> SystemCosts:
        """The costs of `system` on `workload` at a batch size: compute scaled from the nearest measure."""
        key = (system, workload)
        if key not in self.costs:
            known = ", ".join(f"{s}/{w}" for s, w in sorted(self.costs))
            raise ConfigError(f"simulate: no measured costs of {system} on {workload} in these suites (have: {known})")
        costs = self.costs[key]
        at, batch = self.compute_by_batch.get(key, (costs.compute_cpu_s, batch_size))
        return replace(costs, compute_cpu_s=at * batch_size / batch) if batch != batch_size else costs

    def to_json(self, provenance: dict[str, Any] | None = None) -> str:
        return json.dumps({"suites": self.suites,
                           "costs": [{"system": s, "workload": w, **asdict(c)} for (s, w), c in sorted(self.costs.items())],
                           "figures": [asdict(f) for f in self.figures],
                           **({"provenance": provenance} if provenance else {})}, indent=2, default=float)


def median_interval(values: np.ndarray) -> tuple[float, float | None, float | None]:
    """The median and its 95% distribution-free interval (order statistics at the binomial ranks)."""
    v = np.sort(np.asarray(values, dtype=float)[np.isfinite(values)])
    n = len(v)
    if n == 0:
        return math.nan, None, None
    half = 1.96 * math.sqrt(n) / 2
    lo_rank, hi_rank = int(math.floor(n / 2 - half)), int(math.ceil(n / 2 + half))
    if lo_rank < 0 or hi_rank > n - 1:
        return float(np.median(v)), None, None  # too few values for the interval
    return float(np.median(v)), float(v[lo_rank]), float(v[hi_rank])


def least_squares(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Coefficients of y = x @ c and their 95% t half-widths (None with no residual degrees of freedom)."""
    from scipy import stats

    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = len(y) - x.shape[1]
    if dof <= 0:
        return coef, None
    resid = y - x @ coef
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.pinv(x.T @ x)
    return coef, stats.t.ppf(0.975, dof) * np.sqrt(np.diag(cov))


def _steady_steps(res: SuiteResults, run_id: str) -> pd.DataFrame:
    steps = res.steps[res.steps["run_id"] == run_id]
    return steps[warmup_mask(steps)]


def _cpu_figures(res: SuiteResults, run_id: str) -> dict[str, Any]:
    conditions = ((res.manifests.get(run_id) or {}).get("extra") or {}).get("conditions") or {}
    return conditions.get("cpu_calibration") or {}


def fits_cores(run: Any) -> bool:
    """Whether a run's workers fit the cores it had (one each): only such runs measure a cost that
    grows with the workers, since a machine per worker has no contention to carry over."""
    cores = getattr(run, "cores", None)
    return cores is None or not cores == cores or run.workers <= float(cores)


def costs_from_suites(suite_dirs: list[Path]) -> MeasuredCosts:
    """The costs measured by the runs of the given suite folders (1-worker runs give per-step costs;
    multi-worker allreduce runs their allreduce timed alone; Spark's round systems their growth)."""
    measured = MeasuredCosts(suites=[str(p) for p in suite_dirs])
    suites = [load_suite(p) for p in suite_dirs]
    ar_points: dict[str, list[tuple[int, int, float, str, bool]]] = {}
    spark_points: dict[tuple[str, str], list[tuple[int, float, str]]] = {}
    handovers: list[tuple[float, str]] = []
    for res in suites:
        runs = res.runs
        for run in runs.itertuples():
            own_cores = fits_cores(run)  # else the figure would hold this machine's contention
            if run.system in ALLREDUCE_FAMILY and run.workers > 1 and pd.notna(run.allreduce_alone_s):
                size = model_bytes(run.workload)
                ar_points.setdefault(run.system, []).append((run.workers, size, float(run.allreduce_alone_s), run.run_id,
                                                             own_cores))
            if run.system == "switch" and pd.notna(getattr(run, "handover_s", math.nan)):
                handovers.append((float(run.handover_s), run.run_id))
            if run.system in SPARK_ROUNDS and own_cores:
                steps = _steady_steps(res, run.run_id)
                if len(steps):
                    per_step = float((steps["comm_s"].fillna(0) + steps["wait_s"].fillna(0)).median())
                    spark_points.setdefault((run.system, run.workload), []).append((run.workers, per_step, run.run_id))
        for (system, workload, batch), group in runs[runs["workers"] == 1].groupby(["system", "workload", "batch_size"]):
            ids = list(group["run_id"])
            steps = pd.concat([_steady_steps(res, i) for i in ids])
            if steps.empty:
                continue
            key = (system, workload)
            src = f"{res.suite}: {', '.join(ids)}"
            compute = median_interval(steps["compute_s"].to_numpy(float))
            update = median_interval(steps["update_s"].fillna(0).to_numpy(float))
            comm = median_interval((steps["comm_s"].fillna(0) + steps["wait_s"].fillna(0)).to_numpy(float))
            cpu = _cpu_figures(res, ids[0])
            roles = cpu.get("figures") or {}
            workers_cpu = (roles.get("workers") or {}).get("step_cpu_s", 0.0)
            shard_cpu = next((f.get("step_cpu_s", 0.0) for role, f in roles.items() if "shard" in role), 0.0)
            size = model_bytes(workload)
            previous = measured.costs.get(key)
            if previous is not None and measured.compute_by_batch.get(key, (0, 0))[1] >= int(batch):
                continue  # one set per system and workload: the largest batch measured
            costs = SystemCosts(compute_cpu_s=compute[0], update_cpu_s=update[0], comm_fixed_s=comm[0],
                                model_bytes=size)
            if system in PS_FAMILY:
                worker_cpu = min(max(0.0, workers_cpu - update[0]), comm[0])
                costs = replace(costs, worker_cpu_s=worker_cpu, server_cpu_s=min(shard_cpu, comm[0] - worker_cpu))
            measured.costs[key] = costs
            measured.compute_by_batch[key] = (compute[0], int(batch))
            n = len(steps)
            measured.figures += [Figure(system, workload, f"compute_cpu_s (batch {int(batch)})", *compute, n, src),
                            Figure(system, workload, "update_cpu_s", *update, n, src),
                            Figure(system, workload, "comm_fixed_s (comm + wait at 1 worker)", *comm, n, src)]
            if system in PS_FAMILY:
                file = f"{cpu.get('file', '?')} (git {str(cpu.get('git_sha'))[:10]}, {cpu.get('measured_at', '?')})"
                measured.figures += [Figure(system, workload, "worker_cpu_s (CPU figures: workers' step CPU less update)",
                                       costs.worker_cpu_s, None, None, len(cpu.get("runs", [])), file),
                                Figure(system, workload, "server_cpu_s (CPU figures: a shard's CPU per update)",
                                       costs.server_cpu_s, None, None, len(cpu.get("runs", [])), file)]
    _fit_allreduce(measured, ar_points)
    _fit_spark(measured, spark_points)
    if handovers:
        value, lo, hi = median_interval(np.array([h for h, _ in handovers]))
        measured.figures.append(Figure("switch", "*", "handover_s", value, lo, hi, len(handovers),
                                  "switch runs: " + ", ".join(i for _, i in handovers[:3]) + (" ..." if len(handovers) > 3 else "")))
        for key, costs in list(measured.costs.items()):
            if key[0] == "ps":
                measured.costs[("switch", key[1])] = replace(costs, handover_s=value)
    if not measured.costs:
        raise ConfigError("simulate: no 1-worker runs in " + ", ".join(map(str, suite_dirs)) +
                          " (the systems suite has them): no costs to measure")
    return measured


def _fit_allreduce(measured: MeasuredCosts, points: dict[str, list[tuple[int, int, float, str, bool]]]) -> None:
    """alpha, beta from the runs whose ranks had a core each; the crowded wait per ring step from
    the others (more ranks than cores: this machine's, used in validation, never in projections)."""
    for system, all_pts in points.items():
        pts = [p for p in all_pts if p[4]]
        if not pts:
            continue
        x = np.array([[2 * (n - 1), 2 * (n - 1) / n * m] for n, m, *_ in pts], dtype=float)
        y = np.array([t for _, _, t, *_ in pts])
        if len({(n, m) for n, m, *_ in pts}) < 2:  # one configuration: the two terms cannot be told apart
            coef, half = least_squares(x[:, :1], y)
            coef, half = np.append(coef, 0.0), None if half is None else np.append(half, 0.0)
        else:
            coef, half = least_squares(x, y)
        alpha, beta = max(0.0, float(coef[0])), max(0.0, float(coef[1]))
        src = f"allreduce_alone_s of {len(pts)} runs, a core per rank: " + ", ".join(p[3] for p in pts)
        for name, value, h in (("allreduce_alpha_s (per ring step)", alpha, None if half is None else half[0]),
                               ("allreduce_beta_s_per_byte", beta, None if half is None else half[1])):
            measured.figures.append(Figure(system, "*", name, value, None if h is None else value - h,
                                      None if h is None else value + h, len(pts), src))
        crowded_pts = [p for p in all_pts if not p[4]]
        crowded = median_interval(np.array([(t - beta * 2 * (n - 1) / n * m) / (2 * (n - 1)) - alpha
                                            for n, m, t, *_ in crowded_pts])) if crowded_pts else (0.0, None, None)
        if crowded_pts:
            measured.figures.append(Figure(system, "*", "allreduce_crowded_s (per ring step, ranks > cores, this machine)",
                                      max(0.0, crowded[0]), crowded[1], crowded[2], len(crowded_pts),
                                      f"allreduce_alone_s of {len(crowded_pts)} runs with more ranks than cores: "
                                      + ", ".join(p[3] for p in crowded_pts)))
        for key, costs in list(measured.costs.items()):
            if key[0] == system:
                measured.costs[key] = replace(costs, allreduce_alpha_s=alpha, allreduce_beta_s_per_byte=beta,
                                         allreduce_crowded_s=max(0.0, crowded[0]))


def _fit_spark(measured: MeasuredCosts, points: dict[tuple[str, str], list[tuple[int, float, str]]]) -> None:
    """A Spark round system's per-step cost beyond the device, c0 + c1 (N - 1): c0 is its job_s."""
    for (system, workload), pts in points.items():
        if len({n for n, _, _ in pts}) < 2:
            continue
        x = np.array([[1.0, n - 1] for n, _, _ in pts])
        y = np.array([t for _, t, _ in pts])
        coef, half = least_squares(x, y)
        c0, c1 = max(0.0, float(coef[0])), max(0.0, float(coef[1]))
        src = f"{len(pts)} runs at {sorted({n for n, _, _ in pts})} workers (median comm + wait per step)"
        for name, value, h in (("job_s (per step at 1 worker)", c0, None if half is None else half[0]),
                               ("growth_s per extra worker", c1, None if half is None else half[1])):
            measured.figures.append(Figure(system, workload, name, value, None if h is None else value - h,
                                      None if h is None else value + h, len(pts), src))
        key = (system, workload)
        base = measured.costs.get(key) or SystemCosts(compute_cpu_s=0.0, model_bytes=model_bytes(workload))
        measured.costs[key] = replace(base, job_s=c0, per_worker_s=c1, comm_fixed_s=0.0)

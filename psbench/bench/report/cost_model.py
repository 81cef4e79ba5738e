"""The per-iteration cost model of the Kassela suite: why one system's time per
mini-batch falls as the mini-batch shrinks and another's does not, and what that predicts at other
data sizes.

Per system, from its runs (one point per run: the mean step interval after warm-up):

    time per mini-batch = fixed + per_example x examples per core

fitted by weighted least squares (relative noise), each term with a t interval (n - 2 degrees of
freedom). For
Spark's native trainer a second fit splits the fixed part: the slowest task's run time (its
partition's sampling pass and gradient) = task_fixed + per_example' x examples per core, where
task_fixed is read as the Bernoulli sampling pass over the partition's rows (every row is touched
whatever the fraction), i.e. scan x rows per core; an upper bound, a task's own start-up included.
The rest of `fixed` (scheduling, broadcast, the final aggregate, the driver's update) does not
grow with the data. So at R rows per core and fraction f:

    T(R, f) = (fixed - scan x R_measured) + scan x R + per_example x f x R

and the fall from 100 % to f is T(R, 1) / T(R, f). Predictions carry intervals drawn from the
fits' coefficient distributions (multivariate t, the two fits independent).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats as sps

from psbench.bench.harness.results import SuiteResults
from psbench.bench.report import measures
from psbench.bench.report.stats import CONFIDENCE, BOOT_SEED, Interval

VALIDATION_TOLERANCE = 0.15  # the model must meet every measured size's mean within this before it projects
N_DRAWS = 20_000

# The paper's setups, as data per core. The sizes are our assumptions where the paper gives none:
# HIGGS has 11 M rows; the 141-VM synthetic set is taken at HIGGS' size; the 5 nodes are taken as
# the same 2-vCPU VMs. The paper split the data into 100 mini-batches: its smallest fraction is 1 %.
PAPER_SETUPS = (
    ("Kassela 2019: 141 VMs x 2 vCPU, a synthetic set of HIGGS' 11 M rows (size assumed)", 11_000_000, 282),
    ("Kassela 2019: 5 nodes x 2 vCPU (vCPUs assumed), HIGGS, 11 M rows", 11_000_000, 10),
)
PAPER_SMALLEST_FRACTION = 0.01
MODEL_RULE = ("per system, least squares (weighted by 1 / the batch size's mean time squared: relative noise) of each "
              "run's mean step interval (after the warm-up cut) on its examples per core: "
              "time = fixed + per_example x examples; Spark's native trainer also fits its slowest task's time "
              "(task_fixed = the sampling scan of its rows); t intervals on the terms (n - 2 df); predicted falls "
              f"from {N_DRAWS:,} draws of the coefficients (multivariate t)")


@dataclass
class CostFit:
    label: str
    workload: str
    workers: int
    rows_per_core: float
    n: int
    coef: np.ndarray            # (fixed, per_example)
    cov: np.ndarray
    df: int
    scan_coef: np.ndarray | None = None  # (task_fixed, per_example) of the slowest task, Spark native only
    scan_cov: np.ndarray | None = None
    scan_df: int = 0
    points: pd.DataFrame = field(default_factory=pd.DataFrame)  # per batch size: measured mean, fitted, rel. error
    system: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # the options its runs set (what the label encodes)

    def term(self, which: int, coef: np.ndarray | None = None, cov: np.ndarray | None = None,
             df: int | None = None) -> Interval:
        coef = self.coef if coef is None else coef
        cov = self.cov if cov is None else cov
        df = self.df if df is None else df
        if df < 1:
            return Interval(self.n, float(coef[which]), math.nan, math.nan)
        half = float(sps.t.ppf(1 - (1 - CONFIDENCE) / 2, df)) * math.sqrt(max(cov[which, which], 0.0))
        return Interval(self.n, float(coef[which]), float(coef[which]) - half, float(coef[which]) + half)

    @property
    def fixed(self) -> Interval:
        return self.term(0)

    @property
    def per_example(self) -> Interval:
        return self.term(1)

    @property
    def scan_per_row(self) -> Interval | None:
        if self.scan_coef is None:
            return None
        task = self.term(0, self.scan_coef, self.scan_cov, self.scan_df)
        return Interval(task.n, task.estimate / self.rows_per_core, task.lo / self.rows_per_core,
                        task.hi / self.rows_per_core)

    @property
    def max_abs_error(self) -> float:
        return float(self.points["rel_error"].abs().max()) if len(self.points) else math.nan

    @property
    def validated(self) -> bool:
        return self.max_abs_error <= VALIDATION_TOLERANCE

    def _draws(self, seed: int = BOOT_SEED) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)

        def draw(coef: np.ndarray, cov: np.ndarray, df: int) -> np.ndarray:
            if df < 1:
                return np.tile(coef, (N_DRAWS, 1))
            normal = rng.multivariate_normal(np.zeros(len(coef)), cov, size=N_DRAWS, method="svd")
            return coef + normal / np.sqrt(rng.chisquare(df, size=(N_DRAWS, 1)) / df)

        main = draw(self.coef, self.cov, self.df)
        scan = (draw(self.scan_coef, self.scan_cov, self.scan_df) if self.scan_coef is not None
                else np.zeros((N_DRAWS, 2)))
        return main, scan

    def predict(self, rows_per_core: float, fraction: float, main: np.ndarray | None = None,
                scan: np.ndarray | None = None) -> np.ndarray | float:
        """Seconds per mini-batch at `rows_per_core` rows per core and `fraction` of them a mini-batch
        (the point estimate, or one value per coefficient draw when draws are given)."""
        if main is None:
            main = self.coef[None, :]
            scan = self.scan_coef[None, :] if self.scan_coef is not None else np.zeros((1, 2))
        scan_per_row = scan[:, 0] / self.rows_per_core
        other_fixed = main[:, 0] - scan_per_row * self.rows_per_core
        out = other_fixed + scan_per_row * rows_per_core + main[:, 1] * fraction * rows_per_core
        return float(out[0]) if len(out) == 1 else out

    def fall(self, rows_per_core: float, smallest_fraction: float) -> Interval:
        """Predicted T(R, 100 %) / T(R, smallest_fraction), with its interval over coefficient draws."""
        estimate = self.predict(rows_per_core, 1.0) / self.predict(rows_per_core, smallest_fraction)
        main, scan = self._draws()
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = self.predict(rows_per_core, 1.0, main, scan) / self.predict(rows_per_core, smallest_fraction,
                                                                                main, scan)
        ratios = ratios[np.isfinite(ratios) & (ratios > 0)]
        lo, hi = np.quantile(ratios, [(1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2]) if len(ratios) else (math.nan,) * 2
        return Interval(self.n, float(estimate), float(lo), float(hi))


def _wls(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Weighted least squares of y = a + b x: the coefficients, their covariance and the degrees of
    freedom. The weights are 1 / (each batch size's mean time)^2: the runs' spread grows with the
    time (relative noise), and an unweighted fit would let the largest batch's spread swamp the
    fixed cost that the smallest batches measure."""
    design = np.column_stack([np.ones_like(x), x])
    root = np.sqrt(weights)
    coef, *_ = np.linalg.lstsq(design * root[:, None], y * root, rcond=None)
    df = len(y) - 2
    if df < 1:
        return coef, np.zeros((2, 2)), df
    resid = (y - design @ coef) * root
    sigma2 = float(resid @ resid) / df
    return coef, sigma2 * np.linalg.inv((design * weights[:, None]).T @ design), df


def run_points(res: SuiteResults) -> pd.DataFrame:
    """One row per run: label, workload, workers, seed, examples per core per mini-batch (counted),
    rows per core, the mean step interval after warm-up, and the mean slowest-task time per core
    (Spark native: compute_s x partitions per core; nan elsewhere)."""
    if res.runs.empty or res.steps.empty:
        return pd.DataFrame()
    fractions = measures.batch_fractions(res)
    means = measures.run_step_means(res)
    rows = []
    for run in res.runs.itertuples():
        steps = res.steps[res.steps["run_id"] == run.run_id]
        if steps.empty or not math.isfinite(means.get(run.run_id, math.nan)):
            continue
        kept = steps[measures.warmup_mask(steps)]
        extra = (res.manifests.get(run.run_id) or {}).get("extra") or {}
        workers = int(run.workers)
        cluster_rows = steps["worker"].nunique() == 1 and workers > 1  # one row per iteration, whole cluster
        examples = float(kept["n_samples"].mean()) / (workers if cluster_rows else 1)
        fraction = float(fractions.get(run.run_id, math.nan))
        rows_per_core = run.batch_size / fraction if fraction and fraction < 1 else math.nan
        if "train_rows" in extra:
            rows_per_core = float(extra["train_rows"]) / workers
        elif not math.isfinite(rows_per_core):
            rows_per_core = float(run.batch_size)  # 100 % of the shard: the shard is the batch
        per_core = float(extra.get("partitions_per_core") or 1)
        task = kept["compute_s"].mean() * per_core if run.system == "spark-mllib-native" else math.nan
        options = {col[4:]: value for col, value in run._asdict().items()
                   if col.startswith("opt_") and not (isinstance(value, float) and math.isnan(value)) and value is not None}
        rows.append({"run_id": run.run_id, "label": run.label, "system": run.system, "options": options,
                     "workload": run.workload,
                     "workers": workers, "seed": int(run.seed), "batch_size": int(run.batch_size),
                     "fraction": fraction, "examples": examples, "rows_per_core": rows_per_core,
                     "step_s": float(means[run.run_id]), "task_s": float(task)})
    return pd.DataFrame(rows)


def _relative_weights(group: pd.DataFrame, column: str) -> np.ndarray:
    means = group.groupby("batch_size")[column].transform("mean").to_numpy(float)
    return 1.0 / np.maximum(means, 1e-12) ** 2


def fit_costs(res: SuiteResults) -> list[CostFit]:
    """A CostFit per (label, workload, workers) with runs at >= 2 batch sizes."""
    points = run_points(res)
    fits = []
    if points.empty:
        return fits
    for (label, workload, workers), group in points.groupby(["label", "workload", "workers"], sort=True):
        if group["batch_size"].nunique() < 2:
            continue
        x, y = group["examples"].to_numpy(float), group["step_s"].to_numpy(float)
        coef, cov, df = _wls(x, y, _relative_weights(group, "step_s"))
        fit = CostFit(label, workload, int(workers), float(group["rows_per_core"].median()), len(group), coef, cov, df,
                      system=str(group["system"].iloc[0]), options=dict(group["options"].iloc[0]))
        tasks = group["task_s"].to_numpy(float)
        if np.isfinite(tasks).all():
            fit.scan_coef, fit.scan_cov, fit.scan_df = _wls(x, tasks, _relative_weights(group, "task_s"))
        by_batch = group.groupby("batch_size").agg(examples=("examples", "mean"), measured_s=("step_s", "mean"),
                                                   runs=("step_s", "size"))
        by_batch["fitted_s"] = [fit.predict(fit.rows_per_core, e / fit.rows_per_core) for e in by_batch["examples"]]
        by_batch["rel_error"] = by_batch["fitted_s"] / by_batch["measured_s"] - 1
        fit.points = by_batch.reset_index()
        fits.append(fit)
    return fits


def suite_fits(res: SuiteResults) -> list[CostFit]:
    """fit_costs for a Kassela suite (a per-mini-batch sweep); none for any other suite."""
    return fit_costs(res) if res.suite.startswith("kassela") else []


def _ci(iv: Interval | None, scale: float = 1.0, digits: int = 3) -> str:
    if iv is None or math.isnan(iv.estimate):
        return "–"
    if math.isnan(iv.lo):
        return f"{iv.estimate * scale:.{digits}g}"
    return f"{iv.estimate * scale:.{digits}g} [{iv.lo * scale:.{digits}g}, {iv.hi * scale:.{digits}g}]"


def terms_table(fits: list[CostFit]) -> pd.DataFrame:
    """The fitted terms side by side: ms fixed, µs per example, ns per row scanned, and the fit's
    largest relative error at a measured batch size."""
    return pd.DataFrame([{
        "system": f.label, "workload": f.workload, "workers": f.workers, "runs": f.n,
        "fixed ms": _ci(f.fixed, 1e3), "per example µs": _ci(f.per_example, 1e6),
        "scan ns/row": _ci(f.scan_per_row, 1e9), "rows per core": f"{f.rows_per_core:,.0f}",
        "largest fit error": f"{f.max_abs_error:+.1%}" if math.isfinite(f.max_abs_error) else "–",
        "within 15%": "yes" if f.validated else "no"} for f in fits])


def fixed_ratio(numerator: CostFit, denominator: CostFit) -> Interval:
    """numerator's fixed cost ÷ denominator's, with an interval over coefficient draws."""
    a, _ = numerator._draws(BOOT_SEED)
    b, _ = denominator._draws(BOOT_SEED + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = a[:, 0] / b[:, 0]
    ratios = ratios[np.isfinite(ratios) & (b[:, 0] > 0)]
    lo, hi = np.quantile(ratios, [(1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2]) if len(ratios) else (math.nan,) * 2
    return Interval(min(numerator.n, denominator.n), float(numerator.coef[0] / denominator.coef[0]), float(lo),
                    float(hi))


def predicted_falls(fits: list[CostFit], checked: dict[str, bool] | None = None) -> pd.DataFrame:
    """Per system, the fall the model predicts at the measured data per core and at the paper's
    setups (PAPER_SETUPS), to the paper's smallest fraction (1 %) and to this suite's (0.01 %);
    `validated`: the fit meets the measured sizes, and the other data size where one was run
    (`checked`: system -> within the tolerance there)."""
    rows = []
    checked = checked or {}
    for f in fits:
        setups = [("this suite (measured size)", f.rows_per_core * f.workers, f.workers)] + list(PAPER_SETUPS)
        for name, total_rows, cores in setups:
            per_core = total_rows / cores
            rows.append({"system": f.label, "workload": f.workload, "setup": name, "rows per core": per_core,
                         "fall to 1 %": f.fall(per_core, PAPER_SMALLEST_FRACTION),
                         "fall to 0.01 %": f.fall(per_core, 1e-4),
                         "validated": f.validated and checked.get(f.label, False),
                         "why": ("fit error > 15%" if not f.validated else "not checked at another data size"
                                 if f.label not in checked else "" if checked[f.label]
                                 else "the other data size missed by > 15%")})
    return pd.DataFrame(rows)


def predicted_falls_table(falls: pd.DataFrame) -> pd.DataFrame:
    if falls.empty:
        return falls
    out = falls.copy()
    out["rows per core"] = out["rows per core"].map(lambda r: f"{r:,.0f}")
    for col in ("fall to 1 %", "fall to 0.01 %"):
        out[col] = out[col].map(lambda iv: _ci(iv, digits=3) + "x")
    out["validated"] = ["yes" if ok else f"no ({why})" for ok, why in zip(falls["validated"], falls["why"])]
    return out.drop(columns=["why"])


def fixed_ratios_table(fits: list[CostFit], reference: str = "ps") -> pd.DataFrame:
    """Every other system's fixed cost per mini-batch ÷ the reference system's (same workload)."""
    rows = []
    for ref in (f for f in fits if f.label == reference):
        for f in fits:
            if f.workload == ref.workload and f.label != reference:
                rows.append({"system": f.label, "workload": f.workload,
                             f"fixed ÷ {reference}'s": _ci(fixed_ratio(f, ref), digits=3) + "x"})
    return pd.DataFrame(rows)


# ---- the check at another data size ---------------------------------------------------------------

CHECK_SUITES = {"kassela": "kassela-10m"}  # the suite whose sizes check a suite's model


def check_suite(res: SuiteResults) -> SuiteResults | None:
    """The sibling suite (same results folder) that checks this suite's model at another size."""
    from psbench.bench.harness import store
    from psbench.bench.harness.results import load_suite

    name = CHECK_SUITES.get(res.suite)
    path = res.path.parent / name if name and res.path is not None else None
    if path is None or not store.is_suite(path):
        return None
    return load_suite(path)


def size_check(fits: list[CostFit], other: SuiteResults | None) -> pd.DataFrame:
    """Each fit's prediction for the other suite's runs of the same system (and workers) at their
    own rows per core and fraction, against their measured mean per batch size."""
    if other is None:
        return pd.DataFrame()
    points = run_points(other)
    rows = []
    for f in fits:
        same = points[[_same_variant(f, p) for p in points.itertuples()]] if len(points) else points
        for batch, group in (same.groupby("batch_size") if len(same) else ()):
            per_core = float(group["rows_per_core"].median())
            fraction = float(group["examples"].mean()) / per_core
            predicted = f.predict(per_core, fraction)
            measured = float(group["step_s"].mean())
            rows.append({"system": f.label, "fitted on": f.workload, "checked on": group["workload"].iloc[0],
                         "rows per core": per_core, "batch": int(batch), "runs": len(group),
                         "measured ms": measured * 1e3, "predicted ms": predicted * 1e3,
                         "error": predicted / measured - 1})
    return pd.DataFrame(rows)


def _same_variant(fit: CostFit, point: Any) -> bool:
    """A run of the fit's system and workers whose options (defaults filled in) hold every option
    value the fit's runs set: e.g. a 10 M run that sets only spark_conf is the 1 M fit's
    'partitions_per_core=1, gd' variant."""
    from dataclasses import asdict

    from psbench.systems import get_system
    from psbench.systems.base import parse_options

    if point.system != fit.system or point.workers != fit.workers:
        return False
    options = asdict(parse_options(get_system(point.system).Options, dict(point.options), point.system))
    return all(options.get(key) == value for key, value in fit.options.items() if key != "spark_conf")


def checked_labels(check: pd.DataFrame) -> dict[str, bool]:
    """Per system: whether the other size's every batch is predicted within VALIDATION_TOLERANCE."""
    if check.empty:
        return {}
    return {label: bool((group["error"].abs() <= VALIDATION_TOLERANCE).all())
            for label, group in check.groupby("system")}


def size_check_table(check: pd.DataFrame) -> pd.DataFrame:
    if check.empty:
        return check
    out = check.copy()
    out["rows per core"] = out["rows per core"].map(lambda r: f"{r:,.0f}")
    out["error"] = out["error"].map(lambda e: f"{e:+.1%}")
    return out.round({"measured ms": 3, "predicted ms": 3})


COST_FILE = "cost_model.json"  # the fits, for `psbench simulate --spark-from` (the analytic model's Spark job cost)


def to_json(fits: list[CostFit], suite: str, falls: pd.DataFrame | None = None) -> str:
    """The fitted terms with their intervals, one record per system variant, and the falls they
    predict at the paper's setups (`predicted_falls`), for the scale model's projection."""
    import json

    def term(iv: Interval | None) -> dict[str, float] | None:
        return None if iv is None else {"s": iv.estimate, "lo": iv.lo, "hi": iv.hi}

    def fall(iv: Interval) -> dict[str, float]:
        return {"x": iv.estimate, "lo": iv.lo, "hi": iv.hi}

    predicted = [] if falls is None else [
        {"system": r["system"], "workload": r["workload"], "setup": r["setup"], "rows_per_core": r["rows per core"],
         "fall_to_1pct": fall(r["fall to 1 %"]), "fall_to_0.01pct": fall(r["fall to 0.01 %"]),
         "validated": bool(r["validated"]), "why": r["why"]} for r in falls.to_dict("records")]

    return json.dumps({"suite": suite, "rule": MODEL_RULE, "fits": [
        {"label": f.label, "system": f.system, "options": f.options, "workload": f.workload, "workers": f.workers,
         "runs": f.n, "rows_per_core": f.rows_per_core, "fixed": term(f.fixed), "per_example": term(f.per_example),
         "scan_per_row": term(f.scan_per_row), "largest_fit_error": f.max_abs_error} for f in fits],
        "predicted_falls": predicted},
        indent=1, default=str)

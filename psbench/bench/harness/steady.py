"""The steady part of a run's step rows, under the warm-up rule every throughput figure states: the
report's measures (bench/report/measures.py) and the scale model's check (bench/sim/check.py)
read measured and simulated runs through these same functions."""
from __future__ import annotations

import numpy as np
import pandas as pd

# Warm-up kept out of throughput: each worker's first steps pay lazy allocation, thread-pool
# start-up, first-touch page faults and (async) an empty pipeline.
WARMUP_FRACTION = 0.10
WARMUP_MIN_STEPS = 1
WARMUP_RULE = (f"each worker's first {WARMUP_FRACTION:.0%} of its steps (at least {WARMUP_MIN_STEPS}) are warm-up "
               "and kept out; throughput is the samples of the steps that end between the last worker's warm-up "
               "end and the first worker's last step (the span in which every worker trains), over that span")


def warmup_mask(steps: pd.DataFrame) -> pd.Series:
    """True for the rows of one run that lie after their worker's warm-up."""
    order = steps.sort_values(["worker", "step"])
    rank = order.groupby("worker").cumcount()
    count = order.groupby("worker")["step"].transform("size")
    cut = np.maximum(WARMUP_MIN_STEPS, np.ceil(WARMUP_FRACTION * count))
    return (rank >= cut).reindex(steps.index)


def steady_window(steps: pd.DataFrame) -> tuple[float, float, int] | None:
    """(start, end, samples) of one run after warm-up, within the span where every worker trains."""
    if steps.empty:
        return None
    kept = warmup_mask(steps)
    by_worker = steps.groupby("worker")
    if not kept.groupby(steps["worker"]).any().all():
        return None  # a worker did no step after its warm-up
    warm_end = steps[~kept].groupby("worker")["t_wall"].max()
    start = float(warm_end.max())
    end = float(by_worker["t_wall"].max().min())
    if not end > start:
        return None
    inside = steps[(steps["t_wall"] > start) & (steps["t_wall"] <= end)]
    return start, end, int(inside["n_samples"].sum())


def steady_rate(steps: pd.DataFrame) -> float:
    """Samples/s over the steady window (nan where there is none)."""
    window = steady_window(steps)
    return window[2] / (window[1] - window[0]) if window else float("nan")


def step_intervals(steps: pd.DataFrame) -> pd.Series:
    """One run's seconds between a worker's consecutive steps, after warm-up (index: the step rows)."""
    kept = warmup_mask(steps)
    ordered = steps.sort_values(["worker", "step"])
    interval = ordered.groupby("worker")["t_wall"].diff().reindex(steps.index)
    return interval[kept].dropna()

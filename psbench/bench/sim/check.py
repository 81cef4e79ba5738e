"""The scale model against the suites: every run of a suite simulated from its own spec (workers,
batch, device, stragglers and seed, budget, consistency, cores) with the measured costs, and both
read through the same rule (bench/harness/steady.py): samples/s over the steady window, the
median step interval after warm-up. The error per run, with its median and maximum over the runs
the costs did not come from (a 1-worker run is an input: its per-step costs are the model's costs,
so its error says only that the event loop adds them up; validation.csv's `calibration_run`).

Where a run misses, the step splits into the device part (compute + emulated: the worker's own)
and the system part (comm + wait + update): the part whose predicted median is further from the
measured one is the term that misses.

A switch run takes two figures from its own records, as inputs, not predictions: when its
criterion fired (a loss plateau cannot be simulated) and how long its hand-over took; its step
interval is compared over the async phase (a two-phase mixture has no typical step).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from psbench.bench.harness.results import SuiteResults, load_suite
from psbench.bench.harness.steady import steady_rate, step_intervals, warmup_mask
from psbench.bench.sim.costs import MeasuredCosts
from psbench.bench.sim.events import SIMULATED, Network, SimSpec, simulate_run
from psbench.core.errors import ConfigError

GOAL_MEDIAN, GOAL_MAX = 0.15, 0.30  # the goal for the error of samples/s and step time


@dataclass
class Check:
    rows: list[dict[str, Any]]
    skipped: list[tuple[str, str]]       # (run_id, why)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def summary(self) -> dict[str, Any]:
        df = self.frame()
        out: dict[str, Any] = {"runs": len(df), "skipped": len(self.skipped)}
        held = df[~df["calibration_run"]] if len(df) else df
        out["validated_runs"] = len(held)
        for col in ("samples_per_s_error", "step_s_error"):
            values = held[col].abs().dropna() if len(held) else pd.Series(dtype=float)
            out[f"{col}_median"] = float(values.median()) if len(values) else math.nan
            out[f"{col}_max"] = float(values.max()) if len(values) else math.nan
        out["meets_goal"] = bool(out["samples_per_s_error_median"] <= GOAL_MEDIAN and
                                 out["samples_per_s_error_max"] <= GOAL_MAX)
        return out


def _budget_s(budget: Any) -> float | None:
    if not isinstance(budget, str) or not budget.startswith("seconds="):
        return None
    return float(budget.split("=", 1)[1])


def sim_spec(run: pd.Series, res: SuiteResults, steps: pd.DataFrame) -> SimSpec:
    """The SimSpec of a measured run, given its step rows (ConfigError for what the model does not take)."""
    spec = (res.manifests.get(run["run_id"]) or {}).get("spec") or {}
    options = spec.get("options") or {}
    budget = spec.get("budget")
    if budget and _budget_s(budget) is None:
        raise ConfigError(f"budget {budget}: the model takes a seconds budget or steps per worker")
    system = run["system"]
    if system not in SIMULATED:
        raise ConfigError(f"no model of {system}")
    consistency, staleness = "bsp", 0
    text = str(options.get("async_consistency" if system == "switch" else "consistency", "bsp")).lower()
    if text.startswith("ssp"):
        consistency, staleness = "ssp", int(text.partition(":")[2] or 0)
    elif text in ("asp", "bsp"):
        consistency = text
    switch_at = None
    if system == "switch":
        fired = res.events[(res.events["run_id"] == run["run_id"]) & (res.events["kind"] == "switch")]
        if fired.empty:
            raise ConfigError("its switch never fired (no switch event): a sync run, not a switch")
        switch_at = float(fired["t_wall"].min())
    cores = run.get("cores")
    manifest = res.manifests.get(run["run_id"]) or {}
    if (cores is None or cores != cores) and _cluster(manifest).get("launcher") in ("netns", "local"):
        cores = (manifest.get("machine") or {}).get("cores")  # every host of the lab shares the one machine
    kept = steps[warmup_mask(steps)] if len(steps) else steps
    return SimSpec(system=system, workload=run["workload"], workers=int(run["workers"]),
                   batch_size=int(run["batch_size"]), seed=int(run["seed"]), consistency=consistency,
                   staleness=staleness, servers=int(options.get("servers", 1) or 1),
                   emulate_device=spec.get("emulate_device"), stragglers=spec.get("stragglers"),
                   max_steps=spec.get("max_steps"), budget_s=_budget_s(budget),
                   sync=str(options.get("sync", "ddp")), switch_at_s=switch_at,
                   cores=float(cores) if cores is not None and cores == cores else 0,
                   samples_per_step=float(kept["n_samples"].mean()) if len(kept) else None)


def _cluster(manifest: dict[str, Any]) -> dict[str, Any]:
    cluster = (manifest.get("extra") or {}).get("cluster")
    return cluster if isinstance(cluster, dict) else {}


def run_network(manifest: dict[str, Any], goodput_mbit: dict[float, float] | None = None) -> tuple[Network, float | None]:
    """The links a run had beyond this machine's loopback (which the measured round trip holds):
    a cluster-file run with `tc`-capped hosts (psbench netlab bench) gets its cap's measured TCP
    goodput (bandwidth.csv's link_goodput_mbit; the nominal cap when none was measured) as every
    link's bandwidth (the model's link: events.Network). (Network, link Mbit/s), or (Network(), None)
    when uncapped."""
    caps = [float(h["cap_mbit"]) for h in _cluster(manifest).get("hosts") or []
            if isinstance(h, dict) and isinstance(h.get("cap_mbit"), (int, float)) and h["cap_mbit"] > 0]
    if not caps:
        return Network(), None
    cap = min(caps)
    mbit = (goodput_mbit or {}).get(cap, cap)
    return Network(bandwidth_Bps=mbit * 1e6 / 8), mbit


def _parts(steps: pd.DataFrame) -> tuple[float, float]:
    """Median device part (compute + emulated) and system part (comm + wait + update) per step."""
    kept = steps[warmup_mask(steps)]
    device = kept["compute_s"].fillna(0) + kept["emulated_s"].fillna(0)
    system = kept["comm_s"].fillna(0) + kept["wait_s"].fillna(0) + kept["update_s"].fillna(0)
    return float(device.median()), float(system.median())


def check_suite(res: SuiteResults, measured: MeasuredCosts, goodput_mbit: dict[float, float] | None = None) -> Check:
    """Every run of a suite simulated and compared; `goodput_mbit`: a capped link's measured goodput
    by its cap (run_network)."""
    rows, skipped = [], []
    for _, run in res.runs.iterrows():
        run_id = run["run_id"]
        measured_steps = res.steps[res.steps["run_id"] == run_id]
        try:
            spec = sim_spec(run, res, measured_steps)
            costs = measured.for_run(spec.system, spec.workload, spec.batch_size)
            sync_costs = None
            if spec.system == "switch":
                costs = replace(costs, handover_s=float(run["handover_s"]) if pd.notna(run.get("handover_s")) else costs.handover_s)
                sync_system = "ddp" if spec.sync == "ddp" else "ps"
                sync_costs = measured.for_run(sync_system, spec.workload, spec.batch_size)
        except ConfigError as exc:
            skipped.append((run_id, str(exc)))
            continue
        net, link_mbit = run_network(res.manifests.get(run_id) or {}, goodput_mbit)
        sim = simulate_run(spec, costs, net, sync_costs=sync_costs)
        sim_steps = pd.DataFrame(sim.steps)
        if measured_steps.empty or sim_steps.empty:
            skipped.append((run_id, "no steps"))
            continue
        measured_rate, predicted_rate = steady_rate(measured_steps), steady_rate(sim_steps)
        if spec.system == "switch":  # a two-phase mixture has no typical step: compare the async phase's
            measured_step = float(step_intervals(measured_steps[measured_steps["t_wall"] > spec.switch_at_s]).median())
            predicted_step = float(step_intervals(sim_steps[sim_steps["phase"] == "async"]).median())
        else:
            measured_step = float(step_intervals(measured_steps).median())
            predicted_step = float(step_intervals(sim_steps).median())
        device, system = _parts(measured_steps)
        sim_device, sim_system = float(sim_steps["device_s"].median()), float(sim_steps["system_s"].median())
        misses = {"device (compute + emulated)": abs(sim_device - device), "system (comm + wait + update)": abs(sim_system - system)}
        rows.append({
            "suite": res.suite, "run_id": run_id, "label": run["label"], "workload": run["workload"],
            "workers": int(run["workers"]), "conditions": run["conditions"] if link_mbit is None else
            f"{run['conditions']}, links capped ({link_mbit:.4g} Mbit/s goodput)",
            "calibration_run": int(run["workers"]) == 1,
            "measured_samples_per_s": measured_rate, "predicted_samples_per_s": predicted_rate,
            "samples_per_s_error": (predicted_rate - measured_rate) / measured_rate,
            "measured_step_ms": measured_step * 1e3, "predicted_step_ms": predicted_step * 1e3,
            "step_s_error": (predicted_step - measured_step) / measured_step,
            "measured_device_ms": device * 1e3, "predicted_device_ms": sim_device * 1e3,
            "measured_system_ms": system * 1e3, "predicted_system_ms": sim_system * 1e3,
            "term_that_misses": max(misses, key=misses.get) if all(v == v for v in misses.values()) else "",
        })
    return Check(rows, skipped)


def check_suites(suite_dirs: list[Path], measured: MeasuredCosts, goodput_mbit: dict[float, float] | None = None) -> Check:
    rows, skipped = [], []
    for path in suite_dirs:
        part = check_suite(load_suite(path), measured, goodput_mbit)
        rows += part.rows
        skipped += part.skipped
    if not rows:
        raise ConfigError("simulate: no run of " + ", ".join(map(str, suite_dirs)) + " could be simulated: " +
                          "; ".join(f"{r}: {why}" for r, why in skipped[:3]))
    return Check(rows, skipped)


def by_variant(check: Check) -> pd.DataFrame:
    """The error per system variant, worker count and conditions (median over seeds), for the note and report."""
    df = check.frame()
    if df.empty:
        return df
    # conditions too: runs under other conditions (a capped link, stragglers) are never pooled
    return (df.groupby(["suite", "label", "workload", "workers", "conditions"])
              .agg(runs=("run_id", "size"), measured=("measured_samples_per_s", "median"),
                   predicted=("predicted_samples_per_s", "median"), error=("samples_per_s_error", "median"),
                   step_error=("step_s_error", "median"), misses=("term_that_misses", lambda s: statistics.mode(s)))
              .reset_index())

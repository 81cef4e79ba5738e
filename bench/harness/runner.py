"""Runs RunSpecs through their system adapters; skips runs already complete (by config hash)."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psbench.core.atomic import OLD_PREFIX, STAGING_PREFIX, atomic_write_text, dir_lock, owner_alive
from psbench.core.emulation import parse_device, parse_stragglers, real_share, stall_schedule
from psbench.core.records import DEFAULT_FORMAT, Recorder, RunResult
from psbench.core.spec import RunSpec, budget_kind
from psbench.bench.harness.results import FAILED_DIR
from psbench.systems import get_system, names
from psbench.systems.base import parse_options
from psbench.workloads import get_workload
from psbench.core.errors import ConfigError
from psbench.workloads.sharding import parse_strategy


@dataclass
class PlannedRun:
    spec: RunSpec
    system_cls: type
    options: Any
    conditions: dict[str, Any] = field(default_factory=dict)  # emulation and CPU budget, for the manifest


def plan(spec: RunSpec, allow_oversubscribe: bool = False) -> PlannedRun:
    """Validate everything about a spec before any run starts: names, values, options, availability,
    cluster conditions, and whether the run fits the cores (see cpu_budget)."""
    system_cls = get_system(spec.system)
    workload = get_workload(spec.workload)
    parse_strategy(spec.sharding)
    max_workers = getattr(system_cls, "max_workers", None)
    if max_workers is not None and spec.workers > max_workers:
        raise ConfigError(f"system '{spec.system}' runs at most {max_workers} worker(s), got {spec.workers}")
    if workload.dataset in ("mnist", "cifar10"):
        if not spec.data_dir:
            raise ConfigError(f"workload '{spec.workload}' reads files: give --data-dir")
        if not Path(spec.data_dir).is_dir():
            raise ConfigError(f"data dir {spec.data_dir} does not exist")
    options = parse_options(system_cls.Options, spec.options, spec.system)
    reason = system_cls.unavailable_reason()
    if reason:
        raise ConfigError(f"system '{spec.system}' is not available here: {reason}")
    device, stragglers = parse_device(spec.emulate_device), parse_stragglers(spec.stragglers)
    if stragglers is not None and any(w >= spec.workers for w in stragglers.slow):
        raise ConfigError(f"--stragglers '{spec.stragglers}' slows worker(s) "
                          f"{sorted(w for w in stragglers.slow if w >= spec.workers)}; workers are 0..{spec.workers - 1}")
    if spec.budget is not None:
        kind = budget_kind(spec.budget)
        if kind not in getattr(system_cls, "budgets", ()):
            takers = [n for n in names() if kind in getattr(get_system(n), "budgets", ())]
            raise ConfigError(f"--budget {kind}=... applies to {', '.join(takers)}; '{spec.system}' takes "
                              f"{', '.join(f'{k}=' for k in getattr(system_cls, 'budgets', ())) or 'no --budget'}"
                              f" (else --max-steps or --epochs per worker)")
    if spec.eval_every_s is not None and not getattr(system_cls, "timer_evaluator", False):
        takers = [n for n in names() if getattr(get_system(n), "timer_evaluator", False)]
        raise ConfigError(f"--eval-every-s (the timer evaluator) applies to {', '.join(takers)}; '{spec.system}' "
                          f"evaluates at --evals-per-epoch")
    check = getattr(system_cls, "check_spec", None)
    if check is not None:  # what a system cannot train at all (e.g. no native trainer for a model)
        check(spec, options, workload, device, stragglers)
    conditions = cpu_budget(spec, system_cls, options, device, stragglers, allow_oversubscribe)
    return PlannedRun(spec, system_cls, options, conditions)


_COMPUTE_CACHE: dict[tuple[str, int], tuple[float, int]] = {}


def measured_compute_s(spec: RunSpec) -> tuple[float, int]:
    """Median CPU time of one mini-batch of the spec's workload here (1 thread), measured once per
    (workload, batch): what an emulated device's target is compared with. CPU time, not wall time,
    so a busy machine does not inflate it. Returns (seconds, the model's parameter count)."""
    from psbench.systems.common import configure_threads, forward_backward, prepare

    key = (spec.workload, spec.batch_size or get_workload(spec.workload).batch_size)  # prepare()'s batch size
    if key not in _COMPUTE_CACHE:  # looked up first: preparing loads the data and shards it (~80 ms)
        prep = prepare(RunSpec(spec.system, spec.workload, batch_size=key[1], max_steps=12, epochs=100,
                               data_dir=spec.data_dir))
        configure_threads(1)
        model, loss_fn = prep.build_model(), prep.workload.loss_fn()
        times = []
        for _, x, y in prep.batches(0):
            t = time.thread_time()
            forward_backward(model, loss_fn, x, y)
            times.append(time.thread_time() - t)
        _COMPUTE_CACHE[key] = (statistics.median(times[2:]), sum(p.numel() for p in model.parameters()))
    return _COMPUTE_CACHE[key]


def cpu_budget(spec: RunSpec, system_cls: type, options: Any, device, stragglers,
               allow_oversubscribe: bool) -> dict[str, Any]:
    """The cores a run keeps busy: each worker its share of a step spent computing (1 without an
    emulated device; compute / target with one, the rest is sleep), plus the system's own
    processes (system_cls.extra_cpu: PS shards, a Spark driver). More than this machine's cores is
    refused, or recorded as oversubscribed with allow_oversubscribe."""
    cores = os.cpu_count() or 1
    paced = getattr(system_cls, "paces_steps", True)  # False: a JVM's inner loop, which no pacer can sleep
    if device is None or not paced:
        # compute-bound workers keep a core each and push as fast as they can
        share, steps_per_s, n_params = 1.0, float("inf"), 0
    else:
        batch = spec.batch_size or get_workload(spec.workload).batch_size
        compute_s, n_params = measured_compute_s(spec)
        share = real_share(device, stragglers, spec.workload, batch, compute_s, spec.workers, spec.seed)
        steps_per_s = sum(1.0 / max(compute_s, device.target_s(spec.workload, batch)
                                    * (stragglers.factor(w, spec.workers, spec.seed) if stragglers else 1.0))
                          for w in range(spec.workers))
    extra = float(system_cls.extra_cpu(options, steps_per_s, n_params)) if hasattr(system_cls, "extra_cpu") else 0.0
    # A multi-node run (ddp --nnodes) starts only this node's ranks here.
    local = system_cls.local_workers(options, spec.workers) if hasattr(system_cls, "local_workers") else spec.workers
    workers_demand = local * share
    demand = workers_demand + extra
    conditions = {"emulate_device": device.describe() if device is not None else None,
                  "stragglers": stragglers.text if stragglers is not None else None,
                  "worker_compute_share": round(share, 4), "cpu_demand": round(demand, 3), "cores": cores,
                  "oversubscribed": demand > cores + 1e-9}
    if device is not None and not paced:
        conditions["emulate_device_applied"] = False
    if conditions["oversubscribed"] and not allow_oversubscribe:
        hint = ("an emulated device (--emulate-device step_ms=20) so workers sleep most of each step, "
                if device is None else "a slower emulated device, ")
        raise ConfigError(f"run {spec.run_id} needs about {demand:.1f} cores ({local} workers x "
                          f"{share:.2f} compute share + {extra:.1f} for the system's own processes), this machine "
                          f"has {cores}: use {hint}fewer workers, or --allow-oversubscribe (recorded in the manifest)")
    return conditions


def run_dir(results_dir: Path, suite: str, spec: RunSpec) -> Path:
    return Path(results_dir) / suite / spec.run_id


def is_complete(results_dir: Path, suite: str, spec: RunSpec) -> bool:
    """A run is complete when its manifest exists, parses and carries the same config hash."""
    manifest = run_dir(results_dir, suite, spec) / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("config_hash") == spec.config_hash()
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False  # corrupt: run it again, the new directory replaces the old one whole


def clean_staging(results_dir: Path, suite: str) -> None:
    """Remove staging directories an interrupted earlier run left behind, and put back a complete
    run that was moved aside (`.old-<run>-<pid>`) when the process died before its replacement
    was renamed into place. Under the suite folder's lock, and only what no live process owns:
    another terminal may be writing a run into the same suite right now."""
    suite_dir = Path(results_dir) / suite
    if not suite_dir.is_dir():
        return
    with dir_lock(suite_dir):
        for leftover in suite_dir.glob(f"{STAGING_PREFIX}*"):
            if not owner_alive(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
        # A swap runs whole under the lock, so an `.old-` seen here is a leftover whoever named it.
        for old in suite_dir.glob(f"{OLD_PREFIX}*"):
            name = old.name[len(OLD_PREFIX):].rpartition("-")[0]
            final = suite_dir / name
            if name and not final.exists() and (old / "manifest.json").is_file():
                os.replace(old, final)
            else:
                shutil.rmtree(old, ignore_errors=True)


def record_run(planned: PlannedRun) -> Recorder:
    """Run a planned spec in this process: its records, its conditions and the stalls it met."""
    spec = planned.spec
    recorder = Recorder(spec, target_accuracy=get_workload(spec.workload).target_accuracy)
    recorder.extra["conditions"] = planned.conditions
    if planned.conditions.get("oversubscribed"):
        print(f"psbench: warning: {spec.run_id} oversubscribes the cores (about {planned.conditions['cpu_demand']:.1f}"
              f" for {planned.conditions['cores']}); recorded as oversubscribed", file=sys.stderr)
    planned.system_cls().run(spec, planned.options, recorder)
    for worker, step, ms in stall_schedule(spec.stragglers, spec.seed, [(r["worker"], r["step"]) for r in recorder.steps]):
        t_wall = next(r["t_wall"] for r in recorder.steps if r["worker"] == worker and r["step"] == step)
        recorder.event("stall", step=step, worker=worker, t_wall=t_wall, ms=ms)
    return recorder


def run_one(planned: PlannedRun, results_dir: Path, suite: str, record_format: str = DEFAULT_FORMAT) -> RunResult:
    """Run and record one planned spec. A run that fails writes no run folder; its message and the
    whole traceback chain (a JVM's stack trace too) go to <suite>/failed/<run-id>.log, and the
    error raised names the first cause in one line and that log."""
    try:
        recorder = record_run(planned)
    except RuntimeError as exc:
        log = Path(results_dir) / suite / FAILED_DIR / f"{planned.spec.run_id}.log"
        atomic_write_text(log, "".join(traceback.format_exception(exc)))
        first = next((line for line in str(exc).strip().splitlines() if line.strip()), type(exc).__name__)
        raise RuntimeError(f"{first} (log: {log})") from exc
    return recorder.finish(results_dir, suite, record_format)


def run_all(specs: list[RunSpec], results_dir: Path, suite: str, resume: bool = True,
            progress: bool = True, skip_unavailable: bool = False,
            allow_oversubscribe: bool = False, record_format: str = DEFAULT_FORMAT) -> list[RunResult | None]:
    """Validate all, then run each spec not already complete; returns results (None = skipped).
    Record tables are written as `record_format` (parquet or csv)."""
    planned: list[PlannedRun | None] = []
    for spec in specs:
        try:
            planned.append(plan(spec, allow_oversubscribe))
        except ConfigError as exc:
            if skip_unavailable and "is not available here" in str(exc):
                print(f"psbench: skipping {spec.run_id}: {exc}", file=sys.stderr)
                planned.append(None)
            else:
                raise
    clean_staging(results_dir, suite)
    todo = [p for p in planned if p is not None and not (resume and is_complete(results_dir, suite, p.spec))]
    skipped = sum(1 for p in planned if p is not None) - len(todo)
    if skipped:
        print(f"psbench: {skipped} run(s) of suite '{suite}' already complete, skipping (resume)", file=sys.stderr)
    results: list[RunResult | None] = []
    bar = _progress(len(todo), suite) if progress else None
    for p in todo:
        if bar is not None:
            bar.set_postfix_str(p.spec.run_id, refresh=True)
        results.append(run_one(p, results_dir, suite, record_format))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return results


def _progress(total: int, suite: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"suite {suite}", unit="run", file=sys.stderr, dynamic_ncols=True)


def run_summary(spec: RunSpec, allow_oversubscribe: bool = False) -> dict:
    """Run a spec through the harness in this process (planned, recorded, nothing written); its summary."""
    return record_run(plan(spec, allow_oversubscribe)).summary()

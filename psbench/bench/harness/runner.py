"""Runs RunSpecs through their system adapters; skips runs already complete (by config hash)."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from psbench.bench.harness.calibration import (CALIBRATION_WORKERS, Measured, RoleFigure, SystemCalibration,
                                                load, load_or_calibrate)
from psbench.core.accelerator import AUTO, CPU, CUDA, resolve
from psbench.core.cpu import (LAUNCHER, WORKERS, Proc, TreeSampler, active_spans, classifier, measured_cores,
                              usable_cores)
from psbench.core.emulation import parse_device, parse_stragglers, stall_schedule
from psbench.core.atomic import OLD_PREFIX, STAGING_PREFIX, DiskFull, atomic_write_text, dir_lock, owner_alive
from psbench.core.records import DEFAULT_FORMAT, Recorder, RunResult
from psbench.core.spec import RunSpec, budget_kind
from psbench.bench.harness import store
from psbench.bench.harness.results import FAILED_DIR
from psbench.systems import get_system, names
from psbench.systems.base import System, parse_options
from psbench.workloads import Workload, get_workload
from psbench.workloads.datasets import Dataset, data_fingerprint
from psbench.core.errors import ConfigError
from psbench.workloads.sharding import parse_strategy


@dataclass
class PlannedRun:
    spec: RunSpec
    system_cls: type[System]
    options: Any
    conditions: dict[str, Any] = field(default_factory=dict)  # emulation and CPU budget, for the manifest
    processes: list[Proc] = field(default_factory=list)        # what the run starts here, by role
    self_role: str = LAUNCHER                                  # the role of this process in the run


# How a plan gets a system's CPU figures: cached or measured (the default), or given (tests), or
# none (the calibration runs themselves).
Calibrator = Callable[[RunSpec, type[System]], SystemCalibration | None]


def plan(spec: RunSpec, allow_oversubscribe: bool = False, calibrator: Calibrator | None = None) -> PlannedRun:
    """Validate everything about a spec before any run starts: names, values, options, availability,
    cluster conditions, and whether the run fits the cores (see cpu_budget). The planned spec
    carries the resolved device (cpu or cuda), never auto."""
    system_cls = get_system(spec.system)
    requested = spec.device
    spec = replace(spec, device=planned_device(spec, system_cls, parse_device(spec.emulate_device) is not None))
    workload = get_workload(spec.workload)
    if workload.is_user:  # the user's factory and loader: their errors are one line here, not a run's failure
        workload.check(spec.seed, spec.data_dir)
    parse_strategy(spec.sharding)
    max_workers = system_cls.max_workers
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
        if kind not in system_cls.budgets:
            takers = [n for n in names() if kind in get_system(n).budgets]
            raise ConfigError(f"--budget {kind}=... applies to {', '.join(takers)}; '{spec.system}' takes "
                              f"{', '.join(f'{k}=' for k in system_cls.budgets) or 'no --budget'}"
                              f" (else --max-steps or --epochs per worker)")
    if spec.eval_every_s is not None and not system_cls.timer_evaluator:
        takers = [n for n in names() if get_system(n).timer_evaluator]
        raise ConfigError(f"--eval-every-s (the timer evaluator) applies to {', '.join(takers)}; '{spec.system}' "
                          f"evaluates at --evals-per-epoch")
    system_cls.check_spec(spec, options, workload, device, stragglers)  # e.g. no native trainer for a model
    processes, self_role = declared_processes(system_cls, options, spec.workers)
    calibration = (calibrator or calibrated)(spec, system_cls)
    conditions = cpu_budget(spec, system_cls, processes, device, stragglers, allow_oversubscribe, calibration)
    if requested != spec.device:
        conditions["device_requested"] = requested
    if spec.device == CUDA:
        import torch

        conditions["device_name"] = torch.cuda.get_device_name(0)
    return PlannedRun(spec, system_cls, options, conditions, processes, self_role)


def planned_device(spec: RunSpec, system_cls: type[System], emulated: bool) -> str:
    """The device a run trains on: its --device resolved (core/accelerator.py) among those its
    system runs on (`System.devices`); `auto` takes cuda only where the system has it and no device
    is emulated. An emulated device with --device cuda is refused: the emulation stands in for an
    accelerator on CPU workers, and a real GPU's step under its floor would measure neither."""
    if spec.device == CUDA and CUDA not in system_cls.devices:
        raise ConfigError(f"--device cuda: system '{spec.system}' runs on cpu only ({system_cls.no_cuda_reason}); "
                          f"allowed: --device {CPU} or {AUTO}")
    if spec.device == CUDA and emulated:
        raise ConfigError("--emulate-device with --device cuda: refused, the emulated device stands in for an "
                          "accelerator on CPU workers; give one or the other (--device auto with it trains on cpu)")
    if CUDA not in system_cls.devices or emulated:
        return CPU
    return resolve(spec.device)


_COMPUTE_CACHE: dict[tuple[str, int], tuple[float, int]] = {}
# The last workload's data, kept while a planning pass is open (None: not in one, nothing kept).
_PLANNING_DATA: dict[tuple[str, str | None], Dataset] | None = None


@contextmanager
def planning_pass() -> Iterator[None]:
    """Plan many specs: a workload's data is loaded once for all their batch sizes (kassela's 1 % ..
    0.01 % of a million rows), and let go at the end, so a launcher does not hold 10 M rows while
    its runs train."""
    global _PLANNING_DATA
    _PLANNING_DATA = {}
    try:
        yield
    finally:
        _PLANNING_DATA = None


def _data_to_measure(spec: RunSpec, workload: Workload) -> Dataset:
    if _PLANNING_DATA is None:
        return workload.load_data(data_dir=spec.data_dir)
    key = (spec.workload, None if spec.data_dir is None else str(spec.data_dir))
    if key not in _PLANNING_DATA:
        _PLANNING_DATA.clear()  # one workload's data at a time
        _PLANNING_DATA[key] = workload.load_data(data_dir=spec.data_dir)
    return _PLANNING_DATA[key]


MEASURE_ENOUGH_S = 0.5  # timed compute after which a long batch's measurement stops (at five batches or more)


def measured_compute_s(spec: RunSpec) -> tuple[float, int]:
    """Median CPU time of one mini-batch of the spec's workload here (1 thread), measured once per
    (workload, batch): what an emulated device's target is compared with. CPU time, not wall time,
    so a busy machine does not inflate it. Returns (seconds, the model's parameter count)."""
    import numpy as np
    import torch

    from psbench.systems.common import configure_threads, forward_backward

    workload = get_workload(spec.workload)
    key = (spec.workload, spec.batch_size or workload.batch_size)
    if key not in _COMPUTE_CACHE:  # looked up first: loading the data takes up to seconds (higgs-10m)
        data, batch = _data_to_measure(spec, workload), key[1]
        configure_threads(1)
        model, loss_fn = workload.build_model(data, spec.seed), workload.loss_fn()
        # A contiguous run of rows at a random offset, as a worker's step reads a slice of its epoch's
        # rows (Prepared.batches): a view, so neither a shuffle of 10M rows nor a gather is paid here.
        rng, n = np.random.default_rng(spec.seed), len(data.y_train)
        rows = min(batch, n)
        times: list[float] = []
        # Two warm-ups, then up to ten timed batches; a batch whose compute is long (a million rows:
        # ~0.3 s) stops at five timed ones once they hold MEASURE_ENOUGH_S: its median is steady by then,
        # and a suite's planning (make test's shipped-experiments check) paid seconds a batch size.
        while len(times) < 12 and not (len(times) >= 7 and sum(times[2:]) >= MEASURE_ENOUGH_S):
            start = int(rng.integers(0, n - rows + 1))
            x = torch.from_numpy(data.x_train[start:start + rows])
            y = torch.from_numpy(data.y_train[start:start + rows])
            t = time.thread_time()
            forward_backward(model, loss_fn, x, y)
            times.append(time.thread_time() - t)
        _COMPUTE_CACHE[key] = (statistics.median(times[2:]), sum(p.numel() for p in model.parameters()))
    return _COMPUTE_CACHE[key]


def declared_processes(system_cls: type[System], options: Any, workers: int) -> tuple[list[Proc], str]:
    """The processes a run of the system starts on this machine, by role (system_cls.cpu_processes;
    by default only its workers), this launcher among them unless it is itself the worker; and the
    role of this process. A multi-node run (ddp --nnodes, a Spark cluster) counts its local workers."""
    processes = system_cls.cpu_processes(options, system_cls.local_workers(options, workers))
    self_role = system_cls.cpu_self_role
    if self_role == LAUNCHER:
        processes = [*processes, Proc(LAUNCHER, 1)]
    return processes, self_role


CALIBRATION_WORKLOAD = "mlp-digits"  # a system's figures are measured once, on this workload


def calibrated(spec: RunSpec, system_cls: type[System]) -> SystemCalibration | None:
    """The system's CPU figures, measured here once (calibration.py) on its calibration workload
    (mlp-digits, or the system's `calibration_workload`): per process and per step, they carry to
    other workloads, whose own gradient CPU the plan measures apart (measured_compute_s). Once per
    system, not per workload: a fresh machine pays a dozen short calibrations, not one per pair."""
    workers = min(CALIBRATION_WORKERS, system_cls.max_workers or CALIBRATION_WORKERS)
    base = RunSpec(spec.system, calibration_workload(system_cls), workers=workers)
    if not system_cls.calibrates_here():
        return load(base.system, base.workload)
    return load_or_calibrate(base, lambda: measured_compute_s(base)[0], system_cls.paces_steps,
                             system_cls.calibration_min_step_s, _measure)


def calibration_workload(system_cls: type[System]) -> str:
    """The workload a system's CPU figures are measured on: its own, or mlp-digits."""
    return system_cls.calibration_workload or CALIBRATION_WORKLOAD


def _measure(spec: RunSpec) -> Measured:
    """One calibration run, through the harness (nothing written): its steps, span and measured cores."""
    planned = plan(spec, allow_oversubscribe=True, calibrator=lambda _spec, _cls: None)
    recorder = record_run(planned, quiet=True)
    conditions = recorder.extra["conditions"]
    counts: dict[str, int] = {}
    for proc in planned.processes:
        counts[proc.role] = counts.get(proc.role, 0) + proc.count
    return Measured(device_step_s(spec), len(recorder.steps), conditions.get("cpu_span_s", 0.0),
                    conditions.get("cpu_measured_roles", {}), counts)


def device_step_s(spec: RunSpec) -> float | None:
    device = parse_device(spec.emulate_device)
    return None if device is None else device.target_s(spec.workload, spec.batch_size or
                                                        get_workload(spec.workload).batch_size)


# A process's figure is measured to about 0.01 core (CPU times in 10 ms ticks over seconds), so a plan
# is compared with the cores at that precision.
PLAN_DECIMALS = 2


def cpu_budget(spec: RunSpec, system_cls: type[System], processes: list[Proc], device, stragglers,
               allow_oversubscribe: bool, calibration: SystemCalibration | None) -> dict[str, Any]:
    """The cores a run keeps busy, by role: each worker its share of a step spent computing (1
    without an emulated device; with one, compute / its step: the device's target plus what the
    system adds to a step, measured) plus its measured overhead per step, and each of the system's
    own processes its measured cost at the run's step rate (calibration.py), a process at most its
    cores. More than the usable cores
    (psbench.core.cpu) is refused, or recorded as oversubscribed with allow_oversubscribe."""
    cores = usable_cores()
    paced = system_cls.paces_steps  # False: a JVM's inner loop, which no pacer can sleep
    figure = calibration.figure if calibration is not None else (lambda role: RoleFigure())
    per_worker = figure(WORKERS)
    latency = calibration.step_latency_s if calibration is not None else 0.0
    batch = spec.batch_size or get_workload(spec.workload).batch_size
    compute_s = measured_compute_s(spec)[0] if paced else 0.0  # unpaced: workers busy, its roles' cost fixed
    shares, worker_cores, rates = [], [], []
    for w in range(spec.workers):
        if device is not None and paced:
            factor = stragglers.factor(w, spec.workers, spec.seed) if stragglers else 1.0
            step_s = max(compute_s, device.target_s(spec.workload, batch) * factor) + latency
            share = compute_s / step_s if step_s > 0 else 1.0
        else:  # compute-bound workers keep a core each and push as fast as they can
            step_s, share = compute_s + latency, 1.0
        rate = 1.0 / step_s if paced and step_s > 0 else 0.0
        shares.append(share)
        rates.append(rate)
        worker_cores.append(min(1.0, share + per_worker.cores(rate)))
    steps_per_s = sum(rates)  # every worker's steps: what a shard, a driver or a daemon handles
    breakdown: dict[str, dict[str, float]] = {}
    for proc in processes:
        if proc.count <= 0:
            continue
        if proc.role == WORKERS:  # the local ones of a multi-node run: the mean worker's figure
            total = proc.count * sum(worker_cores) / len(worker_cores)
        else:
            total = min(proc.cap, proc.count * figure(proc.role).cores(steps_per_s))
        breakdown[proc.role] = {"count": proc.count, "cores": round(total, 4)}
    demand = sum(b["cores"] for b in breakdown.values())
    conditions = {"emulate_device": device.describe() if device is not None else None,
                  "stragglers": stragglers.text if stragglers is not None else None,
                  "worker_compute_share": round(sum(shares) / len(shares), 4), "cpu_demand": round(demand, 3),
                  **cores.describe(), "cpu_plan": breakdown,
                  "cpu_calibration": calibration.describe() if calibration is not None else None,
                  "oversubscribed": round(demand, PLAN_DECIMALS) > cores.count}
    if device is not None and not paced:
        conditions["emulate_device_applied"] = False
    if conditions["oversubscribed"] and not allow_oversubscribe:
        hint = ("an emulated device (--emulate-device step_ms=20) so workers sleep most of each step, "
                if device is None else "a slower emulated device, ")
        raise ConfigError(f"run {spec.run_id} needs about {demand:.1f} cores ({plan_text(breakdown)}), this machine "
                          f"has {cores.count:g} ({cores.source}): use {hint}fewer workers, or --allow-oversubscribe "
                          "(recorded in the manifest)")
    return conditions


def plan_text(breakdown: dict[str, dict[str, float]]) -> str:
    """'2 workers x 1.00 + 1 ps shard x 0.31 + 1 launcher x 0.02': a plan's cores per process."""
    return " + ".join(f"{b['count']} {role} x {b['cores'] / b['count']:.2f}" for role, b in breakdown.items())


def run_dir(results_dir: Path, suite: str, spec: RunSpec) -> Path:
    return Path(results_dir) / suite / spec.run_id


def is_complete(results_dir: Path, suite: str, spec: RunSpec, packed: dict[str, str | None] | None = None) -> bool:
    """A run is complete when its manifest exists, parses and carries the same config hash, in its
    folder or among the suite's packed runs (`packed`: store.packed_hashes, read once a suite)."""
    if packed is None:
        packed = store.packed_hashes(Path(results_dir) / suite)
    if spec.run_id in packed:
        return packed[spec.run_id] == spec.config_hash()
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


class SampledRecorder(Recorder):
    """A Recorder that samples the run's process tree at the edges of its training clock (start,
    stop, each pause), so the CPU over the training span is read at its ends rather than
    interpolated across them, and that keeps each pause's interval (evaluation, and the teardown
    a system does off the clock, are left out of cpu_measured)."""

    def __init__(self, spec: RunSpec, target_accuracy: float | None, sampler: TreeSampler):
        super().__init__(spec, target_accuracy)
        self.sampler = sampler
        self.pauses: list[tuple[float, float]] = []

    def start_clock(self) -> None:
        self.sampler.sample()
        super().start_clock()

    def stop_clock(self) -> None:
        super().stop_clock()
        self.sampler.sample()

    @contextmanager
    def paused(self) -> Iterator[None]:
        # the samples (a scan of the tree, a few ms) are taken inside the pause: off the clock
        with super().paused():
            self.sampler.sample()
            start = time.time()
            try:
                yield
            finally:
                self.pauses.append((start, time.time()))
                self.sampler.sample()


def record_run(planned: PlannedRun, quiet: bool = False) -> Recorder:
    """Run a planned spec in this process: its records, its conditions, the CPU its process tree
    used over the training span (cpu_measured, in cores) and the stalls it met."""
    spec = planned.spec
    sampler = TreeSampler(classifier(planned.processes), planned.self_role)
    recorder = SampledRecorder(spec, get_workload(spec.workload).target_accuracy, sampler)
    conditions = recorder.extra["conditions"] = dict(planned.conditions)
    if conditions.get("oversubscribed") and not quiet:
        print(f"psbench: warning: {spec.run_id} needs about {conditions['cpu_demand']:.1f} cores "
              f"({plan_text(conditions.get('cpu_plan', {}))}), this machine has {conditions['cores']:g}: its timings "
              "will measure contention; recorded as oversubscribed", file=sys.stderr)
    with sampler:
        planned.system_cls().run(spec, planned.options, recorder)
    if recorder.t0 is not None:  # the training span: set-up, and pauses this process timed, left out
        spans = active_spans(recorder.t0, recorder.t_end or time.time(), recorder.pauses)
        span_s = sum(t1 - t0 for t0, t1 in spans)
        measured = measured_cores(sampler.cpu_between(spans), span_s)
        if measured:
            conditions["cpu_measured"] = measured.pop("total")
            conditions["cpu_measured_roles"] = measured
            conditions["cpu_span_s"] = round(span_s, 4)
    recorder.extra["data"] = data_provenance(spec, recorder.shard_report)
    workload = get_workload(spec.workload)
    if workload.is_user:  # where its model and data came from, and its default batch (no registry holds it)
        recorder.extra["workload_source"] = {**(workload.provenance() or {}), "batch_size": workload.batch_size}
    for worker, step, ms in stall_schedule(spec.stragglers, spec.seed, [(r["worker"], r["step"]) for r in recorder.steps]):
        t_wall = next(r["t_wall"] for r in recorder.steps if r["worker"] == worker and r["step"] == step)
        recorder.event("stall", step=step, worker=worker, t_wall=t_wall, ms=ms)
    return recorder


def data_provenance(spec: RunSpec, shard_report: dict[str, Any] | None) -> dict[str, Any]:
    """What a run trained on: its dataset's fingerprint (kept beside the cache, or of the arrays)
    and its shard plan's, from the shard report the run wrote."""
    workload = get_workload(spec.workload)
    return {"dataset": workload.dataset, "fingerprint": data_fingerprint(workload.load_data(data_dir=spec.data_dir)),
            "shard_plan": (shard_report or {}).get("fingerprint")}


def run_one(planned: PlannedRun, results_dir: Path, suite: str, record_format: str = DEFAULT_FORMAT) -> RunResult:
    """Run and record one planned spec. A run that fails writes no run folder; its message and the
    whole traceback chain (a JVM's stack trace too) go to <suite>/failed/<run-id>.log, and the
    error raised names the first cause in one line and that log."""
    try:
        recorder = record_run(planned)
    except RuntimeError as exc:
        raise failure_kept(exc, results_dir, suite, planned.spec.run_id) from exc
    return recorder.finish(results_dir, suite, record_format)


def failure_kept(exc: BaseException, results_dir: Path, suite: str, run_id: str) -> RuntimeError:
    """A failed run's message and whole traceback chain kept in <suite>/failed/<run-id>.log; the
    error to raise: the message's first line (its first cause) and that log."""
    first = next((line for line in str(exc).strip().splitlines() if line.strip()), type(exc).__name__)
    log = Path(results_dir) / suite / FAILED_DIR / f"{run_id}.log"
    try:
        atomic_write_text(log, "".join(traceback.format_exception(exc)))
    except (DiskFull, OSError) as not_kept:   # the cause still goes out, in one line
        return RuntimeError(f"{first} (its log could not be kept: {getattr(not_kept, 'reason', None) or not_kept})")
    return RuntimeError(f"{first} (log: {log})")


def run_all(specs: list[RunSpec], results_dir: Path, suite: str, resume: bool = True,
            progress: bool = True, skip_unavailable: bool = False,
            allow_oversubscribe: bool = False, record_format: str = DEFAULT_FORMAT,
            dry_run: bool = False) -> list[RunResult | None]:
    """Validate all, then run each spec not already complete; returns results (None = skipped).
    Record tables are written as `record_format` (parquet or csv). `dry_run`: print each run's plan
    (its cores, done or to run) and run nothing."""
    planned: list[PlannedRun | None] = []
    with planning_pass():
        for spec in specs:
            try:
                planned.append(plan(spec, allow_oversubscribe))
            except ConfigError as exc:
                if skip_unavailable and "is not available here" in str(exc):
                    print(f"psbench: skipping {spec.run_id}: {exc}", file=sys.stderr)
                    planned.append(None)
                else:
                    raise
    if dry_run:
        for line in plan_lines(planned, results_dir, suite):
            print(line)
        return []
    clean_staging(results_dir, suite)
    packed = store.packed_hashes(Path(results_dir) / suite)
    todo = [p for p in planned if p is not None and not (resume and is_complete(results_dir, suite, p.spec, packed))]
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


def plan_lines(planned: list[PlannedRun | None], results_dir: Path, suite: str) -> list[str]:
    """One line a run: its id, whether it is done (resume) or to run, its cores' plan."""
    lines, todo = [], 0
    packed = store.packed_hashes(Path(results_dir) / suite)
    for p in planned:
        if p is None:
            continue
        done = is_complete(results_dir, suite, p.spec, packed)
        todo += not done
        c = p.conditions
        crowded = ", oversubscribed" if c.get("oversubscribed") else ""
        lines.append(f"{p.spec.run_id}  {'done' if done else 'to run'}  "
                     f"{c.get('cpu_demand', float('nan')):.2f} of {c.get('cores', '?')} cores{crowded}: "
                     f"{plan_text(c.get('cpu_plan') or {})}")
    lines.append(f"{todo} of {len(lines)} run(s) of suite '{suite}' to run in {Path(results_dir) / suite} "
                 "(a dry run: nothing ran)")
    return lines


def _progress(total: int, suite: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"suite {suite}", unit="run", file=sys.stderr, dynamic_ncols=True)


def run_summary(spec: RunSpec, allow_oversubscribe: bool = False) -> dict:
    """Run a spec through the harness in this process (planned, recorded, nothing written); its summary."""
    return record_run(plan(spec, allow_oversubscribe)).summary()

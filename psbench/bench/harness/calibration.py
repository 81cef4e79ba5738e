"""CPU figures of a system's processes, measured on this machine by a few short runs and cached.

A system declares its processes (`cpu_processes`: workers, PS shards, Ray's daemons, RPC shards, a
Spark driver, and this launcher); what each costs is measured, not assumed. The system runs with 2
workers on an emulated device, with the harness's process-tree sampler on (psbench.core.cpu): a
probe of a few steps at a fast target tells how long the system's own step takes, then a fast run
and a slower one (5x the target, or the system's own step as the target where that is longer) last
about SPAN_S each. Per role, the cores a process kept busy are fitted as

    cores = fixed_cores + step_cpu_s x steps/s

(workers: their own steps/s, and the gradient's CPU, measured apart, taken out; any other role:
the steps/s of all workers together, since a shard or a driver handles every worker's step). A
system whose steps no emulated device can pace (Spark's JVM trainers) runs once, its roles' cost
all fixed. The figures are measured once per system (on its calibration workload) and cached in
cache_dir()/cpu/ (or $PSBENCH_CPU_FIGURES); delete a file to measure again.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from psbench.core.atomic import atomic_write_json
from psbench.core.cpu import WORKERS
from psbench.core.spec import RunSpec
from psbench.workloads.datasets import cache_dir

CALIBRATION_VERSION = 1
CALIBRATION_WORKERS = 2
SPAN_S = 2.0               # training seconds a calibration run aims at: its start-up a small part of it
PROBE_STEPS = 20           # per worker; a probe that lasted SPAN_S / 2 serves as the fast run
STEPS = (10, 500)          # per worker, whatever the step time
FAST_STEP_S = 0.004        # the fast run's device target, unless the gradient itself takes longer
COMPUTE_HEADROOM = 3.0     # ... then 3x the gradient, so the device sleeps and paces the step
SLOW_FACTOR = 5.0          # the slow run's target, x the fast one's


@dataclass(frozen=True)
class RoleFigure:
    """What one process of a role keeps busy."""
    fixed_cores: float = 0.0   # whatever the step rate (daemons' polling, a JVM's threads)
    step_cpu_s: float = 0.0    # CPU seconds per step (workers: per own step, beyond the gradient)

    def cores(self, steps_per_s: float) -> float:
        return self.fixed_cores + self.step_cpu_s * steps_per_s


@dataclass(frozen=True)
class Measured:
    """One calibration run: its step target, steps (all workers), training span, the cores each
    role kept busy over it, and how many processes each role had."""
    step_s: float | None
    steps: int
    span_s: float
    cores: dict[str, float]
    counts: dict[str, int]


@dataclass(frozen=True)
class SystemCalibration:
    system: str
    workload: str
    compute_s: float                      # the gradient's CPU per step at the workload's batch
    figures: dict[str, RoleFigure]
    step_latency_s: float = 0.0           # a worker's step beyond its device target (moving, waiting, a job)
    runs: list[dict[str, Any]] = field(default_factory=list)
    measured_at: str = ""
    git_sha: str | None = None
    cores: dict[str, Any] = field(default_factory=dict)
    file: str = ""

    def figure(self, role: str) -> RoleFigure:
        return self.figures.get(role, RoleFigure())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "version": CALIBRATION_VERSION}

    @classmethod
    def from_dict(cls, raw: dict[str, Any], file: str = "") -> "SystemCalibration":
        figures = {role: RoleFigure(**f) for role, f in raw["figures"].items()}
        return cls(raw["system"], raw["workload"], float(raw["compute_s"]), figures,
                   float(raw.get("step_latency_s", 0.0)), list(raw.get("runs", [])), raw.get("measured_at", ""),
                   raw.get("git_sha"), dict(raw.get("cores", {})), file)

    def describe(self) -> dict[str, Any]:
        """For a run's manifest: where the figures came from, and the figures."""
        return {"file": self.file, "root": _figures_root()[1] if self.file else None, "measured_at": self.measured_at, "git_sha": self.git_sha,
                "compute_s": self.compute_s, "step_latency_s": self.step_latency_s,
                "figures": {r: asdict(f) for r, f in self.figures.items()}, "runs": self.runs}


FIGURES_ENV = "PSBENCH_CPU_FIGURES"  # a folder of figures to use instead of cache_dir()/cpu (the tests')
CACHE_ENV = "PSBENCH_CACHE"          # workloads.datasets.cache_dir's root
FIGURES_FOLDER = "cpu"               # under the cache root


def calibration_file(system: str, workload: str) -> Path:
    import os

    folder = Path(os.environ[FIGURES_ENV]) if os.environ.get(FIGURES_ENV) else cache_dir() / FIGURES_FOLDER
    return folder / f"{system}-{workload}-v{CALIBRATION_VERSION}.json"


def recorded_name(system: str, workload: str) -> str:
    """The figures' file as a run's manifest names it: relative to its root, never this machine's
    absolute path ('cpu/ps-mlp-digits-v1.json' under the cache root, or the bare name in the folder
    $PSBENCH_CPU_FIGURES names). Which root it is stays in the manifest's `root` (`describe`)."""
    return calibration_file(system, workload).relative_to(_figures_root()[0]).as_posix()


def _figures_root() -> tuple[Path, str]:
    """The folder recorded names are relative to, and how a manifest names it."""
    import os

    if os.environ.get(FIGURES_ENV):
        return Path(os.environ[FIGURES_ENV]), f"${FIGURES_ENV}"
    return cache_dir(), f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) else "~/.cache/psbench"


def recorded_file(described: dict[str, Any]) -> Path:
    """The file a manifest's cpu_calibration names, on this machine: an absolute path as older
    manifests wrote it, or a name relative to its root (resolved here, whatever machine wrote it)."""
    name = Path(str(described.get("file", "")))
    return name if name.is_absolute() else _figures_root()[0] / name


def load(system: str, workload: str) -> SystemCalibration | None:
    import json

    file = calibration_file(system, workload)
    try:
        raw = json.loads(file.read_text())
        if raw.get("version") != CALIBRATION_VERSION:
            return None
        return SystemCalibration.from_dict(raw, recorded_name(system, workload))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: measure again


def calibration_spec(base: RunSpec, target_s: float | None, steps: int) -> RunSpec:
    """A calibration run of `base`'s system and workload: `steps` per worker on a device of target_s."""
    return RunSpec(base.system, base.workload, workers=base.workers, max_steps=steps, epochs=10_000,
                   evals_per_epoch=1, data_dir=base.data_dir,
                   emulate_device=None if target_s is None else f"step_ms={target_s * 1e3:.3f}")


def worker_step_s(run: Measured) -> float:
    """How long a worker's step took in a run (its steps are all workers')."""
    return run.span_s * max(1, run.counts.get(WORKERS, 1)) / run.steps if run.steps else 0.0


def calibration_runs(base: RunSpec, compute_s: float, paced: bool, min_step_s: float,
                     measure: Callable[[RunSpec], Measured]) -> list[Measured]:
    """The short runs that measure a system (one if no device paces its steps): a probe at a fast
    target, then runs of about SPAN_S at a fast and a slow rate, their lengths from the probe's step
    time, so a system whose own step is slow (a Spark job, a barrier) is not run for minutes.
    `min_step_s`: the least step the system ever takes, a floor for the fast target."""
    if not paced:
        return [measure(calibration_spec(base, None, PROBE_STEPS))]
    fast = max(FAST_STEP_S, COMPUTE_HEADROOM * compute_s, min_step_s)
    probe = measure(calibration_spec(base, fast, PROBE_STEPS))
    own = worker_step_s(probe)

    def steps(step_s: float) -> int:
        return int(min(STEPS[1], max(STEPS[0], round(SPAN_S / max(step_s, 1e-6)))))

    runs = [probe if own * PROBE_STEPS >= SPAN_S / 2 else measure(calibration_spec(base, fast, steps(own)))]
    slow = max(SLOW_FACTOR * fast, own)  # the device paces the steps, or the system does (then half the rate)
    return runs + [measure(calibration_spec(base, slow, steps(slow + max(0.0, own - fast))))]


def fit(points: list[tuple[float, float]]) -> RoleFigure:
    """fixed + per-step cost through (steps/s, cores) points; neither is negative (a noisy pair
    of runs falls back to a line through the origin, or to a flat mean)."""
    points = [(r, max(0.0, c)) for r, c in points]
    if len(points) < 2 or math.isclose(points[0][0], points[1][0]):
        return RoleFigure(fixed_cores=sum(c for _, c in points) / max(1, len(points)))
    (r1, c1), (r2, c2) = points[:2]
    slope = (c2 - c1) / (r2 - r1)
    if slope < 0:
        return RoleFigure(fixed_cores=(c1 + c2) / 2)
    fixed = c1 - slope * r1
    if fixed < 0:
        return RoleFigure(step_cpu_s=(c1 * r1 + c2 * r2) / (r1 * r1 + r2 * r2))
    return RoleFigure(fixed, slope)


def figures_from(runs: list[Measured], compute_s: float) -> dict[str, RoleFigure]:
    """Each role's figure from the runs: per process, workers net of their gradients' CPU."""
    roles = sorted({role for run in runs for role, n in run.counts.items() if n > 0})
    out = {}
    for role in roles:
        points = []
        for run in runs:
            n, span = run.counts.get(role, 0), run.span_s
            if n <= 0 or span <= 0:
                continue
            cores = run.cores.get(role, 0.0)
            if role == WORKERS:
                rate = run.steps / span / n
                points.append((rate, cores / n - compute_s * rate))
            else:
                points.append((run.steps / span, cores / n))
        out[role] = fit(points)
    return out


def step_latency(runs: list[Measured]) -> float:
    """How much longer than its device target a worker's step took in the fastest paced run: what a
    step adds to the target (moving gradients, waiting, a Spark job), so a plan's step rate is the
    rate the system reaches, not the device's."""
    paced = [r for r in runs if r.step_s and r.steps and r.counts.get(WORKERS)]
    if not paced:
        return 0.0
    fast = min(paced, key=lambda r: r.step_s)
    return max(0.0, worker_step_s(fast) - fast.step_s)


def calibrate(base: RunSpec, compute_s: float, paced: bool, min_step_s: float,
              measure: Callable[[RunSpec], Measured]) -> SystemCalibration:
    from psbench.core.cpu import usable_cores
    from psbench.core.records import git_sha

    runs = calibration_runs(base, compute_s, paced, min_step_s, measure)
    return SystemCalibration(base.system, base.workload, compute_s, figures_from(runs, compute_s), step_latency(runs),
                             [asdict(r) for r in runs], time.strftime("%Y-%m-%dT%H:%M:%S%z"), git_sha(),
                             usable_cores().describe())


def load_or_calibrate(base: RunSpec, compute_s: Callable[[], float], paced: bool, min_step_s: float,
                      measure: Callable[[RunSpec], Measured]) -> SystemCalibration:
    """The cached figures of (base.system, base.workload), measured first if there are none
    (`compute_s`: the gradient's CPU a step, measured only then: it loads the data)."""
    cached = load(base.system, base.workload)
    if cached is not None:
        return cached
    file = calibration_file(base.system, base.workload)
    print(f"psbench: measuring the CPU use of {base.system}'s processes on {base.workload} (a few short runs, "
          f"once; cached in {file})", file=sys.stderr)
    calibration = calibrate(base, compute_s(), paced, min_step_s, measure)
    atomic_write_json(file, calibration.to_dict())
    return SystemCalibration.from_dict(calibration.to_dict(), recorded_name(base.system, base.workload))

"""CPU figures for the tests' plans: what bench/harness/calibration.py measured on the 2-core reference
machine, so a test plans (and a test's subprocesses plan) without calibrating first. The session
writes them as calibration files into a folder named by PSBENCH_CPU_FIGURES (conftest.py); the
tests of the calibration itself point it at an empty folder."""
from __future__ import annotations

import json
from pathlib import Path

from psbench.bench.harness.calibration import CALIBRATION_VERSION, RoleFigure, SystemCalibration
from psbench.core.cpu import LAUNCHER, WORKERS
from psbench.core.spec import RunSpec

# Figures calibration.py measured on the 2-core reference machine (shared, loaded), per system on
# the workload its experiments use most: (a step beyond its device target, {role: (fixed cores,
# CPU seconds per step)}).
SHIPPED_FIGURES: dict[str, tuple[float, dict[str, tuple[float, float]]]] = {
    "single": (0.0, {WORKERS: (0.015, 5.1e-4)}),
    "ps": (0.0013, {WORKERS: (0.038, 3.2e-4), "ps shard": (0.019, 1.5e-4), LAUNCHER: (0.021, 7e-5)}),
    "switch": (0.0043, {WORKERS: (0.049, 9.1e-4), "ps shard": (0.0, 7.1e-4), LAUNCHER: (0.0, 6.5e-4)}),
    "ddp": (0.0057, {WORKERS: (0.018, 1.2e-3), LAUNCHER: (0.0016, 0.0)}),
    "horovod": (0.0027, {WORKERS: (0.134, 9.2e-4), "horovodrun": (0.0, 8.7e-4), LAUNCHER: (0.0008, 0.0)}),
    "ray-ps": (0.0059, {WORKERS: (0.025, 1.1e-3), "ray shard": (0.017, 9.9e-4), "ray daemons": (0.019, 3.8e-5),
                        LAUNCHER: (0.0, 1.1e-3)}),
    "rpc-ps": (0.0044, {WORKERS: (0.32, 0.0), "rpc shard": (0.30, 0.0), LAUNCHER: (0.021, 0.0)}),
    "spark-mllib": (0.573, {WORKERS: (0.0, 0.098), "spark driver": (0.0, 0.081), LAUNCHER: (0.009, 3.6e-3)}),
    "spark-mllib-native": (0.0, {WORKERS: (0.31, 0.0), LAUNCHER: (0.0041, 0.0)}),
    "spark-barrier": (1.145, {WORKERS: (0.028, 0.0145), "spark driver": (0.008, 1.3e-3), LAUNCHER: (0.0096, 0.0)}),
    "spark-torch": (0.886, {WORKERS: (0.095, 0.102), "torchrun": (0.018, 7.2e-3), "spark driver": (0.0024, 1.4e-3),
                            LAUNCHER: (0.014, 0.0)}),
}

# One mini-batch's gradient CPU time (1 thread; runner.measured_compute_s) on the same machine, and the
# model's parameter count, per (workload, batch) of the shipped experiments: a plan of the reference
# machine is checked at the reference machine's compute, not at whatever CPU runs the tests.
SHIPPED_COMPUTE: dict[tuple[str, int], tuple[float, int]] = {
    ('cnn-mnist1d', 16): (0.00106, 6442),
    ('cnn-mnist1d', 32): (0.00139, 6442),
    ('cnn-mnist1d-20k', 10): (0.000943, 6442),
    ('logreg-digits', 32): (0.000175, 650),
    ('logreg-higgs-10m', 800): (0.000217, 58),
    ('logreg-higgs-10m', 8000000): (0.756, 58),
    ('logreg-higgs-1375k', 110): (0.000171, 58),
    ('logreg-higgs-1375k', 11000): (0.000868, 58),
    ('logreg-higgs-1375k', 1100000): (0.0831, 58),
    ('logreg-higgs-1m', 40): (0.000164, 58),
    ('logreg-higgs-1m', 400): (0.000188, 58),
    ('logreg-higgs-1m', 4000): (0.000414, 58),
    ('logreg-higgs-1m', 40000): (0.00288, 58),
    ('logreg-higgs-1m', 400000): (0.0277, 58),
    ('logreg-higgs-49k', 4): (0.000158, 58),
    ('logreg-higgs-49k', 390): (0.00019, 58),
    ('logreg-higgs-49k', 39000): (0.00268, 58),
    ('logreg-higgs-synthetic', 16): (0.000168, 58),
    ('logreg-higgs-synthetic', 64): (0.000179, 58),
    ('logreg-higgs-synthetic', 128): (0.000172, 58),
    ('logreg-higgs-synthetic', 1024): (0.000228, 58),
    ('mlp-digits', 8): (0.000352, 17226),
    ('mlp-digits', 10): (0.00036, 17226),
    ('mlp-digits', 30): (0.000365, 17226),
    ('mlp-digits', 32): (0.000365, 17226),
    ('mlp-higgs-1m', 40): (0.00032, 707),
    ('mlp-higgs-1m', 400): (0.000395, 707),
    ('mlp-higgs-1m', 4000): (0.00129, 707),
    ('mlp-higgs-1m', 40000): (0.0106, 707),
    ('mlp-higgs-1m', 400000): (0.13, 707),
    ('mlp-higgs-synthetic', 16): (0.000348, 12098),
    ('mlp-higgs-synthetic', 64): (0.000385, 12098),
    ('mlp-higgs-synthetic', 128): (0.00045, 12098),
    ('mlp-higgs-synthetic', 1024): (0.00141, 12098),
    ('mlp-longtail', 10): (0.000341, 18980),
    ('mlp-skewed-synthetic', 32): (0.000353, 13130),
    ('mlp-wide-digits', 32): (0.000587, 85002),
    ('mlp-wide-synthetic', 64): (0.00576, 1081346),
    ('resnet-synthetic', 32): (0.0465, 78042),
}


def shipped_figures(spec: RunSpec, system_cls: type) -> SystemCalibration:
    latency, figures = SHIPPED_FIGURES[spec.system]
    return SystemCalibration(spec.system, spec.workload, 0.0, {r: RoleFigure(*f) for r, f in figures.items()}, latency,
                             file="tests/cpu_figures.py SHIPPED_FIGURES")


def write_figures(folder: Path) -> None:
    """Every system's shipped figures as the calibration file of its calibration workload."""
    from psbench.systems import get_system
    from psbench.bench.harness.runner import calibration_workload

    folder.mkdir(parents=True, exist_ok=True)
    for system in SHIPPED_FIGURES:
        workload = calibration_workload(get_system(system))
        figures = shipped_figures(RunSpec(system, workload), type(None))
        (folder / f"{system}-{workload}-v{CALIBRATION_VERSION}.json").write_text(json.dumps(figures.to_dict()))

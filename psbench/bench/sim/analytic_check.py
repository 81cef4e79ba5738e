"""The analytic model (bench/sim/analytic.py) against runs measured on this machine.

`measure_local` runs `single` at two batch sizes (the compute fit) and ps (bsp/asp) / ddp at 1-4
workers on loopback, interleaved repeat by repeat, so a slow spell of a shared machine hits the
model's inputs and the runs it predicts alike. `validate_local` fits the inputs from those same
runs (cores = this machine's, since the workers share it) and reports the model's error.
`netlab_runs` turns the bandwidth experiment's table (bench/lab/netbench.py) into measured runs whose
inputs take the link bandwidth from the cap.
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from psbench.bench.sim.model_size import model_bytes
from psbench.bench.sim.analytic import AnalyticInputs, MeasuredRun, Validation, fit_compute, measure_single, validate
from psbench.core.cpu import usable_cores

SYSTEMS = {"ps-bsp": ("ps", {"consistency": "bsp"}), "ps-asp": ("ps", {"consistency": "asp"}), "ddp": ("ddp", {})}


def measure_run(system: str, workload: str, workers: int, batch_size: int, steps: int, seed: int,
                options: dict, results_dir: Path) -> MeasuredRun:
    from psbench.bench.harness.runner import plan, run_one
    from psbench.core.spec import RunSpec

    spec = RunSpec(system, workload, workers=workers, seed=seed, batch_size=batch_size, max_steps=steps,
                   epochs=1000, evals_per_epoch=1, options=dict(options))
    s = run_one(plan(spec), results_dir, "simval").summary
    return MeasuredRun(system, workers, batch_size, s["samples_per_s"], servers=int(options.get("servers", 1)),
                       consistency=options.get("consistency", "bsp"), label=spec.run_id,
                       samples_per_step=s["samples"] / s["steps"])


def measure_local(workload: str, batch_size: int, workers: Sequence[int] = (1, 2, 3, 4),
                  systems: Sequence[str] = ("ps-bsp", "ps-asp", "ddp"), steps: int = 40, repeats: int = 3,
                  fit_batches: Sequence[int] = (16, 64), results_dir: Path | None = None):
    """(compute points for fit_compute, measured runs), measured interleaved."""
    from psbench.systems.common import configure_threads

    configure_threads(1)
    points: dict[int, list[dict[str, float]]] = {b: [] for b in fit_batches}
    runs: list[MeasuredRun] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(results_dir or tmp)
        measure_single(workload, fit_batches[0], max(10, steps // 4))  # warm-up
        for k in range(repeats):
            for b in fit_batches:
                points[b].append(measure_single(workload, b, steps, seed=k, results_dir=out))
            for name in systems:
                system, options = SYSTEMS[name]
                for n in workers:
                    runs.append(measure_run(system, workload, n, batch_size, steps, k, options, out))
    return points, runs


def local_inputs(workload: str, points, cores: float | None = None) -> AnalyticInputs:
    from psbench.bench.lab.netprobe import zmq_pingpong

    a, t = fit_compute(points)
    link = zmq_pingpong("127.0.0.1")
    cores = cores or usable_cores().count
    return AnalyticInputs(step_overhead_s=a, compute_s_per_sample=t, model_bytes=model_bytes(workload),
                          bandwidth_Bps=link.bandwidth_Bps, rtt_s=link.rtt_s, cores=cores,
                          workload=workload, source=f"single at batch {sorted(points)} interleaved with the runs, "
                                                    f"pyzmq loopback, {cores:g} shared cores")


def validate_local(workload: str, batch_size: int, **kwargs) -> tuple[AnalyticInputs, Validation]:
    points, runs = measure_local(workload, batch_size, **kwargs)
    inputs = local_inputs(workload, points)
    return inputs, validate(runs, inputs)


def netlab_runs(table) -> list[tuple[MeasuredRun, float, float]]:
    """(MeasuredRun, link bandwidth bytes/s, cap Mbit/s) for each capped row of bench/lab/netbench.py's table."""
    out = []
    for row in table.to_dict("records"):
        cap = row["cap_mbit"]
        if cap is None or cap != cap:  # uncapped: the veth's speed is not a model parameter we measured
            continue
        consistency = row["consistency"] if isinstance(row["consistency"], str) and row["consistency"] else "bsp"
        goodput = row.get("link_goodput_mbit")
        mbit = goodput if goodput is not None and goodput == goodput else cap  # measured, else nominal
        out.append((MeasuredRun(row["system"], int(row["workers"]), int(row["batch_size"]), float(row["samples_per_s"]),
                                consistency=consistency, label=row["run_id"]), mbit * 1e6 / 8, cap))
    return out


def validate_netlab(table, inputs: AnalyticInputs) -> Validation:
    """The bandwidth runs against the model, each with its cap as the link bandwidth (every host of the
    lab shares this machine's cores, so `inputs.cores` applies as in the loopback runs; rtt unchanged)."""
    rows = []
    for run, bandwidth, cap in netlab_runs(table):
        v = validate([run], replace(inputs, bandwidth_Bps=bandwidth))
        rows += [{**r, "cap_mbit": cap, "link_mbit": bandwidth * 8 / 1e6} for r in v.rows]
    if not rows:
        from psbench.core.errors import ConfigError

        raise ConfigError("validate_netlab: no capped runs in the table")
    errors = [r["error"] for r in rows]
    return Validation(rows, max(errors), sum(errors) / len(errors))
